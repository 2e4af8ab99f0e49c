"""``steptune profile`` end to end on CPU: the slices run on a warm Ray worker group as a sweep's trials do (this
session's embedded Ray), the planner is fitted to them, and the calibration file it writes is what ``steptune
plan`` then predicts with."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main
from orchestrator.calibration.ledger_fit import load_calibration

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]

TINY = ROOT / "search_spaces" / "tiny-profile.yaml"
"""The file docs/planner.md's standalone command profiles: a few-MB model, tp 2, micro-batch 1/2/4, recompute."""


@pytest.mark.timeout(120)
def test_profile_runs_the_slices_on_ray_and_writes_a_measured_calibration_plan_uses(ray_address, tmp_path, capsys):
    config = TINY
    out = tmp_path / "tiny-cal.yaml"
    assert main(["profile", "--config", str(config), "--out", str(out), "--layers", "2",
                 "--steps", "3", "--repeats", "1", "--cluster", str(ROOT / "search_spaces" / "clusters" / "cpu-local.yaml")]) == 0
    printed = capsys.readouterr().out
    assert "mbs=4 recompute=none" in printed and f"wrote {out}" in printed
    assert "ran on a warm Ray worker group of 2 rank(s)" in printed and "local launcher" not in printed

    doc = yaml.safe_load(out.read_text())
    prov = doc["provenance"]
    assert prov["basis"] == "measured" and prov["tp"] == 2 and prov["layers"] == [2] and prov["shrink"] == 1
    assert prov["shape"] == {"d_model": 128, "n_heads": 4, "d_ff": 512, "vocab_size": 512, "seq_len": 128,
                             "precision": "fp32"}
    assert prov["hardware"].startswith("CPU") and prov["torch"] and prov["date"] and prov["backend"] == "gloo"
    assert [s["name"] for s in prov["slices"]] == ["mbs=1 recompute=none", "mbs=2 recompute=none",
                                                   "mbs=4 recompute=none", "mbs=1 recompute=full"]
    assert all(s["measured_step_s"] > 0 for s in prov["slices"])
    # The fit is real: fitted to these measurements, the planner is nearer them than with the priors. How near is a
    # benchmark figure on a loaded 2-core machine, not a test bound (docs/planner.md states the measured errors).
    errors = doc["calibration"]["mean_abs_error_pct"]["step_time_s"]
    assert 0 <= errors["after"] <= errors["before"]
    assert "tp_bw_eff" not in prov["fitted"] and "matmul_eff" in prov["fitted"]

    eff = load_calibration(out)
    assert eff.matmul_eff == doc["efficiency"]["matmul_eff"]
    assert main(["plan", "--config", str(config), f"planner.calibration_file={out}"]) == 0
    assert f"efficiency set: fitted (calibration file {out.name})" in capsys.readouterr().out


@pytest.mark.timeout(240)
def test_netcal_then_profile_then_plan_on_this_machine(ray_address, tmp_path, capsys):
    """The three commands a team runs (docs/planner.md), end to end on CPU: measure the network (gloo tables in
    nccl-tests' format) into a cluster file, profile the layer shape against that cluster file, and predict the
    job with both files; the prediction says what is measured and which efficiency set it used."""
    config = TINY
    cluster, cal = tmp_path / "measured-cluster.yaml", tmp_path / "measured-cal.yaml"
    assert main(["netcal", "--measure", "2", "--ops", "all_reduce", "--out", str(cluster), "--repeats", "1",
                 "--base", str(ROOT / "search_spaces" / "clusters" / "cpu-local.yaml")]) == 0
    assert main(["profile", "--config", str(config), "--out", str(cal), "--layers", "1",
                 "--steps", "3", "--repeats", "1", "--cluster", str(cluster), "--parity"]) == 0
    assert "parity mbs=1 recompute=none: pass" in capsys.readouterr().out
    prov = yaml.safe_load(cal.read_text())["provenance"]
    assert prov["cluster_file"] == str(cluster)
    # --parity: every slice (tp 2, sequence parallel) learned what its one-rank canonical run learned
    assert [c["passed"] for c in prov["parity"]] == [True] * 4
    # what was measured, per layer: forward, backward, TP comm; recompute as the backward's excess; memory
    measured = {m["name"]: m for m in prov["measured"]}
    assert all(m["forward_s_per_layer"] > 0 and m["backward_s_per_layer"] > 0 and m["tp_comm_s_per_layer"] > 0
               and m["param_bytes_per_rank"] > 0 and m["saved_activation_peak_bytes_per_rank"] > 0
               for m in measured.values())
    assert "recompute_s_per_layer" in measured["mbs=1 recompute=full"]
    assert "recompute_s_per_layer" not in measured["mbs=1 recompute=none"]
    assert main(["plan", "--config", str(config), f"planner.cluster_file={cluster}",
                 f"planner.calibration_file={cal}"]) == 0
    out = capsys.readouterr().out
    assert f"network: MEASURED intra_node_bw_GBps, intra_node_latency_us from {cluster.name}" in out
    assert f"efficiency set: fitted (calibration file {cal.name})" in out


