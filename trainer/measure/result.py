"""Result dataclasses and their JSON form (the schema documented in docs/trainer.md).

A ``RankResult`` is what one rank measured; ``merge`` folds them into one ``Result`` (step times: max over
ranks, since an update is done when its slowest rank is; phases and memory: min and max over ranks).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from dataclasses import dataclass, field
from typing import Any

from trainer.config import TrainConfig
from trainer.measure.flops import model_flops_per_token, recompute_flops_per_token

PHASES = ("forward", "backward", "optimizer", "dp_comm_wait", "pipeline_idle", "tp_comm")
NESTED_PHASES = ("tp_comm",)
"""Phases measured inside others: tp_comm (the tensor-parallel collectives, each waited for where issued) is
part of forward, backward (and the optimizer phase's gradient finish); never add it to them."""


def trace_name(rank: int) -> str:
    """File name of a rank's ``run.profile_step`` trace (``RankResult.trace_file``): what TensorBoard's profiler
    plugin and Perfetto both open."""
    return f"rank{rank}.pt.trace.json.gz"


class NonFiniteLoss(RuntimeError):
    """The global loss became NaN or infinite; raised on every rank at the same step."""


@dataclass
class StepRecord:
    step: int
    time_s: float
    """Wall time of the update on this rank, device-synchronised at both ends."""
    loss: float
    """Mean next-token cross-entropy over every token of the global batch."""
    grad_norm: float
    """Global L2 norm of the gradient (all stages, all shards) before clipping."""
    tokens: int
    """Tokens in the global batch (input tokens that were scored)."""


@dataclass
class Span:
    step: int
    phase: str
    start_s: float
    end_s: float
    """Seconds since the start of that update on this rank."""


@dataclass
class RankResult:
    rank: int
    pp_rank: int
    dp_rank: int
    stage_ids: list[int]
    layer_ids: list[int]
    device_name: str
    steps: list[StepRecord]
    phase_s: dict[str, float]
    """Median over measured steps of the seconds spent in each phase per update."""
    reduce_start_after_backward_s: float | None
    """Median over measured steps of (first gradient-reduction launch - end of the last backward); negative
    means reduction started under backward (overlap). None when there is nothing to reduce (dp = 1)."""
    spans: list[Span]
    memory: dict[str, int]
    fingerprint: dict[str, list[float]]
    """Canonical parameter name -> [sum of squares, sum, is_shard] of the final parameters this rank holds.
    is_shard 1: a piece this rank alone counts (a TP or FSDP shard, or a replicated tensor on the first rank
    holding it), added up over ranks; 0 (older results): a whole tensor, taken from dp_rank 0.
    ``merge_fingerprints`` folds them into [L2 norm, sum] per name."""
    replica_max_abs_diff: float
    """Largest |difference| of a parameter element between this rank's dp group members at the end."""
    peak_flops: float | None
    peak_basis: str
    trace_file: str | None = None
    tp_rank: int = 0
    """Position in the tensor-parallel group (rank = (pp_rank x dp + dp_rank) x tp + tp_rank)."""
    """The torch.profiler trace of ``run.profile_step`` this rank wrote (a path on its node), if any."""


@dataclass
class Summary:
    step_time_s: float
    """Median over measured (post warm-up) updates of the slowest rank's update time."""
    step_time_min_s: float
    step_time_max_s: float
    n_measured_steps: int
    tokens_per_step: int
    tokens_per_s: float
    model_flops_per_step: float
    """6 x N x tokens + attention (12 x layers x d_model x seq_len x tokens); N = matmul parameters."""
    hardware_flops_per_step: float
    """Model FLOPs plus the forward FLOPs that recompute repeats."""
    mfu: float | None
    hfu: float | None
    peak_flops_per_rank: float | None
    peak_basis: str
    peak_memory_bytes: int
    """Largest over ranks; what it counts is peak_memory_basis."""
    peak_memory_basis: str


@dataclass
class Result:
    config: dict[str, Any]
    world_size: int
    n_microbatches: int
    steps: list[StepRecord]
    summary: Summary
    phases: dict[str, dict[str, float]]
    """Phase -> {min, max} over ranks of the per-rank median seconds per update."""
    memory: dict[str, dict[str, int]]
    """Memory metric -> {min, max} over ranks."""
    reduce_start_after_backward_s: float | None
    fingerprint: dict[str, list[float]]
    replica_max_abs_diff: float
    ranks: list[RankResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Result":
        d = dict(d)
        d["steps"] = [StepRecord(**s) for s in d["steps"]]
        d["summary"] = Summary(**d["summary"])
        d["ranks"] = [_rank_from_dict(r) for r in d.get("ranks", [])]
        return cls(**d)


def _rank_from_dict(r: dict[str, Any]) -> RankResult:
    r = dict(r)
    r["steps"] = [StepRecord(**s) for s in r["steps"]]
    r["spans"] = [Span(**s) for s in r["spans"]]
    return RankResult(**r)


def merge(ranks: list[RankResult], *, config: dict[str, Any], n_microbatches: int, warmup_steps: int,
          model_flops_per_step: float, hardware_flops_per_step: float, peak_memory_basis: str) -> Result:
    ranks = sorted(ranks, key=lambda r: r.rank)
    n_steps = len(ranks[0].steps)
    steps = []
    for i in range(n_steps):
        per_rank = [r.steps[i] for r in ranks]
        # Every rank holds the same all-reduced loss and norm; take them from rank 0.
        s0 = per_rank[0]
        steps.append(StepRecord(s0.step, max(s.time_s for s in per_rank), s0.loss, s0.grad_norm, s0.tokens))
    measured = [s.time_s for s in steps[warmup_steps:]]
    step_time = statistics.median(measured)
    tokens = steps[0].tokens
    peaks = [r.peak_flops for r in ranks]
    peak = min(peaks) if all(p for p in peaks) else None
    world = len(ranks)
    mfu = model_flops_per_step / step_time / (world * peak) if peak else None
    hfu = hardware_flops_per_step / step_time / (world * peak) if peak else None
    memory_keys = sorted({k for r in ranks for k in r.memory})
    memory = {k: {"min": min(r.memory.get(k, 0) for r in ranks), "max": max(r.memory.get(k, 0) for r in ranks)}
              for k in memory_keys}
    summary = Summary(
        step_time_s=step_time, step_time_min_s=min(measured), step_time_max_s=max(measured),
        n_measured_steps=len(measured), tokens_per_step=tokens, tokens_per_s=tokens / step_time,
        model_flops_per_step=model_flops_per_step, hardware_flops_per_step=hardware_flops_per_step,
        mfu=mfu, hfu=hfu, peak_flops_per_rank=peak, peak_basis=ranks[0].peak_basis,
        peak_memory_bytes=memory.get("peak_bytes", {"max": 0})["max"], peak_memory_basis=peak_memory_basis,
    )
    phases = {p: {"min": min(r.phase_s.get(p, 0.0) for r in ranks), "max": max(r.phase_s.get(p, 0.0) for r in ranks)}
              for p in PHASES}
    reduce = [r.reduce_start_after_backward_s for r in ranks if r.reduce_start_after_backward_s is not None]
    return Result(
        config=config, world_size=world, n_microbatches=n_microbatches, steps=steps, summary=summary,
        phases=phases, memory=memory, reduce_start_after_backward_s=max(reduce) if reduce else None,
        fingerprint=merge_fingerprints(ranks), replica_max_abs_diff=max(r.replica_max_abs_diff for r in ranks),
        ranks=ranks,
    )


def merge_fingerprints(ranks: list[RankResult]) -> dict[str, list[float]]:
    """Layout-independent fingerprint: [L2 norm, sum] per canonical parameter name.

    Each dp replica holds the same values, so only dp_rank 0's copy (or the dp group's shards, for
    FSDP: each shard reports its own partial sum of squares and sum) is folded in.
    """
    sq: dict[str, float] = {}
    total: dict[str, float] = {}
    for r in ranks:
        for name, (sumsq, s, is_shard) in _parts(r):
            if not is_shard and r.dp_rank != 0:
                continue
            sq[name] = sq.get(name, 0.0) + sumsq
            total[name] = total.get(name, 0.0) + s
    return {n: [sq[n] ** 0.5, total[n]] for n in sorted(sq)}


def _parts(r: RankResult):
    for name, (sumsq, total, is_shard) in r.fingerprint.items():
        yield name, (sumsq, total, bool(is_shard))


def peak_memory_basis(cfg: TrainConfig) -> str:
    if cfg.run.device == "cuda":
        return "torch.cuda.max_memory_allocated (caching-allocator peak, reset at run start)"
    return ("CPU: parameter + gradient + optimizer-state bytes + peak saved-activation bytes "
            "(saved_tensors_hooks); process RSS reported separately")


def finalize(cfg: TrainConfig, ranks: list[RankResult]) -> Result:
    """The ranks' results of ``cfg`` merged into one, with its FLOPs per update and peak-memory basis; torch-free,
    so the driver reads results without importing torch."""
    tokens = cfg.batch.global_batch * cfg.model.seq_len
    model_flops = tokens * model_flops_per_token(cfg.model)
    return merge(ranks, config=cfg.to_dict(), n_microbatches=cfg.n_microbatches, warmup_steps=cfg.run.warmup_steps,
                 model_flops_per_step=model_flops,
                 hardware_flops_per_step=model_flops + tokens * recompute_flops_per_token(cfg),
                 peak_memory_basis=peak_memory_basis(cfg))
