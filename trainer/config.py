"""The trainer's configuration: small frozen dataclasses, validated once, in ``__post_init__``.

YAML (or any mapping) reaches these through :func:`TrainConfig.from_dict`; mutually exclusive options are
separate types chosen by a ``kind:`` key (``recompute: {kind: full, method: block, num_layers: 2}``), so
a field that one option ignores cannot be set on it. ``trainer.mapping.apply_overrides`` applies flat
dotted overrides (CLI ``key=value`` pairs, an Optuna trial's params) to a mapping before it is validated.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Union

from trainer import layout
# The tuning knobs live in trainer.knobs (shared with the planner); re-exported here for the trainer's users.
from trainer.knobs import (RECOMPUTE_MODULES, BalancedSplit, BatchConfig, DataParallel,  # noqa: F401
                           ExplicitSplit, FirstLastSplit, FsdpDP, FullRecompute, NoRecompute, OpRecompute,
                           ParallelConfig, PipelineConfig, Recompute, ReplicateDP, SelectiveRecompute, Split,
                           TensorParallel, TorchDDP)
from trainer.mapping import apply_overrides, build, dump, flatten, parse_dotlist  # noqa: F401 (re-exported)


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int = 256
    """Token vocabulary size (256 = bytes for the built-in corpus and the text-file tool)."""
    n_layers: int = 4
    """Transformer blocks."""
    d_model: int = 64
    """Hidden size."""
    n_heads: int = 4
    """Attention heads; must divide d_model."""
    d_ff: int = 0
    """MLP inner size; 0 means 4 x d_model."""
    seq_len: int = 64
    """Tokens per sequence (the model predicts seq_len next tokens per sequence)."""

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_layers", "d_model", "n_heads", "seq_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.{name}={getattr(self, name)} must be >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}")
        if self.d_ff < 0:
            raise ValueError("model.d_ff must be >= 0 (0 means 4 x d_model)")

    @property
    def ffn_dim(self) -> int:
        return self.d_ff or 4 * self.d_model

    @property
    def layer_matmuls(self) -> tuple[tuple[int, int], ...]:
        """A block's matmuls in forward order as (input width, output width): QKV, attention projection, MLP
        up, MLP down (``trainer.model.gpt.Block``; what op-level recompute counts, and the planner's
        ``model.layer_gemms`` for trainer configs)."""
        d, f = self.d_model, self.ffn_dim
        return (d, 3 * d), (d, d), (d, f), (f, d)


@dataclass(frozen=True)
class SyntheticData:
    """Built-in deterministic corpus: a fixed random bigram language, learnable in a few hundred steps."""
    kind: ClassVar[str] = "synthetic"
    seed: int = 1234
    """Seed of the language itself (not of the model)."""


@dataclass(frozen=True)
class TokenFileData:
    """A memory-mapped token file made by ``python -m trainer.model.data`` (format in docs/trainer.md)."""
    kind: ClassVar[str] = "token_file"
    path: str = ""
    """Path to the ``.bin`` token file (its ``.json`` header sits beside it)."""

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("data.path is required with data.kind=token_file")


@dataclass(frozen=True)
class OptimConfig:
    lr: float = 3e-3
    """AdamW learning rate (constant after warm-up)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up steps."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    beta1: float = 0.9
    """AdamW first-moment decay."""
    beta2: float = 0.95
    """AdamW second-moment decay."""
    eps: float = 1e-8
    """AdamW denominator epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 disables)."""

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ValueError("optim.lr must be > 0")
        if self.grad_clip < 0 or self.weight_decay < 0 or self.warmup_steps < 0:
            raise ValueError("optim.grad_clip, optim.weight_decay and optim.warmup_steps must be >= 0")


@dataclass(frozen=True)
class RunConfig:
    steps: int = 8
    """Updates to run."""
    warmup_steps: int = 2
    """Leading updates excluded from the timing summary (compilation, allocator, caches)."""
    precision: str = "fp32"
    """fp32 or bf16 (autocast; parameters and optimizer state stay fp32)."""
    device: str = "cpu"
    """cpu (gloo) or cuda (nccl)."""
    seed: int = 0
    """Model initialisation seed."""
    threads_per_rank: int = 1
    """torch CPU threads per rank (CPU runs share the machine's cores)."""
    timeline_steps: int = 2
    """Measured updates whose per-rank phase spans are kept for the timeline picture."""
    timeout_s: float = 300.0
    """Collective timeout: a rank that waits longer raises instead of hanging."""
    profile_step: Optional[int] = None
    """A warm-up update to record with torch.profiler (one gzipped Chrome trace per rank); None: no trace.
    Only a warm-up update: the profiler's overhead must never reach a measured step time."""

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError("run.steps must be >= 1")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"run.warmup_steps={self.warmup_steps} must be >= 0 and < run.steps={self.steps}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"run.precision={self.precision!r} must be fp32 or bf16")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"run.device={self.device!r} must be cpu or cuda")
        if self.profile_step is not None and not 0 <= self.profile_step < self.warmup_steps:
            raise ValueError(f"run.profile_step={self.profile_step} is not a warm-up update (0 <= step < "
                             f"run.warmup_steps={self.warmup_steps}): a profiled update is slower and must not be "
                             f"measured; pick a warm-up step or raise run.warmup_steps")
        if self.threads_per_rank < 1 or self.timeline_steps < 0 or self.timeout_s <= 0:
            raise ValueError("run.threads_per_rank >= 1, run.timeline_steps >= 0 and run.timeout_s > 0 are required")


