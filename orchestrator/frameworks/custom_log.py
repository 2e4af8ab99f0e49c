"""Reading a declared framework's log (``command.custom.log``, orchestrator.frameworks.custom.LogFormat).

An iteration line (``log.iteration``) opens an iteration; each declared figure found on that line or on a later one,
up to the next iteration line, belongs to it (the first match wins). A line's figures average over the iterations
since the previous iteration line (as Megatron's log interval does), so the warm-up rule is the same as for the
built-in frameworks. Memory is the peak over every match in the log, wherever printed. The print resolution of the
loss and the grad norm (half the last digit printed, the largest over the log) is read from the numbers themselves,
so black-box parity never asks two printed values to agree closer than the script prints them. Pure: text in,
``ParsedLog`` out.
"""

from __future__ import annotations

import math
import re
from typing import Any

from orchestrator.frameworks.custom import MEMORY_UNITS, TIME_UNITS, LogFormat
from orchestrator.frameworks.log import Iteration, ParsedLog, judge, number

_FIGURES = ("step_time", "loss", "grad_norm", "tokens_per_s")


def half_digit(text: str) -> float:
    """Half the value of the last digit printed in ``text`` (``4.1235`` -> 5e-5, ``1.20e-02`` -> 5e-5, ``12`` -> 0.5);
    0 for what is not a finite number."""
    t = text.strip().replace(",", "")
    m = re.fullmatch(r"[+-]?(\d*)(?:\.(\d*))?(?:[eE]([+-]?\d+))?", t)
    if not m or not (m.group(1) or m.group(2)):
        return 0.0
    decimals = len(m.group(2) or "")
    exponent = int(m.group(3) or 0)
    return 0.5 * 10.0 ** (exponent - decimals)


def parse(fmt: LogFormat, name: str, text: str, warmup: int = 1, expected: int | None = None,
          world_size: int = 1) -> ParsedLog:
    """A declared framework's log -> ParsedLog. ``expected`` defaults to the ``total`` group where the iteration
    pattern has one."""
    rx = fmt.compiled()
    its: list[dict[str, Any]] = []
    peak: int | None = None
    ignored, total = 0, None
    resolution = {"loss": 0.0, "grad_norm": 0.0}
    for line in text.splitlines():
        m = rx["iteration"].search(line)
        if m:
            step = int(m.group("step"))
            prev = its[-1]["step"] if its else 0
            its.append({"step": step, "first": min(prev, step - 1) + 1})
            if "total" in m.groupdict() and m.group("total"):
                total = int(m.group("total"))
        if "memory" in rx and (mm := rx["memory"].search(line)):
            try:
                unit = mm.groupdict().get("unit") or fmt.memory_unit
                if unit not in MEMORY_UNITS:
                    raise ValueError(f"unit {unit!r}")
                peak = max(peak or 0, int(number(mm.group("value")) * MEMORY_UNITS[unit]))
            except ValueError:
                ignored += 1
        if not its:
            continue
        cur = its[-1]
        for fig in _FIGURES:
            if fig in rx and fig not in cur and (fm := rx[fig].search(line)):
                try:
                    cur[fig] = _figure(fmt, fig, fm)
                except ValueError:
                    ignored += 1
                    cur[fig] = None
                if fig in resolution:
                    resolution[fig] = max(resolution[fig], half_digit(fm.group("value")))
    iterations = [_iteration(fmt, it, world_size) for it in its]
    parsed = judge(name, iterations, warmup, expected if expected is not None else total,
                   {"peak": peak} if peak else {}, ignored)
    parsed.resolution.update({k: v for k, v in resolution.items() if v > 0})
    return parsed


def _figure(fmt: LogFormat, fig: str, m: re.Match) -> float:
    v = number(m.group("value"))
    if fig == "step_time":
        unit = m.groupdict().get("unit") or fmt.step_time_unit
        if unit not in TIME_UNITS:
            raise ValueError(f"unit {unit!r}")
        v *= TIME_UNITS[unit]
    return v


def _iteration(fmt: LogFormat, it: dict[str, Any], world_size: int) -> Iteration:
    tps = it.get("tokens_per_s")
    if tps is not None and not fmt.tokens_per_s_per_rank:
        tps = tps / max(1, world_size)
    loss = it.get("loss")
    return Iteration(step=it["step"], first_step=it["first"], time_s=it.get("step_time"), loss=loss,
                     grad_norm=it.get("grad_norm"), losses={"loss": loss} if loss is not None else {},
                     tokens_per_s_per_gpu=tps if tps is None or math.isfinite(tps) else None)
