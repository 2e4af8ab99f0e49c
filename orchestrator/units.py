"""How sizes are written for people: one definition, used by the progress lines, the table and the reasons."""

from __future__ import annotations


def fmt_bytes(n: int | float | None) -> str:
    """Binary units at the scale of the number: ``187 MiB``, ``90.1 GiB``, ``1.50 GiB``; ``-`` for nothing measured.

    About three significant figures, so a peak below 1 GiB never reads as ``0.00 GiB``.
    """
    if not n:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            digits = 0 if unit == "B" or abs(size) >= 100 else 1 if abs(size) >= 10 else 2
            return f"{size:.{digits}f} {unit}"
        size /= 1024
    return "-"
