"""The sweep loop driven by a fake runner (no Ray): pruning, confirm repeats, min_trials, the target stop and
each resume decision, with the real study (Optuna on sqlite), ledger, judge and parity gate.

The fake runner answers each submitted config at once with a hand-made trainer Result whose step time is a
function of the config (``pace``), so every decision the loop takes is scripted and checkable.
"""

from __future__ import annotations

import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.backends import RunOutcome
from orchestrator.sweep.config import load_sweep
from orchestrator.records.record import Metrics, TrialRecord
from orchestrator.search.space import suggest
from orchestrator.sweep.loop import Sweep
from trainer.profile import trace_name
from trainer.result import RankResult, StepRecord, merge

SPACE = {"params": {"batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 4]}}}
PACE = {1: 2.0, 2: 1.0, 4: 0.5, 8: 3.0}
"""Seconds per update by micro-batch size; the baseline runs micro-batch 2, the canonical run (one rank) the whole
batch, 8."""


def result_for(cfg, pace: float):
    """A two-rank Result with every update taking ``pace`` s and the same losses for every layout (parity passes)."""
    ranks = [RankResult(rank=r, pp_rank=0, dp_rank=r, stage_ids=[0], layer_ids=[0], device_name="cpu",
                        steps=[StepRecord(i, pace, 5.0 - 0.1 * i, 1.0, 256) for i in range(cfg.run.steps)],
                        phase_s={}, reduce_start_after_backward_s=None, spans=[], memory={"peak_bytes": 1000},
                        fingerprint={"w": [4.0, 1.0, 0]}, replica_max_abs_diff=0.0, peak_flops=None,
                        peak_basis="none")
             for r in range(2)]
    return merge(ranks, config=cfg.to_dict(), n_microbatches=1, warmup_steps=cfg.run.warmup_steps,
                 model_flops_per_step=1e6, hardware_flops_per_step=1e6, peak_memory_basis="test")


class FakeRunner:
    """The runner protocol (slots/submit/poll/close), answering from ``pace(cfg)`` without running anything."""

    slots, builds, where = 1, 0, "a fake runner"

    def __init__(self, pace=lambda cfg: PACE[cfg.batch.micro_batch_size], die_at: int | None = None):
        self.pace, self.die_at = pace, die_at
        self.submitted: list = []
        self._done: list = []
        self.closed = False

    def submit(self, slot, cfg):
        if self.die_at is not None and len(self.submitted) + 1 == self.die_at:
            raise KeyboardInterrupt  # the driver is killed as this run starts
        self.submitted.append(cfg)
        pace = self.pace(cfg)
        if isinstance(pace, str):
            self._done.append((slot, RunOutcome(pace, f"scripted {pace}")))
            return
        wall = pace * cfg.run.steps
        traces = {trace_name(r): b"trace" for r in range(2)}  # as run.profile_step would bring back
        self._done.append((slot, RunOutcome("ok", None, result_for(cfg, pace), wall_s=wall + 0.1, work_s=wall,
                                            traces=traces)))

    def poll(self, timeout_s):
        done, self._done = self._done, []
        return done

    def close(self):
        self.closed = True


class Quiet:
    """report.Progress's interface, silent (the loop's decisions are what is checked here)."""

    def __init__(self):
        self.running: dict = {}

    def started(self, number, kind, params):
        self.running[number] = kind

    def finished(self, record, done, best, target):
        self.running.pop(record.trial, None)

    def tick(self):
        pass


@pytest.fixture
def config(sweep_file):
    def make(*dotlist, **changes):
        changes.setdefault("space", SPACE)
        changes.setdefault("search", {"n_trials": 4, "wall_time_s": None})
        return load_sweep(sweep_file(**changes), list(dotlist))
    return make


def open_sweep(cfg) -> Sweep:
    sweep = Sweep(cfg)
    sweep.progress = sweep.recorder.progress = Quiet()
    return sweep


def run_loop(cfg, runner: FakeRunner | None = None) -> tuple[Sweep, FakeRunner]:
    runner = runner or FakeRunner()
    sweep = open_sweep(cfg)
    sweep.backend.runner = lambda: runner
    try:
        if (started := sweep.start()) is not None:
            sweep.drive(started)
    finally:
        sweep.study.release()
    return sweep, runner


def trials_of(cfg) -> list:
    return optuna.load_study(study_name=cfg.name, storage=cfg.optuna_url).trials


def by_trial(sweep, kind="trial") -> dict[int, TrialRecord]:
    return {r.trial: r for r in sweep.records if r.kind == kind}


def test_a_clearly_slower_probe_is_pruned_and_a_fast_one_measured_in_full(config):
    cfg = config(pruning={"enabled": True, "after_steps": 2, "slower_than_best": 1.2},
                 enqueue=[{"batch.micro_batch_size": 1}, {"batch.micro_batch_size": 4}])
    sweep, runner = run_loop(cfg)
    steps, probe_steps = cfg.built.configs.baseline.run.steps, cfg.built.configs.baseline.run.warmup_steps + 2
    assert [r.kind for r in sweep.records[:2]] == ["canonical", "baseline"]  # the trust chain first
    slow, fast = by_trial(sweep)[1], by_trial(sweep)[2]
    assert slow.params == {"batch.micro_batch_size": 1} and slow.status == "pruned"
    assert slow.reason.startswith("probe: fastest of 2 measured updates 2000.0 ms > 1.2 x best 1000.0 ms")
    assert (slow.probe.steps, slow.probe.skipped_steps) == (probe_steps, steps - probe_steps)
    assert fast.status == "ok" and fast.metrics.step_time_s == 0.5 and fast.probe.skipped_steps == 0
    assert fast.overhead_s == pytest.approx(0.2)  # two runs (probe + full), 0.1 s outside updates each
    # The pruned trial ran its probe only; the fast one its probe, then the full measurement.
    mbs = [(c.batch.micro_batch_size, c.run.steps) for c in runner.submitted if c.world_size > 1]  # not the canonical's
    assert (1, steps) not in mbs and (1, probe_steps) in mbs and [(4, probe_steps), (4, steps)] == \
        [m for m in mbs if m[0] == 4]
    states = {t.number: t.state for t in trials_of(cfg)}
    assert states[1] == TrialState.PRUNED and states[2] == TrialState.COMPLETE
    assert runner.closed and sweep.stop_reason is None  # the budget, not a target, ended it
    assert sweep.records == sweep.ledger.read()  # what the loop holds is what the ledger reads back
    assert [Path(p).name for p in fast.artifacts] == [trace_name(0), trace_name(1)]
    assert all(Path(p).is_file() for p in fast.artifacts) and fast.result.ranks[0].trace_file == fast.artifacts[0]


class BuggyRunner(FakeRunner):
    """A FakeRunner whose runs of ``buggy(cfg)`` configs learn something else: their loss is off from step 1."""

    def __init__(self, buggy, **kw):
        super().__init__(**kw)
        self.buggy = buggy

    def submit(self, slot, cfg):
        super().submit(slot, cfg)
        outcome = self._done[-1][1]
        if outcome.result is not None and self.buggy(cfg):
            for s in outcome.result.steps[1:]:
                s.loss *= 1.001


def test_a_pruned_trial_is_judged_on_its_probe_and_a_layout_bug_there_is_parity_failed(config):
    """Issue 21 item 3: the slow config (mbs 1) carries a layout bug; its probe is compared with the reference's
    same updates, and the trial is infeasible with a parity constraint, not just pruned."""
    cfg = config(pruning={"enabled": True, "after_steps": 2, "slower_than_best": 1.2},
                 enqueue=[{"batch.micro_batch_size": 1}, {"batch.micro_batch_size": 4}], search={"n_trials": 3})
    # the bug at mbs 1 with data parallelism: the canonical run's one-rank self-check at mbs 1 is clean
    sweep, runner = run_loop(cfg, BuggyRunner(lambda c: c.batch.micro_batch_size == 1 and c.world_size > 1))
    slow = by_trial(sweep)[1]
    probe_steps = cfg.built.configs.baseline.run.warmup_steps + 2
    assert slow.status == "infeasible" and slow.parity.steps == probe_steps and not slow.parity.passed
    from orchestrator.parity.verdict import DEFAULT_TOLERANCE

    assert slow.reason.startswith(f"parity: loss differs at step 1: relative difference 1.00e-03 > tolerance "
                                  f"{DEFAULT_TOLERANCE['fp32'].loss_rel:.1e} "
                                  f"(vs the reference, on the probe's {probe_steps} updates); also probe: fastest")
    assert slow.probe.skipped_steps == cfg.built.configs.baseline.run.steps - probe_steps
    assert trials_of(cfg)[1].user_attrs["constraints"]["parity"] == 1.0
    fast = by_trial(sweep)[2]
    assert fast.status == "ok" and fast.parity.passed and fast.parity.steps == cfg.built.configs.baseline.run.steps


def test_a_baseline_that_differs_from_the_canonical_run_names_the_family_to_blame(config):
    """Issue 21 item 2: baseline pp=2, mbs 2, 1f1b; only mbs 2 computes something else. Each active family is set
    back alone (pp, schedule, microbatch size: nothing inert), and the one whose reset agrees is named."""
    from orchestrator.sweep.loop import SweepError

    cfg = config()
    with pytest.raises(SweepError) as err:
        run_loop(cfg, BuggyRunner(lambda c: c.batch.micro_batch_size == 2))
    msg = str(err.value)
    assert "the baseline (trial 0) failed parity: the baseline does not match the canonical run" in msg
    assert ("Its active settings that differ from the canonical layout: parallel.pp=2 (canonical: 1); "
            "pipeline.schedule='1f1b' (canonical: one stage); batch.micro_batch_size=2 (canonical: 8).") in msg
    assert "Set back to canonical alone, batch.micro_batch_size makes it agree with the canonical run" in msg
    assert "overlap" not in msg and "bucket" not in msg  # inert at dp=1


def test_a_winner_is_confirmed_then_the_target_stops_the_sweep(config):
    cfg = config("target.step_time_s=0.6", "confirm.repeats=2", "search.n_trials=6",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, runner = run_loop(cfg)
    confirms = [r for r in sweep.records if r.kind == "confirm"]
    assert [(c.trial, c.repeat, c.meets_target) for c in confirms] == [(1, 1, True), (1, 2, True)]
    assert sweep.stop_reason == ("trial 1 met the target, passed parity and was confirmed "
                                 "(median of 3 runs 500.0 ms <= 600.0 ms)")
    assert [r.kind for r in sweep.records][-2:] == ["confirm", "confirm"]  # nothing ran after the confirmation
    assert sweep.study.finished() == 2  # baseline + the winner: far below search.n_trials=6


def test_a_confirm_run_that_misses_the_target_does_not_stop_the_sweep(config):
    calls = {"n": 0}

    def pace(cfg):
        if cfg.batch.micro_batch_size != 4:
            return PACE[cfg.batch.micro_batch_size]
        calls["n"] += 1
        return 0.5 if calls["n"] == 1 else 0.9  # measured fast once, then slower on the confirm run

    cfg = config("target.step_time_s=0.6", "confirm.repeats=2", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(pace))
    confirms = [r for r in sweep.records if r.kind == "confirm"]
    # The config's median (0.5, 0.9: 0.7 s) misses the target: the second repeat is not run.
    assert [(c.repeat, c.meets_target) for c in confirms] == [(1, False)]
    assert sweep.stop_reason is None and sweep.study.finished() == 4  # the budget ended it


def test_confirm_repeats_zero_stops_at_the_first_trial_under_the_target(config):
    cfg = config("target.step_time_s=0.6", "confirm.repeats=0", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg)
    assert not [r for r in sweep.records if r.kind == "confirm"]
    assert sweep.stop_reason == "trial 1 meets the target (single run 500.0 ms <= 600.0 ms)"


def test_min_trials_keeps_searching_after_the_confirmation(config):
    cfg = config("target.step_time_s=0.6", "confirm.repeats=1", "search.n_trials=8", "search.min_trials=5",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg)
    kinds = [r.kind for r in sweep.records if r.kind != "canonical"]
    assert kinds[:3] == ["baseline", "trial", "confirm"] and kinds[3:] == ["trial"] * 3
    assert sweep.study.finished() == 5
    assert sweep.stop_reason == ("trial 1 met the target, passed parity and was confirmed "
                                 "(median of 2 runs 500.0 ms <= 600.0 ms) (after search.min_trials=5)")


def test_resume_tells_a_recorded_running_trial_and_requeues_an_unrecorded_one(config):
    cfg = config()
    first = open_sweep(cfg)
    first.recover()  # a new study: the baseline is queued
    measured = first.study.ask()
    params, _ = suggest(measured, cfg.space, first.backend.configs.fixed, first.backend.configs.split_context)
    first.ledger.append(TrialRecord(
        sweep=cfg.name, trial=measured.number, kind="baseline", backend="ray", params=params, config={},
        status="ok", reason=None, metrics=Metrics(step_time_s=0.5), meets_target=False, wall_s=1.0, overhead_s=0.1,
        started_at=0.0, finished_at=1.0))
    lost = first.study.ask()
    lost_params, _ = suggest(lost, cfg.space, first.backend.configs.fixed, first.backend.configs.split_context)
    first.study.release()
    # ... the driver dies here: trial 0 has its ledger line but was never told, trial 1 has neither.
    again = open_sweep(cfg)
    try:
        again.recover()
    finally:
        again.study.release()
    trials = trials_of(cfg)
    assert trials[0].state == TrialState.COMPLETE and trials[0].value == 0.5
    assert trials[0].user_attrs["status"] == "ok"
    assert trials[1].state == TrialState.FAIL
    assert trials[2].state == TrialState.WAITING and trials[2].user_attrs["requeued_from"] == 1
    assert trials[2].system_attrs["fixed_params"] == lost_params
    assert len(trials) == 3  # the baseline is measured, so it is not queued again


def test_resume_queues_the_confirm_run_of_an_unconfirmed_winner(config):
    cfg = config("target.step_time_s=0.6", "confirm.repeats=1", enqueue=[{"batch.micro_batch_size": 4}])
    # canonical, its self-check, baseline, the winner, then killed as its confirm run starts
    with pytest.raises(KeyboardInterrupt):
        run_loop(cfg, FakeRunner(die_at=5))
    again = open_sweep(cfg)
    again.backend.runner = FakeRunner
    try:
        again.recover()
        assert [(j.kind, j.number, j.config.batch.micro_batch_size) for j in again.queue] == [("confirm", 1, 4)]
        again.drive(FakeRunner())
    finally:
        again.study.release()
    assert [(r.kind, r.trial, r.repeat) for r in again.records][-1] == ("confirm", 1, 1)
    assert again.stop_reason == ("trial 1 met the target, passed parity and was confirmed "
                                 "(median of 2 runs 500.0 ms <= 600.0 ms)")


def test_resume_of_a_new_or_failed_baseline_queues_the_baseline(config):
    cfg = config()
    fresh = open_sweep(cfg)
    try:
        fresh.recover()
    finally:
        fresh.study.release()
    (waiting,) = trials_of(cfg)
    assert waiting.state == TrialState.WAITING and waiting.user_attrs["kind"] == "baseline"
    assert waiting.system_attrs["fixed_params"] == cfg.built.configs.baseline_params(cfg.space)
    # The baseline fails (here: out of memory): it is queued again, not counted, and the sweep stops on it.
    from orchestrator.sweep.loop import SweepError

    with pytest.raises(SweepError, match="the baseline \\(trial 0\\) did not run: oom"):
        run_loop(cfg, FakeRunner(lambda c: "oom" if c.parallel.pp == 2 else 1.0))
    again = open_sweep(cfg)
    try:
        again.recover()
    finally:
        again.study.release()
    states = [(t.state, t.user_attrs.get("kind")) for t in trials_of(cfg)]
    assert states[0] == (TrialState.FAIL, "baseline") and states[-1] == (TrialState.WAITING, "baseline")
    assert sum(s == TrialState.WAITING for s, _ in states) == 1  # queued once, not once per resume


def test_a_ledger_that_does_not_load_leaves_no_study_behind(config):
    cfg = config()
    cfg.results_dir.mkdir(parents=True)
    (cfg.results_dir / "trials.jsonl").write_text("{not json\n")
    with pytest.raises(ValueError, match="trials.jsonl:1: not a JSON line"):
        Sweep(cfg)
    assert optuna.get_all_study_names(cfg.optuna_url) == []  # so a fixed ledger resumes into a fresh study


def scripted(paces: dict[int, list[float]]):
    """Pace by micro-batch size, one value per run in turn (the last repeats); the canonical run (one rank) is not
    scripted."""
    calls: dict[int, int] = {}

    def pace(cfg):
        mbs = cfg.batch.micro_batch_size
        if cfg.world_size == 1:
            return 0.6
        seq = paces[mbs]
        i = calls.get(mbs, 0)
        calls[mbs] = i + 1
        return seq[min(i, len(seq) - 1)]
    return pace


def test_after_the_search_overlapping_top_configs_are_run_again_until_the_winner_is_settled(config):
    # mbs 4 (trial 1) leads by its first run, 0.55 s against the baseline's 0.60 s: within the assumed 15%
    # spread of one run, so the two overlap; its second run (0.50) separates them and the winner is settled.
    cfg = config("search.n_trials=3", "winner.max_repeats=5", "winner.min_runs=3", enqueue=[{"batch.micro_batch_size": 4},
                                                                     {"batch.micro_batch_size": 1}])
    sweep, runner = run_loop(cfg, FakeRunner(scripted({1: [2.0], 2: [0.60], 4: [0.55, 0.50]})))
    repeats = [r for r in sweep.records if r.kind == "repeat"]
    assert [(r.trial, r.repeat, r.params, r.metrics.step_time_s) for r in repeats] == \
        [(1, 1, {"batch.micro_batch_size": 4}, 0.50)]
    assert repeats[0].parity is not None and repeats[0].parity.passed  # judged like any run
    assert sweep.study.finished() == 3  # a re-measurement is no trial of the study
    assert sweep.records == sweep.ledger.read()
    from orchestrator.review import report
    from orchestrator.records import winner

    w = winner.summary(sweep.records, cfg.winner)
    assert (w["trial"], w["runs"], w["repeats_run"], w["remeasure_trials"]) == (1, 2, 1, [])
    assert "median (runs)" in report.table(sweep.records)


def test_a_leader_by_one_lucky_run_loses_to_the_better_median(config):
    cfg = config("search.n_trials=2", "winner.max_repeats=8", "winner.min_runs=3", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(scripted({2: [0.60, 0.58, 0.59], 4: [0.55, 0.70, 0.72]})))
    runs = [(r.trial, r.metrics.step_time_s) for r in sweep.records if r.kind == "repeat"]
    assert sorted(runs) == [(0, 0.58), (0, 0.59), (1, 0.70), (1, 0.72)]  # both to winner.min_runs=3
    from orchestrator.records import winner

    w = winner.summary(sweep.records, cfg.winner)
    assert (w["trial"], w["step_time_s"], w["remeasure_trials"]) == (0, 0.59, [])


def test_the_repeat_budget_bounds_the_re_measurements_and_the_summary_says_what_is_unsettled(config):
    cfg = config("search.n_trials=2", "winner.max_repeats=1", "winner.min_runs=3", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(scripted({2: [0.60, 0.58, 0.59], 4: [0.55, 0.70, 0.72]})))
    assert [(r.trial, r.repeat) for r in sweep.records if r.kind == "repeat"] == [(1, 1)]
    from orchestrator.records import winner

    w = winner.summary(sweep.records, cfg.winner)
    assert w["remeasure_trials"] and "not settled" in winner.settling_text(w)
    # A resumed sweep with a larger budget goes on from the ledger where this one stopped.
    more = config("search.n_trials=2", "winner.max_repeats=8", "winner.min_runs=3", enqueue=[{"batch.micro_batch_size": 4}])
    again, runner = run_loop(more, FakeRunner(scripted({2: [0.58, 0.59], 4: [0.72]})))
    assert sorted((r.trial, r.repeat) for r in again.records if r.kind == "repeat") == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert winner.summary(again.records, more.winner)["trial"] == 0


def test_the_wall_time_budget_also_ends_the_re_measurements(config, monkeypatch):
    import types

    from orchestrator.sweep import loop as sweep_module

    clock = {"now": 0.0}  # the loop's clock advances by each run's wall, as if the runs took their time

    class Timed(FakeRunner):
        def submit(self, slot, cfg):
            super().submit(slot, cfg)
            clock["now"] += self._done[-1][1].wall_s

    monkeypatch.setattr(sweep_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"], time=time.time))
    # canonical with its self-check (one record of 7.4 s) and baseline (3.7 s): 11.1 s in, plus a median record
    # of 5.55 s, fits 17 s: the trial starts; after it (14.5 s in) another run (median 3.7 s) does not fit, so the
    # overlapping leader is not run again.
    cfg = config("search.n_trials=2", "search.wall_time_s=17", "winner.max_repeats=8",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, Timed(scripted({2: [0.60], 4: [0.55]})))
    assert [r.kind for r in sweep.records] == ["canonical", "baseline", "trial"]
    assert sweep.stop_reason == "the wall-time budget (17 s) is spent"
    from orchestrator.records import winner

    assert winner.summary(sweep.records, cfg.winner)["remeasure_trials"] == [1, 0]


def test_one_answer_when_the_fastest_single_run_is_not_the_best_median(config, monkeypatch):
    """Trial 1's first run (0.55 s) is the fastest single run, but its confirm and re-measurements (0.70, 0.72)
    make it a 0.70 s config; the baseline's runs (0.60, 0.58, 0.59) make it 0.59 s. Every reader names trial 0,
    by that median: the summary, its target verdict, the table's rank 1 and its * mark, `export`'s default and
    the MLflow parent's best_step_time_s."""
    from mlflow.tracking import MlflowClient

    from orchestrator.export import bundle
    from orchestrator.review import report

    cfg = config("search.n_trials=2", "winner.max_repeats=8", "winner.min_runs=3", "target.step_time_s=0.595",
                 "confirm.repeats=1", "tracking.enabled=true", enqueue=[{"batch.micro_batch_size": 4}])
    runner = FakeRunner(scripted({2: [0.60, 0.58, 0.59], 4: [0.55, 0.70, 0.72]}))
    sweep = open_sweep(cfg)
    sweep.backend.runner = lambda: runner
    try:
        summary = sweep.run()
    finally:
        sweep.study.release()
    # The single run that met the target was confirmed by its median, which missed it: no early stop.
    assert [(r.kind, r.trial, r.metrics.step_time_s) for r in sweep.records if r.kind == "confirm"] == \
        [("confirm", 1, 0.70)]
    assert sweep.stop_reason is None

    assert (summary["best"]["trial"], summary["best"]["step_time_s"], summary["best"]["runs"]) == (0, 0.59, 3)
    assert summary["target_met"]
    text = report.summary_text(summary)
    assert "best (trial 0): median of 3 runs 590.0 ms [580.0 ms, 600.0 ms] per update" in text
    assert "target met: trial 0, median of 3 runs 590.0 ms <= 595.0 ms" in text
    assert "fastest single run: trial 1, 550.0 ms (not the best: that config's median of 3 runs 700.0 ms)" in text
    assert "noise-aware winner" not in text and "unconfirmed" not in text

    rows = report.table(sweep.records, summary["target_s"]).splitlines()
    assert rows[0].split()[:5] == ["rank", "trial", "kind", "median", "(runs)"]
    first, second = rows[1].split(), rows[2].split()
    assert first[:7] == ["1", "0", "baseline", "590.0", "ms", "(3)", "600.0"] and "ok *" in rows[1]
    assert second[:7] == ["2", "1", "trial", "700.0", "ms", "(3)", "550.0"] and "*" not in rows[2]

    monkeypatch.setattr(bundle, "mlflow_run_of", lambda path, r: None)
    ledger = cfg.results_dir / "trials.jsonl"
    assert bundle.pick(bundle.read_ledger(ledger), None, force=False)[0].trial == 0
    bundle.export_trial(ledger, None, cfg.results_dir / "export")
    md = (cfg.results_dir / "export" / "summary.md").read_text()
    assert md.startswith("# steptune export: sweep `t`, trial 0 (baseline)")
    assert "rank 1 of 2 configs (the sweep's best), by median of 3 runs 590.0 ms" in md

    client = MlflowClient(cfg.mlflow_uri)
    parent = client.search_runs([client.get_experiment_by_name("steptune").experiment_id],
                                "tags.\"steptune.role\" = 'parent'")[0]
    assert parent.data.metrics["best_step_time_s"] == 0.59 and parent.data.tags["steptune.best_trial"] == "0"
    # judged on the median (0.59 s <= 0.595 s), though the baseline's own first run (0.60 s) missed the target
    assert parent.data.tags["steptune.best_meets_target"] == "true"
    assert "best (trial 0): median of 3 runs" in Path(client.download_artifacts(
        parent.info.run_id, "summary.md")).read_text()
