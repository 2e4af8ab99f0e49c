"""Peak memory per pipeline stage, and the out-of-memory pre-filter.

* Model state, bytes per parameter (Megatron distributed-optimizer docs): bf16 weights 2, main gradients 4
  (fp32) or 2 (bf16), optimizer 12 (fp32 master weights + Adam m and v), the 12 divided over dp with the
  distributed optimizer: 6 + 12/d for bf16 weights / fp32 gradients, 18 without (the docs' table).
  FSDP at dp > 1 shards all of it, 18/d, and holds unsharded buffers besides (``fsdp.buffer_bytes``).
* Activations of one layer for one microbatch (Korthikanti et al. 2022, "Reducing Activation Recomputation
  in Large Transformer Models", eq. 1-2, generalised to an MLP width f): s b h (10 + 24/t) + 5 a s^2 b / t
  bytes with f = 4h, i.e. 10 s b h replicated over the tensor-parallel group (LayerNorm inputs, dropout
  masks, the QKV and MLP inputs) + (8 s b h + 4 s b f) / t split by it + 5 a s^2 b / t of attention scores.
  Sequence parallelism splits the replicated part too (34 s b h / t); fused attention stores no scores.
  Selective recompute drops: core_attn the score term, mlp the 4 s b f / t MLP internals, norm the two
  LayerNorm outputs (4 s b h). Full recompute keeps only each checkpointed layer input, 2 s b h
  (/ t with sequence parallelism), and rebuilds one recompute group at a time during backward.
  Op-level recompute keeps the layer input, the outputs of the GEMMs it does not recompute (2 s b x output
  width / t each) and fused attention's output (2 s b h / t) and fp32 log-sum-exp (4 a s b / t, not scaled
  by precision); unfused attention is recomputed whole.
* Microbatches held per stage: see ``knobs.in_flight`` (1F1B: p - s; interleaved: Korthikanti et al.
  Sec. 4.2.3's (1 + (p-1)/(p v)) factor on stage 0; GPipe: all m).
* The last stage also holds fp32 logits, 4 s b V / t bytes, for the microbatches in its loss, and the
  inputs of its final norm and LM head, 2 x 2 s b h (/ t with sequence parallelism; the norm's fp32 under
  autocast).
* ``job.precision`` sets the bytes: the above is Megatron's mixed precision. fp32 training stores every
  activation in 4 bytes (twice the 16-bit terms; the logits are fp32 already) and keeps 4-byte weights and
  gradients and two 4-byte Adam moments, plus torch AdamW's 4-byte step counter per parameter tensor.
  bf16 autocast keeps fp32 model state like fp32 with 16-bit activations, and, with autocast's weight cache
  off (the steptune trainer's setting), each GEMM also saves the bf16 copy of its weight for every
  microbatch in flight (2 bytes per GEMM weight); a checkpointed region saves neither, and its checkpoint (the
  layer input, on the residual stream) stays fp32.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .fsdp import buffer_bytes
from .knobs import (Consts, Knobs, chunk_passes, col, encode, in_flight, op_kept_gemms, stage_params,
                    stage_tensors, state_bytes)

OPTIMIZER_BYTES = 12.0
TORCH_ADAM_BYTES = 8.0
"""fp32 exp_avg + exp_avg_sq per parameter (torch AdamW; the fp32 weight is the parameter itself)."""
ADAM_STEP_BYTES = 4.0
"""torch AdamW's per-tensor ``step`` counter (a float32 scalar unless capturable/fused)."""
ACTIVATION_SCALE = {"mixed": 1.0, "fp32": 2.0, "bf16_autocast": 1.0}
"""Stored activation bytes relative to Korthikanti et al.'s 16-bit accounting."""
MEMORY_PARTS = ("params", "grads", "optimizer", "activations", "fsdp_buffers", "reserved")
"""What ``stage_memory`` adds up per stage, in the order reports list it."""


