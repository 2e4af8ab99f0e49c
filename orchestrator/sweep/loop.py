"""The sweep loop: what runs next, on which slot, and when the sweep stops. Nothing else.

Study handling (lock, fingerprint, resume, tell) is orchestrator.sweep.study; judging and recording a
finished run (ledger first, then Optuna, then MLflow) is orchestrator.sweep.judge; everything that
differs between real trials and predictions is the backend's (orchestrator.backends).

A trial is a generator of runs (a probe, then the full measurement), so several trials can be in flight on
several worker groups while the loop waits on whichever finishes first.

Settling (orchestrator.records.answer decides, orchestrator.sweep.race plans): once the search is over, and
whenever a trial's own run meets the target during it, the loop runs rounds: the configs the race names (and the
baseline where it is needed), once each, in a random order. The answer is decided from the ledger after every
round; a target stops the search only when the answer after settling says "met". ``steptune settle`` runs more
rounds of a sweep's answer without new trials (``run_sweep(cfg, rounds)``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import statistics
import time
from typing import Any, Generator

import yaml

from orchestrator import backends
from orchestrator.review import report
from orchestrator.parity import trust
from orchestrator.records import answer as A
from orchestrator.records import query as Q
from orchestrator.backends import RunOutcome
from orchestrator.records.ledger import Ledger
from orchestrator.records.record import Kind, TrialRecord
from orchestrator.search.space import suggest
from orchestrator.sweep import race, timeouts
from orchestrator.sweep.judge import Job, Recorder
from orchestrator.sweep.study import SweepError, SweepStudy
from orchestrator.sweep.finished import Finished

__all__ = ["Job", "Sweep", "SweepError", "run_sweep"]

log = logging.getLogger(__name__)

MAX_LOST_IN_A_ROW = 3
"""Runs lost to the cluster (a node, an actor) one after another before the sweep stops instead of re-queuing."""
MIRROR_GRACE_S = 30.0
"""A sweep stopped by an error waits at most this long for the MLflow mirror before the driver logs what the store
misses itself and ends the parent run (orchestrator.review.mirror)."""
REUSABLE = ("ok", "infeasible", "pruned", "oom", "nan")
"""Statuses a repeated proposal may reuse instead of running again (a crash or timeout may be transient)."""


class Sweep:
    def __init__(self, cfg: Any, backend: Any = None, rounds: int | None = None):
        """``rounds``: settle only (``steptune settle --rounds N``): no new trials, at most that many rounds."""
        self.cfg = cfg
        self.backend = backend or cfg.built or backends.build(cfg)
        """Built once (by load_sweep's check, normally) and used as is."""
        cfg.results_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(cfg.results_dir / "trials.jsonl")
        records = self.ledger.read()  # before the study: a ledger that does not load leaves no study behind
        self.progress = report.Progress(cfg.search.n_trials, done=len(Q.measured(records)))
        self.study = SweepStudy(cfg, self.backend, lambda: self.records)
        self.gate = trust.ParityGate(cfg.results_dir.parent / "parity_refs")
        """Canonical -> baseline -> trials (orchestrator.parity.trust); its store is shared by every sweep under the same
        results directory, by maths key."""
        self.recorder = Recorder(cfg, self.backend, self.study, self.ledger, records, self.gate, self.progress)
        self.queue: list[Job] = []
        self.lost_in_a_row = 0
        self.stop_reason: str | None = None
        """Why the search ended (the budget, the wall time, the target); the stop line renders the final answer."""
        self.target_stop: int | None = None
        """The trial count at which settling found the target met (the search then ends, after min_trials)."""
        self.settling: str | None = None
        """An episode of settling rounds in progress: "target" (a trial's run met the target) or "final"."""
        self.episode_rounds = 0
        self.final_done = False
        self.round_budget = cfg.winner.max_rounds if rounds is None else rounds
        """Settling rounds an episode may run: winner.max_rounds, or what ``steptune settle --rounds`` asks."""
        self.settle_only = rounds is not None
        if self.settle_only:
            self.stop_reason = f"settling only (steptune settle --rounds {rounds}): no new trials"

    @property
    def records(self) -> list[TrialRecord]:
        return self.recorder.records

    @property
    def baseline_s(self) -> float | None:
        return self.recorder.baseline_s

    @property
    def best_s(self) -> float | None:
        return self.recorder.best_s

    @property
    def target_s(self) -> float | None:
        return self.cfg.target.seconds(self.baseline_s)

    def answer(self) -> A.Answer:
        return self.recorder.answer()

    def recover(self) -> None:
        """Resume: the dead driver's RUNNING trials, a missing baseline, the parity anchor."""
        if self.records:  # lines a killed driver wrote to the ledger but never mirrored to MLflow
            self.recorder.track("reconcile", self.records)
        self.study.recover({r.trial: r for r in Q.measured(self.records)}, self.recorder.tell)
        if self.baseline_s is None:
            self.study.ensure_baseline(self.backend.configs.baseline_params(self.cfg.space))
        base = Q.baseline_of(self.records)
        if base is not None and base.status == "ok" and base.result is not None:
            self.gate.resume(base.result)
            self.backend.resume(base)

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        n0 = len(self.records)
        runner = self.start()
        startup = time.perf_counter() - t0
        rounds0 = len({r.round for r in self.records if r.round is not None})
        log.info(f"sweep {self.cfg.name}: {self.backend.name} backend on {runner.where if runner else '-'}; "
                 f"target {self.cfg.target.describe(self.baseline_s)}")
        self.drive(runner, t0)
        t_flush = time.perf_counter()
        self.recorder.flush_tracking()  # a backlog the MLflow mirror still holds is this run's time too
        wall = time.perf_counter() - t0
        answer = self.answer()
        summary = report.summarize(self.records, self.cfg.target, self.cfg.winner, answer,
                                   (self.cfg.name, self.cfg.storage.results_dir))
        book = self.recorder.bookkeeping
        # Duty cycle: seconds inside training updates (a run's wall less its overhead) over this run's wall.
        in_updates = sum(r.wall_s - r.overhead_s for r in self.records[n0:] if r.overhead_s is not None)
        reason = self.stop_reason or "the trial budget is spent"
        if self.settle_only:
            ran = len({r.round for r in self.records if r.round is not None}) - rounds0
            reason += f"; {ran} round(s) ran" + ("" if ran == self.round_budget else
                                                  " (no further round could change the answer)")
        summary.update(stopped_because=report.stop_line(reason, self.target_stop, answer),
                       startup_s=startup, parity_shared_with_canonical=list(self.gate.shared),
                       mlflow_ui=self.recorder.tracker.open_hint(self.cfg.name) if self.recorder.tracker else None,
                       group_builds=runner.builds if runner else 0, sweep_wall_s=wall,
                       bookkeeping_median_s=statistics.median(book) if book else None,
                       mirror_inline_s=self.recorder.mirror.inline_s if self.recorder.mirror else None,
                       duty_cycle=in_updates / wall if wall > 0 and self.backend.confirms else None,
                       time_parts=time_parts(self.records[n0:], wall, startup, wall - (t_flush - t0)))
        self.recorder.end_tracking("finish_sweep", summary, self.study.study, report.table(self.records, answer),
                                   report.by_trial(self.records, answer))
        return summary

    def start(self) -> Any:
        """Resume what the ledger and the study hold (a target settling already found met, a target check cut
        short by a dead driver); the backend's runner."""
        self.recover()
        answer = self.answer()
        if answer.rounds and answer.target.state == A.MET:
            self.target_stop = self.study.finished()
        elif not self.settle_only and self.backend.confirms and not answer.settled and self.cfg.winner.max_rounds > 0 \
                and any(r.meets_target for r in Q.measured(self.records)):
            self.settling = "target"
        return self.backend.runner()

    def drive(self, runner: Any, t0: float | None = None) -> None:
        """The loop: fill free slots with the next job, feed each finished run back to its job; closes ``runner``."""
        t0 = time.perf_counter() if t0 is None else t0
        active: dict[int, Job] = {}
        try:
            while True:
                for slot in range(runner.slots if runner else 0):
                    if slot not in active and (job := self._next_job(active, time.perf_counter() - t0)):
                        active[slot] = job
                        self._submit(runner, slot, next(job.steps))
                if not active:
                    break
                for slot, outcome in runner.poll(timeout_s=0.5):
                    job = active[slot]
                    # (configs run together come back together: a tuple of outcomes)
                    lost = next((o for o in (outcome if isinstance(outcome, tuple) else (outcome,))
                                 if o.status == "lost"), None)
                    if lost is not None:  # the infrastructure's doing: no verdict on the config
                        del active[slot]
                        self._lost(job, lost)
                        continue
                    self.lost_in_a_row = 0
                    if job.one_run and self.queue:  # the next queued run starts first; this one is recorded meanwhile
                        active[slot] = self._next_job(active, time.perf_counter() - t0)
                        try:
                            self._submit(runner, slot, next(active[slot].steps))
                        finally:  # recorded even when starting the next run fails (Ctrl-C, the group lost)
                            self._end(job, outcome)
                        continue
                    try:
                        self._submit(runner, slot, job.steps.send(outcome))
                    except StopIteration:
                        del active[slot]
                self.progress.tick()
        except BaseException:  # Ctrl-C, a store or Ray failing: nothing in flight was measured; run it again later
            for job in active.values():
                if job.trial is not None and not job.told:
                    self.study.requeue(job.number, job.trial.params, job.trial.user_attrs)
            raise
        finally:
            if runner:
                runner.close()

    @staticmethod
    def _end(job: Job, outcome: Any) -> None:
        """Feed a one-run job (Job.one_run) its outcome, which records it and ends it."""
        try:
            job.steps.send(outcome)
        except StopIteration:
            return
        raise RuntimeError(f"trial {job.number} ({job.kind}): a one-run job asked for another run")

    def _submit(self, runner: Any, slot: int, config: Any) -> None:
        """Submit with a timeout that follows what was measured (orchestrator.sweep.timeouts)."""
        if hasattr(runner, "timeout_s"):
            load, cores = timeouts.machine_load()
            walls = [r.wall_s for r in self.records if r.status == "ok" and r.result is not None]
            runner.timeout_s = timeouts.run_timeout_s(self.cfg.resources.trial_timeout_s, walls, load, cores)
        runner.submit(slot, config)

    def _lost(self, job: Job, outcome: Any) -> None:
        """A node or a rank's actor was lost mid-run: nothing was measured and the config is not to blame, so
        the trial is queued again (FAIL in Optuna, as for a dead driver's trial; no ledger line, no constraint)."""
        if job.trial is not None:
            self.study.requeue(job.number, job.trial.params, job.trial.user_attrs)
            job.told = True
        # (a lost settling run needs nothing: the next round runs its config again)
        self.progress.running.pop(job.number, None)
        log.warning("trial %d (%s): %s; queued again, not held against its config", job.number, job.kind,
                    outcome.reason)
        self.lost_in_a_row += 1
        if self.lost_in_a_row > MAX_LOST_IN_A_ROW:
            raise SweepError(f"{self.lost_in_a_row} runs in a row were lost to the cluster (last: {outcome.reason}); "
                             f"check the cluster's nodes, then rerun the same command to resume")

    def _next_job(self, active: dict[int, Job], elapsed: float) -> Job | None:
        if self.study.lock.lost.is_set():
            raise SweepError(f"another driver took study {self.cfg.name!r} over (this one's heartbeat had stopped "
                             f"for longer than storage.grace_period_s); stopping")
        if self.queue:
            return self.queue.pop(0)
        if any(j.kind == "baseline" for j in active.values()):
            return None  # everything else is measured against the baseline
        if self.settling is not None:
            if active:
                return None  # a round is decided once all its runs are in
            job = self._next_round()
            if job is not None:
                return job
            self._episode_over()
        walls = [r.wall_s for r in self.records if r.wall_s]
        wall_budget = self.cfg.search.wall_time_s
        if wall_budget is not None and elapsed + (statistics.median(walls) if walls else 0.0) > wall_budget:
            self.stop_reason = self.stop_reason or f"the wall-time budget ({wall_budget:.0f} s) is spent"
            return None
        job = None if self.stop_reason else self._next_trial(active)
        if job is None and not active and not self.final_done and self.backend.confirms:
            self.settling = "final"  # the search is over: settle the answer
            self.episode_rounds = 0
            return self._next_job(active, elapsed)
        return job

    def _next_trial(self, active: dict[int, Job]) -> Job | None:
        """The next Optuna trial to run; None once the search is over (budget, target)."""
        while True:
            self._target_reached()  # a skipped trial below counts towards search.min_trials too
            if self.stop_reason:
                return None
            if self.study.finished() + sum(j.trial is not None for j in active.values()) >= self.cfg.search.n_trials:
                return None
            trial = self.study.ask()
            kind = trial.user_attrs.get("kind", "trial")
            if kind == "trial" and self.baseline_s is None:
                # Not this trial's fault: it goes back to the queue (FAIL is not counted), behind the baseline.
                self.study.requeue(trial.number, trial.params, trial.user_attrs)
                if not self.study.baseline_waiting():
                    raise SweepError("no baseline measurement to compare against (its trial did not finish ok)")
                continue
            job = Job(kind, trial.number, {}, None, trial)
            configs = self.backend.configs
            try:
                job.params, overrides = suggest(trial, self.cfg.space, configs.fixed, configs.split_context)
                job.config = configs.baseline if kind == "baseline" else configs.build(overrides)
            except ValueError as e:
                job.params = trial.params
                self._finish(job, RunOutcome("skipped", str(e)))
                continue
            if kind == "trial" and self.backend.prefilter is not None:
                verdict = self.backend.prefilter.verdict(job.config)
                if verdict.skip:  # a prediction, so the sampler sees the memory constraint it broke
                    self._finish(job, RunOutcome(
                        "skipped", verdict.reason, prediction={"peak_memory_bytes": verdict.predicted_bytes}))
                    continue
            same = next((r for r in Q.measured(self.records) if r.params == job.params and r.status in REUSABLE),
                        None)
            if same is None or kind == "baseline":
                break
            self._finish(job, RunOutcome("skipped", f"same params as trial {same.trial} "
                                                    f"({same.status.value}): reused, not run again"), same=same)
        self.progress.started(job.number, kind, job.params)
        job.steps = self._trial_steps(job)
        return job

    def _trial_steps(self, job: Job) -> Generator[Any, Any, None]:
        """Yields the configs to run; each send() brings back the previous run's outcome."""
        probe_cfg = None
        if job.kind == "trial" and self.cfg.pruning.enabled and self.best_s:
            probe_cfg = self.backend.configs.probe(job.config, self.cfg.pruning.after_steps)
        if probe_cfg is not None:
            probe = yield probe_cfg
            job.runs.append(probe)
            if probe.status != "ok":
                self._finish(job, probe)
                return
            # The probe's fastest update, not its median: on a shared machine one slow update must not prune a
            # good config; only one whose every measured update is clearly slower than the best is cut.
            pace, best = probe.result.summary.step_time_min_s, self.best_s
            if pace > self.cfg.pruning.slower_than_best * best:
                probe.status = "pruned"
                probe.reason = (f"probe: fastest of {self.cfg.pruning.after_steps} measured updates {pace * 1e3:.1f} ms"
                                f" > {self.cfg.pruning.slower_than_best:g} x best {best * 1e3:.1f} ms")
                self._finish(job, probe)
                return
        if job.kind == "baseline" and (canonical := self.backend.reference_run(self.gate, job.config)) is not None:
            # The baseline is judged against the simplest layout of its maths before it becomes the reference,
            # which certifies itself first: the same maths in a second decomposition (orchestrator.parity.certify).
            # Both run in one go (a tuple: one world launched, not one per run); the canonical run's outcome is the
            # record's, its self-check's are judged with it (the backend's judge: runs[1:]).
            check = Job("canonical", job.number, {}, canonical)
            check.runs.extend((yield (canonical, *self.gate.self_checks(canonical))))
            self._finish(check, check.runs[0])
        if job.kind == "baseline" and self.gate.shared:
            log.warning("the canonical run shares %s with the baseline (the whole batch as one microbatch does not "
                        "fit the device): a bug there is in both runs and the parity gate cannot see it",
                        ", ".join(self.gate.shared))
        outcome = yield job.config
        job.runs.append(outcome)
        if job.kind == "baseline" and outcome.status == "ok" and outcome.result is not None \
                and self.gate.needs_repeat(outcome.result):
            # bf16/GPU: the baseline's own run-to-run spread sets the parity tolerance, so measure it twice.
            job.runs.append((yield job.config))
        if job.kind == "baseline":
            # A baseline that disagrees with the canonical run: before the sweep stops, each of its active layout
            # families is set back alone, so the message names the one that computes something else.
            for family, suspect in self.backend.suspect_runs(self.gate, job.config, outcome):
                if isinstance(suspect, str):
                    self.gate.try_suspect(family, None, suspect)
                    continue
                log.info("the baseline differs from the canonical run: trying it with %s set back", family)
                run = yield suspect
                self.gate.try_suspect(family, run.result if run.status == "ok" else None,
                                      f"did not run: {run.status}: {run.reason}")
        self._finish(job, outcome)

    # ---- settling rounds ----------------------------------------------------------------------

    def _next_round(self) -> Job | None:
        """The first run of the next settling round (the rest queued), or None when the race
        (orchestrator.sweep.race) finds no round that can change the answer or the episode's rounds are spent.
        Derived from the ledger alone, so a resumed sweep goes on where the dead one stopped."""
        left = self.round_budget - self.episode_rounds
        answer = self.answer()
        base = Q.baseline_of(self.records)
        if left <= 0 or answer.settled or base is None or base.status != "ok":
            return None
        # A target check asks only whether the target is met; the final rounds settle ties.
        plan = race.next_round(answer, self.cfg.winner, left, verdict_only=self.settling == "target")
        if plan is None:
            return None
        number = max((r.round or 0 for r in self.records), default=0) + 1
        picks = ([base] if plan.baseline else []) + [answer.figure_of(k).record for k in plan.configs]
        # A random order per round (seeded by the sweep and the round): a config never always runs first, right
        # after the baseline, or last, so an order effect (a cache, a warming machine) does not favour one.
        seed = hashlib.sha256(f"{self.cfg.name}/{self.cfg.sampler.seed}/{number}".encode()).hexdigest()
        random.Random(seed).shuffle(picks)
        log.info("settling round %d: %s (%s)", number, ", ".join(f"trial {r.trial}" for r in picks),
                 plan.why or "settling")
        jobs = [self._round_job(r, number, i + 1, len(picks)) for i, r in enumerate(picks)]
        self.episode_rounds += 1
        self.queue.extend(jobs[1:])
        return jobs[0]

    def _round_job(self, source: TrialRecord, number: int, index: int, size: int) -> Job:
        job = Job("repeat", source.trial, source.params, self.backend.configs.load(source.config), one_run=True)

        def steps() -> Generator[Any, Any, None]:
            job.runs = [(yield job.config)]
            # Counted when recorded, not when started: the run before it may still be unrecorded (Job.one_run).
            repeat_n = sum(r.kind is Kind.REPEAT and r.trial == source.trial for r in self.records) + 1
            self._finish(job, job.runs[0], repeat=repeat_n, round_=number)

        job.steps = steps()
        self.progress.started(source.trial, f"round {number} ({index}/{size}): trial", job.params)
        return job

    def _episode_over(self) -> None:
        """An episode of rounds ended: a target episode that found the target met ends the search."""
        answer = self.answer()
        if self.settling == "target" and answer.target.state == A.MET and self.target_stop is None:
            self.target_stop = self.study.finished()
        if self.settling == "final":
            self.final_done = True
        self.settling = None
        self.episode_rounds = 0

    def _leads(self, record: TrialRecord) -> bool:
        """Whether the record's config has the lowest figure now: a target check of a config that is not the
        leader would judge another config's verdict (the answer's), so a slower one that meets the target by its
        own run waits for the final rounds."""
        lead = self.answer().leader
        return lead is not None and lead.key == A.key_of(record.params)

    def _target_reached(self) -> None:
        """Stop the search for a target settling found met, once search.min_trials are finished."""
        if self.target_stop is not None and not self.stop_reason:
            n = self.cfg.search.min_trials
            if self.study.finished() >= n:
                self.stop_reason = "target" + (f" (after search.min_trials={n})" if n else "")

    def _finish(self, job: Job, outcome: Any, same: TrialRecord | None = None,
                repeat: int | None = None, round_: int | None = None) -> TrialRecord:
        """Record the finished job (orchestrator.sweep.judge), then what it means for the schedule."""
        record = self.recorder.finish(job, outcome, same, repeat, round_)
        if job.kind in ("baseline", "canonical"):
            self._after_baseline(job, record.status, record.reason)
        # A run that meets the target by itself and leads starts a target check (settling rounds), unless one
        # already found the target met. A prediction repeats exactly: the model backend searches its whole budget.
        if record.meets_target and job.kind in ("baseline", "trial") and self.backend.confirms \
                and self.target_stop is None and self.settling is None and self.cfg.winner.max_rounds > 0 \
                and self._leads(record):
            self.settling = "target"
            self.episode_rounds = 0
        elif record.meets_target and job.kind in ("baseline", "trial") and self.cfg.winner.max_rounds == 0 \
                and self.backend.confirms and self.target_stop is None:
            if self.answer().target.state == A.MET:
                self.target_stop = self.study.finished()
        return record

    def _after_baseline(self, job: Job, status: str, reason: str | None) -> None:
        what = "the baseline" if job.kind == "baseline" else "the canonical reference run of the baseline"
        if status == "infeasible" and (reason or "").startswith("parity: "):
            raise SweepError(f"{what} (trial {job.number}) failed parity: {reason[len('parity: '):]}")
        if status != "ok":
            how = "ran but is infeasible" if status == "infeasible" else f"did not run: {status}"
            raise SweepError(f"{what} (trial {job.number}) {how}: {reason}. Fix the baseline config (or "
                             f"resources) first; it is queued again, and rerunning retries it")
        if job.kind == "baseline":
            self.study.enqueue_once(self.cfg.enqueue)


def time_parts(records: list[TrialRecord], wall: float, start: float, flush: float) -> dict[str, float]:
    """Where one invocation's wall time went (``records``: the lines it wrote): starting the backend, the runs'
    training updates and their overhead (dispatch, model build, process groups, result transfer; a run's wall less
    its updates), search runs and settling runs apart, the driver's work between runs (judging, the ledger, Optuna,
    the sampler, handing MLflow its calls) and the MLflow mirror's backlog waited for at the end. They add up to
    ``wall``."""
    def part(settling: bool, updates: bool) -> float:
        return sum((r.wall_s - r.overhead_s) if updates else r.overhead_s for r in records
                   if r.overhead_s is not None and (r.round is not None) == settling)
    runs = sum(r.wall_s or 0.0 for r in records)
    return {"start_s": start, "search_updates_s": part(False, True), "search_overhead_s": part(False, False),
            "settling_updates_s": part(True, True), "settling_overhead_s": part(True, False),
            "between_runs_s": max(0.0, wall - start - runs - flush), "flush_s": flush, "wall_s": wall}


def run_sweep(cfg: Any, rounds: int | None = None) -> tuple[dict, list[TrialRecord]]:
    """Run (or resume) the sweep; returns the summary and the ledger's records.

    The ledger's lock is taken first (a second driver of the same sweep is refused at once, before Ray starts).
    A finished sweep (orchestrator.sweep.finished) runs nothing: its answer is returned as it stands, unless
    ``search.n_trials`` was raised to extend it, or ``rounds`` asks for that many more settling rounds (``steptune
    settle``: the same sweep's answer raced further, no new trial; a finished sweep stays finished). Nothing else is
    written before Ray is joined (a bad ray.address leaves no store, lock or sweep.yaml behind), and sweep.yaml only
    once the ledger and the study accepted this config, so a refused run keeps the old one.
    """
    ledger = Ledger(cfg.results_dir / "trials.jsonl")
    if rounds is not None and not any(r.kind == "baseline" and r.status == "ok" for r in ledger.read()):
        raise ValueError(f"{ledger}: no measured baseline to settle against; run the sweep first "
                         f"(steptune sweep) and settle it once its baseline is measured")
    made = [p for p in (cfg.results_dir.parent, cfg.results_dir) if not p.exists()]
    with ledger.lock():
        finished = Finished(cfg.results_dir)
        was = finished.read()
        if rounds is None and (done := finished.covers(cfg.search.n_trials)) is not None:
            records = ledger.read()
            summary = report.summarize(records, cfg.target, cfg.winner, where=(cfg.name, cfg.storage.results_dir))
            summary.update(stopped_because=done.stopped_because, already_finished=done.n_trials,
                           mlflow_ui=None, sweep_wall_s=None)
            summary["time_to_answer"] = report.time_to_answer(records, finished.sessions())
            return summary, records
        if was is not None and rounds is None:
            log.info("extending sweep %s: search.n_trials=%d (it finished at %d)", cfg.name, cfg.search.n_trials,
                     was.n_trials)
        backend = cfg.built or backends.build(cfg)
        try:
            backend.join()
        except BaseException:
            _unmake(ledger, made)
            raise
        session = finished.begin()
        try:
            sweep = Sweep(cfg, backend, rounds)
            # What `report` needs to judge the ledger again (the target, the settling rule), beside the ledger.
            (cfg.results_dir / "sweep.yaml").write_text(yaml.safe_dump(cfg.raw, sort_keys=False))
            try:
                summary = sweep.run()
            except BaseException as e:  # the MLflow parent must not stay RUNNING: ended FAILED/KILLED with why
                finished.end(session)
                sweep.recorder.end_tracking("end_sweep", e, grace_s=MIRROR_GRACE_S)
                raise
            finally:
                sweep.study.release()
        finally:  # what join started ahead (the first worker group) goes back unless the sweep's runner took it
            backend.release()
        finished.end(session)
        if sweep.settle_only:
            if was is not None:  # settled further, still finished as it was
                finished.write(was.n_trials, was.stopped_because)
        elif not (sweep.stop_reason or "").startswith("the wall-time"):
            finished.write(cfg.search.n_trials, summary["stopped_because"])
        summary["time_to_answer"] = report.time_to_answer(sweep.records, finished.sessions())
        # The summary as printed, beside the ledger (bench/noise.py and scripts compare sweeps by it).
        (cfg.results_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        return summary, sweep.records


def _unmake(ledger: Ledger, made: list) -> None:
    """Remove what taking the lock created, when nothing else was written (a refused start leaves nothing)."""
    lock = ledger.path.with_name(".driver.lock")
    lock.unlink(missing_ok=True)
    for p in reversed(made):
        try:
            p.rmdir()
        except OSError:
            pass
