"""Slices of a production layer shape: a sweep file -> short trainer configs of its real layer, few layers.

``derive_slices`` (a model-backend file: its ``planner:`` model, job and knob sections and its ``space:``) and
``derive_trainer_slices`` (a ray-backend file's ``trainer:`` section) build trainer configs of the layer shape
with only ``layers`` layers: every micro-batch size and every recompute kind of the space, each once (not
their product), on ``ranks`` ranks at the production tensor-parallel size when it divides them.
``memory_refusal`` predicts each slice's peak with the planner's memory model (the pre-filter's) before
anything runs. Pure: nothing here runs; ``orchestrator.calibration.profile`` runs and fits them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from orchestrator.planner import ClusterSpec, Efficiency
from orchestrator.planner.parse import plan_config_from_dict
from orchestrator.units import fmt_bytes

PRECISION = {"mixed": "bf16", "bf16_autocast": "bf16", "fp32": "fp32"}
"""Planner job.precision -> trainer run.precision (the trainer's bf16 is autocast over fp32 weights)."""


ROLES = ("compute", "dp", "pp")
"""What a slice measures: the layers' compute (pp 1), data-parallel buckets (bucket sizes x overlap), or pipeline
sends (pp 2 at the job's microbatch counts)."""


@dataclass(frozen=True)
class Slice:
    name: str
    """What varies from the first slice, e.g. ``mbs=2 recompute=full``."""
    config: Any
    """The trainer config (``trainer.config.TrainConfig``)."""
    role: str = "compute"
    """One of ``ROLES``: which of the planner's terms the slice is there to pin."""

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"slice {self.name}: role {self.role!r} is not one of {', '.join(ROLES)}")


