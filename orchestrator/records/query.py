"""Questions asked of a ledger's records: the baseline, the best, the confirmed winner, what pruning saved.

The typed counterparts of the readers in ``orchestrator.records.ledger``, on ``TrialRecord`` (orchestrator.records.record).
They answer from what a record is (measured, predicted, its probe), not from which backend wrote it.
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
    """The baseline's step time, when it ran ok."""
    base = baseline_of(records)
    return base.metrics.step_time_s if base is not None and base.status is Status.OK else None


def best_of(records: Iterable[TrialRecord]) -> TrialRecord | None:
    """The fastest usable record: status ok (measured or predicted, parity passed or not applicable)."""
    ok = [r for r in measured(records) if r.status is Status.OK and r.metrics.step_time_s]
    return min(ok, key=lambda r: r.metrics.step_time_s, default=None)


def confirms_of(records: Iterable[TrialRecord], trial: int) -> list[TrialRecord]:
    """The confirm runs of one trial, in the order they were written."""
    return [c for c in records if c.kind is Kind.CONFIRM and c.trial == trial]


def confirmed_winner(records: Sequence[TrialRecord], repeats: int) -> TrialRecord | None:
    """The first record that met the target and whose ``repeats`` confirm runs all met it again.

    A prediction is never re-run: the first predicted record under the target is the answer.
    """
    for r in measured(records):
        if not r.meets_target:
            continue
        if r.predicted or repeats == 0:
            return r
        confirms = confirms_of(records, r.trial)
        if len(confirms) >= repeats and all(c.meets_target for c in confirms[:repeats]):
            return r
    return None


def unconfirmed(records: Sequence[TrialRecord], repeats: int) -> TrialRecord | None:
    """A measured record that met the target but has not been through its confirm runs (the driver died between)."""
    for r in measured(records):
        confirms = confirms_of(records, r.trial)
        if (r.meets_target and r.measured and len(confirms) < repeats
                and all(c.meets_target for c in confirms)):
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
