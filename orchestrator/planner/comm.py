"""Collective and overlap timings as Megatron-LM and NCCL run them: pure functions over numpy arrays.

Collectives (alpha-beta model, Thakur et al. 2005; Patarasuk & Yuan 2009; NCCL's nccl-tests "bus
bandwidth" convention, docs/PERFORMANCE.md of NVIDIA/nccl-tests):

* reduce-scatter and all-gather: each GPU moves (n-1)/n of the buffer at the group's bus bandwidth and
  the ring pays (n-1) hops of latency;
* all-reduce: twice that volume. NCCL picks ring or (double binary) tree by size; the tree moves the same
  bytes at about the same bus bandwidth but pays 2 log2(n) hops instead of 2(n-1), so the faster of the two
  is taken;
* bus bandwidth of a group: inside one node it is the NVLink bandwidth per GPU; a group spanning nodes runs
  one ring per NIC rail (NCCL's channels), so each node pushes the group's traffic through the NICs of its
  own members: bus bandwidth = min(NVLink, members per node x NIC bandwidth per GPU). A tensor-parallel-8
  layout leaves one member of each data-parallel group per node, hence one NIC; a TP1 DP32 layout on four
  8-GPU nodes uses all eight.

Overlap (Megatron-LM ``DistributedDataParallel`` with ``overlap_grad_reduce`` and the distributed
optimizer's ``overlap_param_gather``; megatron/core/distributed/param_and_grad_buffer.py):

* gradient synchronisation is enabled only for the last microbatch of the step, so a bucket's reduction
  starts when its gradients of the LAST microbatch are final: buckets become ready evenly over that
  microbatch's backward pass and are sent one after another on one communication stream;
* the parameter all-gather of bucket i is issued at the start of the next forward and must finish before
  the forward reaches bucket i's layers of the first microbatch;
* with pipeline parallelism, stage s finishes its last backward s backward slots before stage 0 (1F1B
  drains from the last stage to the first), so its reduction has that much slack before the update waits,
  and its first forward starts s forward slots after stage 0's, which hides that much of its all-gather.

Tensor-parallel communication overlap (Megatron ``--tp-comm-overlap``: Transformer Engine userbuffers; needs
sequence parallelism). Each all-gather / reduce-scatter of a layer runs next to the GEMM that consumes or
produces its buffer, in one of two ways (Megatron's default userbuffer config, per GEMM):

* pipelined ("ring exchange" / "pipeline"): the GEMM and the collective are both split into tp chunks and
  run as a two-stage pipeline - chunk i's exchange while chunk i-1 multiplies (forward QKV/FC1 all-gather,
  proj/FC2 reduce-scatter; backward proj/FC2 dgrad all-gather). A two-stage pipeline of n items taking c/n
  and g/n each ends at c/n + g/n + (n-1) max(c/n, g/n), so it exposes one chunk's communication plus, when
  the communication is the longer stage, its excess over the GEMM on the remaining chunks:
  c/n + (n-1)/n max(0, c - g);
* bulk: the collective runs beside an independent GEMM from start to end (backward QKV/FC1: the input
  all-gather beside the dgrad GEMM, the dgrad reduce-scatter beside the wgrad GEMM): max(0, c - g).

Either way at most the GEMM is hidden and never more than the communication.

Every collective and every send is priced per message as latency + bytes / bandwidth: the link's latency per
hop (alpha, ``cluster.*_latency_us``: what nccl-tests or ``netcal``'s small sizes measure) and, on top, a fixed
cost per message (``overhead_s``, ``efficiency.collective_latency_us``: the launch, the framework's dispatch and
hook; a few microseconds on NCCL, about a millisecond for a gloo bucket on a loaded CPU host). A data-parallel
step of n buckets pays n messages, so halving the bucket doubles its latency term; the same formulas price
NCCL and gloo, only the figures differ.

Overlap hides a bucket under at most ``overlap_eff`` of the compute window (``efficiency.dp_overlap_eff``): 1
where communication runs on its own engine (GPU copy engines / SMs beside the compute), less where it competes
for the same cores (gloo's threads beside the compute on a CPU host). The last bucket is always exposed.
"""

from __future__ import annotations

import numpy as np


def bus_bandwidth(members: int, members_per_node: int, intra_Bps: float, inter_Bps: float) -> float:
    """Bytes/s per GPU a collective of ``members`` GPUs achieves (before software efficiency).

    ``members_per_node`` is how many of the group share a node; ``inter_Bps`` is the NIC bandwidth per GPU.
    """
    if members <= 1 or members_per_node >= members:
        return float(intra_Bps)
    return float(min(intra_Bps, max(1, members_per_node) * inter_Bps))