RAY_SWEEP = {
    "name": "tiny-ray-profile", "backend": "ray",
    "trainer": {"model": {"n_layers": 4, "d_model": 32, "n_heads": 2, "seq_len": 32, "vocab_size": 128},
                "batch": {"global_batch": 8}, "run": {"steps": 10, "device": "cpu", "threads_per_rank": 1},
                "data_parallel": {"kind": "replicate"}},
    "baseline": {"batch.micro_batch_size": 1, "recompute.kind": "none"},
    "space": {"params": {"parallel.pp": {"type": "categorical", "choices": [1, 2]},
                         "batch.micro_batch_size": {"type": "categorical", "choices": [1, 2]},
                         "data_parallel.bucket_mb": {"type": "categorical", "choices": [0.01, 1.0],
                                                     "when": {"parallel.pp": 1}},
                         "recompute.kind": {"type": "categorical", "choices": ["none", "full"]}}},
}


@pytest.mark.timeout(240)
def test_profile_of_a_ray_backend_sweep_at_its_density_with_every_kind_of_slice(ray_address, tmp_path, capsys):
    """The model a user sweeps (backend: ray, its trainer: section) is profiled as it is, at its job's density (2
    ranks: both busy): compute slices at 1 and 2 layers, data-parallel slices (each bucket, overlap off and on),
    pipeline slices (the fewest and most microbatches), two rounds each; fitted jointly, what the slices cannot pin
    held and named, every fitted parameter with its interval, and the replicates written for every prediction."""
    config = tmp_path / "tiny-ray.yaml"
    config.write_text(yaml.safe_dump(RAY_SWEEP))
    out = tmp_path / "tiny-ray-cal.yaml"
    assert main(["profile", "--config", str(config), "--out", str(out), "--steps", "4", "--repeats", "2",
                 "--max-repeats", "2", "--bootstrap", "8"]) in (0, 1)
    printed = capsys.readouterr().out
    assert "on 2 cpu rank(s) each (the job's density: its 2 rank(s), 64 per node), 1/2 layer(s), 2 round(s)" in printed
    assert "held at the prior:" in printed
    if not out.exists():  # a parameter not pinned down in 2 rounds on a busy host: refused, naming what would pin it
        assert "not pinned down after --max-repeats rounds: nothing written" in printed and "measure slice" in printed
        return
    doc = yaml.safe_load(out.read_text())
    prov = doc["provenance"]
    assert prov["density"]["ranks_per_slice"] == 2 and prov["layers"] == [1, 2] and prov["repeats"] == 2
    assert prov["hardware"].startswith("CPU") and prov["backend"] == "gloo" and prov["torch"]
    roles = {s["role"] for s in prov["slices"]}
    assert roles == {"compute", "dp", "pp"}
    assert all(len(v) == 2 and min(v) > 0 for v in prov["runs_step_s"].values())  # every slice measured twice
    assert prov["held"] and all(isinstance(why, str) and why for why in prov["held"].values())
    for name, f in prov["fitted"].items():
        lo, hi = f["interval_90"]
        assert lo <= f["value"] <= hi, name
    assert len(doc["uncertainty"]["samples"]) == 8 and doc["uncertainty"]["residuals"]["step_time_s"]
    assert load_calibration(out).basis == "fitted"
