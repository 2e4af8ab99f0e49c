"""The planner's predictions: the article's figures, the directions knobs must move things, the OOM
pre-filter, and the vectorised enumerator agreeing with ``predict`` and ``PlanConfig`` exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.planner import (BatchConfig, ClusterSpec, ReplicateDP, TensorParallel, Efficiency, JobSpec, ModelSpec, ParallelConfig, PlanConfig,
                                  apply_params, enumerate_space, plan_config_from_dict, predict, predicts_oom)
from orchestrator.planner.predict import BREAKDOWN
from tests.unit._grid_check import grid_agrees_with_predict

PRESET = Path(__file__).resolve().parents[2] / "search_spaces" / "preset-500b.yaml"
OVERLAP = {"data_parallel.overlap_grad_reduce": True}


@pytest.fixture(scope="module")
def preset() -> dict:
    return yaml.safe_load(PRESET.read_text())


@pytest.fixture(scope="module")
def baseline(preset) -> PlanConfig:
    return apply_params(plan_config_from_dict(preset["planner"]), preset["baseline"])


CALIBRATED = {"matmul_eff": 0.80, "dp_bw_eff": 0.251, "basis": "calibrated"}
"""The preset's documented calibrated set (its efficiency comment; bench/preset_500b.py solves these two)."""


@pytest.fixture(scope="module")
def calibrated(baseline) -> PlanConfig:
    return dataclasses.replace(baseline, efficiency=dataclasses.replace(baseline.efficiency, **CALIBRATED))


def near(value: float, target: float, tol: float = 0.05) -> bool:
    return abs(value - target) <= tol * target


def test_calibrated_set_reproduces_the_article_baseline_12s_of_8s_compute_plus_4s_exposed(calibrated):
    p = predict(calibrated)
    assert near(p.step_time_s, 12.0) and near(p.compute_track_s, 8.0) and near(p.dp_exposed_s, 4.0), p
    assert near(p.mfu, 0.34) and near(p.tokens_per_s, 1_310_720)
    assert p.fits_memory   # the article: there was memory to spare


def test_overlap_hides_no_more_than_the_last_microbatch_backward(baseline):
    """Megatron reduces gradients only in the last microbatch: overlap can hide at most that backward pass
    (stage 0, the critical one for DP, has no pipeline-drain slack), not the article's 2 s."""
    before, after = predict(baseline), predict(apply_params(baseline, OVERLAP))
    assert near(after.dp_total_s, before.dp_total_s, 0.001)     # the same 4 s of transfer ...
    hidden = before.dp_exposed_s - after.dp_exposed_s
    one_backward = (before.backward_s + before.recompute_s + before.tp_comm_s) / before.microbatches
    assert 0.0 < hidden <= one_backward * 1.01
    assert after.compute_track_s == pytest.approx(before.compute_track_s)


@pytest.mark.xfail(strict=True, reason="issue 9: from the article's own 12 s baseline (the calibrated set), Megatron's "
                   "last-microbatch overlap + no recompute does not reach 9.30 s; bench/results/preset_500b.md. (The "
                   "blind set's level rests on one H100 row and moves with it, so it is not the reference here.)")
def test_target_reachable_within_memory(calibrated):
    cfg = apply_params(calibrated, {**OVERLAP, "optimizer.overlap_param_gather": True, "recompute.kind": "none"})
    p = predict(cfg)
    assert p.step_time_s <= 9.30 and p.fits_memory


def test_breakdown_adds_up_and_serialises(baseline):
    p = predict(baseline)
    parts = sum(getattr(p, k) for k in BREAKDOWN if k != "dp_total_s")
    assert parts == pytest.approx(p.step_time_s, rel=1e-12)
    assert len(p.memory_per_stage) == 8 and p.peak_memory_bytes == max(s["total"] for s in p.memory_per_stage)
    d = p.to_dict()
    assert d["mfu_basis"].startswith("6 * total_params") and d["step_time_s"] == p.step_time_s


def _stage0(p, key="activations"):
    return p.memory_per_stage[0][key]


def test_more_recompute_less_memory_more_time(baseline):
    ladder = [{"recompute.kind": "none"},
              {"recompute.kind": "full", "recompute.method": "block", "recompute.num_layers": 2},
              {"recompute.kind": "full", "recompute.method": "block", "recompute.num_layers": 6},
              {"recompute.kind": "full", "recompute.method": "uniform", "recompute.num_layers": 1}]
    preds = [predict(apply_params(baseline, {**OVERLAP, **k})) for k in ladder]
    mems = [_stage0(p) for p in preds]
    assert all(a > b for a, b in zip(mems, mems[1:])), mems
    computes = [p.forward_s + p.backward_s + p.recompute_s for p in preds]
    assert all(a < b for a, b in zip(computes, computes[1:])), computes
    # Unfused attention: selective recompute drops the 5as^2b scores for a little forward work.
    unfused = dataclasses.replace(baseline, model=dataclasses.replace(baseline.model, flash_attention=False))
    none, sel = (predict(apply_params(unfused, {"recompute.kind": k})) for k in ("none", "selective"))
    assert _stage0(sel) < 0.5 * _stage0(none) and sel.recompute_s > none.recompute_s == 0


