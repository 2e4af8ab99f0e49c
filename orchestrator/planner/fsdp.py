"""FSDP at dp > 1 (ZeRO-3: FSDP2 ``fully_shard`` per transformer block): the buffers it holds, what it waits for.

How FSDP2 runs (torch.distributed.fsdp._fully_shard, torch 2.13; the trainer's ``apply_fsdp`` and torchtitan
shard the same way): one parameter group per block, and the root group (embeddings, final norm, LM head) on
each pipeline rank. All are sharded over dp; in this module ``p`` is one block's parameters per GPU
(``params_per_layer / t``) and ``R`` a stage's root parameters.

* Memory. Parameters, gradients and optimizer state are held sharded, 1/d each (memory.py). On top, for
  the duration of a step (``buffer_bytes``): the root's gathered parameters (FSDP2 does not reshard the
  root after forward); gathered block parameters, 1 + max(prefetch, 1) blocks with
  ``reshard_after_forward`` (the block computing and the one prefetched: FSDP2 prefetches one block in
  backward by default, ``prefetch`` explicitly), every block of the stage without it (kept from forward
  to backward); one block's reduce-scatter input (FSDP2 keeps one in flight); and with m > 1 the
  unsharded gradients of the whole stage, since gradient sync runs only in the last microbatch (the
  trainer's ``set_requires_gradient_sync``) and FSDP2 accumulates the others unsharded.
* Time (``fsdp_times``). Collectives as every data-parallel one (comm.py, bus bandwidth of the dp group):
  per block a weight-dtype all-gather ``g`` of ``p`` before its forward and, with
  ``reshard_after_forward``, again before its backward; a gradient reduce-scatter ``r`` after its
  backward in the last microbatch; the root's all-gather ``g0`` before the stage's forward and its
  reduce-scatter ``r0`` after its backward. They share one NCCL communicator, so they run one after
  another, and a block's gather is issued one block ahead:

  - forward: the first gather is exposed; block i's gather runs under block i-1's forward ``f``:
    exposed ``max(0, g - f)``. ``prefetch`` 0 is FSDP2's implicit one-ahead (gathers on their own stream,
    issued as the CPU runs ahead of the GPU, which the planner assumes throughout: it prices GPU time);
    deeper prefetch issues earlier but the collectives still run one after another, so with equal blocks
    it hides nothing more (it costs memory);
  - backward: the first block's gather is exposed; under block i's backward ``b`` run the gather of block
    i-1 and the reduce-scatter of block i+1 (issued when i+1 finished): exposed ``max(0, g + r - b)``, the
    two end blocks carrying one of the two;
  - the last reduce-scatters (block 0's, then the root's) are exposed after the last backward.

  A two-stage pipeline of a collective stream and a compute stream, so what is hidden is never more than
  the compute it runs under and never more than the collective. Nothing here is fitted.
"""

from __future__ import annotations

import numpy as np

from .comm import all_gather_time, reduce_scatter_time
from .knobs import Consts, Knobs, stage_params, state_bytes


def block_params(C: Consts) -> float:
    """Parameters of one transformer block per GPU (before dp sharding)."""
    return C.params_per_layer / C.t


def root_params(C: Consts, K: Knobs) -> np.ndarray:
    """Parameters per GPU of each stage's root group (n, pp): embeddings, final norm, LM head."""
    return stage_params(C, K) - K.layers * block_params(C)


def gathered_blocks(K: Knobs) -> np.ndarray:
    """Blocks whose gathered parameters a stage holds at its peak (n, pp)."""
    col = lambda x: x[:, None]  # noqa: E731
    in_flight = np.minimum(1 + np.maximum(col(K.prefetch), 1), K.layers)
    return np.where(col(K.raf), in_flight, K.layers) * col(K.fsdp)


def buffer_bytes(C: Consts, K: Knobs) -> np.ndarray:
    """FSDP's unsharded buffers per stage (n, pp), bytes; zero for configs that do not run FSDP."""
    if not K.fsdp.any():  # the enumerator's usual case: keep it at full speed
        return np.zeros(K.layers.shape)
    col = lambda x: x[:, None]  # noqa: E731
    weight_bytes, grad_bytes = state_bytes(C, K)
    p = block_params(C)
    gathered = weight_bytes * (root_params(C, K) + gathered_blocks(K) * p)
    rs_input = col(grad_bytes) * p
    accumulated = np.where(col(K.m) > 1, col(grad_bytes) * stage_params(C, K), 0.0)
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


def fsdp_times(C: Consts, K: Knobs, f: np.ndarray, b: np.ndarray, bus: float) -> dict[str, np.ndarray]:
    """Per stage (n, pp): ``stall`` per microbatch outside the last (exposed gathers), ``sync_extra`` what
    the last microbatch's reduce-scatters add to its backward, ``tail`` the reduce-scatters after the last
    backward, ``total`` all FSDP traffic of a step. ``f``, ``b``: one block's forward and backward compute
    (with TP and recompute) per microbatch; ``bus``: the dp group's bus bandwidth, bytes/s."""
    col = lambda x: x[:, None]  # noqa: E731
    weight_bytes, grad_bytes = state_bytes(C, K)
    p, R = block_params(C), root_params(C, K)
    g = all_gather_time(C.d, weight_bytes * p, bus, C.lat_dp)
    r = col(reduce_scatter_time(C.d, grad_bytes * p, bus, C.lat_dp))
    # A stage without embedding or head (a middle pipeline stage) has an empty root: no collective at all.
    g0 = np.where(R > 0, all_gather_time(C.d, weight_bytes * R, bus, C.lat_dp), 0.0)
    r0 = np.where(R > 0, reduce_scatter_time(C.d, col(grad_bytes) * R, bus, C.lat_dp), 0.0)
    g_bwd = np.where(col(K.raf), g, 0.0)
    # Interleaved: a microbatch passes each of the stage's v chunks (layers / v blocks) once.
    L, v = K.layers, col(K.v).astype(float)
    quiet = pass_exposed(g, g_bwd, 0.0, f, b, L / v)
    sync = pass_exposed(g, g_bwd, r, f, b, L / v)
    on = col(K.fsdp)
    m = col(K.m).astype(float)
    traffic = m * (L * (g + g_bwd) + g0) + L * r + r0
    return {"stall": on * (g0 + v * (quiet["forward"] + quiet["backward"])),
            "sync_extra": on * v * (sync["backward"] - quiet["backward"]),
            "tail": on * (np.where(L > 0, r, 0.0) + r0),
            "total": on * traffic}
