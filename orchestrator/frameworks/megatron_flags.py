"""A steptune config as Megatron-LM command-line flags, with every gap named.

Pure: ``megatron_args(cfg) -> (args, notes)`` for a trainer config, ``megatron_args_for_plan(plan)`` for
the cost model's production-scale plan. ``args`` is argv-style (``["--num-layers", "4", ...]``),
using Megatron-LM's real flag names (megatron/training/arguments.py); ``notes`` says, per knob, what
could not be carried over exactly. Each note starts with one of:

- ``not mapped:`` the knob has no Megatron flag; the trial's behaviour is not reproduced,
- ``differs:`` mapped to the nearest Megatron feature, which is not the same thing,
- ``converted:`` mapped exactly, but the unit or name changes (so a reader can check the arithmetic).

A knob is never dropped silently: the unit tests walk every field of the config.
"""

from __future__ import annotations

import math

from trainer.config import FsdpDP, ReplicateDP, SyntheticData, TokenFileData, TorchDDP, TrainConfig, flatten
from trainer.knobs import PipelineConfig
from trainer.mapping import build

# steptune keeps gradients in fp32 (bf16 runs autocast with fp32 parameters), and Megatron reduces main
# gradients in fp32 too (--accumulate-allreduce-grads-in-fp32), so a bucket of B bytes holds B / 4 of them.
GRAD_BYTES = 4
RECOMPUTE_MODULES = {"core_attn": "core_attn", "mlp": "mlp", "norm": "layernorm"}
MEASUREMENT_ONLY = ("run.warmup_steps", "run.timeline_steps", "run.threads_per_rank", "run.profile_step")


def megatron_args(cfg: TrainConfig) -> tuple[list[str], list[str]]:
    args: list[str] = []
    notes: list[str] = []

    def add(flag: str, *values: object) -> None:
        args.append(flag)
        args.extend(_fmt(v) for v in values)

    _model(cfg, add, notes)
    _data(cfg, add, notes)
    add("--micro-batch-size", cfg.batch.micro_batch_size)
    add("--global-batch-size", cfg.batch.global_batch)
    tpc = cfg.tensor_parallel
    add("--tensor-model-parallel-size", tpc.size)
    add("--pipeline-model-parallel-size", cfg.parallel.pp)
    if tpc.size > 1 and tpc.sequence_parallel:
        add("--sequence-parallel")
    _pipeline(cfg, add, notes)
    _data_parallel(cfg, add, notes)
    _recompute(cfg.to_dict()["recompute"], add, notes)
    _optimizer(cfg, add, notes)
    _run(cfg, add, notes)
    return args, notes


def _model(cfg: TrainConfig, add, notes: list[str]) -> None:
    m = cfg.model
    add("--num-layers", m.n_layers)
    add("--hidden-size", m.d_model)
    add("--num-attention-heads", m.n_heads)
    add("--ffn-hidden-size", m.ffn_dim)
    add("--seq-length", m.seq_len)
    add("--max-position-embeddings", m.seq_len)
    # trainer/model/gpt.py: pre-norm LayerNorm, GELU MLP, bias-free linears, learned absolute positions,
    # separate (untied) output head, no dropout. Megatron's defaults differ on biases, tying and dropout.
    add("--normalization", "LayerNorm")
    add("--position-embedding-type", "learned_absolute")
    add("--disable-bias-linear")
    add("--untie-embeddings-and-output-weights")
    add("--attention-dropout", 0.0)
    add("--hidden-dropout", 0.0)
    # Megatron sizes the embedding from a tokenizer. NullTokenizer(--vocab-size V-1) adds one
    # end-of-document id, giving V rows; padding to a multiple of 128 is kept only when it is a no-op.
    add("--tokenizer-type", "NullTokenizer")
    add("--vocab-size", m.vocab_size - 1)
    add("--make-vocab-size-divisible-by", 128 if m.vocab_size % 128 == 0 else 1)
    notes.append(f"converted: model.vocab_size={m.vocab_size} -> --tokenizer-type NullTokenizer --vocab-size "
                 f"{m.vocab_size - 1} (Megatron takes a tokenizer, not a size; NullTokenizer adds one "
                 f"end-of-document id). With a real tokenizer use --tokenizer-type/--tokenizer-model instead; "
                 f"the embedding is then sized (and padded) from it")


