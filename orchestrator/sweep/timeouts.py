"""How long one run may take before it is called hung: derived from what was measured. Pure.

A fixed limit misfires on a shared machine: the same run that takes 3 s alone takes 12 s beside three
CPU-burning neighbours, and a limit tuned for the quiet case kills it. The limit here is the larger of the
configured floor and ``MEASURED_MULTIPLE`` x the slowest ok run measured so far, and both stretch with the load:
x max(1, 1-minute load / cores) as the run starts. A hang is still caught, just later on a busy machine.
"""

from __future__ import annotations

import os
from typing import Iterable

MEASURED_MULTIPLE = 5.0
"""A run may take this many times the slowest ok run so far (trials differ: a config 3x slower than the
baseline is a legitimate measurement, not a hang)."""


def load_factor(load_1m: float | None, cores: int | None) -> float:
    """How much slower a CPU-bound run may be on this machine now: max(1, load / cores)."""
    if not load_1m or not cores:
        return 1.0
    return max(1.0, load_1m / cores)


def run_timeout_s(floor_s: float, ok_walls_s: Iterable[float], load_1m: float | None = None,
                  cores: int | None = None) -> float:
    """The wall-clock limit of the next run: max(floor, MEASURED_MULTIPLE x slowest ok wall) x load factor."""
    measured = max((w for w in ok_walls_s if w and w > 0), default=0.0)
    return max(floor_s, MEASURED_MULTIPLE * measured) * load_factor(load_1m, cores)


def machine_load() -> tuple[float | None, int | None]:
    """(1-minute load average, cores) of this machine; (None, cores) where the OS has no load average."""
    try:
        load = os.getloadavg()[0]
    except (OSError, AttributeError):
        load = None
    return load, os.cpu_count()
