"""Plans as numbers: the fixed context as scalars, the knobs as numpy arrays (one entry per config).

The timing and memory formulas are written once, over these arrays: ``predict`` evaluates one config
(arrays of length 1), the enumerator evaluates millions at a time, and both give identical numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from trainer.knobs import FsdpDP, FullRecompute, OpRecompute, ReplicateDP, SelectiveRecompute, TorchDDP

from .cluster import ElementwiseBytes
from .config import PlanConfig

SCHED_CODE = {"gpipe": 0, "1f1b": 1, "interleaved_1f1b": 2}
RC_CODE = {"none": 0, "selective": 1, "full": 2, "op": 3}


@dataclass(frozen=True)
class Consts:
    """Scalars every config of a batch shares: hardware, model, job, efficiency, parallel degrees."""

    h: int
    a: int
    ffn: int
    L: int
    V: int
    s: int
    gbs: int
    t: int
    p: int
    d: int
    sp: bool
    flash: bool
    peak: float
    hbm: float
    hbm_bw: float
    bw_tp: float
    lat_tp: float
    bw_pp: float
    lat_pp: float
    bw_dp: float
    lat_dp: float
    params_per_layer: int
    total_params: int
    tied: bool
    num_gpus: int
    eff: object
    precision: str = "mixed"
    pos_rows: int = 0
    matmul_per_layer: int = 0
    tensors_per_layer: int = 12
    tp_replicated_per_layer: int = 0
    """Per-layer parameters every tensor-parallel rank holds whole (ModelSpec.tp_replicated_per_layer)."""
    gpus_per_node: int = 8
    intra_bw: float = 0.0
    """NVLink bytes/s per GPU (raw datasheet figure; comm.py derives each group's bus bandwidth)."""
    inter_bw: float = 0.0
    """NIC bytes/s per GPU (raw)."""
    ew: ElementwiseBytes = ElementwiseBytes()
    """Bytes per element of the layer's elementwise kernels (model.elementwise)."""
    gemms: tuple[tuple[int, int], ...] = ()
    """The layer's GEMMs in forward order, [input width, output width] (model.gemms)."""

    @property
    def msg_s(self) -> float:
        """The fixed cost of one collective or send besides its hops (efficiency.collective_latency_us), s."""
        return float(getattr(self.eff, "collective_latency_us", 0.0)) * 1e-6

    def dp_latency(self) -> tuple[float, float]:
        """(seconds per hop, seconds per message) of a data-parallel collective: the link's and
        collective_latency_us, or, when efficiency.dp_latency_us is measured, 0 per hop and that per message."""
        measured = getattr(self.eff, "dp_latency_us", None)
        return (self.lat_dp, self.msg_s) if measured is None else (0.0, float(measured) * 1e-6)

    def pp_latency(self) -> tuple[float, float]:
        """(seconds per hop, seconds per message) of a pipeline send: the link's and collective_latency_us, or,
        when efficiency.pp_latency_us is measured, 0 per hop and that per message."""
        measured = getattr(self.eff, "pp_latency_us", None)
        return (self.lat_pp, self.msg_s) if measured is None else (0.0, float(measured) * 1e-6)

    @classmethod
    def of(cls, cfg: PlanConfig, eff: object | None = None) -> "Consts":
        c, m, par, tp = cfg.cluster, cfg.model, cfg.parallel, cfg.tensor_parallel.size
        e = cfg.efficiency if eff is None else eff
        intra = (c.intra_node_bw_GBps * 1e9, c.intra_node_latency_us * 1e-6)
        inter = (c.inter_node_bw_GBps * 1e9, c.inter_node_latency_us * 1e-6)
        gpn = c.gpus_per_node
        # Megatron's rank order is tp fastest, then dp, then pp: a TP group is tp consecutive ranks, a DP
        # group spans tp*dp ranks, and a pipeline spans all of them.
        tp_link = intra if tp <= gpn else inter
        dp_link = intra if tp * par.dp <= gpn else inter
        pp_link = intra if tp * par.dp * par.pp <= gpn else inter
        return cls(
            h=m.hidden_size, a=m.num_heads, ffn=m.ffn, L=m.num_layers, V=m.vocab_size, s=cfg.job.seq_len,
            gbs=cfg.batch.global_batch, t=tp, p=par.pp, d=par.dp, sp=cfg.tensor_parallel.sequence_parallel and tp > 1,
            flash=m.flash_attention, peak=c.peak_flops, hbm=c.hbm_bytes, hbm_bw=c.hbm_bw_GBps * 1e9,
            bw_tp=tp_link[0] * e.tp_bw_eff, lat_tp=tp_link[1], bw_pp=pp_link[0] * e.pp_bw_eff,
            lat_pp=pp_link[1], bw_dp=dp_link[0] * e.dp_bw_eff, lat_dp=dp_link[1],
            params_per_layer=m.params_per_layer, total_params=m.total_params, tied=m.tied_embeddings,
            num_gpus=c.num_gpus, eff=e, precision=cfg.job.precision, pos_rows=m.position_embeddings,
            matmul_per_layer=m.matmul_params_per_layer, tensors_per_layer=m.tensors_per_layer,
            tp_replicated_per_layer=m.tp_replicated_per_layer,
            gpus_per_node=gpn, intra_bw=intra[0], inter_bw=inter[0],
            ew=m.elementwise, gemms=m.gemms,
        )


@dataclass(frozen=True)
class Knobs:
    """Per-config knob values; ``layers`` is (n_configs, pp), the rest (n_configs,)."""

    b: np.ndarray
    m: np.ndarray
    sched: np.ndarray
    v: np.ndarray
    layers: np.ndarray
    rc: np.ndarray
    rc_block: np.ndarray
    rc_n: np.ndarray
    sel_attn: np.ndarray
    sel_mlp: np.ndarray
    sel_norm: np.ndarray
    op_period: np.ndarray
    """Op-level recompute's matmul period (recompute.matmul_period; 0 for other kinds or none recomputed)."""
    ogr: np.ndarray
    opg: np.ndarray
    dist: np.ndarray
    bucket_mb: np.ndarray
    grad_bytes: np.ndarray
    fsdp: np.ndarray
    """FSDP shards parameters, gradients and optimizer state (data_parallel.kind fsdp at dp > 1; fsdp.py)."""
    raf: np.ndarray
    """FSDP's reshard_after_forward."""
    prefetch: np.ndarray
    """FSDP's explicit prefetch depth (blocks)."""
    tp_overlap: np.ndarray
    """Megatron's TP communication overlap (tensor_parallel.comm_overlap; a no-op at tp 1). A knob, not a
    constant: a space may search it, and one batch of configs may mix both."""
    p2p_overlap: np.ndarray
    """Megatron's overlap_p2p_comm (pipeline_comm.overlap_p2p; a no-op without interleaving)."""
    uneven: np.ndarray
    """Indices of the configs whose ranks hold model chunks of unequal size. Every other config's rank holds
    v chunks of ``layers`` / v layers."""
    chunks: np.ndarray
    """Layers of each model chunk per rank of the ``uneven`` configs, (len(uneven), pp, max v), zero past a
    config's v."""

    @property
    def n(self) -> int:
        return len(self.b)


def encode(cfgs: Sequence[PlanConfig]) -> Knobs:
    """Knob arrays for validated configs (they must share parallel degrees)."""
    rows = []
    for cfg in cfgs:
        rc, pipe, dp, opt = cfg.recompute, cfg.pipeline, cfg.data_parallel, cfg.optimizer
        # torch DDP always overlaps its buckets; FSDP's own overlap is fsdp.py's (the trainer applies it at dp > 1 only).
        overlap = dp.overlap_grad_reduce if isinstance(dp, ReplicateDP) else isinstance(dp, TorchDDP)
        fsdp = isinstance(dp, FsdpDP) and cfg.parallel.dp > 1
        bucket_mb = getattr(dp, "bucket_mb", ReplicateDP.bucket_mb)
        mods = rc.modules if isinstance(rc, SelectiveRecompute) else ()
        rows.append((
            cfg.batch.micro_batch_size, cfg.microbatches, SCHED_CODE[pipe.schedule], pipe.virtual_stages,
            RC_CODE[rc.kind], isinstance(rc, FullRecompute) and rc.method == "block",
            rc.num_layers if isinstance(rc, FullRecompute) else 0,
            "core_attn" in mods, "mlp" in mods, "norm" in mods,
            rc.matmul_period if isinstance(rc, OpRecompute) else 0, overlap, opt.overlap_param_gather, opt.distributed, bucket_mb,
            4.0 if opt.grad_reduce_dtype == "fp32" else 2.0,
            fsdp, fsdp and dp.reshard_after_forward, dp.prefetch if fsdp else 0,
            cfg.tensor_parallel.comm_overlap, cfg.pipeline_comm.overlap_p2p,
        ))
    cols = list(zip(*rows))
    chunks = np.zeros((len(cfgs), cfgs[0].parallel.pp, max(c.pipeline.virtual_stages for c in cfgs)), dtype=np.int64)
    for k, cfg in enumerate(cfgs):
        for r, sizes in enumerate(cfg.stage_chunks):
            chunks[k, r, :len(sizes)] = sizes
    uneven = uneven_configs(chunks, np.asarray([c.pipeline.virtual_stages for c in cfgs]))
    i = lambda k: np.asarray(cols[k], dtype=np.int64)  # noqa: E731
    bl = lambda k: np.asarray(cols[k], dtype=bool)  # noqa: E731
    return Knobs(
        b=i(0), m=i(1), sched=i(2), v=i(3), layers=np.asarray([c.stage_layers for c in cfgs], dtype=np.int64),
        rc=i(4), rc_block=bl(5), rc_n=i(6), sel_attn=bl(7), sel_mlp=bl(8), sel_norm=bl(9), op_period=i(10),
        ogr=bl(11), opg=bl(12), dist=bl(13), bucket_mb=np.asarray(cols[14], dtype=float),
        grad_bytes=np.asarray(cols[15], dtype=float), fsdp=bl(16), raf=bl(17), prefetch=i(18),
        tp_overlap=bl(19), p2p_overlap=bl(20), uneven=uneven, chunks=chunks[uneven],
    )


def col(x: np.ndarray) -> np.ndarray:
    """A per-config vector (n,) as a column (n, 1), to broadcast against per-stage arrays (n, pp)."""
    return x[:, None]


def layer_params_per_gpu(C: Consts) -> float:
    """One transformer layer's parameters on one tensor-parallel rank: the sharded part over tp, the rest whole."""
    return (C.params_per_layer - C.tp_replicated_per_layer) / C.t + C.tp_replicated_per_layer


def stage_params(C: Consts, K: Knobs) -> np.ndarray:
    """Parameters held per GPU of each stage, (n, pp).

    Layers split over tp (their norms replicated, ``layer_params_per_gpu``); the first stage adds the input embedding (and a learned position table, which
    Megatron replicates over tp), the last the LM head (Megatron keeps a copy of a tied embedding there
    when pp > 1) and the final LayerNorm.
    """
    emb = C.V * C.h / C.t
    P = K.layers * layer_params_per_gpu(C)
    P[:, 0] += emb + C.pos_rows * C.h
    if C.p > 1 or not C.tied:
        P[:, -1] += emb
    P[:, -1] += 2 * C.h
    return P


def state_bytes(C: Consts, K: Knobs) -> tuple[float, np.ndarray]:
    """(bytes per weight, bytes per gradient per config (n,)) under the job's precision.

    Megatron's mixed precision keeps bf16 weights and main gradients of grad_reduce_dtype; plain fp32 and
    torch autocast keep both in the parameters' fp32 whatever the knob says.
    """
    if C.precision == "mixed":
        return 2.0, K.grad_bytes
    return 4.0, np.full_like(K.grad_bytes, 4.0)


def stage_tensors(C: Consts, K: Knobs) -> np.ndarray:
    """Parameter tensors per stage (n, pp), laid out as ``stage_params`` lays out their elements."""
    T = K.layers * float(C.tensors_per_layer)
    T[:, 0] += 1 + (C.pos_rows > 0)
    if C.p > 1 or not C.tied:
        T[:, -1] += 1
    T[:, -1] += 2
    return T


def uneven_configs(chunks: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Indices of the configs, given their layers per chunk per rank (n, pp, max v), whose ranks hold model
    chunks of unequal size."""
    live = np.arange(chunks.shape[2])[None, None, :] < v[:, None, None]
    return np.flatnonzero(~np.where(live, chunks == chunks[:, :, :1], True).all(axis=(1, 2)))


def chunk_passes(C: Consts, K: Knobs) -> np.ndarray:
    """How many of ``in_flight``'s chunk passes each chunk of a rank has in flight, for the ``uneven``
    configs, (len(uneven), pp, max v).

    The schedules run a rank's chunks in groups of p microbatches, chunk 0 first (Megatron's
    get_model_chunk_id: pass k runs chunk (k mod pv) div p), so the first F passes hold
    R p + clip(F - R p v - j p, 0, p) passes of chunk j, R = F div (p v). With v = 1 that is F.
    """
    F = in_flight(C, K)[K.uneven][:, :, None]
    v = K.v[K.uneven][:, None, None]
    j = np.arange(K.chunks.shape[2])[None, None, :]
    rounds = F // (C.p * v)
    rest = F - rounds * C.p * v
    return np.where(j < v, rounds * C.p + np.clip(rest - j * C.p, 0, C.p), 0)


def in_flight(C: Consts, K: Knobs) -> np.ndarray:
    """Model-chunk microbatches whose activations a stage holds at its peak, (n, pp).

    GPipe: all m. 1F1B: p - s on stage s (Narayanan et al. 2021 Sec. 2.2.1). Interleaved: Megatron's
    warm-up count 2(p - s - 1) + (v - 1)p, plus the one in progress, capped at m*v chunk passes; on stage 0
    that is Korthikanti et al.'s p * (1 + (p - 1)/(p v)) microbatches' worth of layers.
    """
    s = np.arange(C.p)[None, :]
    m, v = K.m[:, None], K.v[:, None]
    one_f = np.minimum(C.p - s, m)
    inter = np.minimum(interleaved_warmup(C, K) + 1, m * v)
    return np.where(K.sched[:, None] == 0, m, np.where(K.sched[:, None] == 2, inter, one_f))


def interleaved_warmup(C: Consts, K: Knobs) -> np.ndarray:
    """Megatron's interleaved schedule: forward chunk passes stage s runs before its first backward,
    2(p - s - 1) + (v - 1)p, capped at the m v passes there are, (n, pp)."""
    s = np.arange(C.p)[None, :]
    m, v = K.m[:, None], K.v[:, None]
    return np.minimum(2 * (C.p - s - 1) + (v - 1) * C.p, m * v)


def op_kept_gemms(C: Consts, K: Knobs) -> np.ndarray:
    """Which of the layer's GEMMs op-level recompute keeps, (n, GEMMs): all but every op_period-th (the
    trainer's policy, trainer.model.op_checkpoint); all of them for other recompute kinds."""
    k = np.arange(1, len(C.gemms) + 1)[None, :]
    period = col(K.op_period)
    return ~((period > 0) & (k % np.maximum(period, 1) == 0))


def recomputed_layers(K: Knobs) -> np.ndarray:
    """Layers whose forward runs twice under full recompute, per stage (n, pp)."""
    block = K.v[:, None] * np.minimum(K.rc_n[:, None], K.layers // K.v[:, None])
    if len(K.uneven):
        block[K.uneven] = np.minimum(K.rc_n[K.uneven, None, None], K.chunks).sum(axis=2)
    full = np.where(K.rc_block[:, None], block, K.layers)
    return np.where(K.rc[:, None] == 2, full, 0)
