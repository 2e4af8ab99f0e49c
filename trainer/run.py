"""One measured training run on a torch.distributed world, as one rank.

``run`` does not assume it owns the process: it joins the world described by torchrun's variables only
if none exists (and then leaves it again), builds its (pp, dp, tp) mesh once per shape and world (see
``mesh_groups``), resets peak-memory statistics and removes every hook it installs, so a long-lived worker can run many
configs in a row.
"""

from __future__ import annotations

import contextlib
import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer import layout
from trainer.config import FsdpDP, TorchDDP, TrainConfig
from trainer.model.data import open_corpus, replica_batch
from trainer.measure.meters import PhaseClock, SavedActivations, peak_flops, process_peak_rss_bytes, sync
from trainer.parallel.parallelize import Groups, Parallelized, parallelize
from trainer.measure.profile import StepProfiler
from trainer.measure.result import NESTED_PHASES, NonFiniteLoss, RankResult, Span, StepRecord
from trainer.parallel.tensor_parallel import finish_grads, local, owned, tp_comm_clock, vocab_parallel_loss


def device_for(kind: str) -> torch.device:
    if kind == "cuda":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def init_world(device: str = "cpu", timeout_s: float = 300.0) -> None:
    """Join the world described by RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (torchrun's variables)."""
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"no torch.distributed world: set {', '.join(missing)} (torchrun does) or use "
                           f"trainer.launch.spawn")
    if device == "cuda":
        torch.cuda.set_device(device_for("cuda"))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", timeout=timedelta(seconds=timeout_s))


def make_groups(tp: int, pp: int, dp: int, device_type: str, timeout_s: float) -> Groups:
    """The (pp, dp, tp) DeviceMesh over this world, on groups this run creates and later destroys.

    Every rank creates every group, in the same order, as torch.distributed requires; the groups carry
    the run's collective timeout (DeviceMesh's own would take torch's default).
    """
    rank = dist.get_rank()
    timeout = timedelta(seconds=timeout_s)
    grid = torch.arange(tp * pp * dp).view(pp, dp, tp)
    mine = []
    for dim in range(3):
        lines = grid.movedim(dim, -1).reshape(-1, grid.shape[dim])
        for line in lines.tolist():
            g = dist.new_group(line, timeout=timeout)
            if rank in line:
                mine.append(g)
    from torch.distributed.device_mesh import DeviceMesh

    mesh = DeviceMesh.from_group(mine, device_type, mesh=grid, mesh_dim_names=layout.MESH_DIMS)
    pp_rank, dp_rank, tp_rank = layout.rank_coords(rank, tp, pp, dp)
    return Groups(pp_rank, dp_rank, mine[0], mine[1], tp_rank, mine[2], mesh)


_MESHES: dict[tuple, tuple[object, Groups]] = {}


def mesh_groups(tp: int, pp: int, dp: int, device_type: str, timeout_s: float) -> Groups:
    """The mesh of this shape in this world, made once and kept while the world lives.

    Not destroyed after a run, unlike plain groups would be: DTensor caches sharding decisions keyed by
    meshes that compare equal by shape and names alone, so a later run's new mesh would be answered with
    a destroyed one's groups. One mesh per shape keeps every cached answer valid.
    """
    key = (device_type, tp, pp, dp)
    world = dist.group.WORLD
    if key not in _MESHES or _MESHES[key][0] is not world:
        _MESHES[key] = (world, make_groups(tp, pp, dp, device_type, timeout_s))
    return _MESHES[key][1]


def run(cfg: TrainConfig, trace_dir: str | os.PathLike | None = None) -> RankResult:
    """Train ``cfg`` as this rank; with ``run.profile_step`` set, its trace goes to ``trace_dir`` (else a temp dir)."""
    owns_world = not dist.is_initialized()
    init_world(cfg.run.device, cfg.run.timeout_s)
    try:
        tp, pp, dp = cfg.tensor_parallel.size, cfg.parallel.pp, cfg.parallel.dp
        layout.check_world_size(tp, pp, dp, dist.get_world_size())
        torch.set_num_threads(cfg.run.threads_per_rank)
        return _train(cfg, mesh_groups(tp, pp, dp, device_for(cfg.run.device).type, cfg.run.timeout_s), trace_dir)
    finally:
        if owns_world:
            leave_world()


