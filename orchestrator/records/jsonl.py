"""Append-only JSON-lines files (the ledger's file layer): one writer, a line fsynced before the next step, and a
line cut short by a killed writer (no trailing newline) set aside into ``<name>.torn`` instead of read.

Below orchestrator.records.record (which reads a ledger's lines into records) and orchestrator.records.ledger (which writes
records), so neither needs the other's module to reach the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Any, Iterator


class LedgerBusy(RuntimeError):
    """Another driver is writing this ledger."""


class JsonLines:
    """An append-only JSON-lines file with one writer: flushed and fsynced per line, a torn tail set aside."""

    def __init__(self, path: Path):
        self.path = Path(path)

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One writer per ledger: a second driver of the same sweep would treat the first one's trials as dead."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_name(".driver.lock")
        with open(lock, "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                raise LedgerBusy(f"{self.path.parent.name!r} is already being run by another driver (pid "
                                 f"{f.read().strip() or '?'}; lock {lock})") from None
            f.truncate(0)
            f.write(str(os.getpid()))
            f.flush()
            yield

    def append(self, obj: dict[str, Any]) -> None:
        """Write one line, flushed and fsynced before this returns."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._set_aside_torn_tail()
        line = json.dumps(obj, sort_keys=False, default=_jsonable) + "\n"
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())

    def lines(self) -> list[dict[str, Any]]:
        """The raw JSON lines, as written (a torn last line skipped): for tools that look at the file itself."""
        if not self.path.exists():
            return []
        out = []
        text = self.path.read_text(encoding="utf-8")
        for n, line in enumerate(text.splitlines(keepends=True), 1):
            if not line.endswith("\n"):
                break  # torn tail: never told to anyone
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{self.path}:{n}: not a JSON line ({e}); edited by hand?") from None
        return out

    def _set_aside_torn_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        with open(self.path, "rb+") as f:
            f.seek(-1, os.SEEK_END)
            if f.read(1) == b"\n":
                return
            f.seek(0)
            data = f.read()
            cut = data.rfind(b"\n") + 1
            with open(self.path.with_name(self.path.name + ".torn"), "ab") as torn:
                torn.write(data[cut:] + b"\n")
            f.truncate(cut)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"ledger: cannot write {type(obj).__name__}")
