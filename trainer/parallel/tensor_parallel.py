"""Tensor and sequence parallelism on torch's DTensor API (``torch.distributed.tensor.parallel``).

The plan is torchtitan's for Llama, on this GPT: QKV and MLP-up column-parallel, attention and MLP-down
projections row-parallel, the token embedding row-parallel (vocabulary rows), the LM head column-parallel.
With sequence parallelism the residual stream between those regions stays split over the sequence
(``Shard(1)``): the norms run on the local tokens (``SequenceParallel``), the attention and MLP inputs are
all-gathered (``PrepareModuleInput``) and the row-parallel outputs reduce-scattered. Without it, the
residual stream is replicated and the row-parallel outputs all-reduced (Megatron's plain TP).

The LM head stays sharded on the vocabulary (``Shard(-1)`` DTensor logits, torchtitan's loss parallel):
the cross-entropy runs under ``loss_parallel`` (``vocab_parallel_loss``), which all-reduces only each
token's max and sum of exponentials over TP, so the last stage never holds more than 1/tp of the logits
or their gradient. The context must cover the backward too; the trainer enters it around its own
forward-loss-backward and around ``schedule.step``, inside which the pipeline schedules run the last
stage's loss and backward.

The model itself knows nothing of this (``trainer.model.gpt`` has no torch.distributed): its attention
counts heads from the QKV projection's local width, and every parameter is first initialised whole, as in
the single-process model, then sharded, so parity holds by construction.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, PrepareModuleOutput,
                                               RowwiseParallel, SequenceParallel, loss_parallel,
                                               parallelize_module)


def interleave_qkv_heads(weight: torch.Tensor, tp: int) -> None:
    """Reorder a fused QKV weight's rows in place so that contiguous 1/tp slices hold whole heads.

    The single-process layout is [q of every head; k ...; v ...]; a column-parallel split of that would
    hand rank 0 all of q and half of k. Grouping the rows as [rank][q, k, v][its heads] (Megatron's
    per-group interleaving) gives each rank its heads' q, k and v in the order the attention reads them.
    AdamW is elementwise and the parity fingerprint (norm and sum per tensor) ignores the order, so the
    permuted model learns exactly what the single-process one does.
    """
    rows, cols = weight.shape
    grouped = weight.detach().view(3, tp, rows // (3 * tp), cols).transpose(0, 1).reshape(rows, cols).clone()
    weight.data.copy_(grouped)


def _plan(chunk: nn.Module, sp: bool) -> dict[str, object]:
    seq = Shard(1)
    plan: dict[str, object] = {}
    if chunk.tok_emb is not None:
        plan["tok_emb"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq if sp else Replicate())
        if sp:
            # Learned positions are tiny and kept whole; each rank adds the rows of its own tokens. Backward
            # all-gathers the position gradient, so every rank updates the whole table identically.
            plan["pos_emb"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
    for key in chunk.layers:
        p = f"layers.{key}"
        plan.update({f"{p}.attn.qkv": ColwiseParallel(), f"{p}.mlp.fc": ColwiseParallel(),
                     f"{p}.attn.proj": RowwiseParallel(output_layouts=seq if sp else Replicate()),
                     f"{p}.mlp.proj": RowwiseParallel(output_layouts=seq if sp else Replicate())})
        if sp:
            gather = PrepareModuleInput(input_layouts=(seq,), desired_input_layouts=(Replicate(),),
                                        use_local_output=True)
            plan.update({f"{p}.norm1": SequenceParallel(), f"{p}.norm2": SequenceParallel(),
                         f"{p}.attn": gather, f"{p}.mlp": gather})
    if chunk.lm_head is not None:
        if sp:
            plan["norm_f"] = SequenceParallel()
        plan["lm_head"] = ColwiseParallel(input_layouts=seq if sp else Replicate(), output_layouts=Shard(-1),
                                          use_local_output=False)
    for style in plan.values():
        if hasattr(style, "src_data_rank"):
            style.src_data_rank = None  # every rank holds the same whole init: slice locally, no broadcast
    return plan


def apply_tp(chunk: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Shard one model chunk (already initialised whole) over ``tp_mesh``, in place."""
    tp = tp_mesh.size()
    for block in chunk.layers.values():
        interleave_qkv_heads(block.attn.qkv.weight, tp)
    parallelize_module(chunk, tp_mesh, _plan(chunk, sequence_parallel))


@contextlib.contextmanager
def vocab_parallel_loss(enabled: bool) -> Iterator[None]:
    """``loss_parallel`` while inside (when ``enabled``), left again even if the body raises.

    torch's context manager only restores the default cross-entropy ops when its body returns normally;
    a worker that runs many configs would otherwise keep the custom ops after a failed run. Exiting it
    as if the body had succeeded runs its restoring half either way.
    """
    if not enabled:
        yield
        return
    cm = loss_parallel()
    cm.__enter__()
    try:
        yield
    finally:
        cm.__exit__(None, None, None)


