"""The worker group on real Ray, beyond its faults (test_faults_ray.py).

- The driver waits for a run without spinning: a rank that answered is fetched once and never waited for again,
  so while the other ranks still run, the runner's poll sleeps instead of waking at once, fetching the same
  result and taking CPU from the ranks still running (on 2 cores, one of them).
- The world is formed by the first run on the whole group; before it, rank 0 runs one-rank configs (the sweep's
  first job: the canonical run and its self-check) in its own process; after it, in a launched world beside it.
  A rank's actor gone before the world is formed makes that first run lost, as a loss during a run would.
"""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.e2e


def test_a_rank_that_answered_first_is_fetched_once_and_the_poll_sleeps_until_the_last(ray_address, monkeypatch):
    import ray

    from orchestrator.backends import workers
    from orchestrator.backends.ray_runner import RayRunner

    @ray.remote
    def rank(i: int, delay_s: float):
        time.sleep(delay_s)
        return f"rank {i}", None  # what RankWorker.run returns: (its result, its trace)

    group = workers.WorkerGroup(2, 1, 0, "PACK", "cpu")
    group._refs = [rank.remote(0, 0.0), rank.remote(1, 2.5)]
    group._submitted = time.perf_counter()
    group._deadline = group._submitted + 60
    ray.wait(group._refs[:1], timeout=30)  # rank 0 is in

    fetched = []
    real_get = ray.get
    monkeypatch.setattr(workers.ray, "get", lambda refs, *a, **k: fetched.append(refs) or real_get(refs, *a, **k))
    assert group.collect() is None and len(fetched) == 1
    assert group.pending == group._refs[1:]

    runner = RayRunner.__new__(RayRunner)  # its poll over this group alone, not a cluster's worth of actors
    runner.groups, runner._cfgs = [group], {0: None}
    monkeypatch.setattr("orchestrator.backends.ray_runner._outcome", lambda cfg, run: run)
    polls, t0 = 0, time.perf_counter()
    while not (done := runner.poll(timeout_s=0.5)):
        polls += 1
    waited = time.perf_counter() - t0
    assert done[0][1].kind == "ok" and done[0][1].ranks == ["rank 0", "rank 1"]
    assert len(fetched) == 2, "rank 0's result was fetched again"
    # ~2.5 s at 0.5 s a poll: about 5 polls; the spinning poll made hundreds
    assert polls <= waited / 0.5 + 2, (polls, waited)


