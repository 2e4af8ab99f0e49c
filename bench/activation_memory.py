"""Saved-activation bytes: what real CPU runs of the trainer measure against what the planner predicts.

    PYTHONPATH=. .venv/bin/python bench/activation_memory.py   # -> bench/results/activation_memory.md

Each layout runs on real gloo ranks (trainer.launch.spawn); every rank's ``saved_activation_peak_bytes``
(trainer.measure.meters.SavedActivations: autograd's saved tensors plus op-level recompute's cache) is divided by
the planner's activation bytes for its pipeline stage (orchestrator.calibration.prefilter.plan_for_trial, uncalibrated:
no reserve, activation factor 1). tests/distributed/test_prefilter_real_run.py asserts 0.9-1.1 on three of
these layouts.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.planner import ClusterSpec, Efficiency  # noqa: E402
from orchestrator.planner.knobs import Consts, encode  # noqa: E402
from orchestrator.planner.memory import stage_memory  # noqa: E402
from orchestrator.calibration.prefilter import plan_for_trial  # noqa: E402
from trainer.config import TrainConfig, apply_overrides  # noqa: E402
from trainer.launch import spawn_many  # noqa: E402

BASE = {"model": {"vocab_size": 256, "n_layers": 4, "d_model": 64, "n_heads": 4, "seq_len": 64},
        "batch": {"global_batch": 8}, "run": {"steps": 3, "warmup_steps": 1}}
CLUSTER = ClusterSpec(name="cpu", num_gpus=2, gpus_per_node=64, peak_tflops=0.1, hbm_gb=8.0, hbm_bw_GBps=10.0,
                      intra_node_bw_GBps=1.0, intra_node_latency_us=100.0)
EXACT = Efficiency(mem_reserved_gb=0.0, mem_activation_factor=1.0)
LAYOUTS = {
    "pp2 1F1B mb2": {"parallel.pp": 2, "batch.micro_batch_size": 2},
    "pp1 mb2": {"batch.micro_batch_size": 2},
    "pp2 GPipe mb1": {"parallel.pp": 2, "pipeline.schedule": "gpipe"},
    "pp1 mb4 selective(core_attn)": {"batch.micro_batch_size": 4, "recompute.kind": "selective"},
    "pp2 1F1B mb2, op recompute": {"parallel.pp": 2, "batch.micro_batch_size": 2, "recompute.kind": "op"},
    "pp2 GPipe mb2, op recompute": {"parallel.pp": 2, "batch.micro_batch_size": 2, "recompute.kind": "op",
                                    "pipeline.schedule": "gpipe"},
    "pp1 mb4, op recompute every 3rd matmul": {"batch.micro_batch_size": 4, "recompute.kind": "op",
                                               "recompute.matmul_period": 3},
    "pp2 1F1B mb2, bf16 autocast": {"parallel.pp": 2, "batch.micro_batch_size": 2, "run.precision": "bf16"},
    "pp2 1F1B mb2, bf16 autocast, op recompute": {"parallel.pp": 2, "batch.micro_batch_size": 2,
                                                  "run.precision": "bf16", "recompute.kind": "op"},
    "dp2 FSDP mb2, op recompute": {"parallel.dp": 2, "batch.micro_batch_size": 2, "data_parallel.kind": "fsdp",
                                   "recompute.kind": "op"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/activation_memory.md"))
    args = ap.parse_args()
    cfgs = [TrainConfig.from_dict(apply_overrides(BASE, o)) for o in LAYOUTS.values()]
    results: dict[int, object] = {}
    for world in sorted({c.world_size for c in cfgs}):  # one local world per size (spawn_many's rule)
        idx = [i for i, c in enumerate(cfgs) if c.world_size == world]
        results.update(zip(idx, spawn_many([cfgs[i] for i in idx])))
    lines = ["# Saved activations: measured / predicted", "", "Command: `PYTHONPATH=. .venv/bin/python "
             "bench/activation_memory.py`", "", "4-layer GPT (d_model 64, seq 64), global batch 8, CPU gloo ranks; "
             "ratio = measured saved-activation peak / the planner's activation bytes of the rank's stage.", "",
             "| layout | ratio per rank (stage, data-parallel rank order) |", "|---|---:|"]
    for i, (name, cfg) in enumerate(zip(LAYOUTS, cfgs)):
        result = results[i]
        plan = plan_for_trial(cfg, CLUSTER, EXACT)
        predicted = stage_memory(Consts.of(plan), encode([plan]))["activations"][0]
        ranks = sorted(result.ranks, key=lambda r: (r.pp_rank, r.dp_rank))
        ratios = " / ".join(f"{r.memory['saved_activation_peak_bytes'] / predicted[r.pp_rank]:.3f}" for r in ranks)
        lines.append(f"| {name} | {ratios} |")
    write_and_print("\n".join(lines) + "\n", args.out)


if __name__ == "__main__":
    main()
