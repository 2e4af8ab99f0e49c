"""FSDP at dp > 1 (ZeRO-3: FSDP2 ``fully_shard`` per transformer block): the buffers it holds, what it waits for.

How FSDP2 runs (torch.distributed.fsdp._fully_shard, torch 2.13; the trainer's ``apply_fsdp`` and torchtitan
shard the same way): one parameter group per block, and the root group (embeddings, final norm, LM head) on
each model chunk. All are sharded over dp; in this module ``p`` is one block's parameters per GPU
(``layer_params_per_gpu``) and ``R`` a stage's root parameters. A group is gathered when it is used while
sharded; it is resharded after its forward with ``reshard_after_forward`` and after its backward when
FSDP's ``reshard_after_backward`` is on; its gradients are reduce-scattered in a backward with gradient sync on.

Two ways the trainer drives that state (counted per step on real gloo ranks: tests/distributed/
test_fsdp_gathers.py):

* pp = 1 (trainer/run.py ``_accumulation_step``): plain FSDP2 per microbatch, gradient sync only in the
  last. Every block is gathered before its forward and, with ``reshard_after_forward``, again before its
  backward, and resharded after it: 2m gathers per step (m without resharding); one reduce-scatter per step.
  The root: once per microbatch here (FSDP2 leaves a root it picked itself unresharded, as torchtitan
  applies it; the trainer passes its ``reshard_after_forward`` to the root too and so gathers it 2m times
  with resharding: that root gather before each backward is not priced).
* pp > 1 (torch.distributed.pipelining's PipelineStage): every microbatch's backward runs with
  ``reshard_after_backward`` and gradient sync off; after the chunk's last backward (``perform_reduce_grad``)
  both go on and FSDP's post-backward reduce-scatters and reshards every group once. So without
  ``reshard_after_forward`` a group is gathered once per step, in its first forward, and stays gathered;
  with it, a forward leaves it sharded and a backward leaves it gathered, so a backward after a forward
  gathers and a forward after a backward does not: with the step's last pass a backward, of its 2m passes
  the m - 1 that follow a backward gather nothing, m + 1 gathers per step whatever the schedule (GPipe:
  m forwards + the first backward; 1F1B: the forwards before the first backward + every backward that
  follows a forward). The root follows the same rule (the trainer's root reshards as its blocks do).
  torch's interleaved schedule (a ``_PipelineScheduleRuntime``) also unshards a rank's chunks up front,
  before the step's first pass (``_add_unshard_reshard``, up to 3 chunks active: v > 3 evicts and
  re-gathers chunks within the step, which is not modelled); the chunk's first forward then finds its
  groups gathered, so the count stays 1 or m + 1.

* Memory. Parameters, gradients and optimizer state are held sharded, 1/d each (memory.py). On top, for
  the duration of a step (``buffer_bytes``): the root's gathered parameters; gathered block parameters,
  at pp = 1 1 + max(prefetch, 1) blocks with ``reshard_after_forward`` (the block computing and the one
  prefetched: FSDP2 prefetches one block in backward by default, ``prefetch`` explicitly), every block of
  the stage without it (kept from forward to backward); at pp > 1 every block of the stage either way (a
  block stays gathered from a backward to the end of the step, or to the next forward); one block's
  reduce-scatter input (FSDP2 keeps one in flight); and the unsharded gradients of the whole stage when
  the sync waits for a later backward (m > 1, or any pp > 1), since FSDP2 accumulates them unsharded.
* Time (``fsdp_times``). Collectives as every data-parallel one (comm.py, bus bandwidth of the dp group):
  a block's weight-dtype all-gather ``g`` of ``p``, its gradient reduce-scatter ``r``, the root's ``g0`` and
  ``r0``. They share one NCCL communicator, so they run one after another, and a block's gather is issued
  one block ahead (FSDP2 lets the next gather start once the previous one's output is consumed):

  - forward: the first gather is exposed; block i's gather runs under block i-1's forward ``f``:
    exposed ``max(0, g - f)``. ``prefetch`` 0 is FSDP2's implicit one-ahead (gathers on their own stream,
    issued as the CPU runs ahead of the GPU, which the planner assumes throughout: it prices GPU time);
    deeper prefetch issues earlier but the collectives still run one after another, so with equal blocks
    it hides nothing more (it costs memory);
  - backward: the first block's gather is exposed; under block i's backward ``b`` run the gather of block
    i-1 and the reduce-scatter of block i+1 (issued when i+1 finished): exposed ``max(0, g + r - b)``, the
    two end blocks carrying one of the two;
  - pp = 1: the last reduce-scatters (block 0's, then the root's) are exposed after the last backward;
    the other passes' stalls are paid in every microbatch, priced through the pipeline formula;
  - pp > 1, the first microbatch's forward, once per step. GPipe and 1F1B (``chain``): only the first
    gathers of the stage (the root's and block 0's) can run before its input arrives, less the fill wait
    ``fill_slack``: each later gather waits until the block two before it has been consumed on the
    compute stream, which waits on the receive. So the rest of the pass is exposed as at pp = 1,
    ``max(0, g - f)`` per block, and these one-off stalls add up along the fill, a chain through every
    stage (exact for a balanced pipeline, an upper bound otherwise). Interleaved (``up_front``): every
    stage gathers its first chunk (root + its L/v blocks) from the step's start, less its fill wait, all
    stages at once (the largest counts), the later chunks under the first chunk's warm-up passes;
  - pp > 1, with ``reshard_after_forward``: the other gathering passes (forwards before a chunk's first
    backward, ``knobs.in_flight`` over v, then backwards after a forward) stall as at pp = 1, spread over
    the m microbatches through the pipeline formula;
  - pp > 1: every reduce-scatter (L r + r0) runs after the stage's last backward, less the drain slack
    (with interleaving a chunk reduces after its own last backward, which the planner counts at the
    stage's end: FSDP then makes the compute stream wait for them, so they are not hidden either way).

  A two-stage pipeline of a collective stream and a compute stream, so what is hidden is never more than
  the compute it runs under and never more than the collective. Nothing here is fitted.
* Copies on the compute stream (``copy_times``). FSDP2 runs two memory-bound copies on the stream that
  computes, not beside it (torch 2.13, ``_fsdp_param_group.wait_for_unshard`` and
  ``_fsdp_collectives.foreach_reduce``): after each all-gather, the copy-out of the gathered buffer into the
  unsharded parameters (read and write, 2 x weight bytes per parameter of the group); before each
  reduce-scatter, the copy-in of the unsharded gradients into the reduce-scatter buffer, cast to the reduce
  dtype (read the weight-dtype gradient, write the reduce dtype). Both at HBM bandwidth x
  ``elementwise_bw_eff``, as the layer's elementwise kernels. The copy-out adds to every gathering pass
  (through ``stall``), the copy-in to the last microbatch's backward (pp = 1, ``sync_extra``) or to the
  post-backward ``tail`` (pp > 1).
"""