def _data(cfg: TrainConfig, add, notes: list[str]) -> None:
    if isinstance(cfg.data, SyntheticData):
        add("--mock-data")
        notes.append(f"differs: data.kind=synthetic (seed {cfg.data.seed}) -> --mock-data: Megatron's mock data is "
                     f"random tokens, not steptune's bigram language; throughput compares, losses do not")
    elif isinstance(cfg.data, TokenFileData):
        notes.append(f"not mapped: data.kind=token_file ({cfg.data.path}) is not a Megatron indexed dataset; "
                     f"tokenise the source text with Megatron's tools/preprocess_data.py and add "
                     f"--data-path PREFIX --split 100,0,0")


def _pipeline(cfg: TrainConfig, add, notes: list[str]) -> None:
    _pipeline_flags(cfg.pipeline, cfg.parallel.pp, [len(s) for s in cfg.stage_layers()], add, notes)


def _pipeline_flags(pipe: PipelineConfig, pp: int, counts: list[int], add, notes: list[str]) -> None:
    """Shared by the trainer and the planner: both hold the same PipelineConfig and layers per model chunk."""
    v = pipe.virtual_stages
    if pp == 1:
        return  # plain gradient accumulation: no schedule, no split
    if pipe.schedule == "gpipe":
        notes.append("not mapped: pipeline.schedule=gpipe; Megatron's non-interleaved pipeline always runs 1F1B "
                     "(same maths, less activation memory, different timing than the trial measured)")
    first, last = first_last(counts)
    if v > 1 and len(set(counts)) == 1:
        add("--num-layers-per-virtual-pipeline-stage", counts[0])
    elif v > 1 or 0 in counts or (first is None and last is None and len(set(counts)) > 1):
        # The older flags cannot say this split (uneven chunks on a rank, an embedding- or loss-only chunk,
        # uneven middle stages); Megatron-Core's layout string can, and implies the virtual stages.
        add("--pipeline-model-parallel-layout", pipeline_layout(counts))
        notes.append(f"converted: pipeline.split {counts} (layers per model chunk) -> "
                     f"--pipeline-model-parallel-layout (Megatron-Core, marked experimental there; it sets "
                     f"the virtual stages too)")
    else:
        if first is not None:
            add("--decoder-first-pipeline-num-layers", first)
        if last is not None:
            add("--decoder-last-pipeline-num-layers", last)


def pipeline_layout(counts: list[int]) -> str:
    """Megatron-Core's --pipeline-model-parallel-layout for layers per model chunk in pipeline order (chunk c
    on rank c % pp, as Megatron lists them): E (embedding) on the first, t per decoder layer, L (loss) on
    the last, stages split by |; an empty stage is legal there."""
    stages = ["t" * c for c in counts]
    stages[0] = "E" + stages[0]
    stages[-1] += "L"
    return "|".join(stages)


def first_last(counts: list[int]) -> tuple[int | None, int | None]:
    """The fewest Megatron first/last flags that reproduce a per-stage layer split; (None, None) when
    the split is balanced or cannot be expressed (Megatron spreads the rest evenly over the others)."""
    if len(set(counts)) <= 1:
        return None, None
    if len(set(counts[1:])) == 1:
        return counts[0], None
    if len(set(counts[:-1])) == 1:
        return None, counts[-1]
    if len(set(counts[1:-1])) <= 1:
        return counts[0], counts[-1]
    return None, None


