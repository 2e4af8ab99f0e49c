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
from typing import Any

from orchestrator.records.jsonl import JsonLines, LedgerBusy
from orchestrator.records.record import TrialRecord, load_records

__all__ = ["Ledger", "LedgerBusy"]

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
