"""Faults of the cluster and of the stores, each with its outcome (issue 10, items 5-8), on real Ray and Optuna.

- A second driver of the same study (other results dir, same optuna url) is refused, naming the first; it takes
  the study over only after the first's heartbeat is older than the grace period.
- A rank's actor killed from outside, or its node removed mid-trial, is the infrastructure's doing: the trial is
  queued again (no ledger line, no crash constraint), the message names what was lost, and the group is rebuilt
  on what is left, or the sweep stops at once when what is left cannot hold the group.
- Each rank's host, IP, Ray node id and GPU ids are in the ledger line, ranks ordered by node id.
- Another process joins the embedded cluster with the token path alone; ``ray://`` is refused at load.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.sweep.config import load_sweep
from orchestrator.records.ledger import Ledger
from orchestrator.sweep.loop import Sweep, SweepError, run_sweep

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


class _Said(logging.Handler):
    """The orchestrator's log lines as text: what the user is told."""

    def __init__(self, lines: list[str]):
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def said():
    lines: list[str] = []
    logger, handler = logging.getLogger("orchestrator"), _Said(lines)
    old = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)
    logger.setLevel(old)


def _wait_for(what, timeout_s: float, every_s: float = 0.2):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if value := what():
            return value
        time.sleep(every_s)
    raise AssertionError(f"not within {timeout_s} s")


