"""The plan: fixed context (cluster, model, job, efficiency) plus the throughput knobs, validated once.

Knob groups mirror the flat dotted knob names the trainer uses (``batch.micro_batch_size``,
``pipeline.split.first``, ``recompute.num_layers``, ...). Mutually exclusive options are separate types
chosen in YAML by ``kind:``. Every error is a ValueError naming the dotted field to change.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Union

from .checks import check_bool, check_choice, check_int, check_num
from .cluster import ClusterSpec, Efficiency, JobSpec, ModelSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")
RECOMPUTE_METHODS = ("uniform", "block")
SELECTIVE_MODULES = ("core_attn", "mlp", "norm")
GRAD_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class ParallelConfig:
    """Parallel degrees (planner-only knobs; the trainer launches a world of this shape)."""

    tp: int = 1
    """Tensor-parallel size: each layer's GEMMs split over tp GPUs, best kept inside a node."""
    pp: int = 1
    """Pipeline-parallel size: stages of consecutive layers."""
    dp: int = 1
    """Data-parallel replicas at each (tp, pp) position."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism (Korthikanti et al. 2022): LayerNorm/dropout activations and
    pipeline sends are split over tp instead of replicated. A no-op at tp = 1."""

    def __post_init__(self) -> None:
        for f in ("tp", "pp", "dp"):
            check_int(self, f, 1)
        check_bool(self, "sequence_parallel")


@dataclass(frozen=True)
class BatchConfig:
    micro_batch_size: int = 1
    """Sequences per microbatch. The global batch is fixed, so the microbatch count follows:
    global_batch / (micro_batch_size * dp), which must be whole."""

    def __post_init__(self) -> None:
        check_int(self, "micro_batch_size", 1)


@dataclass(frozen=True)
class BalancedSplit:
    """num_layers / pp layers on every pipeline stage (must divide evenly)."""

    kind = "balanced"


@dataclass(frozen=True)
class FirstLastSplit:
    """Megatron's decoder_first/last_pipeline_num_layers: set layer counts on the first and last pipeline
    stages (ranks), the remaining layers spread evenly over the middle stages, which must divide evenly.
    With interleaving each stage's layers are spread evenly over its virtual chunks, as Megatron does."""

    kind = "first_last"
    first: int = 1
    """Layers on the first stage (which also holds the embedding and the most in-flight activations)."""
    last: int = 1
    """Layers on the last stage (which also computes the LM head and the loss)."""

    def __post_init__(self) -> None:
        check_int(self, "first", 1)
        check_int(self, "last", 1)


Split = Union[BalancedSplit, FirstLastSplit]


@dataclass(frozen=True)
class PipelineConfig:
    schedule: str = "1f1b"
    """gpipe (all forwards, then all backwards), 1f1b (PipeDream-Flush, Narayanan et al. 2021 Sec. 2.2.1),
    or interleaved_1f1b (virtual stages per rank, Sec. 2.2.2)."""
    virtual_stages: int = 1
    """Model chunks per rank for interleaved_1f1b (bubble / virtual_stages); must be 1 otherwise."""
    split: Split = field(default_factory=BalancedSplit)
    """How layers are assigned to pipeline stages."""

    def __post_init__(self) -> None:
        check_choice(self, "schedule", SCHEDULES)
        check_int(self, "virtual_stages", 1)
        if self.schedule == "interleaved_1f1b" and self.virtual_stages < 2:
            raise ValueError("virtual_stages: interleaved_1f1b needs >= 2 (use 1f1b for one chunk per rank)")
        if self.schedule != "interleaved_1f1b" and self.virtual_stages != 1:
            raise ValueError(f"virtual_stages: only interleaved_1f1b uses virtual stages "
                             f"(got {self.virtual_stages} with schedule {self.schedule})")
        if not isinstance(self.split, (BalancedSplit, FirstLastSplit)):
            raise ValueError(f"split: expected a BalancedSplit or FirstLastSplit, got {self.split!r}")


@dataclass(frozen=True)
class NoRecompute:
    """Keep every activation the backward pass needs."""

    kind = "none"


@dataclass(frozen=True)
class SelectiveRecompute:
    """Recompute parts of each layer (Korthikanti et al. 2022 Sec. 5; Megatron's recompute_modules).

    core_attn drops the attention scores (the 5as^2b term; nothing to drop under flash attention), mlp
    drops the MLP's inner activations, norm drops the LayerNorm outputs."""

    kind = "selective"
    modules: tuple[str, ...] = ("core_attn",)
    """Which parts to recompute: any of core_attn, mlp, norm."""

    def __post_init__(self) -> None:
        mods = self.modules
        if isinstance(mods, list):
            object.__setattr__(self, "modules", mods := tuple(mods))
        if not isinstance(mods, tuple) or not mods or len(set(mods)) != len(mods) \
                or any(m not in SELECTIVE_MODULES for m in mods):
            raise ValueError(f"modules: must be a non-empty list of distinct {', '.join(SELECTIVE_MODULES)};"
                             f" got {mods!r}")


@dataclass(frozen=True)
class FullRecompute:
    """Recompute whole layers from a checkpointed input (Megatron recompute_granularity=full)."""

    kind = "full"
    method: str = "uniform"
    """uniform: every layer recomputed, checkpoints every num_layers layers; block: only the first
    num_layers layers of each model chunk recomputed, the rest keep their activations."""
    num_layers: int = 1
    """Group size (uniform) or recomputed layers per chunk (block); more than a chunk holds means all."""

    def __post_init__(self) -> None:
        check_choice(self, "method", RECOMPUTE_METHODS)
        check_int(self, "num_layers", 1)


Recompute = Union[NoRecompute, SelectiveRecompute, FullRecompute]


