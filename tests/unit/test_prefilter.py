"""The memory pre-filter: trainer config -> planner config, exact model-state bytes, skip / launch decisions."""

from __future__ import annotations

import pytest
import torch
import yaml

from orchestrator.planner import (BalancedSplit, ClusterSpec, Efficiency, FirstLastSplit, FullRecompute, NoRecompute,
                                  SelectiveRecompute)
from orchestrator.planner.knobs import Consts, encode
from orchestrator.planner.memory import stage_memory
from orchestrator.backends.ray_trials import prefilter_from_settings
from orchestrator.calibration.prefilter import (REASON_PREFIX, MemoryPrefilter, load_cluster, mapping_notes, plan_for_trial,
                                    prefilter_summary, prefilter_summary_text)
from orchestrator.records.record import Metrics, TrialRecord
from trainer.config import TrainConfig, apply_overrides

CPU = ClusterSpec(name="test-cpu", num_gpus=2, gpus_per_node=64, peak_tflops=0.16, hbm_gb=8.0, hbm_bw_GBps=10.0,
                  intra_node_bw_GBps=0.9, intra_node_latency_us=170.0)
EXACT = Efficiency(mem_reserved_gb=0.0, mem_activation_factor=1.0)
BASE = {"model": {"vocab_size": 256, "n_layers": 6, "d_model": 64, "n_heads": 4, "seq_len": 64},
        "batch": {"global_batch": 16}, "run": {"steps": 2, "warmup_steps": 1}}
REPLICATE = {"data_parallel.kind": "replicate"}


def tcfg(**flat) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(BASE, {k.replace("__", "."): v for k, v in flat.items()}))


# ---- mapping ---------------------------------------------------------------------------------------------

