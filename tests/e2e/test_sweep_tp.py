"""The shipped tensor-parallel space (search_spaces/tp-cpu.yaml) as a real sweep: TP layouts measured on a warm Ray
group, each checked against the one-rank canonical run, and a TP trial exported with Megatron's TP flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.export.bundle import export_trial
from orchestrator.records.ledger import read_records
from orchestrator.sweep.config import load_sweep
from orchestrator.sweep.loop import run_sweep

pytestmark = pytest.mark.e2e
SPACE = Path(__file__).resolve().parents[2] / "search_spaces" / "tp-cpu.yaml"


@pytest.mark.timeout(300)
def test_a_tp_sweep_runs_parity_passing_tp_trials_and_exports_them(ray_address, tmp_path):
    # The baseline itself at tp 2: the gate's first comparison is a TP layout against the one-rank canonical.
    cfg = load_sweep(SPACE, [f"storage.results_dir={tmp_path}", "tracking.enabled=false", "search.n_trials=3",
                             "search.min_trials=3", "trainer.run.steps=6", "baseline.tensor_parallel.size=2",
                             "baseline.tensor_parallel.sequence_parallel=true",
                             # No settling rounds: they re-run the baseline and the leader (~2/3 of the test's
                             # time) and this test reads none of them; tests/e2e/test_sweep.py settles winners.
                             "winner.max_rounds=0"])
    run_sweep(cfg)
    records = read_records(cfg.results_dir / "trials.jsonl")
    canonical, baseline = records[0], records[1]
    assert canonical.kind.value == "canonical" and canonical.result.world_size == 1
    assert baseline.kind.value == "baseline" and baseline.status.value == "ok" and baseline.parity.passed
    assert baseline.result.config["tensor_parallel"] == {"size": 2, "sequence_parallel": True, "comm_overlap": False}
    assert baseline.result.phases["tp_comm"]["max"] > 0  # its collectives measured as their own phase
    tp_runs = [r for r in records if r.result is not None and r.result.config["tensor_parallel"]["size"] == 2]
    assert tp_runs and all(r.parity is not None and r.parity.passed for r in tp_runs)

    paths = export_trial(cfg.results_dir / "trials.jsonl", 0, tmp_path / "export")
    args = (tmp_path / "export" / "megatron_args.txt").read_text().split()
    assert args[args.index("--tensor-model-parallel-size") + 1] == "2" and "--sequence-parallel" in args
    assert "tensor_parallel" in (tmp_path / "export" / "trainer.yaml").read_text() and len(paths) == 3