def _data_parallel(cfg: TrainConfig, add, notes: list[str]) -> None:
    dpc = cfg.data_parallel
    if isinstance(dpc, ReplicateDP):
        if dpc.overlap_grad_reduce:
            add("--overlap-grad-reduce")
        n = _bucket_params(dpc.bucket_mb * 1e6)
        add("--ddp-bucket-size", n)
        notes.append(f"converted: data_parallel.bucket_mb={dpc.bucket_mb:g} -> --ddp-bucket-size {n} parameters "
                     f"({dpc.bucket_mb:g} x 10^6 bytes / {GRAD_BYTES} bytes per fp32 gradient element)")
    elif isinstance(dpc, FsdpDP):
        # --overlap-param-gather requires the distributed optimizer and --overlap-grad-reduce.
        add("--use-distributed-optimizer")
        add("--overlap-grad-reduce")
        add("--overlap-param-gather")
        notes.append("differs: data_parallel.kind=fsdp -> Megatron's distributed optimizer with parameter-gather "
                     "overlap: it shards gradients and optimizer state but keeps full parameters on every GPU, "
                     "so per-GPU memory is higher than the FSDP trial measured. Full parameter sharding is "
                     "Megatron FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params), "
                     "not emitted: it brings its own constraints (e.g. --ckpt-format fsdp_dtensor)")
        notes.append(f"not mapped: data_parallel.reshard_after_forward={str(dpc.reshard_after_forward).lower()} "
                     f"(FSDP-only; the distributed optimizer never frees parameters after forward)")
        notes.append(f"not mapped: data_parallel.prefetch={dpc.prefetch} (FSDP's all-gather prefetch depth; "
                     f"Megatron overlaps parameter gathers per bucket)")
    elif isinstance(dpc, TorchDDP):
        n = _bucket_params(dpc.bucket_mb * 1e6)
        add("--overlap-grad-reduce")
        add("--ddp-bucket-size", n)
        notes.append(f"differs: data_parallel.kind=torch_ddp -> Megatron's own DDP (not torch's "
                     f"DistributedDataParallel) with overlapped reduction, as torch DDP always overlaps; "
                     f"bucket_mb={dpc.bucket_mb:g} -> {n} parameters = {dpc.bucket_mb:g} x 10^6 bytes "
                     f"/ {GRAD_BYTES} bytes per fp32 gradient element")


def _bucket_params(nbytes: float) -> int:
    return max(1, int(round(nbytes / GRAD_BYTES)))


def _recompute(rc: dict, add, notes: list[str]) -> None:
    """Shared by the trainer and the planner: both spell recompute as {kind, modules | method, num_layers}."""
    if rc.get("kind") == "selective":
        modules = list(rc.get("modules") or ["core_attn"])
        # Megatron refuses --recompute-method with selective granularity.
        add("--recompute-granularity", "selective")
        add("--recompute-modules", *[RECOMPUTE_MODULES[m] for m in modules])
        if "norm" in modules:
            notes.append("converted: recompute.modules norm -> layernorm (Megatron recomputes both "
                         "input_layernorm and pre_mlp_layernorm, as steptune's norm does)")
    elif rc.get("kind") == "full":
        add("--recompute-granularity", "full")
        add("--recompute-method", rc.get("method", "uniform"))
        add("--recompute-num-layers", rc.get("num_layers", 1))
    elif rc.get("kind") == "op":
        notes.append(f"not mapped: recompute.kind=op (matmul_period {rc.get('matmul_period', 2)}): Megatron-LM has "
                     "no op-level policy; its nearest is --recompute-granularity selective with --recompute-modules "
                     "(core_attn, mlp, layernorm), which keeps different tensors: the exported job keeps every "
                     "activation unless you add those flags")


