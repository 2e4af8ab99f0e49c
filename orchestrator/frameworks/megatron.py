"""Megatron-LM as a framework of the ``command`` backend: its log read, a trial's knobs rendered as its flags.

The log: ``training_log`` in megatron/training/training.py prints, on the last rank, one line per
``--log-interval`` iterations (``[timestamp] iteration N/ TOTAL | key: value | ...``; the timestamp is absent in
older releases) whose time, throughput and losses are averages over the interval, and ``report_memory`` prints
``[Rank R] (after N iterations) memory (MB) | allocated: ... | max allocated: ... | reserved: ... | max
reserved: ...`` once per rank. Every ``... loss`` column is kept (MoE adds ``load_balancing_loss``, MTP
``mtp_1 loss``); ``lm loss`` is the loss the parity gate compares.

The flags: the one mapping of steptune's knobs to Megatron-LM flags (orchestrator.frameworks.megatron_flags,
shared with ``export``), cut to the flags of the knobs a sweep varies, so the user's own fixed flags (model,
data, tokenizer) stay theirs.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from orchestrator.frameworks.log import Iteration, ParsedLog, judge, number
from orchestrator.frameworks.megatron_flags import check_args, flag_values, megatron_args

NAME = "megatron"
_ITERATION = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|(.*)$")
_MEMORY = re.compile(r"memory \(MB\)\s*\|(.*)$")
_MB = 2**20  # report_memory divides torch.cuda byte counts by 1024 x 1024
_MEMORY_KEYS = {"allocated": "allocated", "max allocated": "max_allocated", "reserved": "reserved",
                "max reserved": "max_reserved"}
_NOT_LOSSES = ("loss scale",)


def _fields(rest: str) -> dict[str, str]:
    out = {}
    for part in rest.split("|"):
        key, sep, value = part.partition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


def _iteration(step: int, first: int, f: dict[str, str]) -> Iteration:
    def get(key: str) -> float | None:
        return number(f[key]) if key in f else None

    ms = get("elapsed time per iteration (ms)")
    if ms is None:
        raise ValueError("no 'elapsed time per iteration (ms)'")
    losses = {k: number(v) for k, v in f.items() if "loss" in k and k not in _NOT_LOSSES}
    return Iteration(step=step, first_step=first, time_s=ms / 1e3, loss=losses.get("lm loss"),
                     grad_norm=get("grad norm"), losses=losses, tflops_per_gpu=get("throughput per GPU (TFLOP/s/GPU)"),
                     skipped=int(get("number of skipped iterations") or 0), nan=int(get("number of nan iterations") or 0))


def parse_log(text: str, warmup: int = 1, expected: int | None = None) -> ParsedLog:
    """A Megatron-LM log (any rank's or all nodes' stdout together) -> ParsedLog. ``expected`` defaults to the
    ``/ TOTAL`` the lines print (``--train-iters``)."""
    its: list[Iteration] = []
    memory: dict[str, int] = {}
    ignored, prev, total = 0, 0, None
    for line in text.splitlines():
        if m := _ITERATION.search(line):
            step = int(m.group(1))
            try:
                its.append(_iteration(step, min(prev, step - 1) + 1, _fields(m.group(3))))
                total = int(m.group(2))
            except ValueError:
                ignored += 1
            prev = step
        elif m := _MEMORY.search(line):
            try:
                for key, value in _fields(m.group(1)).items():
                    if key in _MEMORY_KEYS:
                        name = _MEMORY_KEYS[key]
                        memory[name] = max(memory.get(name, 0), int(number(value) * _MB))
            except ValueError:
                ignored += 1
    return judge(NAME, its, warmup, expected if expected is not None else total, memory, ignored)


# ---- knobs -> flags ----------------------------------------------------------------------------------

KNOB_FLAGS: dict[str, tuple[str, ...]] = {
    "batch.micro_batch_size": ("--micro-batch-size",),
    "tensor_parallel.size": ("--tensor-model-parallel-size",),
    "tensor_parallel.sequence_parallel": ("--sequence-parallel",),
    "parallel.pp": ("--pipeline-model-parallel-size",),
    "pipeline.virtual_stages": ("--num-layers-per-virtual-pipeline-stage", "--pipeline-model-parallel-layout"),
    "pipeline.split": ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
                       "--pipeline-model-parallel-layout"),
    "data_parallel.kind": ("--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather",
                           "--ddp-bucket-size"),
    "data_parallel.overlap_grad_reduce": ("--overlap-grad-reduce",),
    "data_parallel.bucket_mb": ("--ddp-bucket-size",),
    "recompute.kind": ("--recompute-granularity", "--recompute-method", "--recompute-num-layers",
                       "--recompute-modules"),
    "recompute.modules": ("--recompute-modules",),
    "recompute.method": ("--recompute-method",),
    "recompute.num_layers": ("--recompute-num-layers",),
}
"""Each knob a Megatron-LM trial can vary, and the flags of the shared mapping that carry it. A knob not here
(pipeline.schedule gpipe, recompute op, FSDP's prefetch...) has no faithful Megatron flag: refused at load."""
_SPLIT_KEYS = ("pipeline.split.", "pipeline.split")


def knob_of(key: str) -> str:
    """A space key as KNOB_FLAGS names it (``pipeline.split.first`` -> ``pipeline.split``)."""
    return "pipeline.split" if key.startswith(_SPLIT_KEYS) else key


def refuse(keys: Iterable[str]) -> None:
    """ValueError naming each knob Megatron-LM cannot express, and the knobs it can."""
    bad = sorted({k for k in keys if knob_of(k) not in KNOB_FLAGS})
    if bad:
        raise ValueError(f"space.params.{bad[0]}: framework megatron cannot express {', '.join(bad)} as Megatron-LM "
                         f"flags; knobs it can vary: {', '.join(KNOB_FLAGS)}")


def render(cfg, keys: Sequence[str]) -> list[str]:
    """The Megatron-LM flags of the knobs ``keys`` for a trial config, from the shared mapping; ValueError where
    the mapping's flags break a rule Megatron asserts at start-up (megatron_flags.check_args, as export)."""
    args, notes = megatron_args(cfg)
    if bad := check_args(args):
        raise ValueError(f"framework megatron: {'; '.join(bad)}")
    for note in notes:  # a varied knob whose value has no Megatron flag would run as something else: refused
        key, _, rest = note.removeprefix("not mapped: ").partition("=")
        if note.startswith("not mapped: ") and rest and (key in keys or knob_of(key) in keys):
            raise ValueError(f"{key}={rest.split(' ')[0]}: framework megatron cannot express this value "
                             f"({note.removeprefix('not mapped: ')})")
    owned = {f for k in keys for f in KNOB_FLAGS[knob_of(k)]}
    out: list[str] = []
    for a in args:
        if a.startswith("--") and a in owned:
            out += [a, *(flag_values(args, a) or [])]
    return out
