"""One prediction for one plan: the ``model`` trial backend's answer."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from .band import Band, load_band
from .config import PlanConfig
from .knobs import Consts, encode
from .memory import MEMORY_PARTS, stage_memory
from .timing import step_times

MFU_BASIS = "6 * total_params * tokens_per_s / (num_gpus * peak_flops): model FLOPs only, no attention or recompute"
BREAKDOWN = ("forward_s", "backward_s", "recompute_s", "dp_exposed_s", "dp_total_s", "pp_bubble_s",
             "pp_p2p_s", "tp_comm_s", "optimizer_s")
"""Phases of the update. All but dp_total_s add up to step_time_s; dp_total_s is the traffic before overlap."""


@dataclass(frozen=True)
class Prediction:
    """Predicted update time, its breakdown along the critical path, and memory per pipeline stage."""

    step_time_s: float
    """Seconds per update (optimizer step)."""
    forward_s: float
    """Forward compute of the slowest stage over all its microbatches."""
    backward_s: float
    """Backward compute of the slowest stage (without recompute)."""
    recompute_s: float
    """Forward work repeated for activation recomputation on the slowest stage."""
    dp_exposed_s: float
    """Data-parallel communication left on the critical path after overlap (with FSDP: everything its
    per-block gathers and reduce-scatters add to the update, fill and drain included)."""
    dp_total_s: float
    """All data-parallel communication of the busiest stage, hidden or not."""
    pp_bubble_s: float
    """Pipeline fill and drain: the slowest stage waiting on the others."""
    pp_p2p_s: float
    """Pipeline point-to-point sends on the critical path."""
    tp_comm_s: float
    """Tensor-parallel communication not hidden under GEMMs."""
    optimizer_s: float
    """The optimizer step (memory-bound)."""
    compute_track_s: float
    """Everything but data-parallel waiting and the optimizer: what a timeline shows as computation."""
    peak_memory_bytes: float
    """Peak over stages of params + grads + optimizer state + activations + reserved."""
    memory_per_stage: list[dict[str, float]]
    """Bytes per stage by kind: params, grads, optimizer, activations, fsdp_buffers, reserved, total."""
    fits_memory: bool
    """peak_memory_bytes <= the cluster's HBM per GPU."""
    tokens_per_s: float
    mfu: float
    mfu_basis: str
    microbatches: int
    critical_stage: int
    """Index of the stage whose per-microbatch work sets the pipeline's pace."""
    step_time_low_s: float
    """Lower end of the band around step_time_s (see band_basis)."""
    step_time_high_s: float
    """Upper end of the band: what a robust plan is judged by."""
    band_basis: str
    """Where the band comes from (coverage, the ranks it is cut at, how many held-out runs)."""
    efficiency_basis: str
    """prior | blind | calibrated | fitted: which kind of efficiency set produced this prediction."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def point_step_time(cfg: PlanConfig) -> float:
    """The point step time alone, with no band: what the band itself is computed from."""
    return float(step_times(Consts.of(cfg), encode([cfg]))["step_time_s"][0])


def predict(cfg: PlanConfig, band: Band | None = None) -> Prediction:
    """The planner's estimate for one validated config, with its band (default: the corpus's stored band)."""
    C, K = Consts.of(cfg), encode([cfg])
    t = {k: float(v[0]) for k, v in step_times(C, K).items()}
    mem = stage_memory(C, K)
    stages = [{k: float(mem[k][0, s]) for k in MEMORY_PARTS + ("total",)}
              for s in range(cfg.parallel.pp)]
    tokens_per_s = cfg.batch.global_batch * cfg.job.seq_len / t["step_time_s"]
    mfu = 6.0 * cfg.model.total_params * tokens_per_s / (cfg.cluster.num_gpus * cfg.cluster.peak_flops)
    return Prediction(
        step_time_s=t["step_time_s"], **{k: t[k] for k in BREAKDOWN}, compute_track_s=t["compute_track_s"],
        peak_memory_bytes=float(mem["peak"][0]), memory_per_stage=stages, fits_memory=bool(mem["fits"][0]),
        tokens_per_s=tokens_per_s, mfu=mfu, mfu_basis=MFU_BASIS, microbatches=cfg.microbatches,
        critical_stage=int(t["critical_stage"]), **_band_fields(t["step_time_s"], band or load_band()),
        efficiency_basis=cfg.efficiency.basis,
    )


def _band_fields(point: float, band: Band) -> dict[str, Any]:
    lo, hi = band.apply(point)
    return {"step_time_low_s": lo, "step_time_high_s": hi, "band_basis": band.basis}
