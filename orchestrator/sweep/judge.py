"""Judging and recording a finished job: the backend's verdict, the TrialRecord, the ledger, Optuna, MLflow.

Order per record is fixed: the ledger line is flushed first (the source of truth), then Optuna is told,
then MLflow; a failing store after the ledger loses nothing.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Generator

from orchestrator.calibration import guided
from orchestrator.records import query as Q
from orchestrator.records import answer as A
from orchestrator.sweep import timeouts
from orchestrator.review import report
from orchestrator.review.mirror import Mirror
from orchestrator.backends import RunOutcome
from orchestrator.records.ledger import Ledger
from orchestrator.records.record import Metrics, ParityVerdict, TrialRecord
from orchestrator.sweep.study import SweepStudy

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One trial (or baseline, confirm or canonical run) in flight: a generator of the configs to run."""

    kind: str
    number: int
    params: dict
    config: Any
    trial: Any = None
    """The Optuna trial it tells (None for confirm and canonical runs, which are not trials of the study)."""
    steps: Generator | None = None
    started: float = field(default_factory=time.time)
    runs: list = field(default_factory=list)
    told: bool = False
    one_run: bool = False
    """The job is a single run whose outcome ends it (a settling round's run): the loop may start the next queued
    job on its slot before recording it, so the ranks do not wait for the ledger, the answer and the MLflow hand-off."""


def metrics_of(outcome: RunOutcome) -> Metrics:
    """A measured result's metrics, a prediction's, or none."""
    if outcome.result is not None:
        return Metrics.of_summary(outcome.result.summary)
    if outcome.prediction is not None:
        return Metrics.of_prediction(outcome.prediction)
    return Metrics()


