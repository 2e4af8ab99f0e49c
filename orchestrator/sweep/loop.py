"""The sweep loop: what runs next, on which slot, and when the sweep stops. Nothing else.

Study handling (lock, fingerprint, resume, tell) is orchestrator.sweep.study; judging and recording a
finished run (ledger first, then Optuna, then MLflow) is orchestrator.sweep.judge; everything that
differs between real trials and predictions is the backend's (orchestrator.backends).

A trial is a generator of runs (a probe, then the full measurement), so several trials can be in flight on
several worker groups while the loop waits on whichever finishes first.
"""

from __future__ import annotations

import logging
import statistics
import time
from typing import Any, Generator

import yaml

from orchestrator import backends
from orchestrator.review import report
from orchestrator.parity import trust
from orchestrator.records import winner
from orchestrator.records import query as Q
from orchestrator.backends import RunOutcome
from orchestrator.records.ledger import Ledger
from orchestrator.records.record import Kind, TrialRecord
from orchestrator.search.space import suggest
from orchestrator.sweep.judge import Job, Recorder
from orchestrator.sweep.study import SweepError, SweepStudy

__all__ = ["Job", "Sweep", "SweepError", "run_sweep"]

log = logging.getLogger(__name__)

MAX_LOST_IN_A_ROW = 3
"""Runs lost to the cluster (a node, an actor) one after another before the sweep stops instead of re-queuing."""
REUSABLE = ("ok", "infeasible", "pruned", "oom", "nan")
"""Statuses a repeated proposal may reuse instead of running again (a crash or timeout may be transient)."""