def density(world: int, gpus_per_node: int, devices_here: int | None = None) -> int:
    """Ranks a slice runs on so that it occupies a node as the job does: every rank of a node busy at once.

    The job runs ``world`` ranks, ``gpus_per_node`` to a node (the cluster file's), so a node of the job holds
    min(world, gpus_per_node) busy ranks, and so must the slices: a rank timed alone beside idle ones runs faster
    than it will in the job (on a 2-core host, 20-44% faster than the same slice with both ranks busy), and a
    fit to it predicts the job too fast. ``devices_here``: the devices (GPUs, or CPU cores for a CPU job) this
    node has; fewer than the density is refused, naming both. ValueError naming the field."""
    for name, v in (("world", world), ("gpus_per_node", gpus_per_node)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")
    ranks = min(world, gpus_per_node)
    if devices_here is not None and devices_here < ranks:
        raise ValueError(f"the job runs {ranks} rank(s) per node (world {world}, gpus_per_node {gpus_per_node}) and "
                         f"this node has {devices_here} device(s): slices at the job's density cannot run here")
    return ranks


def job_world(sweep: Mapping[str, Any], cluster_gpus: int | None = None) -> int:
    """The job's ranks: a ray or command sweep's ``resources.world_size`` (2 unless set), a model-backend file's
    cluster size (``planner.cluster.num_gpus``, else ``cluster_gpus``, else tp x pp x dp of its planner section)."""
    if sweep.get("backend", "model") in ("ray", "command"):
        return int(((sweep.get("resources") or {}).get("world_size")) or 2)
    planner = sweep.get("planner") or {}
    n = ((planner.get("cluster") or {}).get("num_gpus")) or cluster_gpus
    if n:
        return int(n)
    par, tp = planner.get("parallel") or {}, (planner.get("tensor_parallel") or {}).get("size", 1)
    return int(tp) * int(par.get("pp", 1)) * int(par.get("dp", 1))


@dataclass(frozen=True)
class SlicePlan:
    slices: tuple[Slice, ...]
    shape: dict[str, int | str]
    """d_model, n_heads, d_ff, vocab_size, seq_len, precision as run."""
    layers: int
    ranks: int
    tp: int
    shrink: int
    notes: tuple[str, ...]
    """Where the slice differs from the production model or job."""


def _choices(space: Mapping[str, Any], name: str) -> list[Any]:
    spec = ((space or {}).get("params") or {}).get(name)
    if not isinstance(spec, Mapping):
        return []
    if "choices" in spec:
        return list(spec["choices"])
    if spec.get("type") == "int":  # a range: its ends bracket what the sweep will try
        return sorted({int(spec["low"]), int(spec["high"])})
    return []


def _recompute(kind: str, base: Any, layers: int) -> Any:
    from trainer.knobs import FullRecompute, NoRecompute, OpRecompute, SelectiveRecompute

    if kind == base.kind:  # keep the production settings (modules, method), within the slice's layers
        return (dataclasses.replace(base, num_layers=min(base.num_layers, layers))
                if isinstance(base, FullRecompute) else base)
    table = {"none": NoRecompute(), "selective": SelectiveRecompute(), "op": OpRecompute(),
             "full": FullRecompute(method="uniform", num_layers=1)}
    if kind not in table:
        raise ValueError(f"space.params.recompute.kind: {kind!r} is not one of {', '.join(table)}")
    return table[kind]


def derive_slices(sweep: Mapping[str, Any], ranks: int = 2, layers: int = 2, shrink: int = 1, steps: int = 4,
                  device: str = "cpu", with_tp1: bool = False) -> SlicePlan:
    """The slice trial configs of a model-backend sweep file (a mapping; its file keys already resolved).

    ValueError naming the flag or field for anything that cannot make a slice.
    """
    from trainer.config import TrainConfig

    for flag, value, low in (("--ranks", ranks, 1), ("--layers", layers, 1), ("--shrink", shrink, 1),
                             ("--steps", steps, 2)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{flag}: must be an integer >= {low}, got {value!r}")
    if not isinstance(sweep.get("planner"), Mapping):
        raise ValueError("planner: section missing (profile reads a sweep file with backend: model)")
    plan = plan_config_from_dict(sweep["planner"])
    m, notes = plan.model, []
    tp = plan.tensor_parallel.size
    if ranks % tp:
        notes.append(f"tensor_parallel.size={tp} does not divide --ranks {ranks}: the slice runs at tp 1, so its "
                     f"GEMMs are the whole layer's, not one TP rank's")
        tp = 1
    heads, hidden, ffn, vocab = m.num_heads, m.hidden_size, m.ffn_hidden_size or 4 * m.hidden_size, m.vocab_size
    if shrink > 1:
        # Divide, then round down to what tensor parallelism needs: whole heads, MLP and vocabulary per rank.
        heads = max(tp, heads // shrink // tp * tp)
        hidden = heads * max(1, hidden // shrink // heads)
        ffn, vocab = (max(tp, v // shrink // tp * tp) for v in (ffn, vocab))
        notes.append(f"--shrink {shrink}: hidden {m.hidden_size}->{hidden}, heads {m.num_heads}->{heads}, ffn "
                     f"{m.ffn_hidden_size or 4 * m.hidden_size}->{ffn}, vocab {m.vocab_size}->{vocab}: the fit "
                     f"does not describe the production GEMMs")
    if vocab % tp:  # the trainer splits the vocabulary over TP ranks; Megatron pads it up the same way
        notes.append(f"model.vocab_size {vocab} padded to {vocab + -vocab % tp}, a multiple of tensor_parallel.size {tp}")
        vocab += -vocab % tp
    notes += _model_notes(m)
    precision = PRECISION[plan.job.precision]
    if plan.job.precision == "mixed":
        notes.append("job.precision=mixed runs as the trainer's bf16 autocast (fp32 weights and Adam state): "
                     "the GEMMs are bf16 as in production, the memory per parameter is not")
    tpc = plan.tensor_parallel
    if tpc.comm_overlap and device != "cuda":
        notes.append("tensor_parallel.comm_overlap needs CUDA: the slice runs without it")
        tpc = dataclasses.replace(tpc, comm_overlap=False)
    tpc = dataclasses.replace(tpc, size=tp, **({"comm_overlap": False} if tp == 1 else {}))
    base_knobs = sweep.get("baseline") or {}
    mbs0 = int(base_knobs.get("batch.micro_batch_size", plan.batch.micro_batch_size))
    kind0 = str(base_knobs.get("recompute.kind", plan.recompute.kind))
    variants = [(mbs0, kind0)]
    variants += [(int(b), kind0) for b in _choices(sweep.get("space"), "batch.micro_batch_size") if int(b) != mbs0]
    variants += [(mbs0, str(k)) for k in _choices(sweep.get("space"), "recompute.kind") if str(k) != kind0]
    shape = {"d_model": hidden, "n_heads": heads, "d_ff": ffn, "vocab_size": vocab, "seq_len": plan.job.seq_len,
             "precision": precision}
    slices = []
    variants = [(m_, k_, tp) for m_, k_ in dict.fromkeys(variants)]
    if tp > 1 and with_tp1:
        # At tp > 1 the trainer's forward/backward/optimizer phases hold the TP collectives, so calibration
        # cannot use them; one tp 1 slice of the baseline measures the compute phases alone.
        variants.append((mbs0, kind0, 1))
    for mbs, kind, tp_ in variants:
        dp = ranks // tp_
        cfg = TrainConfig(
            model=dataclasses.replace(TrainConfig().model, n_layers=layers, d_model=hidden, n_heads=heads, d_ff=ffn,
                                      vocab_size=vocab, seq_len=plan.job.seq_len),
            # Two microbatches per replica: gradient accumulation as production does it, at the least cost.
            batch=dataclasses.replace(plan.batch, global_batch=mbs * dp * 2, micro_batch_size=mbs),
            parallel=dataclasses.replace(plan.parallel, pp=1, dp=dp),
            tensor_parallel=tpc if tp_ == tp else dataclasses.replace(tpc, size=1, comm_overlap=False),
            recompute=_recompute(kind, plan.recompute, layers),
            run=dataclasses.replace(TrainConfig().run, steps=steps, warmup_steps=1, precision=precision,
                                    device=device, timeline_steps=0))
        slices.append(Slice(f"mbs={mbs} recompute={kind}" + (" tp=1" if tp_ != tp else ""), cfg))
    return SlicePlan(tuple(slices), shape, layers, ranks, tp, shrink, tuple(notes))


def derive_trainer_slices(sweep: Mapping[str, Any], ranks: int = 2, layers: int = 2, steps: int = 6,
                          warmup: int = 2) -> SlicePlan:
    """The slice configs of a ray-backend sweep file (``trainer:``, ``baseline:``, ``space:``; a mapping): its
    own model shape, run, data and optimizer, with ``layers`` layers, pp 1 and dp ``ranks``; the baseline's
    micro-batch size and recompute kind, then every other micro-batch size and every other recompute kind of
    the space, each once. The job's global batch (``_slice_batch``): a slice is the job cut to fewer layers, so
    its microbatches per replica, and with them every per-microbatch and per-update cost, are the job's.

    ValueError naming the flag or field for anything that cannot make a slice.
    """
    from trainer.config import TrainConfig
    from trainer.mapping import apply_overrides

    for flag, value, low in (("--ranks", ranks, 1), ("--layers", layers, 1), ("--steps", steps, warmup + 1)):
        if not isinstance(value, int) or value < low:
            raise ValueError(f"{flag}: must be an integer >= {low}, got {value!r}")
    if not isinstance(sweep.get("trainer"), Mapping):
        raise ValueError("trainer: section missing (a sweep file with backend: ray)")
    baseline = dict(sweep.get("baseline") or {})
    # The baseline's own knobs (e.g. its recompute settings) but not its layout: a slice is pp 1, tp 1.
    knobs = {k: v for k, v in baseline.items() if not k.startswith(("parallel.", "pipeline.", "tensor_parallel."))}
    base = TrainConfig.from_dict(apply_overrides(dict(sweep["trainer"]), knobs))
    if base.tensor_parallel.size != 1:
        raise ValueError("trainer.tensor_parallel.size: slices of a ray-backend file run at tp 1")
    mbs0, kind0 = base.batch.micro_batch_size, base.recompute.kind
    variants = [(mbs0, kind0)]
    variants += [(int(b), kind0) for b in _choices(sweep.get("space"), "batch.micro_batch_size") if int(b) != mbs0]
    variants += [(mbs0, str(k)) for k in _choices(sweep.get("space"), "recompute.kind") if str(k) != kind0]
    slices = []
    for mbs, kind in dict.fromkeys(variants):
        cfg = dataclasses.replace(
            base, model=dataclasses.replace(base.model, n_layers=layers),
            batch=dataclasses.replace(base.batch, global_batch=_slice_batch(base.batch.global_batch, mbs, ranks),
                                      micro_batch_size=mbs),
            parallel=dataclasses.replace(base.parallel, pp=1, dp=ranks),
            pipeline=type(base.pipeline)(), recompute=_recompute(kind, base.recompute, layers),
            run=dataclasses.replace(base.run, steps=steps, warmup_steps=warmup, timeline_steps=0))
        slices.append(Slice(f"ranks={ranks} layers={layers} mbs={mbs} recompute={kind}", cfg))
    m = base.model
    shape = {"d_model": m.d_model, "n_heads": m.n_heads, "d_ff": m.ffn_dim, "vocab_size": m.vocab_size,
             "seq_len": m.seq_len, "precision": base.run.precision}
    return SlicePlan(tuple(slices), shape, layers, ranks, 1, 1, ())


def _slice_batch(global_batch: int, mbs: int, dp: int) -> int:
    """The job's global batch when a slice's replicas can split it into whole microbatches, else the nearest
    multiple of mbs x dp at or above it (at least one microbatch per replica)."""
    unit = mbs * dp
    return max(unit, -(-global_batch // unit) * unit)


def schedules(space: Mapping[str, Any] | None) -> list[tuple[str, int]]:
    """The pipeline schedules a space can run at pp > 1, each with its virtual stages: [(schedule, v)], empty
    when the space never pipelines (``parallel.pp`` has no choice above 1)."""
    pps = [int(p) for p in _choices(space, "parallel.pp")]
    if not any(p > 1 for p in pps):
        return []
    kinds = [str(k) for k in _choices(space, "pipeline.schedule")] or ["1f1b"]
    vs = [int(v) for v in _choices(space, "pipeline.virtual_stages") if int(v) > 1] or [2]
    return [(k, max(vs) if k == "interleaved_1f1b" else 1) for k in dict.fromkeys(kinds)]


def pp_comm_slices(base: Any, space: Mapping[str, Any] | None, prefix: str) -> tuple[Slice, ...]:
    """The pipeline slices of one trainer slice config: 2 stages of one layer per model chunk (2 x v layers), at
    each schedule of the space, at its smallest and largest micro-batch size (the job's global batch, so the most
    and the fewest microbatches, hence sends, the space runs; at least the 2 a 1F1B schedule needs, a multiple of
    2 interleaved); dp = the base's ranks / 2, no recompute. The two microbatch counts tell the per-send cost
    from the fill and drain (``Efficiency.pp_latency_us``)."""
    from trainer.knobs import NoRecompute

    ranks = base.world_size // base.tensor_parallel.size
    if ranks < 2 or ranks % 2:
        raise ValueError(f"--ranks: the pipeline slices need an even number of ranks >= 2 (this slice has {ranks})")
    sizes = sorted({int(b) for b in _choices(space, "batch.micro_batch_size")} or {base.batch.micro_batch_size})
    out = []
    for kind, v in schedules(space):
        for mbs in dict.fromkeys((sizes[0], sizes[-1])):
            dp = ranks // 2
            # torch's 1F1B schedules need at least pp (2) microbatches per replica, interleaving a multiple of pp:
            # where the job's global batch holds fewer, the fewest the schedule runs.
            batch = max(_slice_batch(base.batch.global_batch, mbs * (2 if kind == "interleaved_1f1b" else 1), dp),
                        (1 if kind == "gpipe" else 2) * mbs * dp)
            cfg = dataclasses.replace(
                base, model=dataclasses.replace(base.model, n_layers=2 * v),
                batch=dataclasses.replace(base.batch, global_batch=batch, micro_batch_size=mbs),
                parallel=dataclasses.replace(base.parallel, pp=2, dp=dp),
                # The default pipeline's split is the balanced one: one layer per model chunk.
                pipeline=dataclasses.replace(type(base.pipeline)(), schedule=kind, virtual_stages=v),
                recompute=NoRecompute())
            out.append(Slice(f"{prefix} pp=2 {kind} mbs={mbs}", cfg, "pp"))
    return tuple(out)


def bucket_sizes(space: Mapping[str, Any] | None, base_mb: float) -> list[float]:
    """The DP bucket sizes (MB) the DP slices run: the space's ``data_parallel.bucket_mb`` choices, or a float
    range's ends and its geometric middle, or, without the knob, the trainer's own size and a tenth of it.
    At least two, so the per-message cost and the bandwidth can be told apart (``calibration.slicefit``)."""
    spec = ((space or {}).get("params") or {}).get("data_parallel.bucket_mb")
    if isinstance(spec, Mapping) and "choices" in spec:
        out = sorted({float(c) for c in spec["choices"]})
    elif isinstance(spec, Mapping) and "low" in spec and "high" in spec:
        lo, hi = float(spec["low"]), float(spec["high"])
        out = sorted({lo, round((lo * hi) ** 0.5, 6), hi})
    else:
        out = sorted({float(base_mb), float(base_mb) / 10})
    return out if len(out) >= 2 else sorted({out[0], out[0] / 10})


def dp_comm_slices(base: Any, buckets: list[float], prefix: str) -> tuple[Slice, ...]:
    """The data-parallel communication slices of one trainer slice config (dp >= 2): each bucket size with
    gradient-reduce overlap off and on (``data_parallel.kind=replicate``, the trainer's bucketed all-reduce)."""
    from trainer.knobs import ReplicateDP

    if base.parallel.dp < 2:
        raise ValueError(f"--ranks: the data-parallel slices need dp >= 2 (this slice has dp {base.parallel.dp})")
    out = []
    for mb in buckets:
        for overlap in (False, True):
            cfg = dataclasses.replace(base, data_parallel=ReplicateDP(overlap_grad_reduce=overlap, bucket_mb=mb))
            out.append(Slice(f"{prefix} dp bucket_mb={mb:g} overlap={'on' if overlap else 'off'}", cfg, "dp"))
    return tuple(out)


def derive_any(sweep: Mapping[str, Any], ranks: list[int], layers: list[int], shrink: int = 1, steps: int = 4,
               device: str = "cpu", dp_comm: bool = True, pp_comm: bool = True) -> tuple[SlicePlan, tuple[Slice, ...]]:
    """The compute slices of any sweep file (backend model: ``derive_slices``; backend ray: ``derive_trainer_slices``)
    at every rank count and layer count given, and the communication slices: data-parallel (``dp_comm_slices`` of
    the baseline's slice at the most layers and the largest micro-batch size) for each rank count whose slices run at dp >= 2 with bucketed DP, and,
    for a ray-backend space that pipelines, pipeline (``pp_comm_slices``) for each even rank count.
    Names carry ranks and layers when there are several of either. ValueError naming the flag or field."""
    backend = sweep.get("backend", "model")
    if backend == "model":
        if not isinstance(sweep.get("planner"), Mapping):
            raise ValueError("planner: section missing (a backend: model sweep file needs one)")
        one = lambda r, L: derive_slices(sweep, r, L, shrink, steps, device)  # noqa: E731
    elif backend == "ray":
        if shrink != 1:
            raise ValueError("--shrink: only for model-backend files (a ray sweep's trainer: shape is what runs)")
        one = lambda r, L: derive_trainer_slices(sweep, r, L, steps=steps, warmup=1)  # noqa: E731
    else:
        raise ValueError(f"backend: {backend!r}: profile reads a sweep file with backend: model or ray")
    several = len(ranks) > 1 or len(layers) > 1
    plans, comm = [], []
    for r in ranks:
        for L in layers:
            p = one(r, L)
            if several and backend == "model":
                p = dataclasses.replace(p, slices=tuple(Slice(f"ranks={r} layers={L} {s.name}", s.config)
                                                        for s in p.slices))
            plans.append(p)
            base = p.slices[0].config
            # The buckets hide under the last microbatch's backward: at the largest micro-batch size of the space
            # (the fewest microbatches) that window is longest, so the overlap is seen best where it matters most.
            widest = max((s.config for s in p.slices if s.config.recompute == base.recompute),
                         key=lambda c: c.batch.micro_batch_size)
            if (dp_comm and L == max(layers) and base.parallel.dp >= 2
                    and getattr(base.data_parallel, "kind", "") == "replicate"):
                comm += dp_comm_slices(widest, bucket_sizes(sweep.get("space"), base.data_parallel.bucket_mb),
                                       f"ranks={r} layers={L}")
            if pp_comm and backend == "ray" and L == max(layers) and r >= 2 and r % 2 == 0:
                comm += pp_comm_slices(base, sweep.get("space"), f"ranks={r}")
    first = plans[0]
    notes = tuple(dict.fromkeys(n for p in plans for n in p.notes))
    merged = dataclasses.replace(first, slices=tuple(s for p in plans for s in p.slices), notes=notes,
                                 layers=first.layers if not several else 0, ranks=first.ranks if not several else 0)
    return merged, tuple(comm)


def _model_notes(m: Any) -> list[str]:
    """What the trainer's GPT (pre-LayerNorm, GELU MLP, MHA, learned positions, no biases) cannot reproduce."""
    notes = []
    h, f = m.hidden_size, m.ffn_hidden_size or 4 * m.hidden_size
    if m.layer_gemms and tuple(map(tuple, m.layer_gemms)) != ((h, 3 * h), (h, h), (h, f), (f, h)):
        notes.append("model.layer_gemms is not the trainer's QKV/proj/FC1/FC2 (a gated MLP or GQA?): the slice "
                     "runs the two-matrix GELU MLP and full multi-head attention at the same ffn width")
    if m.linear_biases:
        notes.append("model.linear_biases: the trainer's GEMMs have no biases (a negligible difference in time)")
    if not m.flash_attention:
        notes.append("model.flash_attention=false: the trainer's SDPA picks fused kernels; the fit is of fused attention")
    if m.position_embeddings == 0:
        notes.append("model.position_embeddings=0 (rotary): the trainer learns absolute positions (seq_len rows)")
    if m.tied_embeddings:
        notes.append("model.tied_embeddings: the trainer's LM head is separate (one more vocab x hidden matrix)")
    return notes


def memory_refusal(slices: SlicePlan, cluster: ClusterSpec, prior: Efficiency, cluster_name: str) -> str | None:
    """One line naming the first slice predicted over the memory budget and what it needs, or None."""
    from orchestrator.calibration.prefilter import MemoryPrefilter

    check = MemoryPrefilter(cluster, prior)
    for s in slices.slices:
        v = check.verdict(s.config)
        if v.skip:
            return (f"slice {s.name} ({s.config.model.n_layers} layers, d_model {slices.shape['d_model']}, "
                    f"tp {s.config.tensor_parallel.size}) "
                    f"needs {fmt_bytes(v.predicted_bytes)} per rank (predicted), over the "
                    f"{fmt_bytes(v.budget_bytes)} budget of {cluster_name}; nothing was run (a smaller shape: "
                    f"--shrink F, or a cluster file with more memory)")
    return None