def _optimizer(cfg: TrainConfig, add, notes: list[str]) -> None:
    o = cfg.optim
    # Megatron's "adam" is AdamW (decoupled weight decay), like steptune's torch.optim.AdamW.
    add("--optimizer", "adam")
    add("--lr", o.lr)
    add("--lr-decay-style", "constant")
    add("--lr-warmup-iters", o.warmup_steps)
    add("--weight-decay", o.weight_decay)
    add("--adam-beta1", o.beta1)
    add("--adam-beta2", o.beta2)
    add("--adam-eps", o.eps)
    add("--clip-grad", o.grad_clip)
    if o.weight_decay:
        notes.append(f"differs: optim.weight_decay={o.weight_decay:g}: Megatron exempts biases and 1-D parameters "
                     f"(norm weights) from weight decay; steptune's AdamW decays every parameter")
    if o.warmup_steps:
        notes.append(f"differs: optim.warmup_steps={o.warmup_steps} -> --lr-warmup-iters: both linear; steptune's "
                     f"first update already uses lr x 1/{o.warmup_steps}, check Megatron's first-iteration lr")


def _run(cfg: TrainConfig, add, notes: list[str]) -> None:
    r = cfg.run
    add("--train-iters", r.steps)
    add("--seed", r.seed)
    add("--distributed-timeout-minutes", max(1, math.ceil(r.timeout_s / 60)))
    if r.precision == "bf16":
        add("--bf16")
        add("--accumulate-allreduce-grads-in-fp32")
        notes.append("differs: run.precision=bf16: steptune autocasts with fp32 parameters; Megatron --bf16 keeps "
                     "bf16 weights with fp32 main parameters and gradients (close numerics, not identical)")
    notes.append(f"differs: run.seed={r.seed} -> --seed: Megatron draws initial weights from its own generator "
                 f"(same scheme: normal(0, 0.02), output projections scaled by 1/sqrt(2 x layers)), so the "
                 f"starting tensors and hence the exact losses differ")
    if r.device == "cpu":
        notes.append("not mapped: run.device=cpu (Megatron-LM trains on CUDA GPUs)")
    values = {"run.warmup_steps": r.warmup_steps, "run.timeline_steps": r.timeline_steps,
              "run.threads_per_rank": r.threads_per_rank, "run.profile_step": r.profile_step}
    notes.append("not mapped (measurement only, no effect on training): "
                 + ", ".join(f"{k}={values[k]}" for k in MEASUREMENT_ONLY))
    if r.profile_step is not None:
        notes.append("to trace production too: Megatron's --profile --profile-step-start N --profile-step-end N+1 "
                     "(with --use-pytorch-profiler) records a torch.profiler trace like run.profile_step")


# ---- cost-model (planner) configs: the production-scale plan, e.g. search_spaces/preset-500b.yaml ----

# Planner fields that only calibrate the cost model; they describe the cluster, not the training run.
_PLAN_MODEL_ONLY = ("cluster.", "efficiency.", "model.elementwise.")
_PLAN_REQUIRED = ("model.num_layers", "model.hidden_size", "model.num_heads", "job.seq_len", "batch.global_batch",
                  "batch.micro_batch_size")


