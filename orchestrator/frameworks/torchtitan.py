"""torchtitan as a framework of the ``command`` backend: its metrics lines read, a trial's knobs as its config keys.

The log: the metrics processor (torchtitan/components/metrics.py) logs on rank 0, every ``metrics.log_freq``
steps, ``step: N  loss: L  grad_norm: G  memory: M.MMGiB(P%)  tps: T  tflops: F  mfu: U%`` with terminal colour
codes between the fields (older releases: no grad_norm, ``wps`` for ``tps``; some forks append
``elapsed_time_per_step: S.SSSs``). ``tps`` is tokens per second per device over the steps since the last line;
the line has no step time, so the step time is the tokens a device processes per step over ``tps`` where the
caller knows them (``tokens_per_step_per_gpu``), else none. ``memory`` is the peak reserved since the last line.

The keys: torchtitan's command-line overrides of its trainer config (tyro): ``--section.key value``, and the
activation-checkpointing policy as its typed choice ``activation-checkpoint:full``. The adapter writes for
torchtitan's main branch (``TARGET``: the batch in tokens, ``training.num_tokens_per_microbatch_per_dp_rank``);
``command.framework_version: "0.3.0"`` names the PyPI release instead (``training.local_batch_size``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
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

@dataclass(frozen=True)
class Target:
    """A torchtitan release as the adapter writes for it: where its batch and activation checkpointing live."""

    version: str
    """What ``command.framework_version`` names it by."""
    source: str
    """Where its config keys were read (orchestrator/frameworks/upstream/torchtitan-<version>.txt lists them)."""
    batch: str
    """``tokens``: training.num_tokens_per_microbatch_per_dp_rank / num_tokens_per_train_step and
    parallelism.num_pp_microbatches; ``sequences``: training.local_batch_size / global_batch_size and
    parallelism.pipeline_parallel_microbatch_size."""
    checkpointing: tuple[str, ...]
    """The activation-checkpointing policies its config offers, as tyro subcommands ``activation-checkpoint:X``."""


TARGETS = {
    "main": Target("main", "pytorch/torchtitan main: torchtitan/config/training.py (TrainingConfig, commit "
                           "f204eb63c07b), torchtitan/config/configs/parallelism.py (ParallelismConfig, d76f82d28630), "
                           "torchtitan/distributed/activation_checkpoint.py (ActivationCheckpointingConfig)",
                   "tokens", ("selective", "region", "full", "memory-budget", "none")),
    "0.3.0": Target("0.3.0", "torchtitan 0.3.0 (PyPI): torchtitan/config/configs.py, "
                             "torchtitan/distributed/activation_checkpoint.py", "sequences",
                    ("selective", "full", "memory-budget", "none")),
}
"""The releases the adapter writes for; ``TARGET`` unless the sweep file names another."""
TARGET = "main"
TOML_FILE = "torchtitan_overrides.toml"
AC_PREFIX = "activation-checkpoint:"
KNOB_KEYS: dict[str, tuple[str, ...]] = {
    "batch.micro_batch_size": ("--training.num_tokens_per_microbatch_per_dp_rank", "--training.num_tokens_per_train_step",
                               "--parallelism.num_pp_microbatches", "--training.local_batch_size",
                               "--training.global_batch_size", "--parallelism.pipeline_parallel_microbatch_size"),
    "tensor_parallel.size": ("--parallelism.tensor_parallel_degree",),
    "parallel.pp": ("--parallelism.pipeline_parallel_degree", "--parallelism.num_pp_microbatches",
                    "--parallelism.pipeline_parallel_microbatch_size", "--training.local_batch_size"),
    "pipeline.schedule": ("--parallelism.pipeline_parallel_schedule",),
    "recompute.kind": (AC_PREFIX + "none", AC_PREFIX + "selective", AC_PREFIX + "full"),
}
"""Each knob a torchtitan trial can vary and the overrides that may carry it (by target); any other is refused."""
_SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved_1f1b": "Interleaved1F1B"}
_AC = {"none": "none", "selective": "selective", "full": "full"}
"""steptune's recompute kinds as torchtitan's policies. Its selective keeps what the model declares expensive (the
attention and matmul outputs), not steptune's per-module choice: the same family, not the same set."""