def leave_world() -> None:
    """Leave the world this process joined, and forget the meshes made in it (``mesh_groups``)."""
    _MESHES.clear()
    dist.destroy_process_group()


def _train(cfg: TrainConfig, groups: Groups, trace_dir: str | os.PathLike | None) -> RankResult:
    device = device_for(cfg.run.device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(cfg.run.seed)
    dp, n_micro, mbs = cfg.parallel.dp, cfg.n_microbatches, cfg.batch.micro_batch_size
    replica_tokens = cfg.batch.global_batch // dp * cfg.model.seq_len

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return token_loss(logits, target, replica_tokens)

    par = parallelize(cfg, groups, device, loss_fn)
    params = [p for c in par.chunks for p in c.parameters()]
    opt = torch.optim.AdamW(params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2), eps=cfg.optim.eps,
                            weight_decay=cfg.optim.weight_decay)
    corpus = open_corpus(cfg.data, cfg.model.vocab_size)
    measured = list(range(cfg.run.warmup_steps, cfg.run.steps))
    clock = PhaseClock(device, set(measured[:cfg.run.timeline_steps]))
    acts = SavedActivations()
    restore = _instrument(par, clock)
    tp_timing = contextlib.ExitStack()
    # With comm_overlap the blocks' collectives run inside compiled kernels, overlapped with their GEMMs: they
    # have no span of their own, and the timing wrapper would be traced into the graphs and split them.
    if cfg.tensor_parallel.size > 1 and not cfg.tensor_parallel.comm_overlap:
        tp_timing.enter_context(tp_comm_clock(clock))
    holds_last = (cfg.n_stages - 1) in par.stage_ids
    profiler = StepProfiler(cfg.run.profile_step, device, dist.get_rank(), trace_dir)
    # No autocast weight-cast cache: with FSDP2 resharding between microbatches a cached bf16 copy outlives
    # the parameter it was cast from and its gradient is lost (measured: grad norm -10% at step 0).
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.run.precision == "bf16",
                              cache_enabled=False)
    records, act_peak, reduce_gaps = [], 0, []
    try:
        for step in range(cfg.run.steps):
            with profiler.around(step):  # a warm-up update only (RunConfig checks): never a measured one
                t0 = clock.begin_step(step)
                x, y = replica_batch(corpus, step, cfg.batch.global_batch, dp, groups.dp_rank, cfg.model.seq_len)
                x, y = x.to(device), y.to(device)
                _set_lr(opt, cfg, step)
                if par.reducer is not None:
                    par.reducer.zero_grad()
                else:
                    opt.zero_grad(set_to_none=True)
                acts.reset_peak()
                with acts.hooks(), autocast, vocab_parallel_loss(cfg.tensor_parallel.size > 1):
                    if par.schedule is not None:
                        replica_loss = _pipeline_step(par, clock, x, y, holds_last)
                    else:
                        replica_loss = _accumulation_step(par, cfg, clock, x, y, loss_fn, n_micro, mbs)
                if par.reducer is not None:
                    with clock.phase("dp_comm_wait"):
                        buckets = par.reducer.finish()
                    for launch, done in buckets:
                        clock.add("dp_reduce", launch - t0, done - t0)
                    reduce_gaps.append((step, par.reducer.first_launch - t0 - clock.marks[step]["backward_end"]))
                with clock.phase("optimizer"):
                    finish_grads(params)
                    loss, norm = _global_loss_and_norm(par, cfg, groups, replica_loss, holds_last, device)
                    if not (math.isfinite(loss) and math.isfinite(norm)):
                        raise NonFiniteLoss(f"step {step}: loss={loss} grad_norm={norm}")
                    if cfg.optim.grad_clip and norm > cfg.optim.grad_clip:
                        scale = cfg.optim.grad_clip / (norm + 1e-6)
                        for p in params:
                            if p.grad is not None:
                                p.grad.mul_(scale)
                    opt.step()
                sync(device)
                elapsed = clock.now()
                if step in measured:
                    act_peak = max(act_peak, acts.peak)
            records.append(StepRecord(step, elapsed, loss, norm, cfg.batch.global_batch * cfg.model.seq_len))
        result = _rank_result(cfg, groups, par, opt, clock, measured, records, act_peak, reduce_gaps, device)
        result.trace_file = profiler.trace_file
        return result
    finally:
        tp_timing.close()
        restore()
        if par.reducer is not None:
            par.reducer.remove()


