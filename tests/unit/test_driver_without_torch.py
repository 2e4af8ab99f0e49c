"""The sweep's driver never imports torch: it reads the ranks' results (merging them with the config's FLOPs,
classifying failures, naming traces) with torch-free modules. Importing torch costs ~2.5 s of CPU on a 2-core
machine, and a driver that paid it did so beside the sweep's first run, slowing it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

READ_RESULTS = textwrap.dedent("""
    import sys
    import orchestrator.sweep.loop, orchestrator.backends.ray_trials, orchestrator.backends.ray_runner
    from orchestrator.backends.ray_runner import _outcome
    from orchestrator.backends.workers import RunDone
    from trainer.config import TrainConfig, apply_overrides
    from trainer.measure.result import NonFiniteLoss, RankResult, StepRecord

    cfg = TrainConfig.from_dict(apply_overrides({}, {"run.steps": 4, "run.warmup_steps": 1}))
    rank = RankResult(rank=0, pp_rank=0, dp_rank=0, stage_ids=[0], layer_ids=[0], device_name="cpu",
                      steps=[StepRecord(i, 0.5, 5.0, 1.0, 256) for i in range(4)], phase_s={},
                      reduce_start_after_backward_s=None, spans=[], memory={"peak_bytes": 1000},
                      fingerprint={"w": [4.0, 1.0, 0]}, replica_max_abs_diff=0.0, peak_flops=None, peak_basis="none")
    ok = _outcome(cfg, RunDone([rank], None, "ok", 3.0, traces=[b"trace"], placement=[{"rank": 0}]))
    assert ok.status == "ok" and ok.result.summary.model_flops_per_step > 0 and ok.traces, ok
    both = _outcome((cfg, cfg), RunDone(None, None, "ok", 3.0, placement=[{"rank": 0}], local=[[rank], "boom"]))
    assert [o.status for o in both] == ["ok", "failed"], both
    nan = _outcome(cfg, RunDone(None, NonFiniteLoss("step 2: loss=nan"), "raised", 1.0))
    assert nan.status == "nan", nan
    print("torch" in sys.modules)
""")


def test_the_driver_reads_results_merges_and_classifies_them_without_importing_torch():
    out = subprocess.run([sys.executable, "-c", READ_RESULTS], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False", "the driver imported torch to read a result"