def target(version: str | None) -> Target:
    if version is None:
        return TARGETS[TARGET]
    if version not in TARGETS:
        raise ValueError(f"command.framework_version={version!r}: the torchtitan adapter writes for "
                         f"{', '.join(TARGETS)} (default {TARGET})")
    return TARGETS[version]


def refuse(keys: Iterable[str], t: Target | None = None) -> None:
    bad = sorted(set(keys) - set(KNOB_KEYS))
    if bad:
        raise ValueError(f"space.params.{bad[0]}: framework torchtitan cannot express {', '.join(bad)} as torchtitan "
                         f"config keys; knobs it can vary: {', '.join(KNOB_KEYS)}")


def render(cfg, keys: Sequence[str], t: Target | None = None) -> list[str]:
    """The overrides of the knobs ``keys`` for ``cfg`` on target ``t``, the activation-checkpointing subcommand
    last (tyro reads a subcommand's own flags after it). A microbatch size comes with the global batch it keeps."""
    t = t or target(None)
    seq, mbs, gb, dp, pp = (cfg.model.seq_len, cfg.batch.micro_batch_size, cfg.batch.global_batch, cfg.parallel.dp,
                            cfg.parallel.pp)
    out: list[str] = []

    def add(key: str, value) -> None:
        out.extend([key, str(value)])

    if "batch.micro_batch_size" in keys or "parallel.pp" in keys:
        if t.batch == "tokens":
            add("--training.num_tokens_per_microbatch_per_dp_rank", mbs * seq)
            add("--training.num_tokens_per_train_step", gb * seq)
            if pp > 1:  # every microbatch of a replica through the pipeline in one go: no accumulation
                add("--parallelism.num_pp_microbatches", gb // (dp * mbs))
        elif pp > 1:
            add("--training.local_batch_size", gb // dp)
            add("--parallelism.pipeline_parallel_microbatch_size", mbs)
            add("--training.global_batch_size", gb)
        else:
            add("--training.local_batch_size", mbs)
            add("--training.global_batch_size", gb)
    if "tensor_parallel.size" in keys:
        add("--parallelism.tensor_parallel_degree", cfg.tensor_parallel.size)
    if "parallel.pp" in keys:
        add("--parallelism.pipeline_parallel_degree", pp)
    if "pipeline.schedule" in keys:
        if cfg.pipeline.schedule not in _SCHEDULES:
            raise ValueError(f"pipeline.schedule={cfg.pipeline.schedule}: framework torchtitan cannot express this "
                             f"value (it knows {', '.join(_SCHEDULES)})")
        add("--parallelism.pipeline_parallel_schedule", _SCHEDULES[cfg.pipeline.schedule])
    if "recompute.kind" in keys:
        kind = cfg.to_dict()["recompute"]["kind"]
        if kind not in _AC or _AC[kind] not in t.checkpointing:
            raise ValueError(f"recompute.kind={kind}: framework torchtitan cannot express this value (it knows "
                             f"{', '.join(k for k in _AC if _AC[k] in t.checkpointing)})")
        out.append(AC_PREFIX + _AC[kind])
    return out


def overrides_toml(flags: Sequence[str]) -> str:
    """A trial's torchtitan overrides as a TOML table per config section (the same values as the flags in
    command.sh), e.g. to copy into a config registry function or a release that reads a TOML job config. The
    activation-checkpointing policy is a typed choice, given on the command line; it is written as a comment."""
    sections: dict[str, dict[str, str]] = {}
    notes = []
    rest = list(flags)
    while rest:
        a = rest.pop(0)
        if a.startswith(AC_PREFIX):
            notes.append(f"# activation checkpointing: {a} (a typed choice: command line only)")
            continue
        if not a.startswith("--") or "." not in a or not rest:
            raise ValueError(f"{a!r}: not a torchtitan --section.key value override")
        section, key = a[2:].split(".", 1)
        sections.setdefault(section, {})[key] = rest.pop(0)
    lines = ["# torchtitan overrides of this trial (steptune export): the same values as the flags in command.sh.",
             *notes]
    for section, kv in sections.items():
        lines += ["", f"[{section}]"] + [f"{k} = {_toml_value(v)}" for k, v in kv.items()]
    return "\n".join(lines) + "\n"


def _toml_value(v: str) -> str:
    if v in ("true", "false"):
        return v
    try:
        int(v)
        return v
    except ValueError:
        pass
    try:
        float(v)
        return v
    except ValueError:
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