def token_loss(logits: torch.Tensor, target: torch.Tensor, replica_tokens: int) -> torch.Tensor:
    """Cross-entropy summed over the microbatch, divided by the tokens of the whole replica batch.

    Accumulated over microbatches and averaged over replicas this is the mean over every token of the
    global batch, for any layout. Under TP the logits are vocabulary-sharded and ``loss_parallel`` makes
    the sum the whole vocabulary's on every TP rank, so the normaliser is the same as without TP.
    """
    ce = F.cross_entropy(logits.float().flatten(0, 1), target.flatten(), reduction="sum")
    return ce / replica_tokens


def _set_lr(opt: torch.optim.Optimizer, cfg: TrainConfig, step: int) -> None:
    warm = cfg.optim.warmup_steps
    lr = cfg.optim.lr * min(1.0, (step + 1) / warm) if warm else cfg.optim.lr
    for group in opt.param_groups:
        group["lr"] = lr


def _pipeline_step(par: Parallelized, clock: PhaseClock, x, y, holds_last: bool) -> torch.Tensor | None:
    losses: list[torch.Tensor] = []
    start = clock.now()
    before = _busy(clock)
    args = (x,) if 0 in par.stage_ids else ()
    kwargs = {"target": y, "losses": losses} if holds_last else {}
    par.schedule.step(*args, **kwargs)
    sync(clock.device)
    end = clock.now()
    busy = _busy(clock) - before
    clock.totals[clock.step]["pipeline_idle"] += max(0.0, (end - start) - busy)
    if clock.step in clock.keep:
        _idle_spans(clock, start, end)
    # Under TP each loss is a replicated DTensor: its local value is the whole microbatch's loss.
    return torch.stack([local(loss.detach()).float() for loss in losses]).sum() if holds_last else None


def _busy(clock: PhaseClock) -> float:
    """Seconds of this step's top-level phases (nested ones, like tp_comm inside forward, are in them already)."""
    return sum(v for k, v in clock.totals[clock.step].items() if k not in NESTED_PHASES)


def _idle_spans(clock: PhaseClock, start: float, end: float) -> None:
    busy = sorted((s.start_s, s.end_s) for s in clock.spans if s.step == clock.step and s.start_s >= start)
    t = start
    for s, e in busy:
        if s > t:
            clock.spans.append(Span(clock.step, "pipeline_idle", t, s))
        t = max(t, e)
    if end > t and busy:
        clock.spans.append(Span(clock.step, "pipeline_idle", t, end))


def _accumulation_step(par, cfg, clock, x, y, loss_fn, n_micro, mbs) -> torch.Tensor:
    model = par.chunks[0]
    total = torch.zeros((), device=x.device)
    for i in range(n_micro):
        last = i == n_micro - 1
        sl = slice(i * mbs, (i + 1) * mbs)
        ctx = model.no_sync() if isinstance(cfg.data_parallel, TorchDDP) and cfg.parallel.dp > 1 and not last \
            else contextlib.nullcontext()
        if isinstance(cfg.data_parallel, FsdpDP) and cfg.parallel.dp > 1:
            model.set_requires_gradient_sync(last)
        with ctx:
            with clock.phase("forward"):
                loss = loss_fn(model(x[sl]), y[sl])
            with clock.phase("backward"):
                loss.backward()
            clock.mark("backward_end", first=False)
        total += local(loss.detach()).float()
    return total


