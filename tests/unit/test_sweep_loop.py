"""The sweep loop driven by a fake runner (no Ray): pruning, settling rounds, min_trials, the target stop and
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
from trainer.measure.result import trace_name
from trainer.measure.result import RankResult, StepRecord, merge

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
        """A tuple of configs (the canonical run and its self-check) comes back as a tuple, as RayRunner's does."""
        if self.die_at is not None and len(self.submitted) + 1 == self.die_at:
            raise KeyboardInterrupt  # the driver is killed as this run starts
        runs = [self.run(c) for c in (cfg if isinstance(cfg, tuple) else (cfg,))]
        self._done.append((slot, tuple(runs) if isinstance(cfg, tuple) else runs[0]))

    def run(self, cfg) -> RunOutcome:
        self.submitted.append(cfg)
        pace = self.pace(cfg)
        if isinstance(pace, str):
            return RunOutcome(pace, f"scripted {pace}")
        wall = pace * cfg.run.steps
        traces = {trace_name(r): b"trace" for r in range(2)}  # as run.profile_step would bring back
        return RunOutcome("ok", None, result_for(cfg, pace), wall_s=wall + 0.1, work_s=wall, traces=traces)

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
        changes.setdefault("winner", {"max_rounds": 5})  # settling on (the suite's sweep file turns it off)
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
    cfg = config("winner.max_rounds=0", pruning={"enabled": True, "after_steps": 2, "slower_than_best": 1.2},
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

    def run(self, cfg):
        outcome = super().run(cfg)
        if outcome.result is not None and self.buggy(cfg):
            for s in outcome.result.steps[1:]:
                s.loss *= 1.001
        return outcome


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


def rounds_of(sweep) -> list[tuple[int, int, float]]:
    """(round, trial, step time) of every settling run, ledger order."""
    return [(r.round, r.trial, r.metrics.step_time_s) for r in sweep.records if r.kind == "repeat"]


def test_a_met_target_is_settled_in_interleaved_rounds_then_stops_the_sweep(config):
    cfg = config("target.step_time_s=0.6", "winner.min_rounds=2", "search.n_trials=6",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, runner = run_loop(cfg)
    runs = rounds_of(sweep)
    # Two rounds, each the baseline (trial 0) and the contender (trial 1) once, in a seeded random order.
    assert sorted(runs) == [(1, 0, 1.0), (1, 1, 0.5), (2, 0, 1.0), (2, 1, 0.5)]
    assert all(r.kind == "repeat" and r.repeat is not None and r.parity.passed
               for r in sweep.records if r.round is not None)
    assert sweep.stop_reason == "target"
    answer = sweep.answer()
    assert answer.winner.trial == 1 and answer.target.state == "met" and answer.settled
    assert sweep.study.finished() == 2  # baseline + the winner: far below search.n_trials=6
    from orchestrator.review import report

    line = report.stop_line(sweep.stop_reason, sweep.target_stop, answer)
    assert line.startswith("settling rounds found the target met: trial 1, median of 3 runs 500.0 ms")


def test_a_rounds_next_run_starts_before_the_last_one_is_recorded_and_each_is_recorded_in_order(config):
    cfg = config("target.step_time_s=0.6", "winner.min_rounds=2", "search.n_trials=6",
                 enqueue=[{"batch.micro_batch_size": 4}])
    lines_at_submit: list[int] = []

    class Watching(FakeRunner):
        def submit(self, slot, cfg_):
            lines_at_submit.append(len(sweep.ledger.read()))
            super().submit(slot, cfg_)

    runner = Watching()
    sweep = open_sweep(cfg)
    sweep.backend.runner = lambda: runner
    try:
        sweep.drive(sweep.start())
    finally:
        sweep.study.release()
    # The rounds are the sweep's last four runs (the target is met after them). Each round's second run was
    # submitted while its first run's line was not yet written: the ranks do not wait for the ledger, the answer
    # and the MLflow hand-off. One at a time, the counts would be a, a+1, a+2, a+3.
    a = lines_at_submit[-4]
    assert lines_at_submit[-4:] == [a, a, a + 2, a + 2]
    # ... and still every run is recorded, in the order run, with its own repeat number.
    assert [(r.round, r.repeat) for r in sweep.records if r.kind == "repeat"] == [(1, 1), (1, 1), (2, 2), (2, 2)]


def test_rounds_that_miss_the_target_do_not_stop_the_search(config):
    calls = {"n": 0}

    def pace(cfg):
        if cfg.batch.micro_batch_size != 4:
            return PACE[cfg.batch.micro_batch_size]
        calls["n"] += 1
        return 0.5 if calls["n"] == 1 else 0.9  # measured fast once, then slower in every round

    cfg = config("target.step_time_s=0.6", "winner.min_rounds=2", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(pace))
    assert [t for _, t, _ in rounds_of(sweep)].count(1) >= 2
    assert sweep.stop_reason is None and sweep.study.finished() == 4  # the budget ended it
    assert sweep.answer().target.state == "not met"


def test_max_rounds_zero_judges_the_search_runs_alone(config):
    cfg = config("target.step_time_s=0.6", "winner.max_rounds=0", enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg)
    assert not rounds_of(sweep)
    answer = sweep.answer()
    assert answer.winner.trial == 1 and not answer.settled  # one run each: no rounds, said unsettled


def test_min_trials_keeps_searching_after_settling_found_the_target_met(config):
    cfg = config("target.step_time_s=0.6", "winner.min_rounds=1", "search.n_trials=8", "search.min_trials=5",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg)
    kinds = [r.kind for r in sweep.records if r.kind != "canonical"]
    assert kinds[:4] == ["baseline", "trial", "repeat", "repeat"] and kinds[4:7] == ["trial"] * 3
    assert sweep.study.finished() == 5
    assert sweep.stop_reason == "target (after search.min_trials=5)"


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


def test_a_target_check_cut_short_by_a_dead_driver_goes_on_when_resumed(config):
    cfg = config("target.step_time_s=0.6", "winner.min_rounds=2", enqueue=[{"batch.micro_batch_size": 4}])
    # canonical, its self-check, baseline, the winner, one run of round 1, then killed as the next starts
    with pytest.raises(KeyboardInterrupt):
        run_loop(cfg, FakeRunner(die_at=6))
    assert [r.round for r in Sweep(cfg).ledger.read()].count(1) == 1
    again, _ = run_loop(cfg)
    # The cut round (one run, no baseline beside it to pair with) stays as it is; two whole rounds follow.
    (cut,) = [(n, t) for n, t, _ in rounds_of(again) if n == 1]
    assert sorted((n, t) for n, t, _ in rounds_of(again) if n > 1) == [(2, 0), (2, 1), (3, 0), (3, 1)]
    assert again.stop_reason == "target" and again.answer().target.state == "met"


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


def test_after_the_search_the_contenders_are_settled_in_rounds(config):
    # mbs 4 (trial 1) leads by its first run, 0.55 s against the baseline's 0.60 s: within the assumed 15%
    # spread of one run, so they cannot be told apart yet; paired rounds (0.50 against 0.60) separate them.
    cfg = config("search.n_trials=3", "winner.max_rounds=5", "winner.min_rounds=3",
                 enqueue=[{"batch.micro_batch_size": 4}, {"batch.micro_batch_size": 1}])
    sweep, runner = run_loop(cfg, FakeRunner(scripted({1: [2.0], 2: [0.60], 4: [0.55, 0.50]})))
    runs = rounds_of(sweep)
    assert sorted(runs) == [(k, t, x) for k in (1, 2, 3) for t, x in ((0, 0.60), (1, 0.50))]
    assert sweep.study.finished() == 3  # a settling run is no trial of the study
    assert sweep.records == sweep.ledger.read()
    answer = sweep.answer()
    assert answer.winner.trial == 1 and answer.settled and not answer.tie
    assert answer.winner.ratio == pytest.approx(0.5 / 0.6)
    from orchestrator.review import report

    assert "vs baseline" in report.table(sweep.records, answer)


def test_a_leader_by_one_lucky_run_loses_to_the_better_paired_figure(config):
    cfg = config("search.n_trials=2", "winner.max_rounds=8", "winner.min_rounds=3",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(scripted({2: [0.60, 0.58, 0.59, 0.60], 4: [0.55, 0.70, 0.72, 0.71]})))
    # Trial 1 stays in the rounds until its paired interval over two rounds (0.70, 0.72 against 0.58, 0.59) tells
    # it apart: it leaves the race, and the baseline is the answer.
    assert sorted((n, t) for n, t, _ in rounds_of(sweep)) == [(k, t) for k in (1, 2) for t in (0, 1)]
    answer = sweep.answer()
    assert answer.winner.trial == 0 and answer.settled and not answer.tie


def test_the_round_budget_bounds_the_rounds_and_the_summary_says_what_is_unsettled(config):
    # Trial 1 and the baseline are within 1% of each other: a tie that rounds keep open.
    paces = {2: [0.60, 0.60, 0.59, 0.60, 0.60], 4: [0.55, 0.595, 0.60, 0.59, 0.60]}
    cfg = config("search.n_trials=2", "winner.max_rounds=1", "winner.min_rounds=3",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, FakeRunner(scripted(paces)))
    assert sorted((n, t) for n, t, _ in rounds_of(sweep)) == [(1, 0), (1, 1)]
    answer = sweep.answer()
    assert not answer.settled and "winner.min_rounds=3" in answer.why_unsettled
    from orchestrator.review import report

    text = report.summary_text(report.summarize(sweep.records, cfg.target, cfg.winner, answer))
    assert "not settled:" in text
    # A resumed sweep with a larger budget goes on from the ledger where this one stopped: the second round of
    # both, then the leader (the baseline) alone for its third paired run; no round can split a tie within 1%.
    more = config("search.n_trials=2", "winner.max_rounds=2", "winner.min_rounds=3",
                  enqueue=[{"batch.micro_batch_size": 4}])
    again, _ = run_loop(more, FakeRunner(scripted({2: paces[2][2:], 4: paces[4][2:]})))
    assert sorted((n, t) for n, t, _ in rounds_of(again)) == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0)]
    answer = again.answer()
    assert answer.tie and answer.winner.trial == 0  # a tie: the tie-break keeps the baseline (nothing changed)
    assert "a tie:" in report.summary_text(report.summarize(again.records, more.target, more.winner, answer))


