"""The ledger: ``results/<sweep>/trials.jsonl``, one JSON line per finished trial, the source of truth.

A line is written, flushed and fsynced before the result is told to Optuna or mirrored to MLflow, so a
crash of the driver or of any store loses nothing that was measured; resuming reads it back. Lines are
only ever appended. A line cut short by a killed driver (no trailing newline) is the one exception: it was
never told to anyone, so it is set aside (into ``trials.jsonl.torn``) and its trial runs again.
"""

from __future__ import annotations

import contextlib
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable

from orchestrator.jsonl import JsonLines, LedgerBusy
from orchestrator.record import TrialRecord, load_records

__all__ = ["Ledger", "LedgerBusy"]

KINDS = ("baseline", "trial", "confirm", "canonical")
"""canonical: the reference run of the baseline's maths in the simplest layout (orchestrator.trust)."""
STATUSES = ("ok", "failed", "oom", "timeout", "nan", "infeasible", "pruned", "skipped")
KEYS = ("sweep", "trial", "kind", "backend", "params", "config", "status", "reason", "result", "prediction",
        "parity", "metrics", "meets_target", "wall_s", "overhead_s", "started_at", "finished_at")


class Ledger:
    """``results/<sweep>/trials.jsonl`` as TrialRecords: ``append`` writes one, ``read`` loads them all."""

    def __init__(self, path: Path):
        self.file = JsonLines(path)
        self.path = self.file.path

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """One writer per ledger: a second driver of the same sweep would treat the first one's trials as dead."""
        return self.file.lock()

    def append(self, record: TrialRecord) -> None:
        """Write ``record.to_line()``, flushed and fsynced before this returns (the source of truth comes first)."""
        self.file.append(record.to_line())

    def read(self) -> list[TrialRecord]:
        """The ledger's records (``TrialRecord.from_line``, any schema); a line that does not load names why."""
        lines = self.file.lines()
        try:
            return load_records(lines)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None

    def lines(self) -> list[dict[str, Any]]:
        """The raw JSON lines as written: for tools that look at the file itself (line sizes, old schemas)."""
        return self.file.lines()


def record(*, sweep: str, trial: int, kind: str, backend: str, params: dict, config: dict, status: str,
           reason: str | None, result: dict | None, prediction: dict | None, parity: dict | None,
           metrics: dict, meets_target: bool, wall_s: float, overhead_s: float | None, started_at: float,
           finished_at: float, **extra: Any) -> dict[str, Any]:
    """One ledger line, with the schema's keys in order (tracking and export read these names)."""
    if kind not in KINDS or status not in STATUSES:
        raise ValueError(f"ledger: kind={kind!r} / status={status!r} not in {KINDS} / {STATUSES}")
    line = {"sweep": sweep, "trial": trial, "kind": kind, "backend": backend, "params": params, "config": config,
            "status": status, "reason": reason, "result": result, "prediction": prediction, "parity": parity,
            "metrics": metrics, "meets_target": meets_target, "wall_s": wall_s, "overhead_s": overhead_s,
            "started_at": _iso(started_at), "finished_at": _iso(finished_at)}
    line.update(extra)
    return line


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="milliseconds")


# ---- reading a ledger back ---------------------------------------------------------------------

def measured(records: Iterable[dict]) -> list[dict]:
    """Baseline and trial lines (not confirms): one per Optuna trial."""
    return [r for r in records if r["kind"] in ("baseline", "trial")]


def baseline_of(records: Iterable[dict]) -> dict | None:
    """The baseline line to measure against: the last one that ran ok, else the last attempt."""
    lines = [r for r in records if r["kind"] == "baseline"]
    return next((r for r in reversed(lines) if r["status"] == "ok"), lines[-1] if lines else None)


def best_of(records: Iterable[dict]) -> dict | None:
    """The fastest usable line: status ok (measured or predicted, parity passed or not applicable)."""
    ok = [r for r in measured(records) if r["status"] == "ok" and r["metrics"].get("step_time_s")]
    return min(ok, key=lambda r: r["metrics"]["step_time_s"], default=None)


def confirmed_winner(records: list[dict], repeats: int) -> dict | None:
    """The first line that met the target and whose ``repeats`` confirm lines all met it again.

    Predictions (model backend) are never re-run: the first predicted line under the target is the answer.
    """
    for r in measured(records):
        if not r["meets_target"]:
            continue
        if r["backend"] == "model" or repeats == 0:
            return r
        confirms = [c for c in records if c["kind"] == "confirm" and c["trial"] == r["trial"]]
        if len(confirms) >= repeats and all(c["meets_target"] for c in confirms[:repeats]):
            return r
    return None


def unconfirmed(records: list[dict], repeats: int) -> dict | None:
    """A line that met the target but has not been through its confirm runs yet (the driver died between)."""
    for r in measured(records):
        confirms = [c for c in records if c["kind"] == "confirm" and c["trial"] == r["trial"]]
        if (r["meets_target"] and r["backend"] == "ray" and len(confirms) < repeats
                and all(c["meets_target"] for c in confirms)):
            return r
    return None


def overhead_stats(records: Iterable[dict]) -> dict[str, float | None]:
    per_trial = [r["overhead_s"] for r in records if r.get("overhead_s") is not None and r["backend"] == "ray"]
    return {"median_s": statistics.median(per_trial) if per_trial else None,
            "max_s": max(per_trial, default=None), "n": len(per_trial)}


def pruning_stats(records: Iterable[dict]) -> dict[str, float]:
    """Time pruning saved (estimated: the updates a pruned trial skipped, at its probe's pace) and what the
    probes of the trials that were kept cost (measured)."""
    saved = cost = 0.0
    n_pruned = 0
    for r in records:
        probe = r.get("probe") or {}
        if r["status"] == "pruned":
            n_pruned += 1
            saved += probe.get("skipped_steps", 0) * probe.get("step_time_s", 0.0)
        elif probe:
            cost += probe.get("wall_s", 0.0)
    return {"pruned": n_pruned, "saved_s": saved, "probe_cost_s": cost, "net_s": saved - cost}
