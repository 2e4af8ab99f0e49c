"""The detail file beside a ledger line: what of a measured result only pictures read, kept out of the line.

A measured result's per-rank detail (each rank's steps, phase spans, memory, fingerprint) and, for runs that
are no parity reference, its per-step series and parameter fingerprint are 90-95 % of a line and are read
only by the timeline picture, the per-step curves and ``result.json`` in MLflow. They go to
``results/<sweep>/detail/<trial>-<kind>[-<repeat>].json.gz``, which is written, fsynced and renamed into
place (then its folder fsynced) before the ledger line that names it; so a line never names a file that a
crash left half-written. The line keeps every figure report, export, calibration, the winner rule and the
tracking metrics read, so a lost detail file costs the pictures only.

The file layer only (like orchestrator.records.jsonl): which keys leave the line is decided here, the
record (orchestrator.records.record) splits and joins.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import Any

DETAIL_DIR = "detail"
"""The folder beside ``trials.jsonl`` that holds the detail files."""

PER_RANK = ("ranks",)
SERIES = ("steps", "fingerprint")
REFERENCE_KINDS = ("baseline", "canonical")
"""Their per-step losses, gradient norms and fingerprint stay in the line: a resumed sweep re-anchors its
parity gate on the baseline's run when the reference store lacks it (orchestrator.parity.trust.ParityGate.resume),
so a lost detail file must not cost that."""


def detail_keys(kind: str) -> tuple[str, ...]:
    """The keys of ``Result.to_dict()`` that a line of this kind leaves to its detail file."""
    return PER_RANK if kind in REFERENCE_KINDS else PER_RANK + SERIES


class DetailMissing(ValueError):
    """A detail file the line names cannot be read (gone, cut short, not gzipped JSON, another line's)."""


class DetailFiles:
    """``results/<sweep>/detail/``: one gzipped JSON file per ledger line that has a measured result."""

    def __init__(self, ledger_dir: Path):
        self.root = Path(ledger_dir)

    def write(self, stem: str, payload: dict[str, Any]) -> str:
        """Write ``payload`` under the first free name for ``stem``, durable before this returns.

        Returns its path relative to the ledger's folder, which the line stores. A name already taken (a
        file a killed driver left before its line) gets a sequence number instead of being overwritten.
        """
        folder = self.root / DETAIL_DIR
        if not folder.is_dir():
            folder.mkdir(parents=True, exist_ok=True)
            _fsync_dir(self.root)
        name, n = f"{stem}.json.gz", 1
        while (folder / name).exists():
            n += 1
            name = f"{stem}.{n}.json.gz"
        data = gzip.compress(json.dumps(payload, default=_jsonable).encode(), compresslevel=6, mtime=0)
        tmp = folder / f".{name}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)  # whole or not at all: a reader never sees half a file
        _fsync_dir(folder)
        return f"{DETAIL_DIR}/{name}"

    def read(self, name: str) -> dict[str, Any]:
        """The payload of ``name`` (as the line stores it); ``DetailMissing`` saying why when it cannot be read."""
        path = self.root / name
        try:
            payload = json.loads(gzip.decompress(path.read_bytes()))
        except FileNotFoundError:
            raise DetailMissing(f"{path} is missing") from None
        except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DetailMissing(f"{path} does not read ({type(e).__name__}: {e})") from None
        if not isinstance(payload, dict):
            raise DetailMissing(f"{path} holds a {type(payload).__name__}, not a detail mapping")
        return payload


def stem_of(trial: int, kind: str, repeat: int | None) -> str:
    """``<trial>-<kind>[-<repeat>]``: what tells a ledger's lines apart (a trial has probe, confirm, repeat lines)."""
    return f"{trial}-{kind}" + (f"-{repeat}" if repeat is not None else "")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"detail file: cannot write {type(obj).__name__}")
