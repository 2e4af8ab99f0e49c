"""Questions asked of a ledger's records: the baseline, a confirmation left pending, the overhead, what pruning saved.

The typed counterparts of the readers in ``orchestrator.records.ledger``, on ``TrialRecord`` (orchestrator.records.record).
They answer from what a record is (measured, predicted, its probe), not from which backend wrote it. Which
config is best, and whether it met the target, is orchestrator.records.answer's one decision.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from orchestrator.records.record import Kind, Status, TrialRecord


def measured(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Baseline and trial records (not confirms): one per Optuna trial."""
    return [r for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)]


def baseline_of(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The baseline to measure against: the last one that ran ok, else the last attempt."""
    lines = [r for r in records if r.kind is Kind.BASELINE]
    return next((r for r in reversed(lines) if r.status is Status.OK), lines[-1] if lines else None)


def baseline_s(records: Iterable[TrialRecord]) -> float | None:
    """The baseline trial's own run's step time, when it ran ok (its figure, the median over its settling
    rounds too, is orchestrator.records.answer's ``baseline_s``)."""
    base = baseline_of(records)
    return base.metrics.step_time_s if base is not None and base.status is Status.OK else None


@dataclass(frozen=True)
class OverheadStats:
    """Per-trial overhead (wall minus time in updates) over the records that ran on workers."""

    median_s: float | None
    """Median over the records that have one; None when none has."""
    max_s: float | None
    """The largest."""
    n: int
    """How many records had an overhead (real runs; predictions have none)."""


def overhead_stats(records: Iterable[TrialRecord]) -> OverheadStats:
    # Only real runs have an overhead (a prediction's is None), so no backend test is needed.
    per_trial = [r.overhead_s for r in records if r.overhead_s is not None]
    return OverheadStats(statistics.median(per_trial) if per_trial else None, max(per_trial, default=None),
                         len(per_trial))


@dataclass(frozen=True)
class PruningStats:
    """What pruning saved (estimated) against what the probes of the kept trials cost (measured)."""

    pruned: int
    """Trials stopped after their probe."""
    saved_s: float
    """The updates each pruned trial skipped, at its probe's pace: an estimate, never a measurement."""
    probe_cost_s: float
    """Wall seconds of the probes of trials that went on to their full measurement."""

    @property
    def net_s(self) -> float:
        return self.saved_s - self.probe_cost_s


def pruning_stats(records: Iterable[TrialRecord]) -> PruningStats:
    saved = cost = 0.0
    n_pruned = 0
    for r in records:
        if r.status is Status.PRUNED:
            n_pruned += 1
            if r.probe is not None:
                saved += r.probe.skipped_steps * r.probe.step_time_s
        elif r.probe is not None:
            cost += r.probe.wall_s
    return PruningStats(n_pruned, saved, cost)