@pytest.mark.timeout(300)
def test_a_second_driver_of_the_study_is_refused_until_the_first_is_dead(ray_address, sweep_file, tmp_path, said):
    """Outcome: refused with the first driver's pid and results dir, its running trial untouched, no second
    baseline. A hung first driver (SIGSTOP: alive, no heartbeat) is taken over only once its heartbeat is older
    than storage.grace_period_s; a killed one (SIGKILL) on the same host at once."""
    shared = f"sqlite:///{tmp_path / 'shared-optuna.db'}"
    common = [f"storage.optuna_url={shared}", "storage.heartbeat_interval_s=1", "storage.grace_period_s=6",
              "trainer.run.steps=4000", "resources.trial_timeout_s=600", "search.n_trials=3"]
    first_file = sweep_file("first.yaml", storage={"results_dir": str(tmp_path / "results-a")})
    second_cfg = load_sweep(sweep_file("second.yaml", storage={"results_dir": str(tmp_path / "results-b")}), common)
    log = open(tmp_path / "first.log", "w")
    first = subprocess.Popen([sys.executable, "-m", "orchestrator", "sweep", "--config", str(first_file),
                              f"ray.address={ray_address}", *common], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    def take_over():
        try:
            return Sweep(second_cfg)
        except SweepError as e:
            assert f"pid {first.pid}" in str(e)
            return None
    try:
        def running():
            try:
                study = optuna.load_study(study_name="t", storage=shared)
            except KeyError:
                return None
            return [t for t in study.trials if t.state == TrialState.RUNNING]
        busy = _wait_for(running, 180)
        assert first.poll() is None, (tmp_path / "first.log").read_text()
        with pytest.raises(SweepError) as refused:
            run_sweep(second_cfg)
        assert f"pid {first.pid} on " in str(refused.value) and "results-a" in str(refused.value), refused.value
        trials = optuna.load_study(study_name="t", storage=shared).trials
        assert [(t.number, t.state) for t in trials] == [(busy[0].number, TrialState.RUNNING)]  # untouched
        assert not Ledger(second_cfg.results_dir / "trials.jsonl").read()
        first.send_signal(signal.SIGSTOP)  # hung: its process is there, its heartbeat is not
        stopped = time.time()
        sweep = _wait_for(take_over, 60, every_s=0.5)
        # Its last heartbeat was at most heartbeat_interval_s before the stop; the database clock has 1 s steps.
        assert time.time() - stopped >= 6 - 1 - 1
        assert any(f"took over study 't' from a driver that stopped (pid {first.pid}" in s and "last heartbeat" in s
                   for s in said), said
        sweep.recover()
        sweep.study.release()
    finally:
        first.kill()
        first.wait()
    trials = optuna.load_study(study_name="t", storage=shared).trials
    assert trials[0].state == TrialState.FAIL  # the stopped driver's trial: queued again, once
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    assert [(t.user_attrs["kind"], t.user_attrs["requeued_from"]) for t in waiting] == [("baseline", 0)]


@pytest.mark.timeout(120)
def test_a_killed_driver_on_this_host_is_taken_over_at_once(sweep_file, tmp_path, said):
    """Outcome: its process is gone, so its study is free before the grace period (a resume right after a kill)."""
    cfg = load_sweep(sweep_file(), ["storage.grace_period_s=600"])
    code = ("import sys, time; from orchestrator.sweep.config import load_sweep; from orchestrator.sweep.loop import Sweep; "
            f"Sweep(load_sweep({str(cfg.source)!r}, ['storage.grace_period_s=600'])); print('held', flush=True); "
            "time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(SweepError, match=f"pid {holder.pid} on "):
            Sweep(cfg)
    finally:
        holder.kill()
        holder.wait()
    sweep = Sweep(cfg)
    sweep.study.release()
    assert any(f"(pid {holder.pid}" in s and "its process is gone" in s for s in said), said


@pytest.mark.timeout(180)
def test_a_rank_actor_killed_from_outside_is_lost_not_failed_and_the_group_records_its_placement(ray_address):
    """Outcome: RunDone.kind lost_actor -> status 'lost' ('actor lost'), not 'failed'; a rebuilt group runs
    again, and every run carries each rank's host, ip, node id and GPU ids, in node-id order."""
    import ray

    from orchestrator.backends.ray_runner import _outcome
    from orchestrator.backends.workers import WorkerGroup
    from trainer.config import TrainConfig

    cfg = TrainConfig.from_dict({"model": {"vocab_size": 128, "n_layers": 2, "d_model": 32, "n_heads": 4,
                                           "seq_len": 32}, "parallel": {"pp": 1, "dp": 2}, "batch": {"global_batch": 4},
                                  "run": {"steps": 4000}})
    group = WorkerGroup(2, 1, 0, "STRICT_PACK", "cpu", start_timeout_s=120)
    try:
        group.submit(cfg.to_dict(), timeout_s=600)
        placement = list(group.placement)
        assert [p["rank"] for p in placement] == [0, 1]
        assert all(p["host"] and p["ip"] and len(p["node_id"]) == 56 and p["gpu_ids"] == [] for p in placement)
        assert [p["node_id"] for p in placement] == sorted(p["node_id"] for p in placement)
        time.sleep(1.0)
        ray.kill(group.actors[1])
        done = _wait_for(group.collect, 60)
        assert done.kind == "lost_actor", (done.kind, done.error)
        out = _outcome(cfg, done)
        assert out.status == "lost" and out.reason.startswith("actor lost") and "rank 1" in out.reason, out.reason
        assert out.placement == placement
        short = TrainConfig.from_dict({**cfg.to_dict(), "run": {**cfg.to_dict()["run"], "steps": 4}})
        group.submit(short.to_dict(), timeout_s=120)  # rebuilt: the lost actor is not reused
        again = _wait_for(group.collect, 120)
        assert again.kind == "ok" and group.builds == 2 and again.placement and len(again.placement) == 2
    finally:
        group.kill()


NODE_LOSS_SCRIPT = textwrap.dedent("""
    import json, logging, sys, threading, time
    import ray
    from ray.cluster_utils import Cluster
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep
    from orchestrator.backends.workers import GroupStartError

    path, results = sys.argv[1], {}

    class Said(logging.Handler):
        def __init__(self, lines):
            super().__init__(logging.INFO)
            self.lines = lines

        def emit(self, record):
            self.lines.append(record.getMessage())
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    ray.init(address=cluster.address, log_to_driver=False, logging_level="ERROR")

    def running_rank() -> bool:
        # A rank inside its run: Ray titles the actor's process ray::RankWorker.run while the call lasts. Only
        # descendants of this process (this script's cluster), never another sweep's ranks on the machine.
        import os
        from pathlib import Path
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and (d / "cmdline").read_bytes().startswith(b"ray::RankWorker.run"):
                    pid = int(d.name)
                    while pid > 1 and pid != os.getpid():
                        pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
                    if pid == os.getpid():
                        return True
            except (OSError, ValueError, IndexError):  # gone meanwhile
                pass
        return False

    def remove_mid_trial(node, cfg):
        # Once the first trial (the baseline) is RUNNING in the study and a rank is inside its run, the node
        # goes: the run lasts a few seconds (80 steps), so the removal lands inside it.
        # Read-only sqlite: opening the study through Optuna while the driver creates the schema would race
        # it for the tables ("table alembic_version already exists").
        import sqlite3
        db = cfg.optuna_url.removeprefix("sqlite:///")
        while True:
            try:
                with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as con:
                    if con.execute("SELECT count(*) FROM trials WHERE state = 'RUNNING'").fetchone()[0]:
                        if running_rank():
                            break
            except sqlite3.Error:  # not created yet
                pass
            time.sleep(0.05)
        time.sleep(0.3)
        cluster.remove_node(node)

    for name, cpus, overrides in (("requeue", 1, ["resources.cpus_per_rank=1", "search.n_trials=1"]),
                                  ("too_small", 2, ["resources.cpus_per_rank=1.5", "search.n_trials=2"])):
        node = cluster.add_node(num_cpus=cpus)
        cluster.wait_for_nodes()
        cfg = load_sweep(path, [f"name={name}", "resources.placement=SPREAD",
                                "trainer.run.steps=80", "resources.trial_timeout_s=300", *overrides])
        said = []
        threading.Thread(target=remove_mid_trial, args=(node, cfg), daemon=True).start()
        t0 = time.time()
        try:
            logging.getLogger("orchestrator").addHandler(Said(said))
            logging.getLogger("orchestrator").setLevel(logging.INFO)
            summary, lines = run_sweep(cfg)
            error = None
        except GroupStartError as e:
            lines, error = [], f"{type(e).__name__}: {e}"
        import optuna
        study = optuna.load_study(study_name=name, storage=cfg.optuna_url)
        results[name] = {"lost": node.node_id, "said": said, "error": error, "lines": [r.to_line() for r in lines],
                         "wall_s": time.time() - t0,
                         "trials": [[t.number, t.state.name, t.user_attrs] for t in study.trials]}
    print("RESULT " + json.dumps(results, default=str))
""")


@pytest.mark.timeout(420)
def test_a_node_lost_mid_trial_requeues_the_trial_and_rebuilds_or_stops_at_once(sweep_file, tmp_path):
    """A 2-node local cluster (ray.cluster_utils.Cluster), the worker node removed while a rank runs on it.

    Outcome, room left: the trial is queued again (FAIL in Optuna, no ledger line, no crash constraint), the
    message names the lost node, and the group is rebuilt on the head node, where the trial then runs ok.
    Outcome, no room left: the sweep stops at once (ClusterTooSmall, before any placement wait) naming the lost
    node, with no advice about resources.placement=PACK.
    """
    path = sweep_file(storage={"results_dir": str(tmp_path / "results")})
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # its own cluster, its own token
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.run([sys.executable, "-c", NODE_LOSS_SCRIPT, str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    res = json.loads(proc.stdout.split("RESULT ", 1)[1])
    room = res["requeue"]
    said = "\n".join(room["said"])
    assert room["error"] is None, room
    assert f"node {room['lost']}" in said and "lost" in said and "queued again" in said, said
    lines, trials = room["lines"], room["trials"]
    assert all(r["status"] != "failed" for r in lines), [(r["trial"], r["status"], r["reason"]) for r in lines]
    failed = [t for t in trials if t[1] == "FAIL"]
    assert len(failed) == 1 and not failed[0][2].get("constraints"), trials  # no verdict told for it
    again = [t for t in trials if t[2].get("requeued_from") == failed[0][0]]
    assert len(again) == 1 and again[0][1] == "COMPLETE" and again[0][2]["constraints"]["crash"] == 0, trials
    redo = next(r for r in lines if r["trial"] == again[0][0])
    assert redo["status"] == "ok" and room["lost"] not in {p["node_id"] for p in redo["placement"]}
    for r in lines:  # every measured line says where its ranks ran, in node-id order (the canonical: one rank)
        ids = [p["node_id"] for p in r.get("placement") or []]
        assert len(ids) == (1 if r["kind"] == "canonical" else 2) and ids == sorted(ids), r.get("placement")
    small = res["too_small"]
    assert small["error"] and small["error"].startswith("ClusterTooSmall: the cluster cannot hold 2 ranks"), small
    assert small["lost"] in small["error"] and "PACK" not in small["error"], small["error"]
    assert f"node {small['lost']}" in "\n".join(small["said"]), small["said"]
    assert [t[1] for t in small["trials"]].count("COMPLETE") == 0 and all(
        not t[2].get("constraints") for t in small["trials"]), small["trials"]


@pytest.mark.timeout(120)
def test_another_process_joins_the_embedded_cluster_with_the_token_path_alone(ray_address):
    """Outcome: a fresh process given only RAY_AUTH_TOKEN_PATH (no RAY_AUTH_MODE) joins and runs a task."""
    token_path = os.environ["RAY_AUTH_TOKEN_PATH"]  # where start_local_ray put the embedded cluster's token
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(RAY_AUTH_TOKEN_PATH=token_path, PYTHONPATH=str(ROOT))
    code = textwrap.dedent(f"""
        import ray
        from orchestrator.backends.workers import connect
        print(connect({ray_address!r}, None, num_cpus=1, temp_dir=None, dashboard=False))
        print("answer", ray.get(ray.remote(lambda: 6 * 7).remote()))
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=100)
    assert proc.returncode == 0 and "answer 42" in proc.stdout, proc.stdout + proc.stderr[-3000:]


def test_a_ray_client_address_is_refused_at_load(sweep_file):
    """Outcome: ray://... names the field and the missing ray[client] extra, before anything is launched."""
    with pytest.raises(ValueError, match=r"ray.address=ray://head:10001: .*ray\[client\]"):
        load_sweep(sweep_file(), ["ray.address=ray://head:10001"])


@pytest.mark.parametrize("override, field", [("storage.heartbeat_interval_s=0", "storage.heartbeat_interval_s"),
                                             ("storage.grace_period_s=3", "storage.grace_period_s")])
def test_heartbeat_settings_are_checked_at_load(sweep_file, override, field):
    """Outcome: a heartbeat that could hand a live driver's study to another is refused, naming the field."""
    with pytest.raises(ValueError, match=field):
        load_sweep(sweep_file(), [override, "storage.heartbeat_interval_s=2"] if "grace" in field else [override])


@pytest.mark.timeout(120)
def test_ranks_of_the_embedded_ray_run_at_the_drivers_niceness(ray_address):
    """Outcome: a measured rank is not a nice-15 Ray worker (Ray's default) that any other process on the
    machine preempts: its niceness is the driver's."""
    from orchestrator.backends.workers import WorkerGroup

    group = WorkerGroup(2, 1, 0, "PACK", "cpu", 60)
    group.start()
    try:
        pids = [p["pid"] for p in group.placement]
        nice = [int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[16]) for pid in pids]
    finally:
        group.kill()
    assert nice == [os.nice(0)] * 2, nice