class Sweep:
    def __init__(self, cfg: Any, backend: Any = None):
        self.cfg = cfg
        self.backend = backend or cfg.built or backends.build(cfg)
        """Built once (by load_sweep's check, normally) and used as is."""
        cfg.results_dir.mkdir(parents=True, exist_ok=True)
        self.ledger = Ledger(cfg.results_dir / "trials.jsonl")
        self.progress = report.Progress(cfg.search.n_trials)
        records = self.ledger.read()  # before the study: a ledger that does not load leaves no study behind
        self.study = SweepStudy(cfg, self.backend, lambda: self.records)
        self.gate = trust.ParityGate(cfg.results_dir.parent / "parity_refs")
        """Canonical -> baseline -> trials (orchestrator.parity.trust); its store is shared by every sweep under the same
        results directory, by maths key."""
        self.recorder = Recorder(cfg, self.backend, self.study, self.ledger, records, self.gate, self.progress)
        self.queue: list[Job] = []
        self.lost_in_a_row = 0
        self.stop_reason: str | None = None
        self.target_reason: str | None = None
        """Why the sweep may stop for its target; it does once search.min_trials are finished."""

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

    def recover(self) -> None:
        """Resume: the dead driver's RUNNING trials, a missing baseline, the parity anchor, an unconfirmed winner."""
        if self.records:  # lines a killed driver wrote to the ledger but never mirrored to MLflow
            self.recorder.track("reconcile", self.records)
        self.study.recover({r.trial: r for r in Q.measured(self.records)}, self.recorder.tell)
        if self.baseline_s is None:
            self.study.ensure_baseline(self.backend.configs.baseline_params(self.cfg.space))
        base = Q.baseline_of(self.records)
        if base is not None and base.status == "ok" and base.result is not None:
            self.gate.resume(base.result)
        # Only a measured winner is confirmed (records.query.unconfirmed): a prediction repeats exactly.
        pending = Q.unconfirmed(self.records, self.target_s, self.cfg.confirm.repeats)
        if pending is not None:
            config = self.backend.configs.load(pending.config)
            self.queue.append(self._confirm_job(pending.trial, pending.params, config))

    # ---- the loop ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        runner = self.start()
        startup = time.perf_counter() - t0
        log.info(f"sweep {self.cfg.name}: {self.backend.name} backend on {runner.where if runner else '-'}; "
                 f"target {self.cfg.target.describe(self.baseline_s)}")
        self.drive(runner, t0)
        summary = report.summarize(self.records, self.cfg.target, self.cfg.winner)
        book = self.recorder.bookkeeping
        summary.update(stopped_because=self.stop_reason or "the trial budget is spent", startup_s=startup,
                       parity_shared_with_canonical=list(self.gate.shared),
                       mlflow_ui=self.recorder.tracker.open_hint() if self.recorder.tracker else None,
                       group_builds=runner.builds if runner else 0, sweep_wall_s=time.perf_counter() - t0,
                       bookkeeping_median_s=statistics.median(book) if book else None)
        self.recorder.track("finish_sweep", summary, self.study.study, report.table(self.records, self.target_s))
        return summary

    def start(self) -> Any:
        """Resume what the ledger and the study hold; the backend's runner, or None when there is nothing to do."""
        self.recover()
        self._check_target("the target was already met and confirmed")
        return None if self.stop_reason and self._repeat_of() is None else self.backend.runner()

    def drive(self, runner: Any, t0: float | None = None) -> None:
        """The loop: fill free slots with the next job, feed each finished run back to its job; closes ``runner``."""
        t0 = time.perf_counter() if t0 is None else t0
        active: dict[int, Job] = {}
        try:
            while True:
                for slot in range(runner.slots if runner else 0):
                    if slot not in active and (job := self._next_job(active, time.perf_counter() - t0)):
                        active[slot] = job
                        runner.submit(slot, next(job.steps))
                if not active:
                    break
                for slot, outcome in runner.poll(timeout_s=0.5):
                    job = active[slot]
                    if outcome.status == "lost":  # the infrastructure's doing: no verdict on the config
                        del active[slot]
                        self._lost(job, outcome)
                        continue
                    self.lost_in_a_row = 0
                    try:
                        runner.submit(slot, job.steps.send(outcome))
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

    def _lost(self, job: Job, outcome: Any) -> None:
        """A node or a rank's actor was lost mid-run: nothing was measured and the config is not to blame, so
        the trial is queued again (FAIL in Optuna, as for a dead driver's trial; no ledger line, no constraint)."""
        if job.trial is not None:
            self.study.requeue(job.number, job.trial.params, job.trial.user_attrs)
            job.told = True
        elif job.kind == "confirm":  # run it again (a resume finds it from the ledger too)
            self.queue.append(self._confirm_job(job.number, job.params, job.config))
        # (a lost repeat run needs nothing: the winner rule asks for it again from the ledger)
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
        walls = [r.wall_s for r in self.records if r.wall_s]
        wall_budget = self.cfg.search.wall_time_s
        if wall_budget is not None and elapsed + (statistics.median(walls) if walls else 0.0) > wall_budget:
            self.stop_reason = self.stop_reason or f"the wall-time budget ({wall_budget:.0f} s) is spent"
            return None
        job = None if self.stop_reason else self._next_trial(active)
        if job is None and not active:  # the search is over and nothing it started is still running
            job = self._repeat_job()
        return job

    def _next_trial(self, active: dict[int, Job]) -> Job | None:
        """The next Optuna trial to run; None once the search is over (budget, target)."""
        while True:
            self._target_reached(None)  # a skipped trial below counts towards search.min_trials too
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
            # The baseline is judged against the simplest layout of its maths before it becomes the reference.
            check = Job("canonical", job.number, {}, canonical)
            check.runs.append((yield canonical))
            # ... which certifies itself first: the same maths in a second decomposition (orchestrator.parity.certify)
            for second in self.gate.self_checks(canonical) if check.runs[0].status == "ok" else ():
                check.runs.append((yield second))
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

    def _check_target(self, reason: str | None = None) -> None:
        """Stop for the target (once search.min_trials are finished) when the best config meets it by the figure
        it is ranked by, its confirm runs included (orchestrator.records.winner.confirmed): the same figure
        and config the summary's target verdict names."""
        top = winner.confirmed(self.records, self.target_s, self.cfg.confirm.repeats)
        if top is not None:
            how = "meets the target" if self.cfg.confirm.repeats == 0 else \
                "met the target, passed parity and was confirmed"
            self._target_reached(reason or f"trial {top.trial} {how} ({top.describe()} <= "
                                           f"{report.secs(self.target_s)})")

    def _target_reached(self, reason: str | None) -> None:
        """Stop for a met target (``reason``, or the one already held), once search.min_trials are finished."""
        self.target_reason = self.target_reason or reason
        if self.target_reason and not self.stop_reason:
            n = self.cfg.search.min_trials
            if self.study.finished() >= n:
                self.stop_reason = self.target_reason + (f" (after search.min_trials={n})" if n else "")

    def _repeat_job(self) -> Job | None:
        """One more run of a config the noise-aware winner rule cannot yet tell from the leader (orchestrator.records.winner);
        None when the rule is satisfied, its ``max_repeats`` are spent, or runs are predictions. Derived from the
        ledger alone, so a resumed sweep goes on where the dead one stopped."""
        source = self._repeat_of()
        if source is None:
            return None
        number = source.trial
        job = Job("repeat", number, source.params, self.backend.configs.load(source.config))
        n = sum(r.kind is Kind.REPEAT and r.trial == number for r in self.records) + 1

        def steps() -> Generator[Any, Any, None]:
            job.runs = [(yield job.config)]
            self._finish(job, job.runs[0], repeat=n)

        job.steps = steps()
        self.progress.started(number, "repeat", job.params)
        log.info("trial %d: run again (repeat %d) to settle the winner among the fastest configs", number, n)
        return job

    def _repeat_of(self) -> TrialRecord | None:
        """The record of the config the winner rule wants run again next, if any (see _repeat_job)."""
        rule = self.cfg.winner
        if not self.backend.confirms or sum(r.kind is Kind.REPEAT for r in self.records) >= rule.max_repeats:
            return None
        ranked = winner.standings(self.records)
        key = winner.next_to_run(winner.runs_by_key(ranked), rule)
        return next((s.record for s in ranked if s.key == key), None)

    def _confirm_job(self, number: int, params: dict, config: Any) -> Job:
        job = Job("confirm", number, params, config)

        def steps() -> Generator[Any, Any, None]:
            # (a resumed confirmation goes on from the repeats the ledger already holds)
            for repeat in range(len(Q.confirms_of(self.records, number)) + 1, self.cfg.confirm.repeats + 1):
                job.runs = [(yield config)]
                record = self._finish(job, job.runs[0], repeat=repeat)
                # The config is judged by its median, this run included: once that misses the target, or a run
                # fails, no further repeat can confirm it.
                mine = next((s for s in winner.standings(self.records) if s.trial == number), None)
                if record.status != "ok" or mine is None or not mine.meets(self.target_s):
                    return
            self._check_target()

        job.steps = steps()
        self.progress.started(number, "confirm", params)
        return job

    def _finish(self, job: Job, outcome: Any, same: TrialRecord | None = None,
                repeat: int | None = None) -> TrialRecord:
        """Record the finished job (orchestrator.sweep.judge), then what it means for the schedule."""
        record = self.recorder.finish(job, outcome, same, repeat)
        if job.kind in ("baseline", "canonical"):
            self._after_baseline(job, record.status, record.reason)
        # A prediction costs microseconds and repeats exactly: the model backend searches its whole budget for
        # the best plan instead of stopping at the first one under the target, and has nothing to confirm.
        if record.meets_target and job.kind in ("baseline", "trial") and self.backend.confirms:
            if self.cfg.confirm.repeats == 0:
                self._check_target()
            else:
                self.queue.append(self._confirm_job(job.number, job.params, job.config))
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


def run_sweep(cfg: Any) -> tuple[dict, list[TrialRecord]]:
    """Run (or resume) the sweep; returns the summary and the ledger's records.

    Nothing is written before Ray is joined (a bad ray.address leaves no store, lock or sweep.yaml behind), and
    sweep.yaml only once the ledger and the study accepted this config, so a refused run keeps the old one.
    """
    backend = cfg.built or backends.build(cfg)
    backend.join()
    with Ledger(cfg.results_dir / "trials.jsonl").lock():
        sweep = Sweep(cfg, backend)
        # What `report` needs to judge the ledger again (the target, the confirm rule), beside the ledger.
        (cfg.results_dir / "sweep.yaml").write_text(yaml.safe_dump(cfg.raw, sort_keys=False))
        try:
            summary = sweep.run()
        except BaseException as e:  # the MLflow parent must not stay RUNNING: ended FAILED/KILLED with why
            sweep.recorder.track("end_sweep", e)
            raise
        finally:
            sweep.study.release()
        return summary, sweep.records