def megatron_args_for_plan(plan: dict) -> tuple[list[str], list[str]]:
    """The planner's config (``PlanConfig.to_dict()``, a model-backend ledger line's ``config``) as
    Megatron-LM flags. Same contract as :func:`megatron_args`; any field this function does not know is
    reported as not mapped, so a new planner knob cannot disappear on the way to production."""
    args: list[str] = []
    notes: list[str] = []
    from orchestrator.planner.parse import upgrade_plan_dict

    plan = upgrade_plan_dict(plan)
    flat = flatten(plan)
    used: set[str] = set()
    missing = [k for k in _PLAN_REQUIRED if flat.get(k) is None]
    if missing:
        raise ValueError(f"not a planner config: missing {', '.join(missing)}")

    def get(key: str, default: object = None) -> object:
        used.add(key)
        return flat.get(key, default)

    def add(flag: str, *values: object) -> None:
        args.append(flag)
        args.extend(_fmt(v) for v in values)

    h = get("model.hidden_size")
    add("--num-layers", get("model.num_layers"))
    add("--hidden-size", h)
    add("--num-attention-heads", get("model.num_heads"))
    add("--ffn-hidden-size", get("model.ffn_hidden_size") or 4 * int(h))  # the planner's 0 means 4 x hidden
    seq = get("job.seq_len")
    add("--seq-length", seq)
    add("--max-position-embeddings", seq)
    if not get("model.tied_embeddings", False):
        add("--untie-embeddings-and-output-weights")
    notes.append(f"not mapped: model.vocab_size={get('model.vocab_size')}: Megatron sizes the embedding from "
                 f"the tokenizer (--tokenizer-type/--tokenizer-model); use the one whose size the plan assumed")
    notes.append(f"not mapped: model.flash_attention={str(get('model.flash_attention')).lower()}: Megatron "
                 f"picks the attention kernel itself (--attention-backend, default auto)")
    add("--micro-batch-size", get("batch.micro_batch_size"))
    add("--global-batch-size", get("batch.global_batch"))
    tp, pp = int(get("tensor_parallel.size", 1)), int(get("parallel.pp", 1))
    add("--tensor-model-parallel-size", tp)
    add("--pipeline-model-parallel-size", pp)
    if tp > 1 and get("tensor_parallel.sequence_parallel", False):
        add("--sequence-parallel")
    if tp > 1 and get("tensor_parallel.comm_overlap", False):
        add("--tp-comm-overlap")  # Transformer Engine userbuffers; the plan priced its exposure
    get("parallel.dp")  # Megatron derives it: world size / (tp x pp)
    used.update(k for k in flat if k.startswith("pipeline."))
    pipe = build(PipelineConfig, plan.get("pipeline") or {}, "pipeline")
    _pipeline_flags(pipe, pp, pipe.split.counts(int(get("model.num_layers")), pp * pipe.virtual_stages), add, notes)
    if not get("pipeline_comm.overlap_p2p", True) and pp > 1 and pipe.virtual_stages > 1:
        add("--no-overlap-p2p-communication")  # Megatron overlaps them by default
    _recompute({k.split(".", 1)[1]: get(k) for k in flat if k.startswith("recompute.")}, add, notes)
    _plan_data_parallel(get, add, notes)
    add("--bf16")
    notes.append("converted: the cost model assumes bf16 training (its peak is the BF16 one) -> --bf16")
    model_only = sorted(k for k in flat if k.startswith(_PLAN_MODEL_ONLY))
    used.update(model_only)
    if model_only:
        notes.append("not mapped (cost-model inputs, no training effect): " + ", ".join(model_only))
    for key in sorted(set(flat) - used):
        notes.append(f"not mapped: {key}={flat[key]} (a planner field this export does not know)")
    notes.append("not mapped: the plan has no optimizer, learning-rate schedule, data or --train-iters: "
                 "add your production ones")
    return args, notes


def _plan_data_parallel(get, add, notes: list[str]) -> None:
    kind = get("data_parallel.kind", "replicate")
    overlap = get("data_parallel.overlap_grad_reduce", False) or kind == "torch_ddp"
    gather = get("optimizer.overlap_param_gather", False)
    if get("optimizer.distributed", False):
        add("--use-distributed-optimizer")
    if overlap:
        add("--overlap-grad-reduce")
    if gather and overlap:
        add("--overlap-param-gather")
    elif gather:
        notes.append("not mapped: optimizer.overlap_param_gather=true without overlap_grad_reduce: Megatron "
                     "accepts --overlap-param-gather only together with --overlap-grad-reduce")
    dtype = get("optimizer.grad_reduce_dtype", "fp32")
    if dtype == "bf16":
        add("--grad-reduce-in-bf16")
    mb = get("data_parallel.bucket_mb")
    if mb is not None:
        # MB of gradients in the dtype they are reduced in (trainer.knobs.ReplicateDP), as for a trainer config.
        per = 2 if dtype == "bf16" else GRAD_BYTES
        n = max(1, int(round(float(mb) * 1e6 / per)))
        add("--ddp-bucket-size", n)
        notes.append(f"converted: data_parallel.bucket_mb={float(mb):g} -> --ddp-bucket-size {n} parameters "
                     f"({float(mb):g} x 10^6 bytes / {per} bytes per {dtype} gradient element)")
    if kind == "fsdp":
        notes.append("differs: data_parallel.kind=fsdp (FSDP2 per block, predicted by the planner's FSDP model) has "
                     "no flags here: Megatron FSDP (--use-megatron-fsdp) is not emitted")