from __future__ import annotations

import numpy as np

from .comm import all_gather_time, reduce_scatter_time
from .knobs import Consts, Knobs, col, in_flight, layer_params_per_gpu, stage_params, state_bytes


def block_params(C: Consts) -> float:
    """Parameters of one transformer block per GPU (before dp sharding)."""
    return layer_params_per_gpu(C)


def root_params(C: Consts, K: Knobs) -> np.ndarray:
    """Parameters per GPU of each stage's root group (n, pp): embeddings, final norm, LM head."""
    return stage_params(C, K) - K.layers * block_params(C)


def gathered_blocks(C: Consts, K: Knobs) -> np.ndarray:
    """Blocks whose gathered parameters a stage holds at its peak (n, pp)."""
    in_flight_blocks = np.minimum(1 + np.maximum(col(K.prefetch), 1), K.layers)
    resharded = col(K.raf) & (C.p == 1)  # under a pipeline a backward leaves its block gathered to the step's end
    return np.where(resharded, in_flight_blocks, K.layers) * col(K.fsdp)


def gather_passes(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """Per stage (n, pp): how often per step FSDP gathers each of a chunk's groups (see the module docstring):
    ``up_front`` (torch's interleaved schedule unshards every chunk before the step's first pass),
    ``forward`` and ``backward`` (in those passes), ``per_step`` all three (pp = 1: 2m with
    reshard_after_forward, else m; pp > 1: m + 1, else 1)."""
    m, v, raf = col(K.m), col(K.v), col(K.raf)
    zero = 0 * K.layers
    if C.p == 1:
        fwd, bwd, up_front = m + zero, np.where(raf, m, 0) + zero, zero
    else:
        # Forwards of a chunk before its first backward: the stage's warm-up count over its chunks (exact
        # for GPipe and 1F1B; for the interleaved schedule a stage average, torch's order differs by chunk).
        ahead = np.minimum(m, -(-in_flight(C, K) // v))
        up_front = np.where(col(K.sched) == 2, 1, 0) + zero
        fwd = np.where(raf, ahead, 1) - up_front
        bwd = np.where(raf, m + 1 - ahead, 0)
    return {"up_front": up_front, "forward": fwd, "backward": bwd, "per_step": up_front + fwd + bwd}


def buffer_bytes(C: Consts, K: Knobs) -> np.ndarray:
    """FSDP's unsharded buffers per stage (n, pp), bytes; zero for configs that do not run FSDP."""
    if not K.fsdp.any():  # the enumerator's usual case: keep it at full speed
        return np.zeros(K.layers.shape)
    weight_bytes, grad_bytes = state_bytes(C, K)
    p = block_params(C)
    gathered = weight_bytes * (root_params(C, K) + gathered_blocks(C, K) * p)
    rs_input = col(grad_bytes) * p
    deferred_sync = (col(K.m) > 1) | (C.p > 1)  # gradients reduced in a later backward than they were made
    accumulated = np.where(deferred_sync, col(grad_bytes) * stage_params(C, K), 0.0)
    return np.where(col(K.fsdp), gathered + rs_input + accumulated, 0.0)


def pass_exposed(g_fwd, g_bwd, r, f, b, n_blocks) -> dict[str, np.ndarray]:
    """Exposed seconds of one microbatch over ``n_blocks`` blocks: its forward and its backward stalls.

    ``g_fwd``: a block's forward all-gather; ``g_bwd``: its backward one (0 without reshard_after_forward);
    ``r``: its reduce-scatter (0 outside the last microbatch); ``f``, ``b``: a block's forward and backward
    compute. The reduce-scatter of the last block to finish (block 0) is not in here: it is the tail.
    """
    g_fwd, g_bwd, r, f, b, n = (np.asarray(x, dtype=float) for x in (g_fwd, g_bwd, r, f, b, n_blocks))
    forward = np.where(n > 0, g_fwd + np.maximum(n - 1.0, 0.0) * np.maximum(0.0, g_fwd - f), 0.0)
    ends = np.where(n >= 2, np.maximum(0.0, g_bwd - b) + np.maximum(0.0, r - b), 0.0)
    middle = np.maximum(n - 2.0, 0.0) * np.maximum(0.0, g_bwd + r - b)
    backward = np.where(n > 0, g_bwd + middle + ends, 0.0)
    return {"forward": forward, "backward": backward}


def fsdp_times(C: Consts, K: Knobs, f: np.ndarray, b: np.ndarray, bus: float,
               fill_slack: np.ndarray | float = 0.0) -> dict[str, np.ndarray]:
    """Per stage (n, pp): ``stall`` per microbatch (at pp = 1 outside the last; exposed gathers), the
    one-off stall of the first microbatch's forward at pp > 1, ``chain`` (adding up along the fill) or
    with the interleaved schedule ``up_front`` (all stages at once, from the step's start), ``sync_extra``
    what the last microbatch's reduce-scatters add to its backward (pp = 1), ``tail`` the reduce-scatters
    after the last backward, ``total`` all FSDP traffic of a step. ``f``, ``b``: one block's forward and
    backward compute (with TP and recompute) per microbatch; ``bus``: the dp group's bus bandwidth,
    bytes/s; ``fill_slack``: how long each stage waits for its first input (pp > 1)."""
    weight_bytes, grad_bytes = state_bytes(C, K)
    p, R = block_params(C), root_params(C, K)
    g = all_gather_time(C.d, weight_bytes * p, bus, *C.dp_latency())
    r = col(reduce_scatter_time(C.d, grad_bytes * p, bus, *C.dp_latency()))
    # A stage without embedding or head (a middle pipeline stage) has an empty root: no collective at all.
    g0 = np.where(R > 0, all_gather_time(C.d, weight_bytes * R, bus, *C.dp_latency()), 0.0)
    r0 = np.where(R > 0, reduce_scatter_time(C.d, col(grad_bytes) * R, bus, *C.dp_latency()), 0.0)
    # Interleaved: a microbatch passes each of the stage's v chunks (layers / v blocks) once.
    L, v = K.layers, col(K.v).astype(float)
    on = col(K.fsdp)
    m = col(K.m).astype(float)
    passes = gather_passes(C, K)
    copy_out, copy_in, copy_out0, copy_in0 = copy_times(C, K, R)
    if C.p == 1:
        tail = np.where(L > 0, r, 0.0) + r0   # block 0's and the root's: the others hide under the backward
        g_bwd = np.where(col(K.raf), g, 0.0)
        quiet = pass_exposed(g, g_bwd, 0.0, f, b, L / v)
        sync = pass_exposed(g, g_bwd, r, f, b, L / v)
        zero = np.zeros_like(L, dtype=float)
        copies = L * copy_out * (1.0 + col(K.raf)) + copy_out0  # every gather of the microbatch
        return {"stall": on * (g0 + v * (quiet["forward"] + quiet["backward"]) + copies), "chain": zero,
                "up_front": zero, "sync_extra": on * (v * (sync["backward"] - quiet["backward"]) + L * copy_in + copy_in0),
                "tail": on * tail, "total": on * (m * (L * (g + g_bwd) + g0) + L * r + r0)}
    gathering_forward = pass_exposed(g, 0.0, 0.0, f, b, L / v)["forward"]
    gathering_backward = pass_exposed(g, g, 0.0, f, b, L / v)["backward"]
    n = L / v
    interleaved = col(K.sched) == 2
    # GPipe / 1F1B (v = 1): the root's and block 0's gathers can run before the input arrives; the rest of the
    # pass gathers one block ahead of its compute.
    chain = np.maximum(0.0, g0 + np.where(L > 0, g, 0.0) - fill_slack) + np.maximum(0.0, gathering_forward - g)
    # Interleaved: the whole first chunk is gathered from the step's start, the later chunks under its passes.
    up_front = np.maximum(0.0, g0 + n * g - fill_slack)
    # Every other gathering pass of a chunk (reshard_after_forward only), the root's gather in front of each.
    later_forwards = passes["forward"] - np.where(interleaved, 0, 1)
    later = (v * (later_forwards * gathering_forward + passes["backward"] * gathering_backward)
             + (passes["per_step"] - 1) * g0)
    copies = passes["per_step"] * (L * copy_out + copy_out0)
    return {"stall": on * (later + copies) / m, "chain": on * np.where(interleaved, 0.0, chain),
            "up_front": on * np.where(interleaved, up_front, 0.0), "sync_extra": np.zeros_like(chain),
            "tail": on * (L * r + r0 + L * copy_in + copy_in0),
            "total": on * (passes["per_step"] * (L * g + g0) + L * r + r0)}


def copy_times(C: Consts, K: Knobs, R: np.ndarray) -> tuple:
    """Seconds on the compute stream: one block's all-gather copy-out and reduce-scatter copy-in, and the
    root's (``R``: root parameters per stage), (n, 1) or (n, pp); see the module docstring."""
    weight_bytes, grad_bytes = state_bytes(C, K)
    hbm = C.hbm_bw * C.eff.elementwise_bw_eff
    out_per_param, in_per_param = 2.0 * weight_bytes / hbm, (weight_bytes + col(grad_bytes)) / hbm
    p = block_params(C)
    return out_per_param * p, in_per_param * p, out_per_param * R, in_per_param * R
