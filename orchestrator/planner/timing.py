"""Update time: compute per layer, tensor/pipeline/data-parallel communication, pipeline schedule.

Sources, per formula (also in docs/planner.md):

* GEMM FLOPs of a layer's forward pass, 2 * tokens * (4h^2 + 2h*ffn) = 24 b s h^2 for ffn = 4h, and
  attention scores 4 b s^2 h: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM"), Appendix / eq. 3. Backward = 2x forward (same paper). Causal fused
  attention skips half the score FLOPs and its backward is 2.5x its forward (Dao 2023, FlashAttention-2).
* Elementwise kernels (LayerNorm, bias-dropout-add, GeLU, residual-gradient sums) are memory-bound: their
  bytes (model.elementwise: cluster.ElementwiseBytes) at HBM bandwidth x elementwise_bw_eff; the h-wide
  ones are replicated over TP without sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2).
* LM head: 2 b s V h forward (Narayanan et al. eq. 3's V/(16 l h) term), on the last stage only.
* Collectives, alpha-beta ring model: reduce-scatter and all-gather move (n-1)/n of the buffer per GPU,
  all-reduce 2(n-1)/n; each costs (n-1) hops of latency (Patarasuk & Yuan 2009; Thakur et al. 2005), plus
  efficiency.collective_latency_us once per message (comm.py): TP collectives, pipeline sends and every
  data-parallel bucket alike.
* Tensor parallelism: per layer 2 all-reduces forward and 2 backward (Shoeybi et al. 2019); with sequence
  parallelism each becomes an all-gather + reduce-scatter of the same volume, plus 2 all-gathers in the
  backward pass for the weight gradients (Korthikanti et al. 2022, Sec. 4.2.2). With tensor_parallel.comm_overlap
  each collective hides under its GEMM as Transformer Engine's userbuffers pipeline them (comm.py).
* Pipeline: time = m * slowest stage + (sum of the other stages) / v, which is (m + (p-1)/v) * t_stage when
  balanced: the bubble (p-1)/(v m) of Narayanan et al. Sec. 2.2. Point-to-point: 2 sends of b s h / t
  (scatter/gather optimisation, Sec. 4.1) per microbatch per chunk on the critical path, less what
  Megatron's overlap_p2p_comm hides under interleaving (``p2p_exposed``).
* Data parallelism: buckets of the distributed optimizer's reduce-scatter / all-gather (Megatron
  distributed optimizer docs) or all-reduce, at the group's bus bandwidth, overlapped as Megatron overlaps
  them (the last microbatch's backward, the first microbatch's forward, the pipeline drain): comm.py.
  FSDP instead gathers and reduces per block inside the microbatches (fsdp.py: every microbatch at pp = 1,
  as torch pipelining drives it at pp > 1): its exposed seconds stall the stage's forward and backward, so
  they are priced through the pipeline formula like compute.
"""

from __future__ import annotations

import numpy as np

from .comm import (all_gather_time, all_reduce_time, bucket_tail, bucketed_time, bulk_overlap_exposed,
                   bus_bandwidth, exposed_after_slack, p2p_time, pipelined_overlap_exposed, reduce_scatter_time)
from .fsdp import fsdp_times
from .knobs import (Consts, Knobs, col, interleaved_warmup, op_kept_gemms, recomputed_layers, stage_params,
                    stage_tensors, state_bytes)
from .memory import ACTIVATION_SCALE

TP_OPS_FWD = 4
"""All-gather/reduce-scatter-sized collectives per layer forward (2 all-reduces = 4 of them)."""
ATTN_BWD_FUSED = 2.5
ATTN_BWD_UNFUSED = 2.0
ADAM_BYTES = 26.0
"""HBM bytes an Adam step moves per (sharded) parameter besides the gradient read: fp32 master, m, v
read and written (24) and the bf16 parameter written back (2)."""
TORCH_ADAM_BYTES = 24.0
"""The same for torch AdamW on fp32 parameters: the parameter, m and v, each read and written."""


def _ring(n: int, nbytes, bw: float, lat: float, msg: float = 0.0):
    """Alpha-beta ring collective, one message: (n-1)/n of the buffer over the link, (n-1) hops, ``msg`` once."""
    if n <= 1:
        return np.zeros_like(np.asarray(nbytes, dtype=float))
    return (n - 1) / n * nbytes / bw + (n - 1) * lat + msg


