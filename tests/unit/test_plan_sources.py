"""A model-backend prediction from measured files: which fields a cluster / calibration file brings, and the lines
that say what is measured."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.backends.planner_predictions import ModelRunner, PlannerConfigs
from orchestrator.calibration import sources as S
from orchestrator.calibration.cli import plan, render

REPO = Path(__file__).resolve().parents[2]
PRESET = REPO / "search_spaces" / "preset-500b.yaml"


def _planner() -> dict:
    return yaml.safe_load(PRESET.read_text())["planner"]


def _measured(tmp_path: Path, measured: list[str]) -> Path:
    doc = {"cluster": {"name": "elsewhere", "num_gpus": 16, "peak_tflops": 1.0, "intra_node_bw_GBps": 123.0,
                       "intra_node_latency_us": 4.5, "inter_node_bw_GBps": 31.0, "inter_node_latency_us": 11.0},
           "efficiency": {"matmul_eff": 0.01},
           "provenance": {"basis": "measured", "measured": measured, "date": "2026-12-02",
                          "sources": [{"collective": "all_reduce", "ranks": 8, "nodes": 1}]}}
    path = tmp_path / "measured.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_a_measured_file_brings_only_what_it_measured(tmp_path):
    path = _measured(tmp_path, ["intra_node_bw_GBps", "intra_node_latency_us"])
    out, src = S.resolve({**_planner(), "cluster_file": str(path)})
    inline = _planner()
    assert out["cluster"]["intra_node_bw_GBps"] == 123.0 and out["cluster"]["intra_node_latency_us"] == 4.5
    for kept in ("num_gpus", "peak_tflops", "inter_node_bw_GBps", "name"):
        assert out["cluster"][kept] == inline["cluster"][kept]
    assert out["efficiency"]["tp_bw_eff"] == 1.0  # the intra-node tier's efficiency: measured bandwidth is achieved
    assert out["efficiency"]["dp_bw_eff"] == inline["efficiency"]["dp_bw_eff"]
    assert out["efficiency"]["matmul_eff"] == inline["efficiency"]["matmul_eff"]  # the file's priors stay out
    assert src.network.startswith("MEASURED intra_node_bw_GBps, intra_node_latency_us from measured.yaml")
    assert "priors): inter_node_bw_GBps, inter_node_latency_us" in src.network
    assert "cluster_file" not in out


def test_a_plain_cluster_file_is_a_whole_machine_but_not_the_jobs_size(tmp_path):
    out, src = S.resolve({**_planner(), "cluster_file": "search_spaces/clusters/h100-sxm.yaml"}, REPO)
    assert out["cluster"]["peak_tflops"] == 989.0 and out["cluster"]["num_gpus"] == 5120
    assert src.network.startswith("prior: h100-sxm.yaml")


def test_a_calibration_file_replaces_the_efficiency_set_but_not_a_measured_network(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"efficiency": {"matmul_eff": 0.42, "tp_bw_eff": 0.3, "dp_bw_eff": 0.3}}))
    measured = _measured(tmp_path, ["inter_node_bw_GBps", "inter_node_latency_us"])
    out, src = S.resolve({**_planner(), "calibration_file": str(cal), "cluster_file": str(measured)})
    eff = out["efficiency"]
    assert (eff["matmul_eff"], eff["basis"], eff["tp_bw_eff"]) == (0.42, "fitted", 0.3)
    assert eff["dp_bw_eff"] == 1.0 and eff["pp_bw_eff"] == 1.0
    assert src.compute == "efficiency set fitted (calibration file cal.yaml)"


@pytest.mark.parametrize("key, body, match", [
    ("cluster_file", None, r"planner.cluster_file: .*nope.yaml: no such file"),
    ("cluster_file", {"efficiency": {}}, r"planner.cluster_file: .*expected a cluster: section"),
    ("cluster_file", {"cluster": {"name": "x"}, "provenance": {"basis": "measured", "measured": ["inter_node_bw_GBps"]}},
     r"provenance names inter_node_bw_GBps"),
    ("calibration_file", {"cluster": {}}, r"planner.calibration_file: .*expected an efficiency: section"),
])
def test_bad_files_name_the_key(tmp_path, key, body, match):
    path = tmp_path / "nope.yaml"
    if body is not None:
        path.write_text(yaml.safe_dump(body))
    with pytest.raises(ValueError, match=match):
        S.resolve({**_planner(), key: str(path)})


def test_plan_and_the_model_backend_say_what_is_measured(tmp_path):
    path = _measured(tmp_path, ["intra_node_bw_GBps", "intra_node_latency_us"])
    out = plan(PRESET, [f"planner.cluster_file={path}"])
    assert out["sources"]["network"].startswith("MEASURED") and "network: MEASURED" in render(out)
    assert out["config"]["cluster"]["intra_node_bw_GBps"] == 123.0
    assert plan(PRESET, [])["sources"]["network"].startswith("prior: the planner section")

    configs = PlannerConfigs({**_planner(), "cluster_file": str(path)}, yaml.safe_load(PRESET.read_text())["baseline"])
    runner = ModelRunner(configs.sources)
    runner.submit(0, configs.baseline)
    ((_, outcome),) = runner.poll(0)
    assert outcome.prediction["sources"]["network"] == out["sources"]["network"]


def test_a_measured_cluster_and_a_measured_calibration_predict_what_the_same_numbers_typed_in_do(tmp_path):
    """Composition: both files together give exactly the prediction of a planner section with their numbers set by
    hand (the measured network fields, bandwidth efficiency 1 for the measured tier, the fitted efficiency set)."""
    from orchestrator import planner as pl

    cluster = _measured(tmp_path, ["intra_node_bw_GBps", "intra_node_latency_us"])
    fitted = {**yaml.safe_load((REPO / "search_spaces" / "preset-500b.yaml").read_text())["planner"]["efficiency"],
              "matmul_eff": 0.61, "op_overhead_us": 7.0, "tp_bw_eff": 0.4}
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"efficiency": fitted}))
    by_files, _ = S.resolve({**_planner(), "cluster_file": str(cluster), "calibration_file": str(cal)})
    by_hand = _planner()
    by_hand["cluster"].update(intra_node_bw_GBps=123.0, intra_node_latency_us=4.5)
    by_hand["efficiency"] = {**fitted, "tp_bw_eff": 1.0, "basis": "fitted", "basis_note": "calibration file cal.yaml"}
    baseline = yaml.safe_load(PRESET.read_text())["baseline"]
    a = pl.predict(pl.apply_params(pl.plan_config_from_dict(by_files), dict(baseline)))
    b = pl.predict(pl.apply_params(pl.plan_config_from_dict(by_hand), dict(baseline)))
    assert a.to_dict() == b.to_dict() and a.step_time_s > 0
    # and the numbers matter: the priors predict something else
    c = pl.predict(pl.apply_params(pl.plan_config_from_dict(_planner()), dict(baseline)))
    assert c.step_time_s != a.step_time_s
