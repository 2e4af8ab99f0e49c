"""torchtitan as a framework of the ``command`` backend: its metrics lines read, a trial's knobs as its config keys.

The log: the metrics processor (torchtitan/components/metrics.py) logs on rank 0, every ``metrics.log_freq``
steps, ``step: N  loss: L  grad_norm: G  memory: M.MMGiB(P%)  tps: T  tflops: F  mfu: U%`` with terminal colour
codes between the fields (older releases: no grad_norm, ``wps`` for ``tps``; some forks append
``elapsed_time_per_step: S.SSSs``). ``tps`` is tokens per second per device over the steps since the last line;
the line has no step time, so the step time is the tokens a device processes per step over ``tps`` where the
caller knows them (``tokens_per_step_per_gpu``), else none. ``memory`` is the peak reserved since the last line.

The keys: torchtitan's ``--section.key value`` command-line overrides of its JobConfig.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from orchestrator.frameworks.log import Iteration, ParsedLog, judge, number

NAME = "torchtitan"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STEP = re.compile(r"(?<![\w/])step:\s*(\d+)\s+(.*)$")
_PAIR = re.compile(r"(\w+):\s*(\S+)")
_GIB = 2**30


def _iteration(step: int, first: int, f: dict[str, str], tokens_per_step_per_gpu: int | None) -> Iteration:
    if "loss" not in f:
        raise ValueError("no loss")
    tps = number(f.get("tps") or f["wps"]) if ("tps" in f or "wps" in f) else None
    mem = None
    if "memory" in f:
        mem = int(number(f["memory"].split("GiB")[0]) * _GIB)
    mfu = None if f.get("mfu", "N/A").startswith("N/A") else number(f["mfu"].rstrip("%")) / 100
    time_s = number(f["elapsed_time_per_step"].rstrip("s")) if "elapsed_time_per_step" in f else (
        tokens_per_step_per_gpu / tps if tokens_per_step_per_gpu and tps else None)
    return Iteration(step=step, first_step=first, time_s=time_s, loss=number(f["loss"]),
                     grad_norm=number(f["grad_norm"]) if "grad_norm" in f else None, losses={"loss": number(f["loss"])},
                     tflops_per_gpu=number(f["tflops"]) if "tflops" in f else None, tokens_per_s_per_gpu=tps,
                     mfu=mfu, memory_bytes=mem)


def parse_log(text: str, warmup: int = 1, expected: int | None = None,
              tokens_per_step_per_gpu: int | None = None) -> ParsedLog:
    """A torchtitan log -> ParsedLog (``expected``: ``training.steps``, which the lines do not print)."""
    its: list[Iteration] = []
    ignored, prev = 0, 0
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        m = _STEP.search(line)
        if not m or "validat" in line[:m.start()].lower():
            continue
        step = int(m.group(1))
        try:
            its.append(_iteration(step, min(prev, step - 1) + 1, dict(_PAIR.findall(m.group(2))),
                                  tokens_per_step_per_gpu))
        except (ValueError, KeyError):
            ignored += 1
        prev = step
    peaks = [it.memory_bytes for it in its if it.memory_bytes is not None]
    return judge(NAME, its, warmup, expected, {"max_reserved": max(peaks)} if peaks else {}, ignored)


# ---- knobs -> config keys ----------------------------------------------------------------------------

KNOB_KEYS: dict[str, str] = {
    "batch.micro_batch_size": "--training.local_batch_size",
    "tensor_parallel.size": "--parallelism.tensor_parallel_degree",
    "parallel.pp": "--parallelism.pipeline_parallel_degree",
    "pipeline.schedule": "--parallelism.pipeline_parallel_schedule",
    "recompute.kind": "--activation_checkpoint.mode",
}
"""Each knob a torchtitan trial can vary and the JobConfig override that carries it; any other is refused."""
_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
_AC_MODES = {"none": "none", "selective": "selective", "full": "full"}


def refuse(keys: Iterable[str]) -> None:
    bad = sorted(set(keys) - set(KNOB_KEYS))
    if bad:
        raise ValueError(f"space.params.{bad[0]}: framework torchtitan cannot express {', '.join(bad)} as torchtitan "
                         f"config keys; knobs it can vary: {', '.join(KNOB_KEYS)}")


def render(cfg, keys: Sequence[str]) -> list[str]:
    values = {"batch.micro_batch_size": cfg.batch.micro_batch_size, "tensor_parallel.size": cfg.tensor_parallel.size,
              "parallel.pp": cfg.parallel.pp, "pipeline.schedule": _SCHEDULES.get(cfg.pipeline.schedule),
              "recompute.kind": _AC_MODES.get(cfg.to_dict()["recompute"]["kind"])}
    out: list[str] = []
    for k in keys:
        if values[k] is None:
            raise ValueError(f"{k}: framework torchtitan cannot express this value (it knows "
                             f"{', '.join(_SCHEDULES if k == 'pipeline.schedule' else _AC_MODES)})")
        out += [KNOB_KEYS[k], str(values[k])]
    return out
