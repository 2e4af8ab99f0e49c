"""How many configs per second the planner evaluates, and the preset space's true optimum.

    .venv/bin/python bench/planner_speed.py [--preset search_spaces/preset-500b.yaml] [--float-points 16]

Vectorised: every config of the preset's space (floats at --float-points log-spaced values) through the
same formulas as ``predict``, in numpy chunks. Scalar: ``apply_params`` + ``predict`` per config, as a
trial backend calls it. Prefilter: ``MemoryPrefilter.check`` on trainer configs of the default sweep's model
(trainer config -> planner config -> memory), as the sweep calls it before each launch.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.planner import apply_params, enumerate_space, plan_config_from_dict, predict  # noqa: E402
from orchestrator.calibration.prefilter import MemoryPrefilter, load_cluster  # noqa: E402
from trainer.config import TrainConfig, apply_overrides  # noqa: E402


def prefilter_timing(n_rounds: int = 200) -> tuple[int, float]:
    """Calls and seconds of MemoryPrefilter.check over a few layouts of the default sweep's tiny GPT."""
    cluster, eff = load_cluster(ROOT / "search_spaces/clusters/cpu-local.yaml")
    pf = MemoryPrefilter(cluster, eff, budget_bytes=1e9)
    base = yaml.safe_load((ROOT / "examples/tiny.yaml").read_text())
    layouts = [{"parallel.pp": 2, "batch.micro_batch_size": b} for b in (1, 2, 4)] + [
        {"parallel.dp": 2, "data_parallel.kind": "replicate"}, {"parallel.pp": 2, "recompute.kind": "full"}]
    cfgs = [TrainConfig.from_dict(apply_overrides(base, o)) for o in layouts]
    pf.check(cfgs[0])  # imports and first-call setup are not what a sweep pays per trial
    t0 = time.perf_counter()
    for _ in range(n_rounds):
        for c in cfgs:
            pf.check(c)
    return n_rounds * len(cfgs), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=str(ROOT / "search_spaces/preset-500b.yaml"))
    ap.add_argument("--float-points", type=int, default=16)
    ap.add_argument("--scalar", type=int, default=3000, help="configs for the scalar timing")
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner_speed.md"))
    args = ap.parse_args()
    preset = yaml.safe_load(Path(args.preset).read_text())
    base = apply_params(plan_config_from_dict(preset["planner"]), preset["baseline"])
    space = preset["space"]["params"]

    t0 = time.perf_counter()
    grid = enumerate_space(base, space, float_points=args.float_points)
    vec_s = time.perf_counter() - t0
    best = grid.best()
    feasible = grid.feasible_times()

    rng = np.random.default_rng(0)
    picks = [grid.params(i) for i in rng.choice(np.flatnonzero(grid.valid), size=args.scalar, replace=False)]
    t0 = time.perf_counter()
    for params in picks:
        predict(apply_params(base, params))
    scalar_s = time.perf_counter() - t0
    pf_n, pf_s = prefilter_timing()

    lines = [
        "# Planner speed", "",
        f"Command: `.venv/bin/python bench/planner_speed.py --float-points {args.float_points}`", "",
        f"Taken {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {os.cpu_count()} CPUs (shared: rates move "
        "with the machine's load).", "",
        "| path | configs | seconds | configs/s |", "|---|---:|---:|---:|",
        f"| vectorised enumeration of the preset space | {grid.n:,} | {vec_s:.2f} | {grid.n / vec_s:,.0f} |",
        f"| scalar apply_params + predict | {len(picks):,} | {scalar_s:.2f} | {len(picks) / scalar_s:,.0f} |",
        f"| memory prefilter check (trainer config in) | {pf_n:,} | {pf_s:.2f} | {pf_n / pf_s:,.0f} |", "",
        f"Valid configs: {int(grid.valid.sum()):,}; valid and fitting in memory: {int(np.isfinite(feasible).sum()):,}; "
        f"predicted <= 9.30 s: {int((feasible <= 9.30).sum()):,}.", "",
        f"True optimum (of the enumerated grid): {grid.step_time_s[best]:.3f} s/update, "
        f"peak {grid.peak_memory_bytes[best] / 1e9:.1f} GB:", "",
        "```", *(f"{k}: {v}" for k, v in grid.params(best).items()), "```", "",
    ]
    write_and_print("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