@dataclass(frozen=True)
class DataParallelConfig:
    overlap_grad_reduce: bool = False
    """Reduce gradient buckets as soon as they are final, under the remaining backward work. Off: the
    whole reduction runs after the backward pass, on the critical path."""
    overlap_param_gather: bool = False
    """Gather updated parameter buckets under the next step's forward (needs distributed_optimizer)."""
    bucket_mb: float = 40.0
    """Bucket size in MB of bf16 gradients (Megatron's ddp bucket size is bucket_mb * 1e6 / 2 params).
    Larger: fewer collectives (less latency) but a longer last bucket that nothing can hide."""
    distributed_optimizer: bool = True
    """Shard optimizer state over dp (ZeRO-1, Megatron distributed optimizer): reduce-scatter gradients,
    all-gather parameters. Off: all-reduce gradients, full optimizer state on every replica."""
    grad_reduce_dtype: str = "fp32"
    """Precision of main gradients and their reduction (Megatron default fp32; bf16 halves both)."""

    def __post_init__(self) -> None:
        check_bool(self, "overlap_grad_reduce")
        check_bool(self, "overlap_param_gather")
        check_bool(self, "distributed_optimizer")
        check_num(self, "bucket_mb", lo=0.0, lo_open=True)
        check_choice(self, "grad_reduce_dtype", GRAD_DTYPES)
        if self.overlap_param_gather and not self.distributed_optimizer:
            raise ValueError("overlap_param_gather: needs distributed_optimizer (only it gathers parameters)")


@dataclass(frozen=True)
class PlanConfig:
    """Everything one prediction needs. Cross-field rules are checked here, once."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    job: JobSpec = field(default_factory=JobSpec)
    efficiency: Efficiency = field(default_factory=Efficiency)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    recompute: Recompute = field(default_factory=NoRecompute)
    data_parallel: DataParallelConfig = field(default_factory=DataParallelConfig)

    def __post_init__(self) -> None:
        par, model = self.parallel, self.model
        if par.tp * par.pp * par.dp != self.cluster.num_gpus:
            raise ValueError(f"parallel.dp: tp*pp*dp = {par.tp}*{par.pp}*{par.dp} = {par.tp * par.pp * par.dp} "
                             f"must equal cluster.num_gpus = {self.cluster.num_gpus}")
        if model.num_heads % par.tp or model.ffn % par.tp:
            raise ValueError(f"parallel.tp: {par.tp} must divide model.num_heads ({model.num_heads}) "
                             f"and the MLP width ({model.ffn})")
        per_step = self.batch.micro_batch_size * par.dp
        if self.job.global_batch % per_step:
            raise ValueError(f"batch.micro_batch_size: global batch {self.job.global_batch} is not divisible "
                             f"by micro_batch_size*dp = {self.batch.micro_batch_size}*{par.dp}; the global "
                             f"batch is fixed, so pick a micro_batch_size dividing {self.job.global_batch / par.dp:g}")
        check_layout(self.model.num_layers, par.pp, self.pipeline, self.microbatches)

    @property
    def microbatches(self) -> int:
        """Microbatches per replica per update, from the fixed global batch."""
        return self.job.global_batch // (self.batch.micro_batch_size * self.parallel.dp)

    @property
    def stage_layers(self) -> list[int]:
        return split_counts(self.model.num_layers, self.parallel.pp, self.pipeline.split)

    def to_dict(self) -> dict[str, Any]:
        """Nested mapping with ``kind:`` on option types; ``plan_config_from_dict`` reads it back."""
        return {f.name: _dump(getattr(self, f.name)) for f in dataclasses.fields(self)}


def _dump(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out = {"kind": type(obj).kind} if hasattr(type(obj), "kind") else {}
        out.update({f.name: _dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)})
        return out
    return list(obj) if isinstance(obj, tuple) else obj


def split_counts(num_layers: int, pp: int, split: Split) -> list[int]:
    """Layers per pipeline stage; every layer is on exactly one stage or this raises."""
    if isinstance(split, BalancedSplit):
        if num_layers % pp:
            raise ValueError(f"pipeline.split.kind: balanced needs model.num_layers ({num_layers}) divisible "
                             f"by parallel.pp ({pp}); use first_last")
        return [num_layers // pp] * pp
    if pp < 2:
        raise ValueError("pipeline.split.kind: first_last needs parallel.pp >= 2")
    rest = num_layers - split.first - split.last
    if pp == 2:
        if rest:
            raise ValueError(f"pipeline.split.first: with pp=2, first + last must be model.num_layers "
                             f"({num_layers}); got {split.first} + {split.last}")
        return [split.first, split.last]
    mid = pp - 2
    if rest < mid or rest % mid:
        raise ValueError(f"pipeline.split.first: {num_layers} - first {split.first} - last {split.last} = "
                         f"{rest} layers must divide evenly over the {mid} middle stages (at least 1 each)")
    return [split.first] + [rest // mid] * mid + [split.last]


def check_layout(num_layers: int, pp: int, pipe: PipelineConfig, microbatches: int) -> None:
    counts = split_counts(num_layers, pp, pipe.split)
    if pipe.schedule == "interleaved_1f1b":
        v = pipe.virtual_stages
        if pp < 2:
            raise ValueError("pipeline.schedule: interleaved_1f1b needs parallel.pp >= 2")
        if any(c % v for c in counts):
            raise ValueError(f"pipeline.virtual_stages: {v} must divide every stage's layer count {counts}")
        if microbatches % pp:
            raise ValueError(f"pipeline.schedule: interleaved_1f1b needs the microbatch count ({microbatches})"
                             f" to be a multiple of parallel.pp ({pp}) (Megatron's rule); change "
                             f"batch.micro_batch_size")