@dataclass(frozen=True)
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The GPT's shape."""
    data: Union[SyntheticData, TokenFileData] = field(default_factory=SyntheticData)
    """Where the sequences come from."""
    batch: BatchConfig = field(default_factory=BatchConfig)
    """Global batch (fixed) and microbatch size (a knob)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Pipeline and data-parallel sizes."""
    tensor_parallel: TensorParallel = field(default_factory=TensorParallel)
    """Tensor (and sequence) parallelism: the innermost mesh dimension."""
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    """Pipeline schedule, virtual stages and layer split."""
    data_parallel: DataParallel = field(default_factory=ReplicateDP)
    """How data-parallel replicas keep their gradients (and parameters) in step."""
    recompute: Recompute = field(default_factory=NoRecompute)
    """Which activations backward recomputes instead of keeping."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """AdamW and gradient clipping."""
    run: RunConfig = field(default_factory=RunConfig)
    """Steps, precision, device and measurement settings."""

    def __post_init__(self) -> None:
        pp, v = self.parallel.pp, self.pipeline.virtual_stages
        n_micro = layout.num_microbatches(self.batch.global_batch, self.batch.micro_batch_size, self.parallel.dp)
        if pp > 1:
            layout.check_schedule(self.pipeline.schedule, pp, v, n_micro)
            layout.check_torch_schedule(self.pipeline.schedule, pp, n_micro)
        elif self.pipeline.schedule not in layout.SCHEDULES or v != 1:
            raise ValueError("with parallel.pp=1 use pipeline.virtual_stages=1 and a known pipeline.schedule")
        stages = self.stage_layers()
        if isinstance(self.recompute, FullRecompute) and self.recompute.num_layers > max(map(len, stages)):
            raise ValueError(
                f"recompute.num_layers={self.recompute.num_layers} exceeds the layers of every stage "
                f"({[len(s) for s in stages]}): lower it"
            )
        if isinstance(self.data_parallel, TorchDDP) and pp > 1:
            raise ValueError(
                "data_parallel.kind=torch_ddp cannot be combined with parallel.pp > 1: torch DDP under pipeline "
                "schedules fails (GPipe, Interleaved1F1B) or leaves replicas silently divergent (static_graph); "
                "use data_parallel.kind=replicate (bucketed all-reduce, overlap supported) or fsdp"
            )
        self._check_tensor_parallel()
        if isinstance(self.data_parallel, FsdpDP) and self.data_parallel.prefetch and pp > 1 and v > 1:
            # Explicit prefetch chains blocks within one module; interleaved chunks on a rank run out of order.
            raise ValueError("data_parallel.prefetch must be 0 with pipeline.virtual_stages > 1")

    def _check_tensor_parallel(self) -> None:
        tpc, m = self.tensor_parallel, self.model
        tp = tpc.size
        if tp == 1:
            return
        # Each rank holds whole heads, a slice of the MLP and a slice of the vocabulary (embedding rows, head
        # columns): Megatron's rules, since a head or a vocabulary entry split over ranks has no local meaning.
        for name, value in (("model.n_heads", m.n_heads), ("model.d_ff", m.ffn_dim), ("model.vocab_size", m.vocab_size)):
            if value % tp:  # model.d_ff = 0 (4 x d_model) always divides: tp | n_heads | d_model
                raise ValueError(f"{name}: {value} is not divisible by tensor_parallel.size={tp}")
        if tpc.sequence_parallel and m.seq_len % tp:
            raise ValueError(f"model.seq_len: {m.seq_len} is not divisible by tensor_parallel.size={tp}, which "
                             f"tensor_parallel.sequence_parallel splits it over")
        if isinstance(self.data_parallel, TorchDDP):
            raise ValueError("data_parallel.kind: torch_ddp cannot be combined with tensor_parallel.size > 1 (torch DDP "
                             "does not reduce DTensor gradient shards); use replicate or fsdp")
        if tpc.comm_overlap:
            self._check_async_tp()

    def _check_async_tp(self) -> None:
        """torch's asynchronous TP: an inductor pass over CUDA symmetric memory, on compiled blocks."""
        why = None
        if self.run.device != "cuda":
            why = f"torch's asynchronous TP needs run.device=cuda (CUDA symmetric memory), not {self.run.device}: set it to false"
        elif isinstance(self.recompute, (SelectiveRecompute, OpRecompute)):
            # Measured (torch 2.13): checkpoint inside a compiled block fails on DTensor activations (selective)
            # and on a policy context (op); full recompute checkpoints whole blocks from outside and works.
            why = (f"the blocks it compiles cannot trace recompute.kind={self.recompute.kind} "
                   f"(a checkpoint inside the block): use recompute.kind full or none, or set it to false")
        else:
            import importlib.util

            import torch

            if not torch.cuda.is_available():
                why = "torch's asynchronous TP needs CUDA and this torch sees no GPU: set it to false"
            elif importlib.util.find_spec("torch.distributed._symmetric_memory") is None:
                why = f"this torch ({torch.__version__}) has no torch.distributed._symmetric_memory (asynchronous TP): set it to false"
        if why:
            raise ValueError(f"tensor_parallel.comm_overlap: {why}")

    # Derived quantities, computed from the validated fields.
    @property
    def world_size(self) -> int:
        return self.tensor_parallel.size * self.parallel.pp * self.parallel.dp

    @property
    def n_microbatches(self) -> int:
        return layout.num_microbatches(self.batch.global_batch, self.batch.micro_batch_size, self.parallel.dp)

    @property
    def n_stages(self) -> int:
        return self.parallel.pp * self.pipeline.virtual_stages

    def stage_layers(self) -> list[list[int]]:
        """Layer indices of each model chunk (pp x virtual_stages of them), in pipeline order."""
        return layout.layer_ranges(self.pipeline.split.counts(self.model.n_layers, self.n_stages))

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> "TrainConfig":
        return build(cls, data or {}, "")

    def to_dict(self) -> dict[str, Any]:
        return dump(self)
