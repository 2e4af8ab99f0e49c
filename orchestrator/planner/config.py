"""The plan: the shared tuning knobs (``trainer.knobs``) plus what only the planner has, validated once.

The planner's own sections are the fixed context (cluster, model, job, efficiency; ``cluster.py``) and the
knobs the trainer does not implement: tensor/sequence parallelism and Megatron's distributed optimizer.
``data_parallel.kind: fsdp`` at dp > 1 is predicted as FSDP2 runs it (``fsdp.py``).
Every knob section is the trainer's class itself, so a knob means the same thing (and has the same unit)
in a trainer config, a planner preset, the pre-filter and the export. Errors are ValueErrors naming the
dotted field (``parallel.dp: ...``); the builder puts ``planner.`` in front for a preset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainer import layout
from trainer.knobs import (BatchConfig, DataParallel, FsdpDP, NoRecompute, ParallelConfig, PipelineConfig,
                           Recompute, ReplicateDP, Split, TensorParallel)
from trainer.mapping import dump

from .checks import check_bool, check_choice, check_int, prefixed
from .cluster import ClusterSpec, Efficiency, JobSpec, ModelSpec

GRAD_DTYPES = ("fp32", "bf16")


@dataclass(frozen=True)
class OptimizerSharding:
    """Megatron's distributed optimizer and main-gradient precision (the trainer keeps plain AdamW, fp32)."""

    distributed: bool = True
    """Shard optimizer state over dp (ZeRO-1, Megatron --use-distributed-optimizer): reduce-scatter gradients,
    all-gather parameters. Off: all-reduce gradients, full optimizer state on every replica. With
    data_parallel.kind fsdp at dp > 1 the state is sharded with its parameters either way."""
    overlap_param_gather: bool = False
    """Gather updated parameter buckets under the next step's forward (needs distributed)."""
    grad_reduce_dtype: str = "fp32"
    """Precision of main gradients and their reduction (Megatron default fp32; bf16 halves both, and a
    data_parallel.bucket_mb then holds twice the elements)."""

    def __post_init__(self) -> None:
        with prefixed("optimizer"):
            check_bool(self, "distributed")
            check_bool(self, "overlap_param_gather")
            check_choice(self, "grad_reduce_dtype", GRAD_DTYPES)
            if self.overlap_param_gather and not self.distributed:
                raise ValueError("overlap_param_gather: needs optimizer.distributed (only it gathers parameters)")


@dataclass(frozen=True)
class PipelineComm:
    """Megatron's pipeline point-to-point communication (the trainer's is torch pipelining's own)."""

    overlap_p2p: bool = True
    """Megatron's overlap_p2p_comm (its default; --no-overlap-p2p-communication turns it off): under the
    interleaved schedule the steady-state 1F1B passes send and receive asynchronously, under the next chunk
    pass's compute; the warm-up and cool-down passes' sends stay exposed. A no-op without interleaving."""

    def __post_init__(self) -> None:
        with prefixed("pipeline_comm"):
            check_bool(self, "overlap_p2p")


@dataclass(frozen=True)
class PlanConfig:
    """Everything one prediction needs. Cross-field rules are checked here, once."""

    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    model: ModelSpec = field(default_factory=ModelSpec)
    job: JobSpec = field(default_factory=JobSpec)
    efficiency: Efficiency = field(default_factory=Efficiency)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    tensor_parallel: TensorParallel = field(default_factory=TensorParallel)
    batch: BatchConfig = field(default_factory=BatchConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    recompute: Recompute = field(default_factory=NoRecompute)
    data_parallel: DataParallel = field(default_factory=ReplicateDP)
    optimizer: OptimizerSharding = field(default_factory=OptimizerSharding)
    pipeline_comm: PipelineComm = field(default_factory=PipelineComm)

    def __post_init__(self) -> None:
        par, model, tp = self.parallel, self.model, self.tensor_parallel.size
        if tp * par.pp * par.dp != self.cluster.num_gpus:
            raise ValueError(f"parallel.dp: tensor_parallel.size*pp*dp = {tp}*{par.pp}*{par.dp} = "
                             f"{tp * par.pp * par.dp} must equal cluster.num_gpus = {self.cluster.num_gpus}")
        if model.num_heads % tp or model.ffn % tp:
            raise ValueError(f"tensor_parallel.size: {tp} must divide model.num_heads ({model.num_heads}) "
                             f"and the MLP width ({model.ffn})")
        per_step = self.batch.micro_batch_size * par.dp
        if self.batch.global_batch % per_step:
            raise ValueError(f"batch.micro_batch_size: global batch {self.batch.global_batch} is not divisible "
                             f"by micro_batch_size*dp = {self.batch.micro_batch_size}*{par.dp}; the global "
                             f"batch is fixed, so pick a micro_batch_size dividing {self.batch.global_batch / par.dp:g}")
        if isinstance(self.data_parallel, FsdpDP) and par.dp > 1 and self.optimizer.overlap_param_gather:
            raise ValueError("optimizer.overlap_param_gather: Megatron's distributed-optimizer gather does not apply "
                             "to data_parallel.kind fsdp, which gathers each block's parameters before its use "
                             "(prefetch and overlap: data_parallel.prefetch); set it to false")
        layout.check_schedule(self.pipeline.schedule, par.pp, self.pipeline.virtual_stages, self.microbatches)
        rank_chunks(model.num_layers, par.pp, self.pipeline.virtual_stages, self.pipeline.split)

    @property
    def microbatches(self) -> int:
        """Microbatches per replica per update, from the fixed global batch."""
        return self.batch.global_batch // (self.batch.micro_batch_size * self.parallel.dp)

    @property
    def stage_layers(self) -> list[int]:
        """Layers per pipeline RANK (the sum of its model chunks)."""
        return [sum(c) for c in self.stage_chunks]

    @property
    def stage_chunks(self) -> list[list[int]]:
        """Layers of each model chunk, per pipeline rank (``rank_chunks``)."""
        return rank_chunks(self.model.num_layers, self.parallel.pp, self.pipeline.virtual_stages,
                           self.pipeline.split)

    def to_dict(self) -> dict[str, Any]:
        """Nested mapping with ``kind:`` on option types; ``plan_config_from_dict`` reads it back."""
        return dump(self)


def rank_chunks(num_layers: int, pp: int, virtual_stages: int, split: Split) -> list[list[int]]:
    """Layers of each model chunk a pipeline rank holds, per rank, under the shared split rule
    (``trainer.layout.split_counts``; chunk c lives on rank c % pp). Chunks may differ in size, and an end
    chunk may hold no layers (only the embedding, or only the head and loss: ``knobs.chunk_counts``)."""
    chunks = split.counts(num_layers, pp * virtual_stages)
    return [chunks[r::pp] for r in range(pp)]


def rank_layers(num_layers: int, pp: int, virtual_stages: int, split: Split) -> list[int]:
    """Layers per pipeline rank: the sum of its model chunks (``rank_chunks``)."""
    return [sum(c) for c in rank_chunks(num_layers, pp, virtual_stages, split)]
