"""The one way a benchmark publishes its table: printed, and written to bench/results/ for the repo."""

from __future__ import annotations

from pathlib import Path


def write_and_print(text: str, out: str | Path) -> None:
    print(text)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
