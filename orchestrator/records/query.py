"""Questions asked of a ledger's records: the baseline, a confirmation left pending, the overhead, what pruning saved.

The typed counterparts of the readers in ``orchestrator.records.ledger``, on ``TrialRecord`` (orchestrator.records.record).
They answer from what a record is (measured, predicted, its probe), not from which backend wrote it. Which
config is best, and whether it met the target, is orchestrator.records.winner's one rule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

from orchestrator.records import winner
from orchestrator.records.record import Kind, Status, TrialRecord


def measured(records: Iterable[TrialRecord]) -> list[TrialRecord]:
    """Baseline and trial records (not confirms): one per Optuna trial."""
    return [r for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)]


def baseline_of(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The baseline to measure against: the last one that ran ok, else the last attempt."""
    lines = [r for r in records if r.kind is Kind.BASELINE]
    return next((r for r in reversed(lines) if r.status is Status.OK), lines[-1] if lines else None)


def baseline_s(records: Iterable[TrialRecord]) -> float | None:
    """The baseline's step time, when it ran ok."""
    base = baseline_of(records)
    return base.metrics.step_time_s if base is not None and base.status is Status.OK else None


def confirms_of(records: Iterable[TrialRecord], trial: int) -> list[TrialRecord]:
    """The confirm runs of one trial, in the order they were written."""
    return [c for c in records if c.kind is Kind.CONFIRM and c.trial == trial]


def unconfirmed(records: Sequence[TrialRecord], target_s: float | None, repeats: int) -> TrialRecord | None:
    """A measured trial that met the target by its own run and still lacks some of its ``repeats`` confirm runs
    (the driver died between) while its config's figure (orchestrator.records.winner) still meets the target;
    a confirmation ends early once it does not."""
    meeting = {s.trial for s in winner.standings(records) if s.meets(target_s)}
    for r in measured(records):
        if r.meets_target and r.measured and r.trial in meeting and len(confirms_of(records, r.trial)) < repeats:
            return r
    return None


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
