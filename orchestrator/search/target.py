"""What step time the sweep aims at: absolute, relative to the baseline, or derived from a schedule. Pure.

The schedule form is the planning arithmetic of a real run: the wall-clock days the run may take, the
fraction of them the cluster is actually training (availability: failures, restarts, evaluation), and the
number of updates the token budget needs. 76 days x 86,400 s x 0.9 / 635,782 updates = 9.30 s per update.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

SECONDS_PER_DAY = 86_400


def schedule_step_time(days: float, availability: float, updates: int) -> float:
    """Seconds per update that finish ``updates`` updates in ``days`` at ``availability``."""
    return days * SECONDS_PER_DAY * availability / updates


@dataclass(frozen=True)
class Target:
    step_time_s: float | None = None
    relative_to_baseline: float | None = None
    days: float | None = None
    availability: float | None = None
    updates: int | None = None

    @property
    def kind(self) -> str:
        if self.step_time_s is not None:
            return "absolute"
        if self.relative_to_baseline is not None:
            return "relative"
        return "schedule" if self.days is not None else "none"

    def seconds(self, baseline_step_time_s: float | None) -> float | None:
        """The target in seconds per update; None when there is none (or it is relative and no baseline yet)."""
        if self.kind == "absolute":
            return self.step_time_s
        if self.kind == "schedule":
            return schedule_step_time(self.days, self.availability, self.updates)
        if self.kind == "relative" and baseline_step_time_s:
            return self.relative_to_baseline * baseline_step_time_s
        return None

    def describe(self, baseline_step_time_s: float | None = None) -> str:
        s = self.seconds(baseline_step_time_s)
        if self.kind == "none":
            return "no target (best within budget)"
        secs = f"{s:.4g} s/update" if s is not None else "? s/update"
        if self.kind == "relative":
            return f"{secs} ({self.relative_to_baseline:g} x baseline)"
        if self.kind == "schedule":
            return (f"{secs} ({self.days:g} d x 86,400 s x {self.availability:.0%} availability / "
                    f"{self.updates:,} updates)")
        return secs


def parse_target(data: Any, where: str = "target") -> Target:
    """``{step_time_s: 9.3}`` | ``{relative_to_baseline: 0.8}`` | ``{schedule: {days, availability, updates}}``."""
    if data is None or data == {}:
        return Target()
    if not isinstance(data, Mapping):
        raise ValueError(f"{where}: expected a mapping with one of step_time_s, relative_to_baseline, schedule")
    allowed = {"step_time_s", "relative_to_baseline", "schedule"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(f'{where}.{k}' for k in unknown)}; allowed: {sorted(allowed)}")
    given = [k for k in allowed if data.get(k) is not None]
    if len(given) != 1:
        raise ValueError(f"{where}: give exactly one of step_time_s, relative_to_baseline, schedule "
                         f"(got {sorted(given)})")
    (key,) = given
    if key == "step_time_s":
        return Target(step_time_s=_positive(data[key], f"{where}.step_time_s"))
    if key == "relative_to_baseline":
        rel = _positive(data[key], f"{where}.relative_to_baseline")
        if rel > 1:
            raise ValueError(f"{where}.relative_to_baseline={rel} must be <= 1 "
                             f"(a fraction of the baseline's step time)")
        return Target(relative_to_baseline=rel)
    sched = data[key]
    if not isinstance(sched, Mapping) or set(sched) != {"days", "availability", "updates"}:
        raise ValueError(f"{where}.schedule: expected exactly days, availability, updates (got {_keys(sched)})")
    days = _positive(sched["days"], f"{where}.schedule.days")
    availability = _positive(sched["availability"], f"{where}.schedule.availability")
    if availability > 1:
        raise ValueError(f"{where}.schedule.availability={availability} must be a fraction in (0, 1], e.g. 0.9")
    updates = sched["updates"]
    if isinstance(updates, bool) or not isinstance(updates, int) or updates < 1:
        raise ValueError(f"{where}.schedule.updates: expected a positive integer, got {updates!r}")
    target = Target(days=days, availability=availability, updates=updates)
    seconds = target.seconds(None)
    if not 0 < seconds < math.inf:  # finite inputs can still overflow (1e303 days) or underflow to 0 s
        raise ValueError(f"{where}.schedule: {days:g} days x {availability:g} availability / {updates:,} updates "
                         f"gives {seconds:g} s per update; give the days and updates of a real run")
    return target


def _positive(value: Any, where: str) -> float:
    # Subnormal floats (below sys.float_info.min) are not targets: times a step time they underflow to 0 s.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not sys.float_info.min <= value < math.inf:
        raise ValueError(f"{where}: expected a positive number, got {value!r}")
    return float(value)


def _keys(data: Any) -> Any:
    return sorted(data) if isinstance(data, Mapping) else data