def test_bigger_microbatch_more_memory_and_a_larger_bubble_share(baseline):
    # At a fixed global batch a bigger microbatch means fewer microbatches, so the pipeline's fill and
    # drain ((p-1)/m, Narayanan et al. 2021) is a larger share of the step, and each holds more activations.
    preds = [predict(apply_params(baseline, {"batch.micro_batch_size": b, "recompute.kind": "none"}))
             for b in (1, 2, 3)]
    assert [p.microbatches for p in preds] == [24, 12, 8]
    mems = [_stage0(p) for p in preds]
    share = [p.pp_bubble_s / p.compute_track_s for p in preds]
    assert mems[0] < mems[1] < mems[2] and share[0] < share[1] < share[2]
    for p, sh in zip(preds, share):   # ~ (p-1)/(m+p-1) of the compute track, p = 8
        assert sh == pytest.approx(7 / (p.microbatches + 7), rel=0.1)


def test_overlap_hides_communication(baseline):
    base = predict(baseline)
    grad = predict(apply_params(baseline, OVERLAP))
    both = predict(apply_params(baseline, {**OVERLAP, "optimizer.overlap_param_gather": True}))
    assert base.dp_exposed_s > grad.dp_exposed_s > both.dp_exposed_s > 0
    assert base.dp_total_s == pytest.approx(both.dp_total_s)


def test_bucket_size_trades_latency_against_the_last_bucket(baseline):
    exposed = {mb: predict(apply_params(baseline, {**OVERLAP, "data_parallel.bucket_mb": mb})).dp_exposed_s
               for mb in (10.0, 400.0, 40000.0)}   # MB of fp32 gradients
    assert exposed[400.0] < exposed[10.0] and exposed[400.0] < exposed[40000.0]
    off = {mb: predict(apply_params(baseline, {"data_parallel.bucket_mb": mb})).dp_exposed_s for mb in (10.0, 400.0)}
    assert off[400.0] < off[10.0]   # without overlap only the per-collective latency differs