def test_the_wall_time_budget_also_ends_the_rounds(config, monkeypatch):
    import types

    from orchestrator.sweep import loop as sweep_module

    clock = {"now": 0.0}  # the loop's clock advances by each run's wall, as if the runs took their time

    class Timed(FakeRunner):
        def run(self, cfg):
            outcome = super().run(cfg)
            clock["now"] += outcome.wall_s
            return outcome

    monkeypatch.setattr(sweep_module, "time", types.SimpleNamespace(perf_counter=lambda: clock["now"], time=time.time))
    # canonical with its self-check (one record of 7.4 s) and baseline (3.7 s): 11.1 s in, plus a median record
    # of 5.55 s, fits 17 s: the trial starts; after it (14.5 s in) another run does not fit, so no settling round
    # starts.
    cfg = config("search.n_trials=2", "search.wall_time_s=17", "winner.max_rounds=8",
                 enqueue=[{"batch.micro_batch_size": 4}])
    sweep, _ = run_loop(cfg, Timed(scripted({2: [0.60], 4: [0.55]})))
    assert [r.kind for r in sweep.records] == ["canonical", "baseline", "trial"]
    assert sweep.stop_reason == "the wall-time budget (17 s) is spent"
    assert not sweep.answer().settled


def test_one_answer_when_the_fastest_single_run_is_not_the_answer(config, monkeypatch):
    """Trial 1's first run (0.55 s) is the fastest single run and met the target, but its settling runs (0.70,
    0.72, 0.71) against the baseline's (0.60, 0.58, 0.59) make it the slower config. Every reader names trial 0
    by the same decision: the summary, its target verdict, the table's rank 1 and its * mark, `export`'s
    default, the MLflow parent's tags and description, each child's meets_target tag."""
    from mlflow.tracking import MlflowClient

    from orchestrator.export import bundle
    from orchestrator.review import report

    # The baseline's own run meets the target (a target check of it alone settles it met); search.min_trials
    # still runs trial 1, and the final rounds decide between the two.
    cfg = config("search.n_trials=2", "search.min_trials=2", "winner.max_rounds=8", "winner.min_rounds=3",
                 "target.step_time_s=0.65", "tracking.enabled=true", enqueue=[{"batch.micro_batch_size": 4}])
    runner = FakeRunner(scripted({2: [0.60, 0.58, 0.59, 0.60], 4: [0.55, 0.70, 0.72, 0.71]}))
    sweep = open_sweep(cfg)
    sweep.backend.runner = lambda: runner
    try:
        summary = sweep.run()
    finally:
        sweep.study.release()
    assert summary["best"]["trial"] == 0 and summary["target_verdict"] == "met" and summary["target_met"]
    assert summary["stopped_because"].startswith("settling rounds found the target met (after search.min_trials=2)"
                                                 ": trial 0")
    text = report.summary_text(summary)
    assert "best (trial 0): median of 3 runs" in text and "target met: trial 0" in text
    assert "fastest single run: trial 1, 550.0 ms (not the answer" in text
    answer = sweep.answer()
    rows = report.table(sweep.records, answer).splitlines()
    assert rows[1].split()[:3] == ["1", "0", "baseline"] and "ok *" in rows[1]
    assert rows[2].split()[:3] == ["2", "1", "trial"]
    # (its own figure, the median of 0.55 and 0.70, meets the target too: its * and its child's tag say so)

    monkeypatch.setattr(bundle, "mlflow_run_of", lambda path, r: None)
    ledger = cfg.results_dir / "trials.jsonl"
    (cfg.results_dir / "sweep.yaml").write_text(__import__("yaml").safe_dump(cfg.raw))
    assert bundle.pick(bundle.read_ledger(ledger), None, force=False, answer=answer)[0].trial == 0
    bundle.export_trial(ledger, None, cfg.results_dir / "export")
    md = (cfg.results_dir / "export" / "summary.md").read_text()
    assert md.startswith("# steptune export: sweep `t`, trial 0 (baseline)")
    assert "rank 1 of 2 configs (the sweep's best)" in md

    client = MlflowClient(cfg.mlflow_uri)
    exp = client.get_experiment_by_name("steptune").experiment_id
    parent = client.search_runs([exp], "tags.\"steptune.role\" = 'parent'")[0]
    assert parent.data.tags["steptune.best_trial"] == "0" and parent.data.tags["steptune.best_meets_target"] == "true"
    assert parent.data.tags["steptune.target_verdict"] == "met"
    assert "best (trial 0)" in parent.data.tags["mlflow.note.content"]
    children = client.search_runs([exp], f"tags.\"mlflow.parentRunId\" = '{parent.info.run_id}'")
    assert len(children) == len(sweep.records)  # one child per ledger line, repeats included
    meets = {(c.data.tags["steptune.trial"], c.data.tags["steptune.kind"]): c.data.tags["steptune.meets_target"]
             for c in children}
    assert meets[("1", "trial")] == ("true" if answer.meets({"batch.micro_batch_size": 4}) else "false")
    assert meets[("0", "baseline")] == "true" and meets[("0", "canonical")] == "false"
    ranks = {(c.data.tags["steptune.trial"], c.data.tags["steptune.kind"]): c.data.tags.get("steptune.answer_rank")
             for c in children}
    assert ranks[("0", "baseline")] == "001" and ranks[("1", "trial")] == "002" and ranks[("0", "canonical")] == "~"
    assert "answer_rank" in summary["mlflow_ui"] and "orderByAsc=true" in summary["mlflow_ui"]


