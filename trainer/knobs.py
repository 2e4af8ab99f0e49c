"""The tuning knobs, defined once: the trainer runs them, the planner predicts them, the export writes them.

Batch, parallel degrees, tensor parallelism, pipeline (schedule, virtual stages, layer split), recompute and data
parallelism.
One meaning and one unit per field name, whoever reads it (``docs/knobs.md`` maps each onto the planner and
onto Megatron-LM flags). Mutually exclusive options are separate types chosen by a ``kind:`` key. Every
error is a ValueError that starts with the dotted knob name (``recompute.num_layers: ...``): the sections
sit at the same names in the trainer's ``TrainConfig`` and the planner's ``PlanConfig``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Union

from trainer import layout

RECOMPUTE_MODULES = ("core_attn", "mlp", "norm")
RECOMPUTE_METHODS = ("uniform", "block")


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_ints(obj: object, section: str, names: tuple[str, ...], lo: int = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if not _int(value) or value < lo:
            raise ValueError(f"{section}.{name}: must be an integer >= {lo}, got {value!r}")


def _check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {value!r}")


@dataclass(frozen=True)
class BatchConfig:
    global_batch: int = 8
    """Sequences per update, FIXED: changing it changes what the model learns (never a search knob)."""
    micro_batch_size: int = 1
    """Sequences per microbatch: the knob. Microbatches per replica = global_batch / (micro_batch_size x dp),
    which must be whole."""

    def __post_init__(self) -> None:
        _check_ints(self, "batch", ("global_batch", "micro_batch_size"))


@dataclass(frozen=True)
class ParallelConfig:
    pp: int = 1
    """Pipeline-parallel ranks: consecutive layers form stages, one rank per stage (times virtual_stages)."""
    dp: int = 1
    """Data-parallel replicas at each pipeline position. The world size (trainer ranks, planner GPUs) is
    tensor_parallel.size x pp x dp."""

    def __post_init__(self) -> None:
        _check_ints(self, "parallel", ("pp", "dp"))


@dataclass(frozen=True)
class TensorParallel:
    """Megatron tensor parallelism: each layer's GEMMs split over ``size`` adjacent ranks (torch's DTensor
    tensor-parallel API in the trainer; the planner's meaning and unit). World = size x parallel.pp x
    parallel.dp, tensor-parallel ranks innermost."""
    size: int = 1
    """Tensor-parallel size (Megatron's --tensor-model-parallel-size); best kept inside a node."""
    sequence_parallel: bool = True
    """Megatron sequence parallelism (Korthikanti et al. 2022): LayerNorm/dropout activations and pipeline
    sends are split over the tensor-parallel group instead of replicated. A no-op at size 1."""
    comm_overlap: bool = False
    """Megatron's --tp-comm-overlap: each layer's all-gathers and reduce-scatters run pipelined with the
    GEMMs next to them. Needs sequence_parallel; a no-op at size 1. The trainer runs it as torch's
    asynchronous TP (run.device=cuda only; it torch.compiles each transformer block, the one knob that
    compiles anything) and refuses it at load elsewhere."""

    def __post_init__(self) -> None:
        _check_ints(self, "tensor_parallel", ("size",))
        _check_bool("tensor_parallel.sequence_parallel", self.sequence_parallel)
        _check_bool("tensor_parallel.comm_overlap", self.comm_overlap)
        if self.comm_overlap and self.size > 1 and not self.sequence_parallel:
            raise ValueError("tensor_parallel.comm_overlap: needs tensor_parallel.sequence_parallel (Megatron overlaps "
                             "the sequence-parallel all-gathers and reduce-scatters only); turn it on or drop the overlap")


# ---- pipeline --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BalancedSplit:
    """Layers spread as evenly as possible over the model chunks; remainder layers go to middle chunks first."""
    kind: ClassVar[str] = "balanced"

    def counts(self, n_layers: int, n_chunks: int) -> list[int]:
        return layout.split_counts(n_layers, n_chunks)


@dataclass(frozen=True)
class ExplicitSplit:
    """Layers per model chunk, listed (one entry per chunk: pp x virtual_stages, in pipeline order)."""
    kind: ClassVar[str] = "explicit"
    layers: tuple[int, ...] = ()
    """Layer count of each model chunk, in pipeline order."""

    def counts(self, n_layers: int, n_chunks: int) -> list[int]:
        return layout.split_counts(n_layers, n_chunks, explicit=self.layers)


@dataclass(frozen=True)
class FirstLastSplit:
    """Fixed layer counts on the first and last model chunk, the others balanced (and equal: Megatron's rule
    for decoder_first/last_pipeline_num_layers). Counts are per model CHUNK: with virtual_stages = 1 a chunk
    is a pipeline rank's whole stage; with interleaving, ``first`` is chunk 0 only (rank 0's first chunk)."""
    kind: ClassVar[str] = "first_last"
    first: int = 0
    """Layers on the first model chunk (which also holds the embedding); 0: balanced with the middle."""
    last: int = 0
    """Layers on the last model chunk (which also holds the LM head and loss); 0: balanced with the middle."""

    def __post_init__(self) -> None:
        _check_ints(self, "pipeline.split", ("first", "last"), lo=0)  # 0: balanced with the middle

    def counts(self, n_layers: int, n_chunks: int) -> list[int]:
        return layout.split_counts(n_layers, n_chunks, first=self.first, last=self.last)


Split = Union[BalancedSplit, ExplicitSplit, FirstLastSplit]


@dataclass(frozen=True)
class PipelineConfig:
    schedule: str = "1f1b"
    """gpipe (all forwards, then all backwards), 1f1b (PipeDream-Flush) or interleaved_1f1b (virtual_stages
    chunks per rank). Ignored when parallel.pp = 1: plain gradient accumulation."""
    virtual_stages: int = 1
    """Model chunks per pipeline rank; > 1 only with interleaved_1f1b (chunk c lives on rank c % pp)."""
    split: Split = field(default_factory=BalancedSplit)
    """Which layers each model chunk holds (pp x virtual_stages chunks)."""

    def __post_init__(self) -> None:
        if self.schedule not in layout.SCHEDULES:
            raise ValueError(f"pipeline.schedule: {self.schedule!r} is not one of {', '.join(layout.SCHEDULES)}")
        _check_ints(self, "pipeline", ("virtual_stages",))
        if self.virtual_stages != 1 and self.schedule != "interleaved_1f1b":
            raise ValueError(f"pipeline.virtual_stages: {self.virtual_stages} needs pipeline.schedule="
                             f"interleaved_1f1b (got {self.schedule})")


# ---- recompute -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NoRecompute:
    """Keep every activation the backward pass needs."""
    kind: ClassVar[str] = "none"


@dataclass(frozen=True)
class SelectiveRecompute:
    """Recompute chosen sub-modules of every layer (Megatron's selective granularity; core_attn its default)."""
    kind: ClassVar[str] = "selective"
    modules: tuple[str, ...] = ("core_attn",)
    """A non-empty subset of core_attn (attention scores), mlp (MLP inner activations), norm (LayerNorm
    outputs): Megatron's --recompute-modules (norm is its layernorm)."""

    def __post_init__(self) -> None:
        if isinstance(self.modules, list):
            object.__setattr__(self, "modules", tuple(self.modules))
        mods = self.modules
        if (not isinstance(mods, tuple) or not mods or len(set(mods)) != len(mods)
                or any(m not in RECOMPUTE_MODULES for m in mods)):
            raise ValueError(f"recompute.modules: {mods!r} must be a non-empty list of distinct "
                             f"{', '.join(RECOMPUTE_MODULES)}")


@dataclass(frozen=True)
class FullRecompute:
    """Recompute whole layers from a checkpointed input (Megatron's full granularity)."""
    kind: ClassVar[str] = "full"
    method: str = "uniform"
    """uniform: groups of num_layers layers, each recomputed as one unit; block: the first num_layers layers
    of each model chunk recomputed, the rest keep their activations."""
    num_layers: int = 1
    """Group size (uniform) or recomputed layers per model chunk (block)."""

    def __post_init__(self) -> None:
        if self.method not in RECOMPUTE_METHODS:
            raise ValueError(f"recompute.method: {self.method!r} must be uniform or block")
        _check_ints(self, "recompute", ("num_layers",))


@dataclass(frozen=True)
class OpRecompute:
    """Decide op by op, per layer, what backward keeps (torch's selective activation checkpointing;
    torchtitan's "selective op" policy): matmul and attention outputs are kept, except every
    ``matmul_period``-th matmul of the layer, and every other op (norms, activation functions, residual
    adds, copies) runs again in backward from the kept tensors and the layer's input."""
    kind: ClassVar[str] = "op"
    matmul_period: int = 2
    """Recompute the n-th, 2n-th, ... matmul of each layer in forward order (torchtitan's policy: 2, every
    second one); 0 keeps every matmul output."""

    def __post_init__(self) -> None:
        _check_ints(self, "recompute", ("matmul_period",), lo=0)

    def recomputes_matmul(self, k: int) -> bool:
        """Whether the k-th matmul of a layer (1-based, forward order) runs again in backward."""
        return self.matmul_period > 0 and k % self.matmul_period == 0


Recompute = Union[NoRecompute, SelectiveRecompute, FullRecompute, OpRecompute]


# ---- data parallelism ------------------------------------------------------------------------------------

def _check_bucket(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"data_parallel.bucket_mb: must be a number > 0 (MB of gradients), got {value!r}")


@dataclass(frozen=True)
class ReplicateDP:
    """Replicated parameters, gradients reduced in buckets (Megatron-style DDP, correct under any schedule)."""
    kind: ClassVar[str] = "replicate"
    overlap_grad_reduce: bool = True
    """Reduce a bucket as soon as its gradients are final, under the remaining backward work. Off: every
    bucket after the backward pass, on the critical path."""
    bucket_mb: float = 25.0
    """Bucket size in MB (10^6 bytes) of gradients in the dtype they are reduced in: 4 bytes per element for
    fp32 gradients (the trainer's, always), 2 for the planner's optimizer.grad_reduce_dtype=bf16. Megatron's
    --ddp-bucket-size is this in elements: bucket_mb x 10^6 / bytes per element."""

    def __post_init__(self) -> None:
        _check_bool("data_parallel.overlap_grad_reduce", self.overlap_grad_reduce)
        _check_bucket(self.bucket_mb)


@dataclass(frozen=True)
class FsdpDP:
    """Sharded parameters, gradients and optimizer state (FSDP2 ``fully_shard`` per block, on the dp mesh)."""
    kind: ClassVar[str] = "fsdp"
    reshard_after_forward: bool = True
    """Free gathered parameters after forward and gather again for backward (less memory, more traffic)."""
    prefetch: int = 1
    """Blocks whose parameter all-gather is issued ahead (0: FSDP2's implicit one-ahead only)."""

    def __post_init__(self) -> None:
        _check_bool("data_parallel.reshard_after_forward", self.reshard_after_forward)
        _check_ints(self, "data_parallel", ("prefetch",), lo=0)


@dataclass(frozen=True)
class TorchDDP:
    """torch's DistributedDataParallel (always overlaps its reduction); only without a pipeline (under
    pipeline schedules it fails or silently diverges replicas on torch 2.13, as measured when the trainer
    was specified, so such a config is refused)."""
    kind: ClassVar[str] = "torch_ddp"
    bucket_mb: float = 25.0
    """Bucket size in MB (10^6 bytes) of gradients, as for replicate (torch's bucket_cap_mb counts MiB; the
    trainer converts)."""

    def __post_init__(self) -> None:
        _check_bucket(self.bucket_mb)


DataParallel = Union[ReplicateDP, FsdpDP, TorchDDP]

KNOB_SECTIONS = {"batch": BatchConfig, "parallel": ParallelConfig, "tensor_parallel": TensorParallel,
                 "pipeline": PipelineConfig, "recompute": Recompute, "data_parallel": DataParallel}
"""The knob sections by the name they have in both the trainer's and the planner's config."""