def test_one_rank_configs_run_before_the_group_forms_its_world_and_after_it(ray_address):
    from orchestrator.backends.ray_runner import _outcome
    from orchestrator.backends.workers import WorkerGroup
    from trainer.config import TrainConfig

    tiny = {"model": {"vocab_size": 128, "n_layers": 2, "d_model": 32, "n_heads": 4, "seq_len": 32},
            "batch": {"global_batch": 4}, "run": {"steps": 3, "warmup_steps": 1}}
    one = TrainConfig.from_dict({**tiny, "parallel": {"pp": 1, "dp": 1}})
    two = TrainConfig.from_dict({**tiny, "parallel": {"pp": 1, "dp": 2}})

    def run(cfg):
        group.submit([c.to_dict() for c in cfg] if isinstance(cfg, tuple) else cfg.to_dict(), timeout_s=120)
        deadline = time.monotonic() + 120
        while (done := group.collect()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        return _outcome(cfg, done)

    group = WorkerGroup(2, 1, 0, "PACK", "cpu", start_timeout_s=120)
    try:
        group.start()
        assert not group.joined
        first = run((one, one))  # rank 0's own process: no world yet
        assert [o.status for o in first] == ["ok", "ok"] and not group.joined
        assert [s.loss for s in first[0].result.steps] == [s.loss for s in first[1].result.steps]
        both = run(two)
        assert both.status == "ok" and group.joined and both.result.world_size == 2
        later = run((one,))  # the group is in its world now: a launched world beside rank 0
        assert later[0].status == "ok" and [s.loss for s in later[0].result.steps] == \
            [s.loss for s in first[0].result.steps]
        assert run(two).status == "ok" and group.builds == 1
    finally:
        group.kill()


def test_a_rank_lost_before_the_world_is_formed_is_judged_as_a_lost_rank_not_a_failed_start(ray_address):
    """The world is formed at the first run on the whole group: an actor gone by then (its node lost, killed from
    outside) makes that run lost (the trial queued again), as a loss during the run would, not a GroupStartError."""
    import ray

    from orchestrator.backends.ray_runner import _outcome
    from orchestrator.backends.workers import WorkerGroup
    from trainer.config import TrainConfig

    two = TrainConfig.from_dict({"model": {"vocab_size": 128, "n_layers": 2, "d_model": 32, "n_heads": 4,
                                           "seq_len": 32}, "batch": {"global_batch": 4}, "parallel": {"pp": 1, "dp": 2},
                                 "run": {"steps": 3, "warmup_steps": 1}})
    group = WorkerGroup(2, 1, 0, "PACK", "cpu", start_timeout_s=120)
    try:
        group.start()
        ray.kill(group.actors[1])
        group.submit(two.to_dict(), timeout_s=120)
        deadline = time.monotonic() + 60
        while (done := group.collect()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        out = _outcome(two, done)
        assert done.kind == "lost_actor" and out.status == "lost" and "rank 1" in out.reason, (done.kind, out.reason)
        group.submit(two.to_dict(), timeout_s=120)  # rebuilt
        deadline = time.monotonic() + 120
        while (done := group.collect()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert done.kind == "ok" and group.builds == 2 and group.joined
    finally:
        group.kill()


def test_a_result_that_comes_after_the_deadline_is_a_timeout_and_the_group_is_kept(ray_address, monkeypatch):
    """Every rank answered, but after the run's limit: a timeout whatever the poll's timing (a limit that held only
    when a poll missed the result made a 1 ms limit pass a fast run), and the group, whose world is whole, is kept."""
    import ray

    from orchestrator.backends import workers
    from orchestrator.backends.ray_runner import _classify

    @ray.remote
    def rank(i: int):
        time.sleep(0.3)
        return f"rank {i}", None

    group = workers.WorkerGroup(2, 1, 0, "PACK", "cpu")
    killed = []
    monkeypatch.setattr(group, "kill", lambda: killed.append(True))
    group._refs = [rank.remote(0), rank.remote(1)]
    group._submitted = time.perf_counter()
    group._timeout, group._deadline = 0.001, group._submitted + 0.001
    ray.wait(group._refs, num_returns=2, timeout=30)  # both in before the first look
    done = group.collect()
    assert done.kind == "late" and not killed and not group.busy
    assert "came after resources.trial_timeout_s=0.001 s" in str(done.error)
    out = _classify(None, done)
    assert out.status == "timeout" and "killed" not in out.reason


@pytest.mark.timeout(120)
def test_the_first_group_boots_while_the_driver_opens_its_stores_and_a_refused_sweep_gives_it_back(ray_address,
                                                                                                    sweep_file):
    """The sweep joins Ray and launches its worker group at once (its ranks import torch while the driver opens the
    MLflow parent and the Optuna study); a sweep refused after that (here: a study made for another sweep) kills
    the launched actors and frees their placement, so the cluster's CPUs are whole again."""
    import optuna
    import ray
    from ray.util import placement_group_table

    from orchestrator.backends.ray_trials import RayTrials
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep
    from orchestrator.sweep.study import SweepError

    cfg = load_sweep(sweep_file(), ["tracking.enabled=false"])
    cfg.results_dir.mkdir(parents=True)
    optuna.create_study(study_name=cfg.name, storage=cfg.optuna_url).set_user_attr("fingerprint", "another sweep's")
    launched = []
    real_join = RayTrials.join

    def join(self):
        real_join(self)
        launched.append(self._launched)

    before = {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"}
    RayTrials.join = join
    try:
        with pytest.raises(SweepError, match="was made with another backend"):
            run_sweep(cfg)
    finally:
        RayTrials.join = real_join
    (runner,) = launched
    assert runner is not None and cfg.built._launched is None
    (group,) = runner.groups
    assert not group.actors and not group._launched and group.pg is None
    deadline = time.monotonic() + 30
    while (left := {pg_id for pg_id, pg in placement_group_table().items() if pg["state"] != "REMOVED"} - before) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, placement_group_table()
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources()["CPU"] and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == ray.cluster_resources()["CPU"]
