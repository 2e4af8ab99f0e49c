"""``python -m orchestrator plan``: one config in, a prediction with its interval out; bad input is exit 2 naming
the field. Runs the real entry point (orchestrator.__main__) in-process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from orchestrator.__main__ import main

PRESET = Path(__file__).resolve().parents[2] / "search_spaces" / "preset-500b.yaml"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["plan", "--config", str(PRESET), *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_happy_path_prints_breakdown_memory_mfu_basis_and_band(capsys):
    rc, out, err = run(capsys)
    assert rc == 0, err
    for needle in ("PREDICTED", "efficiency set: blind", "(90%: ", "breakdown (critical path", "exposed dp comm",
                   "stage 7:", "MFU", "TFLOP/s per GPU", "peak", "target"):
        assert needle in out, needle


def test_json_parses_and_overrides_apply(capsys):
    rc, out, _ = run(capsys, "--json", "data_parallel.overlap_grad_reduce=true", "planner.efficiency.basis=calibrated")
    assert rc == 0
    d = json.loads(out)
    p = d["prediction"]
    assert d["knobs"]["data_parallel.overlap_grad_reduce"] is True and d["efficiency_basis"] == "calibrated"
    assert p["step_time_low_s"] < p["step_time_s"] < p["step_time_high_s"] and p["band_basis"]
    assert len(p["memory_per_stage"]) == 8 and d["target_verdict"] in ("met", "not met", "undecided")
    # a calibrated basis does not change a fitted field: the b200 corpus set's interval still applies
    assert d["interval"]["from_fit"] and d["interval"]["low"] < p["step_time_s"] < d["interval"]["high"]
    # overlap hides some of the baseline's exposed traffic
    assert p["step_time_s"] < d["baseline_step_time_s"]


@pytest.mark.parametrize("arg, field", [
    ("planner.efficiency.matmul_eff=2", "planner.efficiency.matmul_eff"),
    ("planner.efficiency.basis=guess", "planner.efficiency.basis"),
    ("batch.micro_batch_size=7", "batch.micro_batch_size"),
    ("recompute.kind=sometimes", "recompute.kind"),
    ("notakeyvalue", "key=value"),
])
def test_bad_value_is_one_line_exit_2_naming_the_field(capsys, arg, field):
    rc, out, err = run(capsys, arg)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and field in err, err


@pytest.mark.parametrize("arg, suggestion", [
    ("data_parallel.overlap_grad_reduc=true", "data_parallel.overlap_grad_reduce"),
    ("planner.efficiency.matmul_ef=0.8", "planner.efficiency.matmul_eff"),
    ("batch.micro_batchsize=2", "batch.micro_batch_size"),
])
def test_unknown_key_suggests_the_near_one(capsys, arg, suggestion):
    rc, _, err = run(capsys, arg)
    assert rc == 2 and f"did you mean {suggestion}?" in err, err


def test_bad_file_is_exit_2(capsys, tmp_path):
    bad = tmp_path / "s.yaml"
    raw = yaml.safe_load(PRESET.read_text())
    raw["planner"]["cluster"]["num_gpus"] = 5000
    bad.write_text(yaml.safe_dump(raw))
    rc = main(["plan", "--config", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2 and "parallel.dp" in err and len(err.strip().splitlines()) == 1
    assert main(["plan", "--config", str(tmp_path / "missing.yaml")]) == 2