def _fmt(v: object) -> str:
    return repr(v) if isinstance(v, float) else str(v)  # repr: the shortest text that reads back exactly


def format_args(args: list[str]) -> str:
    """One flag per line with its values: readable, and ``$(cat file)`` still word-splits it correctly."""
    lines: list[list[str]] = []
    for a in args:
        if a.startswith("--") or not lines:
            lines.append([a])
        else:
            lines[-1].append(a)
    return "\n".join(" ".join(line) for line in lines) + "\n"


# ---- the rules Megatron-LM asserts at start-up (megatron/training/arguments.py), checked on any argv ----

def flag_values(args: list[str], name: str) -> list[str] | None:
    """Values following ``name`` in an argv (None when the flag is absent, [] for a switch)."""
    if name not in args:
        return None
    i = args.index(name) + 1
    out = []
    while i < len(args) and not args[i].startswith("--"):
        out.append(args[i])
        i += 1
    return out


def check_args(args: list[str]) -> list[str]:
    """What Megatron-LM would refuse in ``args`` at start-up, one line each ([]: nothing). The one definition of
    these rules: ``export`` and the ``command`` backend's Megatron adapter (orchestrator.frameworks.megatron) both
    check their flags with it, before anything is written or launched."""
    bad: list[str] = []

    def one(name: str) -> str | None:
        v = flag_values(args, name)
        return v[0] if v else None

    if "--overlap-param-gather" in args and not {"--use-distributed-optimizer", "--overlap-grad-reduce"} <= set(args):
        bad.append("--overlap-param-gather needs --use-distributed-optimizer and --overlap-grad-reduce")
    if flag_values(args, "--recompute-granularity") == ["selective"] and "--recompute-method" in args:
        bad.append("--recompute-method is refused with --recompute-granularity selective")
    tp = int(one("--tensor-model-parallel-size") or 1)
    heads = one("--num-attention-heads")
    if heads is not None and int(heads) % tp:
        bad.append(f"--num-attention-heads {heads} is not divisible by --tensor-model-parallel-size {tp}")
    if "--sequence-parallel" in args and tp == 1:
        bad.append("--sequence-parallel with --tensor-model-parallel-size 1 (Megatron turns it off)")
    if "--tp-comm-overlap" in args and "--sequence-parallel" not in args:
        bad.append("--tp-comm-overlap needs --sequence-parallel")
    if "--num-layers-per-virtual-pipeline-stage" in args and "--decoder-first-pipeline-num-layers" in args:
        bad.append("--num-layers-per-virtual-pipeline-stage with --decoder-first-pipeline-num-layers")
    if "--pipeline-model-parallel-layout" in args:
        if {"--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
                "--decoder-last-pipeline-num-layers"} & set(args):
            bad.append("--pipeline-model-parallel-layout replaces every other pipeline split flag")
        layers = one("--num-layers")
        if layers is not None and (one("--pipeline-model-parallel-layout") or "").count("t") != int(layers):
            bad.append("--pipeline-model-parallel-layout does not hold --num-layers decoder layers")
    names = [a for a in args if a.startswith("--")]
    if dup := sorted({a for a in names if names.count(a) > 1}):
        bad.append(f"flag(s) given twice: {', '.join(dup)}")
    return bad