MAPPING = [
    # (trainer overrides, expected planner fields)
    ({}, {"gpus": 1, "tp": 1, "pp": 1, "dp": 1, "schedule": "1f1b", "v": 1, "split": BalancedSplit(),
          "recompute": NoRecompute(), "precision": "fp32", "mbs": 1, "microbatches": 16}),
    ({"parallel.pp": 2, "pipeline.split.kind": "first_last", "pipeline.split.first": 2, "pipeline.split.last": 4,
      "batch.micro_batch_size": 2},
     {"gpus": 2, "pp": 2, "split": FirstLastSplit(first=2, last=4), "mbs": 2, "microbatches": 8}),
    ({"parallel.pp": 2, "model.n_layers": 7}, {"split": BalancedSplit(), "stage_layers": [4, 3]}),  # the same rule
    ({"parallel.pp": 2, "model.n_layers": 8, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
     {"schedule": "interleaved_1f1b", "v": 2, "split": BalancedSplit()}),
    ({"parallel.pp": 2, "pipeline.schedule": "gpipe", "run.precision": "bf16"},
     {"schedule": "gpipe", "precision": "bf16_autocast"}),
    ({"parallel.pp": 1, "pipeline.schedule": "gpipe"}, {"schedule": "1f1b"}),  # pp=1 is plain accumulation
    ({"recompute.kind": "full", "recompute.method": "block", "recompute.num_layers": 2},
     {"recompute": FullRecompute(method="block", num_layers=2)}),
    ({"recompute.kind": "selective", "recompute.modules": ["mlp", "norm"]},
     {"recompute": SelectiveRecompute(modules=("mlp", "norm"))}),
    ({"parallel.dp": 2, **REPLICATE, "data_parallel.bucket_mb": 2.0, "data_parallel.overlap_grad_reduce": False},
     {"gpus": 2, "dp": 2, "bucket_mb": 2.0, "overlap": False, "microbatches": 8}),   # the same MB, no conversion
    ({"parallel.dp": 2, "data_parallel.kind": "torch_ddp", "data_parallel.bucket_mb": 8.0},
     {"dp": 2, "bucket_mb": 8.0, "kind": "torch_ddp"}),
    ({"parallel.dp": 2, "data_parallel.kind": "fsdp", "data_parallel.prefetch": 2},
     {"dp": 2, "kind": "fsdp", "bucket_mb": None, "microbatches": 8}),
    ({"tensor_parallel.size": 2, "parallel.pp": 2}, {"gpus": 4, "tp": 2, "pp": 2, "dp": 1}),  # the world is tp x pp x dp
    ({"tensor_parallel.size": 2, "parallel.dp": 2, "tensor_parallel.sequence_parallel": False},
     {"gpus": 4, "tp": 2, "dp": 2, "microbatches": 8}),
]


@pytest.mark.parametrize("overrides,expected", MAPPING)
def test_mapping_table(overrides, expected):
    cfg = TrainConfig.from_dict(apply_overrides(BASE, overrides))
    plan = plan_for_trial(cfg, CPU, EXACT)
    got = {"gpus": plan.cluster.num_gpus, "tp": plan.tensor_parallel.size, "pp": plan.parallel.pp, "dp": plan.parallel.dp,
           "schedule": plan.pipeline.schedule, "v": plan.pipeline.virtual_stages, "split": plan.pipeline.split,
           "recompute": plan.recompute, "precision": plan.job.precision, "mbs": plan.batch.micro_batch_size,
           "microbatches": plan.microbatches, "bucket_mb": getattr(plan.data_parallel, "bucket_mb", None),
           "overlap": getattr(plan.data_parallel, "overlap_grad_reduce", None), "kind": plan.data_parallel.kind,
           "stage_layers": plan.stage_layers}
    assert {k: got[k] for k in expected} == expected
    m = plan.model
    assert (m.num_layers, m.hidden_size, m.num_heads, m.ffn, m.vocab_size) == (
        cfg.model.n_layers, cfg.model.d_model, cfg.model.n_heads, cfg.model.ffn_dim, cfg.model.vocab_size)
    assert (m.linear_biases, m.tied_embeddings, m.position_embeddings) == (False, False, cfg.model.seq_len)
    assert not plan.optimizer.distributed and plan.efficiency is EXACT
    assert plan.stage_layers == [sum(len(c) for c in cfg.stage_layers()[r::cfg.parallel.pp])
                                 for r in range(cfg.parallel.pp)]


def test_mapping_notes_name_the_approximations():
    assert mapping_notes(tcfg()) == []
    assert "torch_ddp" in mapping_notes(tcfg(parallel__dp=2, data_parallel__kind="torch_ddp"))[0]
    assert "no effect with pp=1" in mapping_notes(tcfg(pipeline__schedule="gpipe"))[0]
    assert "unsharded buffers" in mapping_notes(tcfg(parallel__dp=2, data_parallel__kind="fsdp"))[0]


def test_unequal_chunks_per_rank_are_predicted():
    """6 layers over 4 chunks: [1, 2, 2, 1], so each rank holds a 1-layer and a 2-layer chunk."""
    cfg = TrainConfig.from_dict(apply_overrides(BASE, {
        "parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
        "batch.micro_batch_size": 2}))
    plan = plan_for_trial(cfg, CPU)
    assert plan.stage_chunks == [[1, 2], [2, 1]] and plan.stage_layers == [3, 3]


# ---- exact model state against the trainer's own modules (in process) ------------------------------------

@pytest.mark.parametrize("overrides", [
    {"parallel.pp": 2, "pipeline.split.kind": "first_last", "pipeline.split.first": 2, "pipeline.split.last": 4},
    {"parallel.pp": 2, "model.n_layers": 8, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
    {"parallel.dp": 2, "run.precision": "bf16", "model.d_ff": 96},
    # Llama 3's layout: rank 0 holds the embedding-only chunk, rank 1 the head-only one.
    {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
     "pipeline.split.kind": "explicit", "pipeline.split.layers": [0, 3, 3, 0]},
])
def test_params_grads_and_adam_state_are_exact(overrides):
    """The bytes trainer/run.py reports: parameters, .grad, and every tensor in AdamW's state."""
    from trainer.parallel.parallelize import build_chunks

    cfg = TrainConfig.from_dict(apply_overrides(BASE, overrides))
    plan = plan_for_trial(cfg, CPU, EXACT)
    mem = stage_memory(Consts.of(plan), encode([plan]))
    for pp_rank in range(cfg.parallel.pp):
        chunks, _ = build_chunks(cfg, pp_rank, torch.device("cpu"))
        params = [p for c in chunks for p in c.parameters()]
        for p in params:
            p.grad = torch.zeros_like(p)
        opt = torch.optim.AdamW(params)
        opt.step()
        nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
        measured = {"params": nbytes(params), "grads": nbytes(p.grad for p in params),
                    "optimizer": nbytes(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))}
        predicted = {k: mem[k][0, pp_rank] for k in measured}
        assert predicted == measured, pp_rank


@pytest.mark.parametrize("overrides", [
    {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
    {"parallel.pp": 2, "parallel.dp": 2, "data_parallel.kind": "fsdp", "run.precision": "bf16", "model.d_ff": 96},
])
def test_fsdp_model_state_is_each_ranks_dim0_shard(overrides):
    """FSDP2 keeps on dp rank r the rows torch.chunk(param, dp, dim=0)[r] of every parameter (its gradient and
    Adam moments alike) and one whole AdamW step counter per parameter: built here from the trainer's own
    modules, rank by rank. Every dim 0 of this model divides by dp, so each rank holds exactly the mean the
    planner predicts."""
    from trainer.parallel.parallelize import build_chunks

    cfg = TrainConfig.from_dict(apply_overrides(BASE, overrides))
    plan = plan_for_trial(cfg, CPU, EXACT)
    mem = stage_memory(Consts.of(plan), encode([plan]))
    d = cfg.parallel.dp
    nbytes = lambda ts: sum(t.numel() * t.element_size() for t in ts)  # noqa: E731
    for pp_rank in range(cfg.parallel.pp):
        chunks, _ = build_chunks(cfg, pp_rank, torch.device("cpu"))
        full = [p for c in chunks for p in c.parameters()]
        for dp_rank in range(d):
            shards = [torch.nn.Parameter(torch.chunk(p.detach(), d, dim=0)[dp_rank].clone()) for p in full]
            for p in shards:
                p.grad = torch.zeros_like(p)
            opt = torch.optim.AdamW(shards)
            opt.step()
            measured = {"params": nbytes(shards), "grads": nbytes(p.grad for p in shards),
                        "optimizer": nbytes(v for st in opt.state.values() for v in st.values() if torch.is_tensor(v))}
            assert {k: mem[k][0, pp_rank] for k in measured} == measured, (pp_rank, dp_rank)
            assert measured["params"] * d == nbytes(full)


def test_precision_modes_scale_activations():
    fp32 = plan_for_trial(tcfg(parallel__pp=2), CPU, EXACT)
    bf16 = plan_for_trial(tcfg(parallel__pp=2, run__precision="bf16"), CPU, EXACT)
    a32 = stage_memory(Consts.of(fp32), encode([fp32]))["activations"][0, 0]
    a16 = stage_memory(Consts.of(bf16), encode([bf16]))["activations"][0, 0]
    # Stage 0 holds 2 microbatches (1F1B) of 3 layers; bf16 adds each layer's bf16 GEMM weight copy per microbatch.
    weight_copies = 2 * 3 * 2 * fp32.model.matmul_params_per_layer
    assert a16 - weight_copies == pytest.approx(a32 / 2)


# ---- the pre-filter --------------------------------------------------------------------------------------

def test_skips_what_cannot_fit_and_launches_what_fits():
    cfg = tcfg(parallel__pp=2, batch__micro_batch_size=4, pipeline__schedule="gpipe")
    plan = plan_for_trial(cfg, CPU, EXACT)
    need = stage_memory(Consts.of(plan), encode([plan]))["peak"][0]
    skip, why = MemoryPrefilter(CPU, EXACT, budget_bytes=need / 2).check(cfg)
    assert skip and why.startswith(REASON_PREFIX) and "not launched" in why
    assert "> budget" in why and "pipeline stage" in why and "activations" in why
    skip, why = MemoryPrefilter(CPU, EXACT, budget_bytes=need * 1.01).check(cfg)
    assert not skip and "fits" in why
    # A margin forgives a prediction up to that much over the budget.
    assert not MemoryPrefilter(CPU, EXACT, budget_bytes=need / 1.2, margin=0.25).check(cfg)[0]
    # Without a budget the cluster's memory per GPU is the limit; tiny hbm_gb: skipped.
    tiny = ClusterSpec(name="tiny", num_gpus=2, hbm_gb=0.001)
    assert MemoryPrefilter(tiny, EXACT).check(cfg)[0]


def test_unpredictable_configs_are_launched_and_counted(monkeypatch):
    from orchestrator.calibration import prefilter

    pf = MemoryPrefilter(CPU, EXACT, budget_bytes=1.0)
    real = prefilter.plan_for_trial

    def refuse_pp2(cfg, *a, **k):  # every trainer config maps today; a future knob may not
        if cfg.parallel.pp == 2:
            raise ValueError("pipeline.something: not representable")
        return real(cfg, *a, **k)

    monkeypatch.setattr(prefilter, "plan_for_trial", refuse_pp2)
    skip, why = pf.check(tcfg(parallel__pp=2))
    assert not skip and "not predicted" in why and "pipeline.something" in why
    assert pf.check(tcfg())[0]
    assert (pf.checked, pf.skipped, pf.not_predicted) == (2, 1, 1)
    assert "1 not launched" in pf.summary() and "1 launched without a prediction" in pf.summary()


def test_the_repo_cluster_file_loads():
    cluster, eff = load_cluster("search_spaces/clusters/cpu-local.yaml")
    assert cluster.name == "cpu-local" and eff.mem_reserved_gb == 0.0
    assert plan_for_trial(tcfg(parallel__pp=2), cluster, eff).cluster.num_gpus == 2


def test_settings_section(tmp_path):
    cluster = tmp_path / "c.yaml"
    cluster.write_text(yaml.safe_dump({"cluster": {"name": "c", "num_gpus": 2, "hbm_gb": 4.0},
                                       "efficiency": {"mem_reserved_gb": 0.0}}))
    calib = tmp_path / "cal.yaml"
    calib.write_text(yaml.safe_dump({"efficiency": {"mem_reserved_gb": 0.0, "mem_activation_factor": 1.5}}))
    assert prefilter_from_settings(None) is None
    assert prefilter_from_settings({"enabled": False, "cluster": "x"}) is None
    pf = prefilter_from_settings({"enabled": True, "cluster": "c.yaml", "calibration": "cal.yaml",
                                  "memory_budget_gb": 0.5}, base_dir=tmp_path)
    assert pf.budget_bytes == 0.5 * 2**30 and pf.efficiency.mem_activation_factor == 1.5
    assert prefilter_from_settings({"cluster": str(cluster)}, default_budget_gb=2).budget_bytes == 2 * 2**30
    assert prefilter_from_settings({"cluster": str(cluster)}).budget_bytes == 4e9      # the cluster's hbm_gb
    for bad, match in [({"cluster": str(cluster), "budget": 1}, "prefilter.budget: unknown"),
                       ({"enabled": True}, "prefilter.cluster: required"),
                       ({"cluster": "nope.yaml"}, "prefilter.cluster: .*no such file"),
                       ({"cluster": str(cluster), "memory_budget_gb": -1}, "prefilter.memory_budget_gb"),
                       ({"cluster": str(cluster), "calibration": "missing.yaml"}, "prefilter.calibration")]:
        with pytest.raises(ValueError, match=match):
            prefilter_from_settings(bad, base_dir=tmp_path)


def test_summary_from_the_ledger():
    def rec(trial, status, reason):
        return TrialRecord(sweep="s", trial=trial, kind="trial", backend="ray", params={}, config={}, status=status,
                           reason=reason, metrics=Metrics(), meets_target=False, wall_s=0.0, overhead_s=None,
                           started_at=0.0, finished_at=0.0)

    lines = [rec(1, "ok", None),
             rec(2, "skipped", f"{REASON_PREFIX} predicted peak 3 GiB > budget 2 GiB"),
             rec(3, "skipped", "same params as trial 1 (ok): reused, not run again")]
    s = prefilter_summary(lines)
    assert s["skipped"] == 1 and list(s["reasons"]) == [2]
    text = prefilter_summary_text(s)
    assert "1 config(s) not launched" in text and "trial 2: predicted peak" in text
    assert "no config" in prefilter_summary_text(prefilter_summary(lines[:1]))
