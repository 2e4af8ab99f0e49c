"""The ledger: ``results/<sweep>/trials.jsonl``, one JSON line per finished trial, the source of truth.

A line is written, flushed and fsynced before the result is told to Optuna or mirrored to MLflow, so a
crash of the driver or of any store loses nothing that was measured; resuming reads it back. Lines are
only ever appended. A line cut short by a killed driver (no trailing newline) is the one exception: it was
never told to anyone, so it is set aside (into ``trials.jsonl.torn``) and its trial runs again. A measured
line's detail (what only pictures read, orchestrator.records.detail) is written beside it, before it.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Iterable

from orchestrator.records.detail import DetailFiles, DetailMissing, stem_of
from orchestrator.records.jsonl import JsonLines, LedgerBusy
from orchestrator.records.record import TrialRecord, load_records

__all__ = ["Ledger", "LedgerBusy", "join_details", "read_records"]


class Ledger:
    """``results/<sweep>/trials.jsonl`` as TrialRecords: ``append`` writes one, ``read`` loads them all."""

    def __init__(self, path: Path):
        self.file = JsonLines(path)
        self.path = self.file.path

    def lock(self) -> contextlib.AbstractContextManager[None]:
        """One writer per ledger: a second driver of the same sweep would treat the first one's trials as dead."""
        return self.file.lock()

    def append(self, record: TrialRecord) -> None:
        """Write ``record.to_line()``, flushed and fsynced before this returns (the source of truth comes first).

        A measured record's detail file is written and fsynced first and named in ``record.detail``, so the
        line never names a file that is not whole on disk."""
        if record.result is not None and record.detail is None:
            stem = stem_of(record.trial, record.kind.value, record.repeat)
            record.detail = DetailFiles(self.path.parent).write(stem, record.detail_payload())
        self.file.append(record.to_line())

    def read(self) -> list[TrialRecord]:
        """The ledger's records (``TrialRecord.from_line``, any schema) with their detail joined back; a line
        that does not load names why, a detail file that does not read is noted in ``record.detail_error``."""
        lines = self.file.lines()
        try:
            records = load_records(lines)
        except ValueError as e:
            raise ValueError(f"{self.path}: {e}") from None
        join_details(records, self.path.parent)
        return records

    def lines(self) -> list[dict[str, Any]]:
        """The raw JSON lines as written: for tools that look at the file itself (line sizes, old schemas)."""
        return self.file.lines()


def read_records(path: Path) -> list[TrialRecord]:
    """The records of ``results/<sweep>/trials.jsonl`` (a torn last line skipped): ``Ledger(path).read()``."""
    return Ledger(path).read()


def join_details(records: Iterable[TrialRecord], ledger_dir: Path) -> None:
    """Join each record's detail file (under ``ledger_dir``) into its result, or note in ``detail_error`` why not."""
    files = DetailFiles(ledger_dir)
    for r in records:
        if r.detail is None or r.result is None:
            continue
        try:
            r.join_detail(files.read(r.detail))
        except DetailMissing as e:
            r.detail_error = f"{e}: the pictures that need it are skipped; the line holds every other figure"
