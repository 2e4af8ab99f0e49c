"""`python -m trainer` as a user runs it: its own local ranks, or under torchrun."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.measure.result import Result

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.timeout(200)
@pytest.mark.parametrize("layout", [["parallel.pp=2"], ["parallel.dp=2"]])
def test_tiny_example_trains_on_two_ranks(tmp_path, layout):
    out = tmp_path / "r.json"
    proc = _run([sys.executable, "-m", "trainer", "--config", "examples/tiny.yaml", "run.steps=6", *layout,
                 "--out", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = Result.from_dict(json.loads(out.read_text()))
    assert result.world_size == 2 and result.summary.step_time_s > 0
    assert result.steps[-1].loss < result.steps[0].loss
    assert "MFU" in proc.stdout and "measured CPU peak" in proc.stdout


@pytest.mark.timeout(200)
def test_runs_under_torchrun(tmp_path):
    out = tmp_path / "r.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = _run([str(torchrun), "--standalone", "--nproc_per_node=2", "-m", "trainer", "--config",
                 "examples/tiny.yaml", "run.steps=4", "parallel.pp=2", "run.profile_step=0", "--out", str(out)],
                tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = Result.from_dict(json.loads(out.read_text()))
    assert sorted(r.rank for r in result.ranks) == [0, 1]
    # Each rank wrote its own trace (on its own node, under torchrun) into traces/ beside --out.
    assert sorted(Path(r.trace_file) for r in result.ranks) == [tmp_path / "traces" / f"rank{i}.pt.trace.json.gz"
                                                                for i in (0, 1)]
    assert all(Path(r.trace_file).stat().st_size > 1000 for r in result.ranks) and "torch.profiler trace" in proc.stdout


def test_bad_override_is_refused_before_launch(tmp_path):
    proc = _run([sys.executable, "-m", "trainer", "--config", "examples/tiny.yaml", "batch.micro_batch_size=3"],
                tmp_path)
    assert proc.returncode == 2
    assert "batch.global_batch" in proc.stderr and "micro_batch_size" in proc.stderr
