"""Calibration from a sweep ledger: recovers the efficiency that generated noisy synthetic trials.

The synthetic ledger is written by the planner itself (through ``plan_for_trial``), in the real ledger's
shape: TrialRecords whose ``result`` is a trainer ``Result`` (summary + per-phase min/max) written by ``to_line``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from orchestrator.calibration.ledger_fit import (CPU_FIT, calibrate_from_ledger, calibrate_main, format_calibration,
                                      load_calibration, write_calibration)
from orchestrator.planner import ClusterSpec, Efficiency, predict
from orchestrator.calibration.prefilter import plan_for_trial
from orchestrator.records.record import Metrics, TrialRecord
from trainer.config import TrainConfig, apply_overrides
from trainer.measure.result import Result

FIXTURE = Path(__file__).parent.parent / "fixtures" / "ledger_v0.jsonl"

CLUSTER = ClusterSpec(name="synthetic-cpu", num_gpus=2, gpus_per_node=64, peak_tflops=0.2, hbm_gb=8.0,
                      hbm_bw_GBps=10.0, intra_node_bw_GBps=1.0, intra_node_latency_us=150.0)
TRUE = Efficiency(matmul_eff=0.45, gemm_tokens_half=256.0, attention_eff=0.15, op_overhead_us=400.0, pp_bw_eff=0.3,
                  dp_bw_eff=0.5, optimizer_bw_eff=0.2, mem_reserved_gb=0.0,
                  mem_activation_factor=1.2)
START = Efficiency(matmul_eff=0.3, gemm_tokens_half=256.0, attention_eff=0.1, op_overhead_us=300.0, pp_bw_eff=0.5,
                   dp_bw_eff=0.8, optimizer_bw_eff=0.1, mem_reserved_gb=0.0)
FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "pp_bw_eff", "dp_bw_eff", "optimizer_bw_eff",
       "mem_activation_factor")
BASE = {"model": {"vocab_size": 512, "n_layers": 4, "d_model": 256, "n_heads": 4, "seq_len": 256},
        "batch": {"global_batch": 16}, "run": {"steps": 8, "warmup_steps": 2}}
TRIALS = [
    {"parallel.pp": 2, "parallel.dp": 1, "batch.micro_batch_size": 1},
    {"parallel.pp": 2, "parallel.dp": 1, "batch.micro_batch_size": 4, "pipeline.schedule": "gpipe"},
    {"parallel.pp": 2, "parallel.dp": 1, "batch.micro_batch_size": 2, "recompute.kind": "full"},
    {"parallel.pp": 2, "parallel.dp": 1, "batch.micro_batch_size": 8, "pipeline.schedule": "gpipe",
     "recompute.kind": "selective", "recompute.modules": ["mlp"]},
    {"parallel.pp": 1, "parallel.dp": 2, "batch.micro_batch_size": 1, "data_parallel.kind": "replicate",
     "data_parallel.overlap_grad_reduce": False, "data_parallel.bucket_mb": 4.0},
    {"parallel.pp": 1, "parallel.dp": 2, "batch.micro_batch_size": 8, "data_parallel.kind": "replicate",
     "data_parallel.overlap_grad_reduce": False, "data_parallel.bucket_mb": 0.5},
    {"parallel.pp": 1, "parallel.dp": 2, "batch.micro_batch_size": 2, "data_parallel.kind": "replicate",
     "data_parallel.overlap_grad_reduce": True, "data_parallel.bucket_mb": 1.0, "recompute.kind": "full"},
    {"parallel.pp": 1, "parallel.dp": 2, "batch.micro_batch_size": 4, "data_parallel.kind": "replicate",
     "data_parallel.overlap_grad_reduce": True, "data_parallel.bucket_mb": 2.0},
]


def _cfg(overrides: dict) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(BASE, overrides))


def _line(trial: int, cfg: TrainConfig, noise: float, rng, **changes) -> TrialRecord:
    """A record as the sweep writes it, its Result measured by the planner at TRUE (times jittered)."""
    p = predict(plan_for_trial(cfg, CLUSTER, TRUE))
    jit = lambda x: float(x * (1 + noise * rng.standard_normal()))  # noqa: E731
    phase_s = {"forward": p.forward_s, "backward": p.backward_s + p.recompute_s, "optimizer": p.optimizer_s,
               "dp_comm_wait": p.dp_exposed_s, "pipeline_idle": p.pp_bubble_s + p.pp_p2p_s}
    # A real Result (the fixture ledger's baseline) carrying the planner's numbers as its measurements.
    result = Result.from_dict(json.loads(FIXTURE.read_text().splitlines()[0])["result"])
    result.config = cfg.to_dict()
    result.phases = {k: {"min": 0.0, "max": jit(v)} for k, v in phase_s.items()}  # first: the seeded draws' order
    result.summary = dataclasses.replace(result.summary, step_time_s=jit(p.step_time_s),
                                         peak_memory_bytes=int(jit(p.peak_memory_bytes)))
    rec = TrialRecord(sweep="synthetic", trial=trial, kind="trial", backend="ray", params={}, config=cfg.to_dict(),
                      status="ok", reason=None, result=result, metrics=Metrics.of_summary(result.summary),
                      meets_target=False, wall_s=1.0, overhead_s=0.1, started_at=0.0, finished_at=1.0)
    return dataclasses.replace(rec, **changes)


@pytest.fixture
def ledger(tmp_path):
    rng = np.random.default_rng(0)
    lines = [_line(i, _cfg(t), 0.01, rng) for i, t in enumerate(TRIALS)]
    # What must be left out: a failed trial, a model-backend prediction, and an unmappable (FSDP) trial.
    lines.append(_line(90, _cfg(TRIALS[0]), 0.0, rng, status="failed"))
    predicted = {"step_time_s": 1.0, "peak_memory_bytes": 1e9}
    lines.append(_line(91, _cfg(TRIALS[1]), 0.0, rng, backend="model", result=None, prediction=predicted,
                       metrics=Metrics.of_prediction(predicted), overhead_s=None))
    fsdp = _cfg({**{k: v for k, v in TRIALS[4].items() if not k.startswith("data_parallel.")},
                 "data_parallel.kind": "fsdp"})
    lines.append(_line(92, _cfg(TRIALS[4]), 0.0, rng, config=fsdp.to_dict()))
    path = tmp_path / "results" / "synthetic" / "trials.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("".join(json.dumps(line.to_line()) + "\n" for line in lines))
    return path


def test_recovers_known_parameters_and_reports_error_per_metric(ledger):
    cal = calibrate_from_ledger(ledger, CLUSTER, START, fit=FIT)
    assert cal.n_records == len(TRIALS) and sorted(cal.used_trials) == list(range(len(TRIALS)))
    assert [t for t, _ in cal.skipped] == [92] and "fsdp" in cal.skipped[0][1]
    for name in FIT:
        assert cal.fitted[name] == pytest.approx(getattr(TRUE, name), rel=0.10), name
    expected = {"step_time_s", "peak_memory_bytes", "forward_s", "backward_incl_recompute_s", "optimizer_s",
                "dp_exposed_s", "pp_idle_s"}
    assert set(cal.errors_after) == expected
    # dp=1 trials measure no data-parallel wait and pp=1 trials no pipeline idle: those are not fitted.
    assert cal.errors_after["dp_exposed_s"]["n"] == 4 and cal.errors_after["pp_idle_s"]["n"] == 4
    for name, err in cal.errors_after.items():
        assert err["mean_abs_pct"] < 3.0, name            # 1% noise
        assert cal.errors_before[name]["mean_abs_pct"] > err["mean_abs_pct"], name
    assert cal.errors_before["step_time_s"]["mean_abs_pct"] > 10.0


def test_format_write_and_load_round_trip(ledger, tmp_path):
    cal = calibrate_from_ledger(ledger, CLUSTER, START, fit=FIT)
    table = format_calibration(cal)
    header = table.splitlines()[0]
    assert all(word in header for word in ("metric", "before", "after"))
    assert any(line.startswith("peak_memory_bytes") for line in table.splitlines())
    assert "not used: trial 92" in table
    out = write_calibration(cal, tmp_path / "cal.yaml", cluster_file="c.yaml")
    eff = load_calibration(out)
    assert eff == cal.efficiency
    doc = yaml.safe_load(out.read_text())
    assert doc["calibration"]["n_records"] == len(TRIALS) and doc["calibration"]["cluster"] == "c.yaml"


def test_only_ok_lines_by_default_and_clear_errors(ledger, tmp_path):
    with pytest.raises(ValueError, match="no ledger"):
        calibrate_from_ledger(tmp_path / "missing.jsonl", CLUSTER)
    only_failed = tmp_path / "f.jsonl"
    failed = _line(0, _cfg(TRIALS[0]), 0.0, np.random.default_rng(1), status="failed", reason="RankFailed")
    only_failed.write_text(json.dumps(failed.to_line()) + "\n")
    with pytest.raises(ValueError, match="no measured trial with status ok"):
        calibrate_from_ledger(only_failed, CLUSTER)
    cal = calibrate_from_ledger(only_failed, CLUSTER, START, fit=("mem_activation_factor",), statuses=("failed",))
    assert cal.n_records == 1
    bad = tmp_path / "bad.yaml"
    bad.write_text("efficiency: {matmul_eff: 2.0}\n")
    with pytest.raises(ValueError, match="efficiency.matmul_eff"):
        load_calibration(bad)


def test_cli_prints_the_table_and_writes_yaml(ledger, tmp_path, capsys):
    cluster_file = tmp_path / "cluster.yaml"
    cluster_file.write_text(yaml.safe_dump({"cluster": dataclasses.asdict(CLUSTER),
                                            "efficiency": dataclasses.asdict(START)}))
    out = tmp_path / "calib.yaml"
    rc = calibrate_main(["--sweep", "synthetic", "--results-dir", str(tmp_path / "results"), "--cluster",
                         str(cluster_file), "--out", str(out), "--fit", ",".join(FIT)])
    text = capsys.readouterr().out
    assert rc == 0 and "mean |err| after" in text and str(out) in text
    assert load_calibration(out).matmul_eff == pytest.approx(TRUE.matmul_eff, rel=0.10)
    assert calibrate_main(["--sweep", "nope", "--results-dir", str(tmp_path / "results"), "--cluster",
                           str(cluster_file)]) == 2
    assert calibrate_main(["--sweep", "synthetic", "--results-dir", str(tmp_path / "results"), "--cluster",
                           str(cluster_file), "--fit", "warp_drive"]) == 2
    assert "warp_drive" in capsys.readouterr().err


def test_default_fit_is_fittable():
    from orchestrator.planner.calibrate import BOUNDS

    assert set(CPU_FIT) <= set(BOUNDS)
