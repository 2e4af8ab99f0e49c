"""Calibration: recovers the efficiency parameters that generated noisy synthetic measurements."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from orchestrator.planner import (BatchConfig, ClusterSpec, ReplicateDP, TensorParallel, Efficiency, JobSpec, ModelSpec, ParallelConfig, PlanConfig,
                                  apply_params, calibrate, predict)

TRUE = Efficiency(matmul_eff=0.55, gemm_tokens_half=256.0, attention_eff=0.35, op_overhead_us=40.0, tp_bw_eff=0.6,
                  pp_bw_eff=0.7, dp_bw_eff=0.4,
                  mem_reserved_gb=6.0, mem_activation_factor=1.15)
START = Efficiency()   # the defaults: every fitted value starts 15-400% away from the truth
FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "tp_bw_eff", "dp_bw_eff",
       "mem_reserved_gb", "mem_activation_factor")
METRICS = ("step_time_s", "forward_s", "backward_s", "recompute_s", "dp_exposed_s", "tp_comm_s")
KNOBS = [
    {},
    {"batch.micro_batch_size": 4},
    {"batch.micro_batch_size": 8},
    {"recompute.kind": "selective"},
    {"recompute.kind": "full", "recompute.method": "uniform", "recompute.num_layers": 1},
    {"data_parallel.overlap_grad_reduce": True},
    {"data_parallel.overlap_grad_reduce": True, "optimizer.overlap_param_gather": True,
     "batch.micro_batch_size": 2},
    {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "data_parallel.bucket_mb": 20.0},
    {"recompute.kind": "full", "recompute.method": "block", "recompute.num_layers": 2,
     "data_parallel.overlap_grad_reduce": True},
]


def _base(eff: Efficiency) -> PlanConfig:
    return PlanConfig(
        cluster=ClusterSpec(num_gpus=128, gpus_per_node=8, peak_tflops=989, hbm_gb=80, inter_node_bw_GBps=25),
        model=ModelSpec(num_layers=16, hidden_size=4096, num_heads=32, vocab_size=50304, flash_attention=True),
        job=JobSpec(seq_len=4096), efficiency=eff, parallel=ParallelConfig(pp=4, dp=8),
        tensor_parallel=TensorParallel(size=4), batch=BatchConfig(256),
        data_parallel=ReplicateDP(overlap_grad_reduce=False, bucket_mb=80.0),   # 20M fp32 elements
    )


def _records(noise: float, seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    truth = _base(TRUE)
    records = []
    for knobs in KNOBS:
        p = predict(apply_params(truth, knobs))
        jitter = lambda x: float(x * (1 + noise * rng.standard_normal()))  # noqa: E731
        records.append({"config": knobs, "measured": {m: jitter(getattr(p, m)) for m in METRICS},
                        "peak_memory_bytes": jitter(p.peak_memory_bytes)})
    return records


@pytest.mark.parametrize("use_scipy", [True, False])
def test_recovers_known_parameters_from_noisy_measurements(use_scipy):
    if use_scipy:
        pytest.importorskip("scipy.optimize")   # optional: the numpy solver below covers its absence
    cal = calibrate(_records(noise=0.01), _base(START), fit=FIT, use_scipy=use_scipy)
    assert ("scipy" in cal.solver) == use_scipy
    for name in FIT:
        # A 40 us launch overhead is ~5% of a layer here, so 1% noise leaves it the loosest.
        tol = 0.25 if name == "op_overhead_us" else 0.08
        assert cal.fitted[name] == pytest.approx(getattr(TRUE, name), rel=tol), name
    assert cal.errors_after["step_time_s"]["mean_abs_pct"] < 2.0 < cal.errors_before["step_time_s"]["mean_abs_pct"]
    assert set(cal.errors_after) == set(METRICS) | {"peak_memory_bytes"}
    fitted = predict(cal.apply(_base(START)))
    assert fitted.step_time_s == pytest.approx(predict(_base(TRUE)).step_time_s, rel=0.02)


def test_exact_measurements_give_exact_parameters():
    cal = calibrate(_records(noise=0.0), _base(START), fit=FIT, prior_weight=0.0)
    for name in FIT:
        assert cal.fitted[name] == pytest.approx(getattr(TRUE, name), rel=1e-3), name
    assert max(e["max_abs_pct"] for e in cal.errors_after.values()) < 0.05


def test_trainer_result_shape_and_full_configs_are_read():
    truth = _base(TRUE)
    p = predict(truth)
    record = {"config": truth, "summary": {"step_time_s": p.step_time_s, "peak_memory_bytes": p.peak_memory_bytes},
              "phases": {"forward": {"min": 0.0, "max": p.forward_s},
                         "backward": {"min": 0.0, "max": p.backward_s + p.recompute_s}}}
    cal = calibrate([record], _base(START), fit=("matmul_eff",))
    assert set(cal.errors_after) == {"step_time_s", "peak_memory_bytes", "forward_s", "backward_incl_recompute_s"}
    assert cal.efficiency.basis == "fitted"
    assert dataclasses.replace(cal.efficiency, matmul_eff=START.matmul_eff, basis=START.basis) == START  # only the fitted field moved


@pytest.mark.parametrize("records, fit, match", [
    ([], None, "^records: need at least one"),
    ([{"config": {}}], None, r"^records\[0\]: no measured metric"),
    ([{"config": {"batch.micro_batch_size": 3}, "step_time_s": 1.0}], None, r"^records\[0\]\.config\.batch"),
    ([{"config": {}, "step_time_s": 1.0}], ("peak_tflops",), "^fit: 'peak_tflops' is not a fittable"),
])
def test_bad_calibration_input(records, fit, match):
    with pytest.raises(ValueError, match=match):
        calibrate(records, _base(START), fit=fit)


def test_trainer_phases_under_tensor_parallelism_leave_out_what_holds_tp_communication():
    from orchestrator.planner.calibrate import trainer_phase_metrics

    phases = {"forward": {"max": 1.0}, "backward": {"max": 2.0}, "optimizer": {"max": 0.1},
              "dp_comm_wait": {"max": 0.2}, "pipeline_idle": {"max": 0.3}, "tp_comm": {"max": 0.0}}
    assert trainer_phase_metrics(phases) == {"forward_s": 1.0, "backward_incl_recompute_s": 2.0, "optimizer_s": 0.1,
                                             "dp_exposed_s": 0.2, "pp_idle_s": 0.3, "tp_comm_s": 0.0}
    # tp > 1 (tp_comm may read 0 when compiled blocks hide it): forward/backward/optimizer are not comparable
    assert trainer_phase_metrics(phases, tensor_parallel=True) == {"dp_exposed_s": 0.2, "pp_idle_s": 0.3,
                                                                  "tp_comm_s": 0.0}