def test_more_virtual_stages_smaller_bubble(baseline):
    cfg = apply_params(baseline, {"recompute.kind": "none"})
    bubbles = [predict(apply_params(cfg, {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": v}
                                    if v > 1 else {})).pp_bubble_s for v in (1, 2, 3, 4, 6, 12)]
    assert all(a > b for a, b in zip(bubbles, bubbles[1:])), bubbles
    assert bubbles[1] == pytest.approx(bubbles[0] / 2, rel=1e-9)   # (p-1)/(v m)


def test_interleaving_holds_more_activations_on_stage_0(baseline):
    # Korthikanti et al. 2022: stage 0 holds L * (1 + (p-1)/(p v)) layers of activations.
    plain = predict(apply_params(baseline, {"recompute.kind": "none"}))
    inter = predict(apply_params(baseline, {"recompute.kind": "none", "pipeline.schedule": "interleaved_1f1b",
                                            "pipeline.virtual_stages": 4}))
    per_layer = _stage0(plain) / 96
    assert _stage0(inter) == pytest.approx(per_layer * 96 * (1 + 7 / 32), rel=1e-9)


def test_oom_prefilter(baseline):
    ok, why = predicts_oom(baseline)
    assert not ok and why.startswith("fits: stage 0")
    big = apply_params(baseline, {"batch.micro_batch_size": 3, "recompute.kind": "none", "pipeline.schedule": "gpipe"})
    oom, why = predicts_oom(big)
    assert oom and "GB >" in why and not predict(big).fits_memory
    small_gpu = dataclasses.replace(baseline.cluster, hbm_gb=80.0)
    assert predicts_oom(baseline, small_gpu)[0]


def test_no_distributed_optimizer_costs_optimizer_memory(baseline):
    plain = apply_params(baseline, {"optimizer.distributed": False})
    shard, full = predict(baseline).memory_per_stage[3], predict(plain).memory_per_stage[3]
    params = shard["params"] / 2
    assert shard["optimizer"] == pytest.approx(12 * params / 80) and full["optimizer"] == pytest.approx(12 * params)
    assert shard["grads"] == pytest.approx(4 * params)   # fp32 main gradients: 6 + 12/d bytes per parameter


def _small() -> PlanConfig:
    return PlanConfig(
        cluster=ClusterSpec(num_gpus=64, gpus_per_node=8, peak_tflops=1000, hbm_gb=40),
        model=ModelSpec(num_layers=12, hidden_size=1024, num_heads=16, vocab_size=32000, flash_attention=False),
        job=JobSpec(seq_len=1024), efficiency=Efficiency(),
        parallel=ParallelConfig(pp=4, dp=8), tensor_parallel=TensorParallel(size=2), batch=BatchConfig(32),
        data_parallel=ReplicateDP(overlap_grad_reduce=False, bucket_mb=80.0),   # 20M fp32 elements
    )


SMALL_SPACE = {
    "batch.micro_batch_size": {"type": "categorical", "choices": [1, 2, 3, 4]},
    "pipeline.schedule": {"type": "categorical", "choices": ["gpipe", "1f1b", "interleaved_1f1b"]},
    "pipeline.virtual_stages": {"type": "int", "low": 2, "high": 4,
                                "when": {"pipeline.schedule": "interleaved_1f1b"}},
    "pipeline.split.kind": {"type": "categorical", "choices": ["balanced", "first_last"]},
    "pipeline.split": {"type": "layer_split", "first": [1, 4], "last": [2, 4],
                       "when": {"pipeline.split.kind": "first_last"}},
    "recompute.kind": {"type": "categorical", "choices": ["none", "selective", "full", "op"]},
    "recompute.method": {"type": "categorical", "choices": ["uniform", "block"], "when": {"recompute.kind": "full"}},
    "recompute.num_layers": {"type": "int", "low": 1, "high": 4, "when": {"recompute.kind": "full"}},
    "recompute.matmul_period": {"type": "categorical", "choices": [0, 2, 3], "when": {"recompute.kind": "op"}},
    "data_parallel.overlap_grad_reduce": {"type": "categorical", "choices": [False, True]},
    "optimizer.distributed": {"type": "categorical", "choices": [False, True]},
    "optimizer.overlap_param_gather": {"type": "categorical", "choices": [False, True]},
    "data_parallel.bucket_mb": {"type": "float", "low": 2.0, "high": 200.0, "log": True},
}


def test_enumerator_matches_planconfig_and_predict():
    base = _small()
    grid = enumerate_space(base, SMALL_SPACE, float_points=2)
    assert grid.n == 4 * (1 + 1 + 3) * (1 + 4 * 3) * (1 + 1 + 2 * 4 + 3) * 2 * 2 * 2 * 2
    rng = np.random.default_rng(0)
    checked = grid_agrees_with_predict(base, grid, rng.choice(grid.n, size=600, replace=False))
    assert min(checked.values()) > 50
    ops = [i for i in np.flatnonzero(grid.valid) if grid.params(i).get("recompute.kind") == "op"]
    assert len(ops) >= 100 and grid_agrees_with_predict(base, grid, ops[::len(ops) // 100])[True] >= 100
    # Interleaving with a first/last split gives a rank chunks of unequal size: priced per chunk on both paths.
    uneven = [i for i in np.flatnonzero(grid.valid) if grid.params(i).get("pipeline.schedule") == "interleaved_1f1b"
              and grid.params(i).get("pipeline.split.kind") == "first_last"]
    assert len(uneven) >= 20 and grid_agrees_with_predict(base, grid, uneven[:200])[True] == len(uneven[:200])
    best = grid.best()
    assert grid.valid[best] and grid.fits_memory[best]
    assert grid.step_time_s[best] == grid.feasible_times().min()


COMM_SPACE = {
    "pipeline.schedule": {"type": "categorical", "choices": ["1f1b", "interleaved_1f1b"]},
    "pipeline.virtual_stages": {"type": "categorical", "choices": [3], "when": {"pipeline.schedule": "interleaved_1f1b"}},
    "tensor_parallel.comm_overlap": {"type": "categorical", "choices": [False, True]},
    "pipeline_comm.overlap_p2p": {"type": "categorical", "choices": [False, True],
                                  "when": {"pipeline.schedule": "interleaved_1f1b"}, "default": True},
}


@pytest.mark.parametrize("sequence_parallel, tp, valid", [
    (True, 2, 6),    # 1f1b x 2 TP overlaps + interleaved x 2 x 2
    (False, 2, 3),   # comm_overlap needs sequence parallelism at tp > 1: half refused, as PlanConfig refuses them
    (False, 1, 6),   # ... and is a no-op at tp 1, so nothing is refused
])
def test_enumerator_searches_the_comm_overlaps_as_predict_prices_them(sequence_parallel, tp, valid):
    base = dataclasses.replace(_small(), tensor_parallel=TensorParallel(size=tp, sequence_parallel=sequence_parallel),
                               parallel=ParallelConfig(pp=4, dp=16 // tp))
    base = dataclasses.replace(base, batch=BatchConfig(64))
    grid = enumerate_space(base, COMM_SPACE)
    assert grid.n == 2 + 2 * 2
    checked = grid_agrees_with_predict(base, grid, range(grid.n))
    assert checked[True] == int(grid.valid.sum()) == valid
    times = {tuple(sorted(grid.params(i).items())): grid.step_time_s[i] for i in np.flatnonzero(grid.valid)}
    if tp > 1 and sequence_parallel:  # the levers are priced, not ignored: each overlap saves time here
        key = lambda **kw: tuple(sorted({"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 3,
                                          "tensor_parallel.comm_overlap": False, "pipeline_comm.overlap_p2p": False,
                                          **kw}.items()))  # noqa: E731
        assert times[key(**{"tensor_parallel.comm_overlap": True})] < times[key()]
        assert times[key(**{"pipeline_comm.overlap_p2p": True})] < times[key()]
