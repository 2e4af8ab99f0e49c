"""The memory pre-filter: predict a real trial's peak memory with the planner and skip configs that cannot fit.

``plan_for_trial`` maps a trainer config (``trainer.config.TrainConfig``) onto the planner's ``PlanConfig``;
``MemoryPrefilter.check`` evaluates only the planner's memory model (well under a millisecond) and says
whether a sweep should launch the trial. A config the planner cannot represent is never skipped: the
pre-filter says so and the trial runs, since only a prediction may stop a launch.

What the trainer measures on CPU (``trainer/run.py``) is parameter + gradient + optimizer-state bytes plus
the peak of saved-activation bytes; the planner's ``job.precision`` modes ``fp32`` and ``bf16_autocast``
reproduce the first three exactly (docs/planner.md, "Accuracy against the real trainer", gives the measured
activation error).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

from orchestrator.planner import ClusterSpec, Efficiency, JobSpec, ModelSpec, PlanConfig
from orchestrator.planner.config import OptimizerSharding, PipelineComm
from orchestrator.planner.knobs import Consts, encode
from orchestrator.planner.memory import MEMORY_PARTS, stage_memory
from orchestrator.planner.parse import plan_config_from_dict
from orchestrator.records.record import Status, TrialRecord
from orchestrator.units import fmt_bytes as _fmt

REASON_PREFIX = "prefilter:"
"""Every reason the pre-filter writes starts with this, so a ledger's skipped lines can be told apart."""


# ---- the cluster file --------------------------------------------------------------------------