def _instrument(par: Parallelized, clock: PhaseClock):
    """Time the pipeline stages' compute by wrapping their per-chunk methods (instance attributes only)."""
    originals = []

    def wrap(obj, name, phase, mark=None):
        fn = getattr(obj, name)

        def timed(*a, **k):
            with clock.phase(phase):
                out = fn(*a, **k)
            if mark:
                clock.mark(mark, first=False)
            return out
        setattr(obj, name, timed)
        originals.append((obj, name))

    for stage in par.stages:
        wrap(stage, "forward_one_chunk", "forward")
        wrap(stage, "backward_one_chunk", "backward", mark="backward_end")
        wrap(stage, "perform_reduce_grad", "dp_comm_wait")

    def restore():
        for obj, name in originals:
            delattr(obj, name)
    return restore


def _global_loss_and_norm(par, cfg, groups, replica_loss, holds_last, device) -> tuple[float, float]:
    """The all-reduced loss and the whole model's gradient L2 norm: every element counted exactly once
    (sharded pieces on every rank, replicated ones on coordinate 0 of the dims they are replicated over)."""
    sq = torch.zeros((), device=device, dtype=torch.float64)
    for c in par.chunks:
        for p in c.parameters():
            if p.grad is not None and owned(p, groups.coords):
                sq += local(p.grad).double().pow(2).sum()
    vec = torch.stack([
        # Every TP rank of the last stage holds the same loss: count one.
        replica_loss.double() / cfg.parallel.dp if holds_last and groups.tp_rank == 0
        else torch.zeros((), device=device, dtype=torch.float64),
        sq,
    ])
    dist.all_reduce(vec)
    return float(vec[0]), float(vec[1].sqrt())


def _canonical(name: str) -> str:
    return name[len("module."):] if name.startswith("module.") else name


def _rank_result(cfg, groups, par, opt, clock, measured, records, act_peak, reduce_gaps, device) -> RankResult:
    sharded = isinstance(cfg.data_parallel, FsdpDP) and cfg.parallel.dp > 1
    fingerprint, flat = {}, []
    with torch.no_grad():
        for c in par.chunks:
            for name, p in c.named_parameters():
                t = local(p.detach())
                # Only the pieces this rank owns, each a partial sum (flag 1) that merge adds up: the whole
                # tensor's norm and sum, whatever the TP/FSDP split.
                if owned(p, groups.coords):
                    fingerprint[_canonical(name)] = [float(t.double().pow(2).sum()), float(t.double().sum()), 1.0]
                flat.append(t.reshape(-1))
        replica_diff = 0.0
        if cfg.parallel.dp > 1 and not sharded:
            vec = torch.cat(flat).float()
            hi, lo = vec.clone(), vec.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=groups.dp_group)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=groups.dp_group)
            replica_diff = float((hi - lo).abs().max())
    param_bytes = sum(local(p).numel() * p.element_size() for c in par.chunks for p in c.parameters())
    grad_bytes = sum(local(p.grad).numel() * p.grad.element_size()
                     for c in par.chunks for p in c.parameters() if p.grad is not None)
    opt_bytes = sum(local(v).numel() * v.element_size() for st in opt.state.values() for v in st.values()
                    if torch.is_tensor(v))
    memory = {"param_bytes": param_bytes, "grad_bytes": grad_bytes, "optimizer_state_bytes": opt_bytes,
              "saved_activation_peak_bytes": act_peak, "process_peak_rss_bytes": process_peak_rss_bytes()}
    if device.type == "cuda":
        memory["cuda_peak_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        memory["peak_bytes"] = memory["cuda_peak_allocated_bytes"]
    else:
        memory["peak_bytes"] = param_bytes + grad_bytes + opt_bytes + act_peak
    gaps = sorted(g for s, g in reduce_gaps if s in measured)
    peak, basis = peak_flops(device, cfg.run.precision)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return RankResult(
        rank=dist.get_rank(), pp_rank=groups.pp_rank, dp_rank=groups.dp_rank, tp_rank=groups.tp_rank,
        stage_ids=par.stage_ids,
        layer_ids=[int(k) for c in par.chunks for k in getattr(c, "module", c).layers],
        device_name=name, steps=records, phase_s=clock.medians(measured),
        reduce_start_after_backward_s=gaps[len(gaps) // 2] if gaps else None,
        spans=clock.spans, memory=memory, fingerprint=fingerprint, replica_max_abs_diff=replica_diff,
        peak_flops=peak, peak_basis=basis,
    )