def reduce_scatter_time(n: int, nbytes, bus_Bps: float, alpha_s: float, overhead_s: float = 0.0):
    """Ring reduce-scatter of an ``nbytes`` buffer (the full, unsharded size) over n GPUs, seconds: one
    message, ``overhead_s`` plus (n-1) hops of ``alpha_s`` plus (n-1)/n of the buffer at the bus bandwidth."""
    nbytes = np.asarray(nbytes, dtype=float)
    if n <= 1:
        return np.zeros_like(nbytes)
    return (n - 1) / n * nbytes / bus_Bps + (n - 1) * alpha_s + overhead_s


all_gather_time = reduce_scatter_time
"""All-gather into an ``nbytes`` buffer moves the same bytes over the same ring as reduce-scatter."""


def all_reduce_time(n: int, nbytes, bus_Bps: float, alpha_s: float, overhead_s: float = 0.0):
    """All-reduce of ``nbytes`` over n GPUs: the faster of ring (2(n-1) hops) and tree (2 log2 n hops), one
    message (``overhead_s`` once)."""
    nbytes = np.asarray(nbytes, dtype=float)
    if n <= 1:
        return np.zeros_like(nbytes)
    ring = 2.0 * (n - 1) / n * nbytes / bus_Bps + 2 * (n - 1) * alpha_s
    tree = 2.0 * (n - 1) / n * nbytes / bus_Bps + 2 * np.ceil(np.log2(n)) * alpha_s
    return np.minimum(ring, tree) + overhead_s


def p2p_time(nbytes, Bps: float, alpha_s: float, overhead_s: float = 0.0):
    """One point-to-point send between adjacent pipeline stages, seconds: one hop, one message."""
    return np.asarray(nbytes, dtype=float) / Bps + alpha_s + overhead_s


def bucketed_time(per_bucket, n_buckets):
    """What n buckets cost sent back to back with nothing to hide under: n messages, each paying its own
    latency, so n x (latency + bytes / n / bandwidth) = n x latency + bytes / bandwidth."""
    return np.asarray(n_buckets, dtype=float) * np.asarray(per_bucket, dtype=float)


def bucket_tail(per_bucket, n_buckets, window, overlap_eff: float = 1.0):
    """Seconds of communication left after a compute ``window`` during which n equal buckets become ready.

    Bucket i (0-based) is ready at (i+1) window / n and the buckets go out back to back, each taking
    ``per_bucket``. The last finishes at max(window + per_bucket, window/n + n per_bucket), so the tail
    after the window is never less than one bucket and never more than all of them, and at most the window
    is hidden. The same expression gives the parameter all-gather's exposure in front of a forward pass
    whose bucket i is needed at i window / n. ``overlap_eff`` scales the window: the fraction of the compute
    under which communication can progress (1 on a GPU; less where both share the same cores).
    """
    per_bucket = np.asarray(per_bucket, dtype=float)
    n_buckets = np.asarray(n_buckets, dtype=float)
    window = np.maximum(np.asarray(window, dtype=float), 0.0) * float(overlap_eff)
    return np.maximum(per_bucket, n_buckets * per_bucket - window * (n_buckets - 1) / n_buckets)


def exposed_after_slack(tail, slack):
    """What of a stage's tail the update still waits for when the stage had ``slack`` seconds in hand."""
    return np.maximum(0.0, np.asarray(tail, dtype=float) - np.asarray(slack, dtype=float))


def pipelined_overlap_exposed(comm_s, gemm_s, chunks: int):
    """Seconds of a collective left exposed when it is pipelined with a GEMM in ``chunks`` chunks.

    Two-stage pipeline makespan c/n + g/n + (n-1) max(c/n, g/n) minus the GEMM's own g:
    c/n + (n-1)/n max(0, c - g). One chunk is always exposed; at most (n-1)/n of the GEMM hides the rest.
    """
    comm_s = np.asarray(comm_s, dtype=float)
    n = max(1, int(chunks))
    return comm_s / n + (n - 1) / n * np.maximum(0.0, comm_s - np.asarray(gemm_s, dtype=float))


def bulk_overlap_exposed(comm_s, gemm_s):
    """Seconds of a collective left exposed when it runs beside an independent GEMM: max(0, c - g)."""
    return np.maximum(0.0, np.asarray(comm_s, dtype=float) - np.asarray(gemm_s, dtype=float))