def load_cluster(path: str | Path) -> tuple[ClusterSpec, Efficiency]:
    """A cluster file (``cluster:``, optional ``efficiency:`` priors and ``provenance:``) -> validated specs.

    ``provenance`` (where the figures come from: ``steptune netcal`` writes it) is for people; the planner
    does not read it.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"cluster file {path}: no such file")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping) or "cluster" not in data:
        raise ValueError(f"{path}: expected a mapping with a cluster: section (and optionally efficiency:)")
    extra = sorted(set(data) - {"cluster", "efficiency", "provenance"})
    if extra:
        raise ValueError(f"{path}: {extra[0]}: unknown section; known: cluster, efficiency, provenance")
    # A one-rank placeholder plan lets the planner's own parser validate and name bad fields.
    plan = plan_config_from_dict({"cluster": {**data["cluster"], "num_gpus": 1},
                                  "efficiency": data.get("efficiency") or {}}, where=str(path))
    cluster = dataclasses.replace(plan.cluster, num_gpus=int(data["cluster"].get("num_gpus", 1)))
    return cluster, plan.efficiency


# ---- trainer config -> planner config ----------------------------------------------------------

def plan_for_trial(train_cfg: Any, cluster: ClusterSpec, efficiency: Efficiency | None = None) -> PlanConfig:
    """The planner's view of a trainer config on ``cluster`` (its GPU count becomes the trial's tp x pp x dp).

    The knob sections (batch, parallel, tensor_parallel, pipeline, recompute, data_parallel) are the trainer's own objects,
    passed through: they mean the same to both. What the planner cannot represent raises ValueError naming
    the field (the pre-filter then launches the config unpredicted); ``mapping_notes`` lists the
    approximations made for everything else.
    """
    m, par = train_cfg.model, train_cfg.parallel
    model = ModelSpec(num_layers=m.n_layers, hidden_size=m.d_model, num_heads=m.n_heads, ffn_hidden_size=m.ffn_dim,
                      vocab_size=m.vocab_size, tied_embeddings=False, linear_biases=False,
                      # CPU and CUDA SDPA pick fused kernels that keep no s x s scores (measured on CPU:
                      # ScaledDotProductFlashAttentionForCpu), which is what flash_attention models.
                      flash_attention=True, position_embeddings=m.seq_len, layer_gemms=m.layer_matmuls)
    job = JobSpec(seq_len=m.seq_len, precision="fp32" if train_cfg.run.precision == "fp32" else "bf16_autocast")
    pipeline = train_cfg.pipeline
    if par.pp == 1:
        # Without a pipeline the trainer accumulates microbatches one at a time, whatever the schedule says:
        # one microbatch in flight, which is the planner's 1F1B on a single stage.
        pipeline = dataclasses.replace(pipeline, schedule="1f1b", virtual_stages=1)
    return PlanConfig(cluster=dataclasses.replace(cluster, num_gpus=train_cfg.world_size), model=model, job=job,
                      efficiency=efficiency or Efficiency(), parallel=par,
                      tensor_parallel=train_cfg.tensor_parallel, batch=train_cfg.batch,
                      pipeline=pipeline, recompute=train_cfg.recompute, data_parallel=train_cfg.data_parallel,
                      # The trainer: plain AdamW on every replica, fp32 gradients.
                      optimizer=OptimizerSharding(distributed=False, grad_reduce_dtype="fp32"),
                      # torch pipelining posts a stage's receive when its action runs, not ahead of the
                      # compute before it, so the transfer stays on the critical path.
                      pipeline_comm=PipelineComm(overlap_p2p=False))


def mapping_notes(train_cfg: Any) -> list[str]:
    """Where ``plan_for_trial`` approximates: what differs and which way it errs."""
    from trainer.config import FsdpDP, TorchDDP

    notes = []
    dpc, par = train_cfg.data_parallel, train_cfg.parallel
    if isinstance(dpc, TorchDDP) and par.dp > 1:
        notes.append("data_parallel.kind=torch_ddp is modelled as the bucketed all-reduce with overlap; DDP's own "
                     "gradient buckets (one more gradient copy) are not counted, as the CPU measurement does not")
    if isinstance(dpc, FsdpDP) and par.dp == 1:
        notes.append("data_parallel.kind=fsdp with dp=1 shards nothing: modelled as replicated")
    if isinstance(dpc, FsdpDP) and par.dp > 1:
        notes.append("data_parallel.kind=fsdp: the prediction adds FSDP's unsharded buffers (gathered blocks, the "
                     "reduce-scatter input, accumulated gradients), which the CPU measurement does not count")
    if par.pp == 1 and train_cfg.pipeline.schedule != "1f1b":
        notes.append(f"pipeline.schedule={train_cfg.pipeline.schedule} has no effect with pp=1 (gradient "
                     f"accumulation, one microbatch in flight)")
    return notes


# ---- the pre-filter ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Verdict:
    """One pre-filter decision. ``predicted_bytes`` is None when the config could not be predicted."""

    skip: bool
    reason: str
    predicted_bytes: float | None = None
    budget_bytes: float | None = None
    stage: int | None = None
    parts: dict[str, float] | None = None
    """Bytes of the peak stage by kind: params, grads, optimizer, activations, fsdp_buffers, reserved."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class MemoryPrefilter:
    """Skip trainer configs whose predicted peak memory per rank exceeds a budget.

    ``efficiency`` should be a calibrated one (``orchestrator.calibration.ledger_fit``); without it the planner's
    defaults are used. ``budget_bytes`` defaults to the cluster's memory per GPU (``hbm_gb``). A config is
    skipped when its prediction exceeds ``budget_bytes * (1 + margin)``: a positive margin (say the
    calibrated memory fit's max error) keeps a model error from stopping a config that would have fit.
    """

    def __init__(self, cluster: ClusterSpec, efficiency: Efficiency | None = None, budget_bytes: float | None = None,
                 margin: float = 0.0):
        if budget_bytes is not None and not budget_bytes > 0:
            raise ValueError(f"prefilter budget: must be > 0 bytes, got {budget_bytes!r}")
        if not margin >= 0:
            raise ValueError(f"prefilter.margin: must be >= 0, got {margin!r}")
        self.cluster = cluster
        self.efficiency = efficiency or Efficiency()
        self.budget_bytes = float(budget_bytes) if budget_bytes is not None else cluster.hbm_bytes
        self.margin = float(margin)
        self.checked = self.skipped = self.not_predicted = 0

    def verdict(self, train_cfg: Any) -> Verdict:
        self.checked += 1
        try:
            plan = plan_for_trial(train_cfg, self.cluster, self.efficiency)
        except ValueError as e:
            self.not_predicted += 1
            return Verdict(False, f"{REASON_PREFIX} not predicted, launched anyway ({e})",
                           budget_bytes=self.budget_bytes)
        mem = stage_memory(Consts.of(plan), encode([plan]))
        stage = int(mem["peak_stage"][0])
        peak = float(mem["peak"][0])
        parts = {k: float(mem[k][0, stage]) for k in MEMORY_PARTS}
        detail = ", ".join(f"{k} {_fmt(v)}" for k, v in parts.items() if v)
        where = f"pipeline stage {stage}" if plan.parallel.pp > 1 else "each rank"
        limit = self.budget_bytes * (1.0 + self.margin)
        if peak > limit:
            self.skipped += 1
            margin = f" (+{self.margin:.0%} margin)" if self.margin else ""
            return Verdict(True, f"{REASON_PREFIX} predicted peak {_fmt(peak)} on {where} > budget "
                                 f"{_fmt(self.budget_bytes)}{margin} ({detail}); not launched",
                           peak, self.budget_bytes, stage, parts)
        return Verdict(False, f"{REASON_PREFIX} predicted peak {_fmt(peak)} on {where} fits the budget "
                              f"{_fmt(self.budget_bytes)} ({detail})", peak, self.budget_bytes, stage, parts)

    def check(self, train_cfg: Any) -> tuple[bool, str]:
        """(True, why) to skip the config, (False, why) to launch it."""
        v = self.verdict(train_cfg)
        return v.skip, v.reason

    def summary(self) -> str:
        return (f"memory pre-filter: {self.checked} configs checked, {self.skipped} not launched (predicted over "
                f"{_fmt(self.budget_bytes)}), {self.not_predicted} launched without a prediction")


# ---- the sweep's prefilter: section ------------------------------------------------------------

SETTINGS = ("enabled", "cluster", "calibration", "memory_budget_gb", "margin")


def prefilter_summary(records: Iterable[TrialRecord]) -> dict[str, Any]:
    """From a ledger's records: how many trials the pre-filter kept from launching, and the reasons (one per trial)."""
    skipped = [r for r in records if r.status is Status.SKIPPED and (r.reason or "").startswith(REASON_PREFIX)]
    return {"skipped": len(skipped), "reasons": {r.trial: r.reason for r in skipped}}


def prefilter_summary_text(summary: Mapping[str, Any], limit: int = 5) -> str:
    """``prefilter_summary``'s result as the lines a sweep summary prints."""
    n = summary["skipped"]
    if not n:
        return "memory pre-filter: no config was predicted over the memory budget"
    lines = [f"memory pre-filter: {n} config(s) not launched, predicted over the memory budget:"]
    for trial, reason in list(summary["reasons"].items())[:limit]:
        lines.append(f"  trial {trial}: {reason[len(REASON_PREFIX):].strip()}")
    if n > limit:
        lines.append(f"  ... and {n - limit} more (the ledger's skipped lines)")
    return "\n".join(lines)