def test_a_second_driver_is_refused_by_the_lock_before_ray_is_contacted(config):
    """Issue 26 item 7: the lock is taken first (a bad Ray address would otherwise be tried, for tens of seconds)."""
    from orchestrator.records.ledger import Ledger, LedgerBusy
    from orchestrator.sweep.loop import run_sweep

    cfg = config("ray.address=127.0.0.1:1")
    t0 = time.perf_counter()
    with Ledger(cfg.results_dir / "trials.jsonl").lock():
        with pytest.raises(LedgerBusy, match="already being run by another driver"):
            run_sweep(cfg)
    assert time.perf_counter() - t0 < 10


def test_a_finished_sweep_prints_its_answer_and_runs_nothing_until_its_budget_grows(config):
    import json

    from orchestrator.sweep.loop import run_sweep

    class Joined(Exception):
        """Raised where the backend would start or join Ray: a finished sweep must not get that far."""

    def refuse():
        raise Joined

    cfg = config("winner.max_rounds=0")
    sweep, _ = run_loop(cfg)  # a real (fake-runner) sweep: its ledger
    (cfg.results_dir / "run.json").write_text(json.dumps({"finished": {"n_trials": 4, "stopped_because": "budget"},
                                                          "sessions": [{"start": 0.0, "end": 10.0}]}))
    again = config("winner.max_rounds=0")
    again.built.join = refuse
    summary, records = run_sweep(again)
    assert summary["already_finished"] == 4 and summary["stopped_because"] == "budget"
    assert len(records) == len(sweep.records) and summary["best"]["trial"] == sweep.answer().winner.trial
    bigger = config("winner.max_rounds=0", "search.n_trials=6")
    bigger.built.join = refuse
    with pytest.raises(Joined):  # extending it runs again: the backend is joined first
        run_sweep(bigger)