def compile_for_async_tp(chunk: nn.Module, tp_mesh: DeviceMesh) -> None:
    """``tensor_parallel.comm_overlap``: torch's asynchronous TP on each transformer block (torchtitan's recipe).

    Inductor's micro-pipeline pass rewrites an all-gather feeding a matmul, and a matmul feeding a
    reduce-scatter, into chunked kernels over CUDA symmetric memory that overlap the transfer with the
    GEMM; it only sees collectives inside a compiled graph, so the blocks (where the sequence-parallel
    gathers and reduce-scatters sit) are compiled. The pass is switched on through the compile options of
    these blocks alone, not inductor's global config, so a worker's later runs are unaffected.
    ``Module.compile`` compiles in place: parameter names, and so fingerprints and optimizer state, stay
    those of the eager model.
    """
    from torch.distributed import _symmetric_memory

    enable = getattr(_symmetric_memory, "enable_symm_mem_for_group", None)
    # Older torch needs the group registered for symmetric memory; newer marks the call deprecated
    # (every group can allocate it) and warns, so it is only made where still needed.
    if enable is not None and not getattr(enable, "__deprecated__", None):
        enable(tp_mesh.get_group().group_name)
    for block in chunk.layers.values():
        block.compile(options={"_micro_pipeline_tp": True})


def finish_grads(params: list[nn.Parameter]) -> None:
    """Bring every DTensor gradient to its parameter's placements (after backward, before the norm).

    Autograd leaves some in another layout. Replicated parameters used on sequence-sharded activations
    (the sequence-parallel norms) get a ``Partial`` gradient, each rank's sum over its own tokens: Megatron
    all-reduces these after backward (its layernorm-grads step), here it is this redistribution. The
    vocabulary-parallel embedding's gradient comes back replicated: each rank keeps its own rows.
    FSDP2 does the same inside its reduce-scatter, so under FSDP nothing is left to do here.
    """
    for p in params:
        g = p.grad
        if isinstance(g, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(placements=p.placements)


def owned(p: torch.Tensor, coords: dict[str, int]) -> bool:
    """Whether this rank's local piece of ``p`` counts towards whole-model sums (norms, fingerprints).

    A piece is counted once: on every rank along mesh dimensions where ``p`` is sharded, only on
    coordinate 0 along the dimensions it is replicated over (tp for a replicated norm, dp for replicate DP).
    """
    sharded = set()
    if isinstance(p, DTensor):
        names = p.device_mesh.mesh_dim_names or ()
        # Any placement that is neither replicated nor partial splits the tensor: Shard, and FSDP's
        # _StridedShard on dp over a TP-sharded dimension (which is_shard() does not own up to).
        sharded = {n for n, pl in zip(names, p.placements) if not (pl.is_replicate() or pl.is_partial())}
    return all(c == 0 for dim, c in coords.items() if dim not in sharded)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


# ---- measuring TP communication ----------------------------------------------------------------------------

_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce")
"""The functional collectives DTensor redistributions go through (torch.distributed.tensor.placement_types)."""


@contextlib.contextmanager
def timed_collectives(record: Callable[[float, float], None], clock_now: Callable[[], float],
                      sync: Callable[[], None]) -> Iterator[None]:
    """Time every DTensor collective (TP's all-gathers, reduce-scatters, all-reduces) while inside.

    Each one is waited for where it is issued, between device synchronisations, so its span is the time
    this rank's compute stood still for it: the exposed TP communication. Eager TP waits for these at the
    next op anyway (the row-parallel outputs' async wait is at the residual add right after), so the
    forced wait moves little; what it costs is reported as part of forward/backward like any comm.
    """
    import torch.distributed._functional_collectives as funcol

    originals = {name: getattr(funcol, name) for name in _COLLECTIVES}

    def wrap(fn):
        def timed(*args, **kwargs):
            sync()
            start = clock_now()
            out = fn(*args, **kwargs)
            if isinstance(out, funcol.AsyncCollectiveTensor):
                out = out.wait()
            sync()
            record(start, clock_now())
            return out
        return timed

    for name, fn in originals.items():
        setattr(funcol, name, wrap(fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(funcol, name, fn)


def tp_comm_clock(clock) -> contextlib.AbstractContextManager:
    """``timed_collectives`` feeding a PhaseClock's ``tp_comm`` phase."""
    from trainer.measure.meters import sync

    return timed_collectives(lambda s, e: clock.add("tp_comm", s, e), clock.now, lambda: sync(clock.device))