class Recorder:
    """Judges finished runs and writes them everywhere they go; holds the sweep's records."""

    def __init__(self, cfg: Any, backend: Any, study: SweepStudy, ledger: Ledger, records: list[TrialRecord],
                 gate: Any, progress: report.Progress):
        self.cfg, self.backend, self.study, self.ledger, self.gate = cfg, backend, study, ledger, gate
        self.progress = progress
        self.records = records
        """The ledger's records, read before the study was opened; each finished job's is appended."""
        self._answer: tuple[tuple, A.Answer] | None = None
        self.best_trial: int | None = None
        """The answer last mirrored to MLflow's parent (its tags and ``best_step_time_s``)."""
        self.bookkeeping: list[float] = []
        """Driver seconds per finished trial after its ledger line (Optuna, handing MLflow its calls): not in any
        trial's wall."""
        self.tracker, self.parent = self._open_tracker()
        self.mirror = Mirror(self.tracker, self.parent, lambda: self.tracker.reconcile(self.parent, self.records),
                             background=cfg.tracking.background) if self.tracker is not None else None
        """MLflow calls, in order, in a lowest-priority process (orchestrator.review.mirror): the next run starts
        without waiting for them; flushed before the sweep's wall time is taken and before its summary."""

    def answer(self) -> A.Answer:
        """The answer of the records so far (orchestrator.records.answer), decided once per new record: the loop
        asks for it several times between two runs, and each ask is driver time the ranks wait through."""
        seen = (len(self.records), id(self.records[-1]) if self.records else None)
        if self._answer is None or self._answer[0] != seen:
            self._answer = (seen, A.decide(self.records, self.cfg.target, self.cfg.winner))
        return self._answer[1]

    @property
    def baseline_s(self) -> float | None:
        """The baseline's figure: the median of its runs (one run until settling rounds add more)."""
        return self.answer().baseline_s if self.records else None

    @property
    def best_s(self) -> float | None:
        """The lowest figure so far (the answer's leader; its winner may be another member of a tie): what pruning
        compares a probe with."""
        lead = self.answer().leader
        return lead.step_time_s if lead else None

    # ---- MLflow -------------------------------------------------------------------------------

    def _open_tracker(self) -> tuple[Any, str | None]:
        if not self.cfg.tracking.enabled:
            return None, None
        try:
            from orchestrator.review.tracking import Tracker

            tracker = Tracker(self.cfg.mlflow_uri, self.cfg.tracking.experiment)
            return tracker, tracker.start_sweep(self.cfg.name, self.cfg.raw, self.cfg.target.seconds(self.baseline_s))
        except Exception as e:  # tracking mirrors the ledger; the sweep does not depend on it
            log.warning("MLflow tracking is off for this sweep: %s: %s", type(e).__name__, e)
            return None, None

    def track(self, what: str, *args: Any) -> None:
        """Mirror to MLflow (``Tracker.<what>(parent, *args)``); a failure is logged, the ledger has the line."""
        if self.mirror is not None:
            self.mirror.submit(what, *args)

    def flush_tracking(self) -> None:
        """Every call so far in the store (the driver takes over from a mirror that fell behind)."""
        if self.mirror is not None:
            self.mirror.flush()

    def end_tracking(self, what: str, *args: Any, grace_s: float | None = None) -> None:
        """The sweep's last MLflow call, after the mirror (orchestrator.review.mirror.Mirror.last); ``grace_s``:
        how long a sweep stopped by an error waits for the mirror (default: its queue's length)."""
        if self.mirror is not None:
            self.mirror.last(what, *args, patience_s=grace_s)

    # ---- a finished job -----------------------------------------------------------------------

    def tell(self, trial: Any, record: TrialRecord, same: TrialRecord | None = None) -> None:
        self.study.tell(trial, record, self.baseline_s, same)

    def finish(self, job: Job, outcome: RunOutcome, same: TrialRecord | None = None,
               repeat: int | None = None, round_: int | None = None) -> TrialRecord:
        """Judge, record (ledger first), tell Optuna, mirror to MLflow; the record written."""
        runs = [r for r in job.runs if r is not None]
        verdict = self.backend.judge(job.kind, outcome, self.gate, runs)
        status, metrics = verdict.status, metrics_of(outcome)
        parity = ParityVerdict.from_dict(verdict.parity) if verdict.parity is not None else None
        if same is not None:  # a repeated proposal: what the first measurement said, for the sampler and the table
            metrics, parity = copy.deepcopy(same.metrics), same.parity
        base = self.baseline_s or (metrics.step_time_s if job.kind == "baseline" and status == "ok" else None)
        if metrics.step_time_s and base:
            metrics.speedup_vs_baseline = base / metrics.step_time_s
        target = self.cfg.target.seconds(base)
        meets = (job.kind != "canonical" and status == "ok" and target is not None  # a reference run is no candidate
                 and (metrics.step_time_s if metrics.step_time_s is not None else float("inf")) <= target)
        run_name = f"trial{job.number}" + ("" if job.kind == "trial" else f"_{job.kind}{repeat or ''}") + \
            (f"_r{round_}" if round_ is not None else "")
        fields = self.backend.ledger_fields(job.kind, job.config, outcome, status, runs)
        if job.trial is not None:  # what a guided sampler's planner predicted for it ({} for other samplers)
            fields.update(guided.planner_fields(self.study.study.sampler, job.params, metrics.to_dict(), job.number))
        record = TrialRecord(
            sweep=self.cfg.name, trial=job.number, kind=job.kind, backend=self.backend.name, params=job.params,
            config=self.backend.configs.to_dict(job.config) if job.config is not None else {}, status=status,
            reason=verdict.reason, metrics=metrics, meets_target=meets, wall_s=sum(r.wall_s for r in runs),
            started_at=_ms(job.started), finished_at=_ms(time.time()), result=outcome.result, prediction=outcome.prediction,
            parity=parity, repeat=repeat, round=round_, load_1m=timeouts.machine_load()[0],
            duplicate_of=same.trial if same is not None else None,
            # tracking logs them under the child run's traces/
            artifacts=outcome.save_traces(self.cfg.results_dir / "traces" / run_name), **fields)
        self.ledger.append(record)  # first: the source of truth
        self.records.append(record)
        t_book = time.perf_counter()
        if job.trial is not None:
            self.tell(job.trial, record, same)
            job.told = True
        answer = self.answer()
        best = answer.winner
        # The parent's history plots the lowest figure so far (monotone while the search runs); the answer's own
        # figure is its last point (finish_sweep).
        self.track("log_trial", record, answer.leader.step_time_s if answer.leader else None)
        if best is not None and best.trial != self.best_trial:  # a re-measurement can hand the lead to another
            self.track("log_best", best.record)
            self.best_trial = best.trial
        self.bookkeeping.append(time.perf_counter() - t_book)
        best_txt = report.secs(best.step_time_s if best else None, self.backend.predicted)
        self.progress.finished(record, len(Q.measured(self.records)), best_txt,
                               self.cfg.target.describe(answer.baseline_s or base))
        return record


def _ms(epoch_s: float) -> datetime:
    """A time at the ledger's precision (ISO text to the millisecond), so a record in memory equals it read back."""
    t = datetime.fromtimestamp(epoch_s, timezone.utc)
    return t.replace(microsecond=t.microsecond // 1000 * 1000)

