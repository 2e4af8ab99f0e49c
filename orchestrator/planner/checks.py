"""Field validation shared by the planner's dataclasses.

Each check raises ``ValueError("<field>: ...")``; the parsers prefix the path above it, so a bad value in a
preset surfaces as ``planner.parallel.pp: ...`` and a bad knob as ``parallel.pp: ...``.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_int(obj: Any, field: str, lo: int | None = None, hi: int | None = None) -> None:
    value = getattr(obj, field)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field}: expected an integer, got {value!r}")
    if lo is not None and value < lo:
        raise ValueError(f"{field}: must be >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{field}: must be <= {hi}, got {value}")


def check_num(obj: Any, field: str, lo: float | None = None, hi: float | None = None,
              lo_open: bool = False) -> None:
    value = getattr(obj, field)
    if not _number(value):
        raise ValueError(f"{field}: expected a finite number, got {value!r}")
    if lo is not None and (value < lo or (lo_open and value == lo)):
        raise ValueError(f"{field}: must be {'>' if lo_open else '>='} {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{field}: must be <= {hi}, got {value}")


def check_bool(obj: Any, field: str) -> None:
    value = getattr(obj, field)
    if not isinstance(value, bool):
        raise ValueError(f"{field}: expected true or false, got {value!r}")


def check_choice(obj: Any, field: str, choices: tuple[str, ...]) -> None:
    value = getattr(obj, field)
    if value not in choices:
        raise ValueError(f"{field}: must be one of {', '.join(choices)}; got {value!r}")


@contextmanager
def prefixed(prefix: str) -> Iterator[None]:
    """Re-raise a ValueError from inside with ``prefix.`` in front of the field it names."""
    try:
        yield
    except ValueError as err:
        msg = str(err)
        raise ValueError(f"{prefix}.{msg}" if prefix else msg) from None
