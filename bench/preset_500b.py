"""The 500B preset both ways: blind (B200 datasheet + the transferred H100 efficiency set) and calibrated to
the article's timeline (labelled so), against the article's 12 s = 8 s compute + 4 s exposed and 10 s.

    .venv/bin/python bench/preset_500b.py [--out bench/results/preset_500b.md]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402

from orchestrator.planner import apply_params, calibrate, plan_config_from_dict, predict  # noqa: E402
from orchestrator.planner import corpus, fidelity  # noqa: E402

ARTICLE = {"baseline": (12.0, 8.0, 4.0), "overlap": (10.0, 8.0, 2.0)}
CASES = (("baseline (article: 12 s = 8 + 4)", {}, "baseline"),
         ("grad-reduce overlap (article: 10 s)", {"data_parallel.overlap_grad_reduce": True}, "overlap"),
         ("+ param-gather overlap", {"data_parallel.overlap_grad_reduce": True,
                                     "optimizer.overlap_param_gather": True}, None))
CALIBRATED_FIT = ("matmul_eff", "dp_bw_eff")
"""Two physical parameters solved from the article's baseline: its 8 s of compute and 4 s of exposed traffic."""


def _table(lines: list[str], label: str, base, band) -> None:
    lines += [f"### {label}", "", "| case | step s | band s | compute s | exposed DP s | DP total s | article | error |",
              "|---|---:|---:|---:|---:|---:|---|---:|"]
    for name, params, key in CASES:
        p = predict(apply_params(base, params))
        lo, hi = band.apply(p.step_time_s)
        art, err = "", ""
        if key:
            t, c, x = ARTICLE[key]
            art = f"{t:g} s ({c:g} + {x:g})"
            err = f"{100 * (p.step_time_s / t - 1):+.1f}% (compute {100 * (p.compute_track_s / c - 1):+.0f}%)"
        lines.append(f"| {name} | {p.step_time_s:.2f} | {lo:.2f}-{hi:.2f} | {p.compute_track_s:.2f} | "
                     f"{p.dp_exposed_s:.2f} | {p.dp_total_s:.2f} | {art} | {err} |")
    lines.append("")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "bench/results/preset_500b.md"))
    args = ap.parse_args()
    preset = yaml.safe_load((ROOT / "search_spaces/preset-500b.yaml").read_text())
    rows = corpus.load()
    fits = fidelity.fit_all(rows)
    band = fidelity.band_from_residuals([e for _, e in fidelity.heldout_residuals(rows, fits)])
    planner = dict(preset["planner"])
    planner["cluster"] = {**corpus.cluster_dict("b200"), "num_gpus": planner["cluster"]["num_gpus"]}
    blind_eff = dataclasses.replace(fidelity.transferred_efficiency(fits, "b200"),
                                    mem_reserved_gb=planner["efficiency"].get("mem_reserved_gb", 10))
    planner["efficiency"] = dataclasses.asdict(blind_eff)
    blind = apply_params(plan_config_from_dict(planner), preset["baseline"])
    lines = ["# The 500B preset: blind vs calibrated", "", "Command: `.venv/bin/python bench/preset_500b.py`", "",
             "Model, job and parallel layout as in search_spaces/preset-500b.yaml (the model shape is the preset's "
             "ASSUMPTION; the article states GPUs, PP8, DP80, batch, timeline). Hardware: "
             "search_spaces/clusters/b200.yaml (datasheet).", "",
             f"Band: the corpus's {band.coverage:.0%} held-out band [{100 * band.lo:+.1f}%, {100 * band.hi:+.1f}%].", "",
             "## (a) Blind: B200 datasheet + the H100 efficiency set (transferred, no B200 data)", "",
             "Efficiency: " + ", ".join(f"{k} = {getattr(blind_eff, k):.3g}" for k in
                                        ("matmul_eff", "gemm_tokens_half", "flash_attention_eff", "tp_overlap",
                                         "dp_bw_eff", "op_overhead_us")), ""]
    _table(lines, "blind", blind, band)
    records = [{"config": blind, "step_time_s": 12.0, "compute_track_s": 8.0, "dp_exposed_s": 4.0}]
    cal = calibrate(records, blind, fit=CALIBRATED_FIT)
    lines += ["## (b) CALIBRATED to the article's baseline timeline (not a prediction of it)", "",
              "Solved from the article's own 12 s = 8 + 4: " +
              ", ".join(f"{k} = {v:.3g}" for k, v in cal.fitted.items()) +
              ". The 10 s overlap figure is then predicted, not fitted.", ""]
    _table(lines, "calibrated", dataclasses.replace(blind, efficiency=cal.efficiency), band)
    lines += ["## Reading", "",
              "Megatron enables gradient reduction only in the last microbatch, so with overlap_grad_reduce a "
              "bucket's reduce-scatter can hide only under the last microbatch's backward on its stage (about "
              "1/24 of the backward at 24 microbatches) plus the pipeline drain ahead of later stages; stage 0 has "
              "no drain slack and also carries the input embedding. The physical model therefore cannot move 2 s "
              "under computation as the article reports: hiding 2 s needs the reduction to start before the last "
              "microbatch (e.g. a schedule that reduces per microbatch, or a smaller microbatch count), which the "
              "article's setup may have had and the preset does not describe.", ""]
    write_and_print("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
