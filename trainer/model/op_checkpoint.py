"""Op-level recompute (``recompute.kind: op``): which op outputs a layer keeps for backward.

torch's selective activation checkpointing runs the layer under ``checkpoint`` and asks a policy, after
each op, whether to cache its output or run the op again when backward needs it. The policy here is
torchtitan's "selective op" rule: keep matmul outputs (but every ``period``-th matmul of the layer),
attention outputs and reduce-scatter outputs; recompute everything else. The planner prices the same rule
(``orchestrator/planner``: ``recompute.kind op``).

The cached outputs are held by torch's checkpoint machinery, not by autograd's saved-tensor hooks, so the
trainer's saved-activation counter cannot see them; each layer reports their bytes to the counter that is
active (``counting_cached_outputs``) and releases them when its backward starts, where recompute consumes
them, or when its graph is freed without a backward.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Callable, Iterator, Protocol

import torch
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from trainer.knobs import OpRecompute

_aten = torch.ops.aten
MATMULS = frozenset({_aten.mm.default})
"""What counts as a layer's matmul (a Linear on a 3-d input reaches the dispatcher as mm)."""
_KEPT_NAMES = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
               "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu")
KEPT = frozenset(getattr(_aten, n).default for n in _KEPT_NAMES if hasattr(_aten, n)) | frozenset(
    [torch.ops._c10d_functional.reduce_scatter_tensor.default] if hasattr(torch.ops, "_c10d_functional") else [])
"""Non-matmul ops whose outputs are kept: fused attention (output and log-sum-exp) and reduce-scatter."""


class CachedBytesSink(Protocol):
    def hold(self, nbytes: int) -> Callable[[], None]:
        """Count ``nbytes`` as live; the returned callable releases them."""


_sink: contextvars.ContextVar[CachedBytesSink | None] = contextvars.ContextVar("op_checkpoint_sink", default=None)


@contextlib.contextmanager
def counting_cached_outputs(sink: CachedBytesSink) -> Iterator[None]:
    """Report the bytes every op-recomputed layer caches, while inside, to ``sink``."""
    token = _sink.set(sink)
    try:
        yield
    finally:
        _sink.reset(token)


class LayerPolicy:
    """One layer's forward: the selective-checkpoint decision per op, and the bytes it kept."""

    def __init__(self, rc: OpRecompute) -> None:
        self.rc = rc
        self.matmuls = {False: 0, True: 0}  # forward and recompute count apart (older torch asks in both)
        self.kept_bytes = 0
        self._storages: set[int] = set()

    def __call__(self, ctx, func, *args, **kwargs) -> CheckpointPolicy:
        if func in MATMULS:
            self.matmuls[ctx.is_recompute] += 1
            keep = not self.rc.recomputes_matmul(self.matmuls[ctx.is_recompute])
        else:
            keep = func in KEPT
        if keep and not ctx.is_recompute:
            self._count(getattr(ctx, "op_output", None))
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def _count(self, out: object) -> None:
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                # A DTensor (tensor parallelism) holds its bytes in its local shard.
                storage = (t._local_tensor if isinstance(t, DTensor) else t).untyped_storage()
                if storage.data_ptr() not in self._storages:
                    self._storages.add(storage.data_ptr())
                    self.kept_bytes += storage.nbytes()


class _ReleaseOnce:
    """Releases a layer's cached bytes once: when its backward starts, or when its graph is freed unused."""

    def __init__(self, release: Callable[[], None]) -> None:
        self.release = release

    def __del__(self) -> None:
        self.release()


class _ReleaseAtBackward(torch.autograd.Function):
    """Identity on the layer output whose backward (the layer's first) releases the cached bytes; its ctx
    holds them otherwise, so a forward that never runs backward (pipelining's shape inference) frees them
    with its graph."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, held: _ReleaseOnce) -> torch.Tensor:
        ctx.held = held
        return y.view_as(y)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.held.release()
        return grad, None


def op_checkpoint(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, rc: OpRecompute) -> torch.Tensor:
    """``fn(x)`` with op-level recompute of the matmuls ``rc`` names and all non-kept ops."""
    policy = LayerPolicy(rc)
    y = checkpoint(fn, x, use_reentrant=False,
                   context_fn=lambda: create_selective_checkpoint_contexts(policy))
    sink = _sink.get()
    if sink is not None and policy.kept_bytes and y.requires_grad:
        y = _ReleaseAtBackward.apply(y, _ReleaseOnce(sink.hold(policy.kept_bytes)))
    return y