def activation_bytes(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """Bytes per layer per microbatch (n,): everything, after selective drops, a checkpoint, and what op-level
    recompute keeps."""
    sb = (C.s * K.b).astype(float)
    rep = C.t if C.sp else 1
    replicated = 10.0 * sb * C.h / rep
    split = (8.0 * sb * C.h + 4.0 * sb * C.ffn) / C.t
    scores = 0.0 if C.flash else 5.0 * C.a * C.s * sb / C.t
    x = ACTIVATION_SCALE[C.precision]
    full = (replicated + split + scores) * x
    dropped = (np.where(K.sel_attn, scores, 0.0) + np.where(K.sel_mlp, 4.0 * sb * C.ffn / C.t, 0.0)
               + np.where(K.sel_norm, 4.0 * sb * C.h / rep, 0.0)) * x
    if C.precision == "bf16_autocast":
        full = full + 2.0 * C.matmul_per_layer / C.t
        dropped = dropped + np.where(K.sel_mlp, 2.0 * 2 * C.h * C.ffn / C.t, 0.0)
    # A checkpoint keeps the layer input, the residual stream: fp32 under torch autocast (only GEMM outputs are bf16).
    ckpt = 2.0 * sb * C.h / rep * (2.0 if C.precision == "bf16_autocast" else x)
    op = np.zeros_like(ckpt)
    if (K.rc == 3).any():  # the enumerator's usual space has no op recompute: keep it at full speed
        outs = np.asarray([o for _, o in C.gemms], dtype=float)
        kept = 2.0 * sb * (op_kept_gemms(C, K) * outs).sum(axis=1) / C.t * x
        attn = (2.0 * sb * C.h / C.t * x + 4.0 * C.a * sb / C.t) if C.flash else 0.0
        op = ckpt + kept + attn
    return {"full": full, "selective": full - dropped, "ckpt": ckpt, "op": op}


def _chunk_bytes(lc, rc, block, n, full, sel, ckpt, op) -> tuple[np.ndarray, np.ndarray]:
    """(what one pass of an lc-layer model chunk keeps, the recompute working set while its backward runs),
    broadcast over whatever shape the arguments share."""
    lc = np.asarray(lc, dtype=float)
    kept = np.minimum(n, lc)
    per_pass = np.where(rc == 0, lc * full, np.where(rc == 1, lc * sel, np.where(rc == 3, lc * op, np.where(
        block, kept * ckpt + (lc - kept) * full, np.ceil(lc / np.maximum(n, 1.0)) * ckpt))))
    # One recompute group's full activations exist at once while its backward runs.
    working = np.where(rc == 2, np.where(block, full * (kept > 0), kept * full), 0.0)
    return per_pass, working


def stage_memory(C: Consts, K: Knobs) -> dict[str, np.ndarray]:
    """Per stage (n, pp) bytes by kind, their total, and per config the peak and whether it fits."""
    e = C.eff
    P = stage_params(C, K)
    # FSDP shards parameters and gradients too; the optimizer state follows its parameters (a step counter
    # per tensor stays whole on every rank).
    state_shard = np.where(col(K.fsdp), C.d, 1)
    shard = np.where(col(K.dist | K.fsdp), C.d, 1)
    act = activation_bytes(C, K)
    full, sel, ckpt, op = col(act["full"]), col(act["selective"]), col(act["ckpt"]), col(act["op"])
    flight = in_flight(C, K).astype(float)
    held, working = _chunk_bytes(K.layers // col(K.v), col(K.rc), col(K.rc_block), col(K.rc_n), full, sel, ckpt, op)
    held = held * flight
    if len(K.uneven):
        # Ranks with chunks of unequal size: each chunk's bytes, weighted by its passes in flight.
        u = lambda x: x[K.uneven][:, :, None]  # noqa: E731
        per_u, work_u = _chunk_bytes(K.chunks, u(col(K.rc)), u(col(K.rc_block)), u(col(K.rc_n)), u(full),
                                     u(sel), u(ckpt), u(op))
        held[K.uneven] = (chunk_passes(C, K) * per_u).sum(axis=2)
        working[K.uneven] = work_u.max(axis=2)
    logits = np.zeros_like(P)
    head_copy = 2.0 * C.V * C.h / C.t if C.precision == "bf16_autocast" else 0.0
    # The final norm's input is the residual stream (fp32 under autocast), the LM head's its 16-bit cast.
    norm_in = 4.0 if C.precision in ("fp32", "bf16_autocast") else 2.0
    head_inputs = (norm_in + 2.0 * ACTIVATION_SCALE[C.precision]) * C.s * K.b * C.h / (C.t if C.sp else 1)
    logits[:, -1] = (4.0 * C.s * K.b * C.V / C.t + head_inputs + head_copy) * np.ceil(flight[:, -1] / K.v)
    activations = (held + working + logits) * e.mem_activation_factor
    weight_bytes, grad_bytes = state_bytes(C, K)
    if C.precision == "mixed":
        optimizer = OPTIMIZER_BYTES * P / shard
    else:
        optimizer = TORCH_ADAM_BYTES * P / shard + ADAM_STEP_BYTES * stage_tensors(C, K)
    parts = {
        "params": weight_bytes * P / state_shard,
        "grads": col(grad_bytes) * P / state_shard,
        "optimizer": optimizer,
        "activations": activations,
        "fsdp_buffers": buffer_bytes(C, K),
        "reserved": np.full_like(P, e.mem_reserved_gb * 1e9),
    }
    total = sum(parts.values())
    peak = total.max(axis=1)
    return {**parts, "total": total, "peak": peak, "peak_stage": total.argmax(axis=1), "fits": peak <= C.hbm}


def predicts_oom(cfg, cluster=None) -> tuple[bool, str]:
    """(True, why) when the config's peak stage needs more memory than a GPU has; (False, headroom) else.

    ``cluster`` overrides the config's own cluster (same model, other hardware).
    """
    if cluster is not None:
        cfg = dataclasses.replace(cfg, cluster=cluster)
    mem = stage_memory(Consts.of(cfg), encode([cfg]))
    s = int(mem["peak_stage"][0])
    gb = lambda k: mem[k][0, s] / 1e9  # noqa: E731
    need, have = mem["peak"][0] / 1e9, cfg.cluster.hbm_gb
    detail = (f"params {gb('params'):.1f}, grads {gb('grads'):.1f}, optimizer {gb('optimizer'):.1f}, "
              f"activations {gb('activations'):.1f}, "
              + (f"fsdp buffers {gb('fsdp_buffers'):.1f}, " if mem["fsdp_buffers"][0, s] else "")
              + f"reserved {gb('reserved'):.1f} GB")
    if need > have:
        return True, f"stage {s} needs {need:.1f} GB > {have:.1f} GB per GPU ({detail})"
    return False, f"fits: stage {s} peaks at {need:.1f} of {have:.1f} GB ({detail})"
