"""Planner vs published Megatron-LM runs, and the 500B preset vs the article's timeline.

    .venv/bin/python bench/planner_validation.py [--out bench/results/planner_validation.md]

1. Fit the A100 efficiency parameters to Korthikanti et al. 2022's eight step times (calibration set).
2. Predict the held-out Narayanan et al. 2021 runs with them; compare per-GPU throughput (eq. 3 FLOPs).
3. Memory: what the papers report as (not) fitting in 80 GB.
4. Re-derive the preset's fitted B200 parameters from the article's figures and show both timelines.
Sources of every figure: orchestrator/planner/published.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.planner import (NoRecompute, apply_params, calibrate, plan_config_from_dict,  # noqa: E402
                                  predict, predicts_oom)
from orchestrator.planner.published import FIT_RUNS, VALIDATION_RUNS, fit_records  # noqa: E402

A100_FIT = ("matmul_eff", "gemm_tokens_half", "attention_eff", "tp_overlap", "op_overhead_us")
ARTICLE_FIT = ("matmul_eff", "dp_bw_eff", "dp_overlap_microbatches")
ARTICLE = [
    {"config": {}, "step_time_s": 12.0, "compute_track_s": 8.0, "dp_exposed_s": 4.0},
    {"config": {"data_parallel.overlap_grad_reduce": True}, "step_time_s": 10.0, "compute_track_s": 8.0,
     "dp_exposed_s": 2.0},
]


def _pct(pred: float, ref: float) -> float:
    return 100.0 * (pred / ref - 1.0)


def published_section(lines: list[str]) -> dict[str, float]:
    cal = calibrate(fit_records(), FIT_RUNS[0].config(), fit=A100_FIT)
    lines += ["## 1. Calibration set: Korthikanti et al. 2022, Table 5 (A100, dp = 1)", "",
              f"Fitted ({cal.solver}): " + ", ".join(f"{k} = {float(v):.3g}" for k, v in cal.fitted.items()), "",
              "| run | GPUs | TPxPP | published s/iter | predicted s/iter | error |", "|---|---:|---:|---:|---:|---:|"]
    for run in FIT_RUNS:
        p = predict(run.config(cal.efficiency))
        lines.append(f"| {run.name} | {run.gpus} | {run.tp}x{run.pp} | {run.step_time_s:.2f} | {p.step_time_s:.2f} "
                     f"| {_pct(p.step_time_s, run.step_time_s):+.1f}% |")
    for label, errs in (("before", cal.errors_before), ("after", cal.errors_after)):
        e = errs["step_time_s"]
        lines.append(f"\nFit error {label}: step_time_s mean |err| {e['mean_abs_pct']:.1f}%, "
                     f"max {e['max_abs_pct']:.1f}% over {e['n']} runs")
    lines += ["", "## 2. Held out: predicted vs published throughput (TFLOP/s per GPU, Narayanan et al. eq. 3)", "",
              "| run | source | GPUs | TPxPPxDP | batch | published | predicted | error |",
              "|---|---|---:|---:|---:|---:|---:|---:|"]
    megatron_errs = []
    for run in VALIDATION_RUNS:
        cfg = run.config(cal.efficiency)
        p = predict(cfg)
        pred = run.eq3_flops() / (p.step_time_s * run.gpus) / 1e12
        err = _pct(pred, run.published_tflops())
        if run.source.startswith("Narayanan"):
            megatron_errs.append(abs(err))
        lines.append(f"| {run.name} | {run.source} | {run.gpus} | {run.tp}x{run.pp}x{cfg.parallel.dp} | {run.batch} "
                     f"| {run.published_tflops():.1f} | {pred:.1f} | {err:+.1f}% |")
    lines += ["", f"Megatron-LM rows: mean |error| {np.mean(megatron_errs):.1f}%, max {np.max(megatron_errs):.1f}% "
              f"({len(megatron_errs)} runs). MT-NLG ran on DeepSpeed's pipeline engine, which the Megatron-calibrated "
              "parameters do not describe: its production throughput (126 TFLOP/s) is well below Megatron's own "
              "530B benchmark (163-180 TFLOP/s), and the model reports that gap rather than hiding it.", ""]
    return {"mean": float(np.mean(megatron_errs)), "max": float(np.max(megatron_errs))}


def memory_section(lines: list[str]) -> None:
    lines += ["## 3. Memory: the published configs ran in 80 GB; without recomputation they would not", "",
              "No published per-GPU memory figure is used here: the check is that what ran is predicted to fit, "
              "and that dropping recomputation (which the papers needed) is predicted not to.", "",
              "| run | config | predicted peak GB | predicted OOM | published |", "|---|---|---:|---|---|"]
    for run in FIT_RUNS[2::2]:
        cfg = run.config()
        plain = dataclasses.replace(cfg, recompute=NoRecompute(),
                                    tensor_parallel=dataclasses.replace(cfg.tensor_parallel, sequence_parallel=False))
        for label, c, paper in (("as published (full recompute)", cfg, "ran"),
                                ("no recompute, no SP", plain, "not run")):
            oom, _ = predicts_oom(c)
            peak = predict(c).peak_memory_bytes / 1e9
            lines.append(f"| {run.name.split()[0]} | {label} | {peak:.0f} | {oom} | {paper} |")
    lines.append("")


def article_section(lines: list[str]) -> None:
    preset = yaml.safe_load((ROOT / "search_spaces/preset-500b.yaml").read_text())
    base = apply_params(plan_config_from_dict(preset["planner"]), preset["baseline"])
    cal = calibrate(ARTICLE, base, fit=ARTICLE_FIT)
    lines += ["## 4. The 500B preset against the article (B200)", "",
              "Fitting the three free parameters to the article's figures (12 s = 8 s compute + 4 s exposed; 10 s with"
              " 2 s of reduction under compute) re-derives the preset's values:", "",
              "| parameter | re-fitted | in the preset |", "|---|---:|---:|"]
    for name in ARTICLE_FIT:
        lines.append(f"| {name} | {float(cal.fitted[name]):.4g} | {getattr(base.efficiency, name):.4g} |")
    lines += ["", "| timeline | step s | compute track s | exposed DP s | DP total s | bubble s | recompute s | MFU |",
              "|---|---:|---:|---:|---:|---:|---:|---:|"]
    cases = (("article baseline (12 s)", {}),
             ("grad-reduce overlap (article: 10 s)", {"data_parallel.overlap_grad_reduce": True}),
             ("+ param-gather overlap", {"data_parallel.overlap_grad_reduce": True,
                                         "optimizer.overlap_param_gather": True}),
             ("+ no recompute", {"data_parallel.overlap_grad_reduce": True, "optimizer.overlap_param_gather": True,
                                 "recompute.kind": "none"}))
    for label, params in cases:
        p = predict(apply_params(base, params))
        lines.append(f"| {label} | {p.step_time_s:.2f} | {p.compute_track_s:.2f} | {p.dp_exposed_s:.2f} | "
                     f"{p.dp_total_s:.2f} | {p.pp_bubble_s:.2f} | {p.recompute_s:.2f} | {100 * p.mfu:.1f}% |")
    lines.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner_validation.md"))
    args = ap.parse_args()
    lines = ["# Planner validation", "", "Command: `.venv/bin/python bench/planner_validation.py`", ""]
    published_section(lines)
    memory_section(lines)
    article_section(lines)
    write_and_print("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