def layer_costs(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """Per layer, per microbatch, per GPU: seconds of forward/backward compute and TP communication."""
    e = C.eff
    T = (K.b * C.s).astype(float)
    eta = e.matmul_eff * T / (T + e.gemm_tokens_half)
    gemm = 2.0 * T * (4 * C.h * C.h + 2 * C.h * C.ffn) / C.t / (C.peak * eta)
    mlp = 2.0 * T * (2 * C.h * C.ffn) / C.t / (C.peak * eta)
    flash_eff = getattr(e, "flash_attention_eff", None)
    attn_eff = flash_eff if (C.flash and flash_eff is not None) else e.attention_eff
    attn = 4.0 * T * C.s * C.h * (0.5 if C.flash else 1.0) / C.t / (C.peak * attn_eff)
    ovh = e.op_overhead_us * 1e-6
    # Memory-bound elementwise kernels: the h-wide ones run on every TP rank unless sequence parallelism
    # splits them (Korthikanti et al. 2022, Sec. 4.2.2); the MLP activation is always split.
    rep = 1.0 / C.t if C.sp else 1.0
    hbm = C.hbm_bw * e.elementwise_bw_eff / ACTIVATION_SCALE[C.precision]  # fp32 activations move twice the bytes
    ew_f = (C.ew.forward_h * T * C.h * rep + C.ew.forward_ffn * T * C.ffn / C.t) / hbm
    ew_b = (C.ew.backward_h * T * C.h * rep + C.ew.backward_ffn * T * C.ffn / C.t) / hbm
    f_tp, b_tp, mlp_tp = tp_exposed(C, K, T, eta)
    # Op-level recompute (recompute.kind op) runs again the GEMMs it does not keep, every elementwise op and
    # the forward's all-gathers / all-reduces (it keeps reduce-scatter outputs); fused attention is kept.
    op_frac = 0.0
    if (K.rc == 3).any():  # the enumerator's usual space has no op recompute: keep it at full speed
        w = np.asarray([i * o for i, o in C.gemms], dtype=float)
        op_frac = (~op_kept_gemms(C, K) * w).sum(axis=1) / w.sum()
    return {
        "f_comp": gemm + attn + ovh + ew_f,
        "b_comp": 2.0 * gemm + (ATTN_BWD_FUSED if C.flash else ATTN_BWD_UNFUSED) * attn + ovh + ew_b,
        "f_tp": f_tp,
        "b_tp": b_tp,
        "sel_comp": np.where(K.sel_mlp, mlp, 0.0) + np.where(K.sel_attn, attn, 0.0),
        "sel_tp": np.where(K.sel_mlp, mlp_tp, 0.0),  # the MLP's input all-gather runs again
        "op_comp": op_frac * gemm + ew_f + ovh + (0.0 if C.flash else attn),
        "op_tp": f_tp * (0.5 if C.sp else 1.0),
        "lm_f": 2.0 * T * C.V * C.h / C.t / (C.peak * eta),
        "p2p": np.where(C.p > 1, p2p_send(C, T), 0.0),
    }


def tp_exposed(C: Consts, K: Knobs, T: np.ndarray, eta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exposed tensor-parallel seconds per layer per microbatch: (forward, backward, the MLP's input gather).

    One all-gather or reduce-scatter moves the 2Th-byte activation. Without overlap every one is exposed:
    4 forward, 4 backward (+2 weight-gradient all-gathers with sequence parallelism). With
    ``tensor_parallel.comm_overlap`` (Megatron's userbuffer defaults; comm.py) each hides under its GEMM:
    forward QKV/FC1 all-gathers and proj/FC2 reduce-scatters pipelined in tp chunks; backward the proj/FC2
    dgrad all-gathers pipelined, and the QKV/FC1 input all-gathers and dgrad reduce-scatters in bulk beside
    their dgrad and wgrad GEMMs. QKV is 3h^2 wide, proj h^2, FC1 and FC2 h*ffn each (the planner's MHA +
    two-matrix MLP; a GQA/SwiGLU model's widths are folded into ffn).
    """
    c = _ring(C.t, 2.0 * T * C.h, C.bw_tp, C.lat_tp, C.msg_s)
    plain = TP_OPS_FWD * c, (TP_OPS_FWD + (2 if C.sp else 0)) * c, c
    on = K.tp_overlap & (C.t > 1)
    if not on.any():  # the usual batch: no config overlaps, skip the overlap formulas
        return plain
    rate = 1.0 / (C.t * C.peak * eta)  # seconds per FLOP of a layer GEMM, split over the tp GPUs
    qkv, proj, fc = (2.0 * T * w * rate for w in (3 * C.h * C.h, C.h * C.h, C.h * C.ffn))
    pipe = lambda g: pipelined_overlap_exposed(c, g, C.t)  # noqa: E731
    bulk = lambda g: bulk_overlap_exposed(c, g)  # noqa: E731
    fwd = pipe(qkv) + pipe(proj) + 2.0 * pipe(fc)
    bwd = pipe(proj) + pipe(fc) + 2.0 * bulk(qkv) + 2.0 * bulk(fc)
    return tuple(np.where(on, o, p) for o, p in zip((fwd, bwd, pipe(fc)), plain))


def p2p_send(C: Consts, T: np.ndarray) -> np.ndarray:
    """One pipeline send of a microbatch's 2Th-byte activation (or its gradient), seconds.

    Every tp rank sends 1/t of it: with sequence parallelism the tensor is already split; without it
    Megatron's scatter/gather optimisation (Narayanan et al. 2021, Sec. 4.1; --scatter-gather-tensors-in-
    pipeline, on by default) sends a 1/t slice per rank and all-gathers the slices over NVLink on arrival.
    """
    gather = 0.0 if C.sp else _ring(C.t, 2.0 * T * C.h, C.bw_tp, C.lat_tp, C.msg_s)
    return p2p_time(2.0 * T * C.h / C.t, C.bw_pp, *C.pp_latency()) + gather


def p2p_exposed(C: Consts, K: Knobs, send: np.ndarray, chunk_fwd: np.ndarray) -> np.ndarray:
    """Pipeline sends on the critical path, seconds (n,): 2 per chunk pass (the activation forward, its
    gradient back) plus 2(p - 1) for the fill and the drain, each ``send`` long.

    With Megatron's overlap_p2p_comm under interleaving, the steady-state 1F1B passes (all but stage 0's
    warm-up 2(p - 1) + (v - 1)p, capped at m v) send while the next chunk pass computes: each of their sends
    costs only what it exceeds one chunk pass's forward (``chunk_fwd``); the warm-up and cool-down sends
    stay exposed (Megatron overlaps them only with --overlap-p2p-communication-warmup-flush).
    """
    m, v = K.m.astype(float), K.v.astype(float)
    hidden = np.where(K.p2p_overlap & (K.v > 1), m * v - interleaved_warmup(C, K)[:, 0], 0.0)
    return 2.0 * ((m * v - hidden + C.p - 1) * send + hidden * np.maximum(0.0, send - chunk_fwd))


def stage_times(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """Per stage, per microbatch (n, pp): forward, backward, recompute compute and TP comm seconds."""
    lc = layer_costs(C, K)
    Lk = K.layers.astype(float)
    last = np.zeros(C.p)
    last[-1] = 1.0
    n_rec = recomputed_layers(K).astype(float)
    selective, op = (K.rc == 1)[:, None], (K.rc == 3)[:, None]
    rec_comp = (n_rec * col(lc["f_comp"]) + np.where(selective, Lk * col(lc["sel_comp"]), 0.0)
                + np.where(op, Lk * col(lc["op_comp"]), 0.0))
    rec_tp = (n_rec * col(lc["f_tp"]) + np.where(selective, Lk * col(lc["sel_tp"]), 0.0)
              + np.where(op, Lk * col(lc["op_tp"]), 0.0))
    head_f = last * col(lc["lm_f"])
    # Every chunk pass pays the fixed cost of a call into the chunk, whatever its layers (v passes per microbatch).
    passes = col(K.v.astype(float)) * float(getattr(C.eff, "pass_overhead_us", 0.0)) * 1e-6
    f_comp = Lk * col(lc["f_comp"]) + head_f + passes
    b_comp = Lk * col(lc["b_comp"]) + 2.0 * head_f + passes
    f_tp = Lk * col(lc["f_tp"])
    b_tp = Lk * col(lc["b_tp"])
    return {"f_comp": f_comp, "b_comp": b_comp, "rec_comp": rec_comp, "f_tp": f_tp, "b_tp": b_tp,
            "rec_tp": rec_tp, "F": f_comp + f_tp, "B": b_comp + b_tp + rec_comp + rec_tp, "p2p": lc["p2p"],
            "head_f": head_f}


def dp_bus_bandwidth(C: Consts) -> float:
    """Bus bandwidth of a data-parallel group (bytes/s per GPU, after dp_bw_eff): comm.bus_bandwidth.

    Megatron's rank order is tp fastest, then dp: a DP group's members are tp ranks apart, so a node of
    gpus_per_node GPUs holds gpus_per_node / tp of them (at least one) once tp * dp spans nodes.
    """
    if C.intra_bw <= 0.0:  # Consts built without raw link figures: the link Consts.of chose
        return C.bw_dp
    per_node = C.d if C.t * C.d <= C.gpus_per_node else max(1, C.gpus_per_node // C.t)
    return bus_bandwidth(C.d, per_node, C.intra_bw, C.inter_bw) * C.eff.dp_bw_eff


def dp_times(C: Consts, K: Knobs, F: np.ndarray, B: np.ndarray) -> dict[str, np.ndarray]:
    """Data-parallel traffic per stage and what of it the update waits for (see comm.py for the rules).

    Reduce-scatter of gradients (grad_bytes each) then all-gather of bf16 parameters with the distributed
    optimizer; one all-reduce of gradients without it; ceil(params / bucket) buckets each. ``F`` and ``B``
    are one microbatch's forward and backward (with recompute) per stage, (n, pp). Gradient buckets overlap
    the last microbatch's backward when overlap_grad_reduce is on; stage s also has the pipeline drain of the
    stages before it in hand. Parameter buckets overlap the first microbatch's forward (plus the fill
    ahead of stage s) when overlap_param_gather is on, else they follow the optimizer step in full.
    """
    P = stage_params(C, K)
    zero = np.zeros_like(P)
    if C.d <= 1:
        return {"rs": zero[:, 0], "ag": zero[:, 0], "total": zero, "P": P}
    bus = dp_bus_bandwidth(C)
    weight_bytes, grad_bytes = state_bytes(C, K)
    # bucket_mb is MB of gradients in the dtype they are reduced in (trainer.knobs.ReplicateDP).
    elems = col(K.bucket_mb) * 1e6 / col(grad_bytes)
    nb = np.maximum(1.0, np.ceil(P / elems))
    grad_bucket = P * col(grad_bytes) / nb
    dist = col(K.dist)
    hop, msg = C.dp_latency()
    c_rs = np.where(dist, reduce_scatter_time(C.d, grad_bucket, bus, hop, msg),
                    all_reduce_time(C.d, grad_bucket, bus, hop, msg))
    c_ag = np.where(dist, all_gather_time(C.d, P * weight_bytes / nb, bus, hop, msg), 0.0)
    if K.fsdp.any():  # FSDP's own collectives are fsdp.py's
        c_rs, c_ag = c_rs * col(~K.fsdp), c_ag * col(~K.fsdp)
    slack_b, slack_f = drain_slack(B, K), drain_slack(F, K)
    ov = float(getattr(C.eff, "dp_overlap_eff", 1.0))
    rs_tail = np.where(col(K.ogr), bucket_tail(c_rs, nb, B, ov), bucketed_time(c_rs, nb))
    ag_tail = np.where(col(K.opg), bucket_tail(c_ag, nb, F, ov), bucketed_time(c_ag, nb))
    rs = exposed_after_slack(rs_tail, slack_b).max(axis=1)
    ag = np.where(K.opg, exposed_after_slack(ag_tail, slack_f).max(axis=1), ag_tail.max(axis=1))
    return {"rs": rs, "ag": ag, "total": nb * (c_rs + c_ag), "P": P}


def drain_slack(X: np.ndarray, K: Knobs) -> np.ndarray:
    """Per stage (n, pp): how much earlier than stage 0 stage s ends its last pass (X = a stage's backward
    per microbatch) or how much later it starts its first (X = forward): sum_{j<s} X_j / v."""
    zero = np.zeros_like(X[:, :1])
    return np.concatenate([zero, np.cumsum(X, axis=1)[:, :-1]], axis=1) / K.v[:, None].astype(float)


def pipeline_bubble(S: np.ndarray, K: Knobs) -> np.ndarray:
    """Fill and drain, (sum_s S_s - S_max) / v, for per-microbatch stage times S (n, pp)."""
    return (S.sum(axis=1) - S.max(axis=1)) / K.v


def pipeline_time(S: np.ndarray, K: Knobs) -> np.ndarray:
    """m * S_max + the bubble: the pipeline's time for per-microbatch stage times S (n, pp)."""
    return K.m * S.max(axis=1) + pipeline_bubble(S, K)


def fsdp_exposed(C: Consts, K: Knobs, st: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(what FSDP adds to the update, all its traffic) per config (n,): its per-microbatch stalls through
    the pipeline formula, the first microbatch's one-off stalls along the fill (pp > 1), plus the
    reduce-scatters after the last backward less the stage's drain slack (fsdp.py)."""
    zero = np.zeros(K.n)
    if C.d <= 1 or not K.fsdp.any():
        return zero, zero
    # One block's forward and backward (with TP and its share of the recompute): what the collectives run under.
    Lk = np.maximum(K.layers, 1).astype(float)
    f_block = (st["F"] - st["head_f"]) / Lk
    b_block = (st["B"] - 2.0 * st["head_f"]) / Lk
    fs = fsdp_times(C, K, f_block, b_block, dp_bus_bandwidth(C), drain_slack(st["F"], K))
    S = st["F"] + st["B"]
    stalled = pipeline_time(S + fs["stall"], K) - pipeline_time(S, K)
    end = exposed_after_slack(fs["sync_extra"] + fs["tail"], drain_slack(st["B"], K)).max(axis=1)
    once = fs["chain"].sum(axis=1) + fs["up_front"].max(axis=1)
    return stalled + once + end, fs["total"].max(axis=1)


def step_times(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """The update time and its breakdown, per config (n,)."""
    st = stage_times(C, K)
    S = st["F"] + st["B"]
    crit = np.argmax(S, axis=1)
    rows = np.arange(K.n)
    at = lambda x: x[rows, crit]  # noqa: E731
    m = K.m.astype(float)
    v = K.v.astype(float)
    bubble = pipeline_bubble(S, K)
    p2p = np.where(C.p > 1, p2p_exposed(C, K, st["p2p"], at(st["F"]) / v), 0.0)
    dp = dp_times(C, K, st["F"], st["B"])
    fsdp_s, fsdp_total = fsdp_exposed(C, K, st)
    P = dp["P"]
    shard = np.where((K.dist | K.fsdp)[:, None], C.d, 1)
    _, grad_bytes = state_bytes(C, K)
    adam = ADAM_BYTES if C.precision == "mixed" else TORCH_ADAM_BYTES
    opt_bytes = P / shard * (adam + grad_bytes[:, None])
    per_tensor = stage_tensors(C, K) * float(getattr(C.eff, "optimizer_tensor_us", 0.0)) * 1e-6
    optimizer = (opt_bytes / (C.hbm_bw * C.eff.optimizer_bw_eff) + per_tensor).max(axis=1) \
        + float(getattr(C.eff, "step_overhead_us", 0.0)) * 1e-6
    out = {
        "forward_s": m * at(st["f_comp"]),
        "backward_s": m * at(st["b_comp"]),
        "recompute_s": m * at(st["rec_comp"]),
        "tp_comm_s": m * (at(st["f_tp"]) + at(st["b_tp"]) + at(st["rec_tp"])),
        "pp_bubble_s": bubble,
        "pp_p2p_s": p2p,
        "dp_exposed_s": dp["rs"] + dp["ag"] + fsdp_s,
        "dp_total_s": dp["total"].max(axis=1) + fsdp_total,
        "optimizer_s": optimizer,
        "critical_stage": crit,
    }
    out["compute_track_s"] = (out["forward_s"] + out["backward_s"] + out["recompute_s"] + out["tp_comm_s"]
                              + bubble + p2p)
    out["step_time_s"] = out["compute_track_s"] + out["dp_exposed_s"] + optimizer
    return out
