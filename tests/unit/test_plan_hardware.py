"""A calibration file names the hardware it measured; plan / the model backend / guided search warn when
they are asked about other hardware (orchestrator/calibration/hardware.py, sources.py)."""

from __future__ import annotations

import pytest
import yaml

from orchestrator.calibration import hardware
from orchestrator.calibration.sources import resolve

PROV = {"hardware": "CPU: AMD EPYC 7B13", "torch": "2.13.0", "backend": "gloo", "cluster_peak_tflops": 0.162}


@pytest.mark.parametrize("kw, warns", [
    ({"host": "CPU: AMD EPYC 7B13"}, None),
    ({"host": "NVIDIA H200"}, "measured on CPU: AMD EPYC 7B13 (torch 2.13.0, gloo), x runs on NVIDIA H200"),
    ({"peak_tflops": 0.162}, None),
    ({"peak_tflops": 989.0}, "a cluster of 0.162 TFLOP/s peak per device), x is for a cluster of 989 TFLOP/s"),
    ({}, None),
])
def test_mismatch_table(kw, warns):
    got = hardware.mismatch(PROV, what="x", **kw)
    assert (got is None) if warns is None else (warns in got and got.startswith("warning:"))
    assert hardware.mismatch({}, host="anything") is None  # a file that does not say: nothing to compare


def test_plan_warns_when_the_calibration_is_of_other_hardware(tmp_path):
    cal = tmp_path / "cal.yaml"
    cal.write_text(yaml.safe_dump({"efficiency": {"matmul_eff": 0.3}, "provenance": {"basis": "measured", **PROV}}))
    _, same = resolve({"cluster": {"peak_tflops": 0.162}, "calibration_file": str(cal)})
    _, other = resolve({"cluster": {"peak_tflops": 989.0}, "calibration_file": str(cal)})
    assert same.warnings == () and len(other.warnings) == 1 and "cal.yaml" in other.warnings[0]
    assert other.lines()[-1] == other.warnings[0]


def test_this_host_is_named():
    assert hardware.this_host()  # a GPU's name or "CPU: <model>"
