"""Parity margins: the worst legitimate difference vs the smallest seeded-bug difference, per precision.

    .venv/bin/python bench/parity_margins.py [--out bench/results/parity_margins.md]

Every row is a real run on local gloo ranks against the single-process baseline of the same maths.
bf16: the baseline runs twice; its run-to-run spread x REPEAT_FACTOR (or the bf16 floor, whichever is
larger) is the tolerance (orchestrator.parity.verdict.tolerance_from_repeats).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.parity.verdict import (DEFAULT_TOLERANCE, REPEAT_FACTOR, compare, reference_from_result,  # noqa: E402
                                 tolerance_from_repeats)
from tests.distributed._common import TINY  # noqa: E402
from tests.distributed.seeded_bugs import BUGS  # noqa: E402
from trainer.config import TrainConfig, apply_overrides  # noqa: E402
from trainer.launch import spawn_many  # noqa: E402

LEGIT = {
    "dp2 replicate overlap": {"parallel.dp": 2},
    "dp2 fsdp": {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
    "dp2 full recompute, mbs 1": {"parallel.dp": 2, "recompute.kind": "full", "batch.micro_batch_size": 1},
    "pp2 1f1b": {"parallel.pp": 2},
    "pp2 gpipe, mbs 4": {"parallel.pp": 2, "pipeline.schedule": "gpipe", "batch.micro_batch_size": 4},
    "pp2 interleaved v2": {"parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2},
}


def cfg(over: dict, precision: str) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(TINY, {**over, "run.precision": precision}))


def row(name: str, v: dict) -> str:
    return (f"| {name} | {'pass' if v['passed'] else 'FAIL'} | {v['first_fail_step']} | {v['first_fail_metric']} | "
            f"{v['max_loss_rel_diff']:.2e} | {v['max_grad_norm_rel_diff']:.2e} | {v['max_fingerprint_rel_diff']:.2e} | "
            f"{v['replica_max_abs_diff']:.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("bench/results/parity_margins.md"))
    args = parser.parse_args()
    out = ["# Parity margins", "", "Command: `.venv/bin/python bench/parity_margins.py` (tiny GPT, 6 steps, CPU gloo).", ""]
    for precision in ("fp32", "bf16"):
        base_a, base_b = spawn_many([cfg({}, precision), cfg({}, precision)])
        ref = reference_from_result(base_a)
        tol = (DEFAULT_TOLERANCE[precision] if precision == "fp32"
               else tolerance_from_repeats(ref, reference_from_result(base_b), precision))
        spread = compare(ref, base_b, tolerance=tol)
        out += [f"## {precision}", "",
                f"Tolerance: {tol} (baseline run-to-run: loss {spread['max_loss_rel_diff']:.1e}; "
                f"factor {REPEAT_FACTOR} applies to bf16).", "",
                "| run | verdict | first fail step | metric | max loss rel | max grad-norm rel | max param rel | replicas |",
                "|---|---|---|---|---|---|---|---|"]
        legit = []
        for group in ({k: v for k, v in LEGIT.items() if "pp2" not in k}, {k: v for k, v in LEGIT.items() if "pp2" in k}):
            for name, result in zip(group, spawn_many([cfg(v, precision) for v in group.values()])):
                v = compare(ref, result, tolerance=tol)
                legit.append(v)
                out.append(row(f"legit: {name}", v))
        bugs = []
        for bug, layout, _, _ in BUGS:
            (result,) = spawn_many([cfg(layout, precision)], setup=bug)
            v = compare(ref, result, tolerance=tol)
            bugs.append(v)
            out.append(row(f"bug: {bug.__name__}", v))
        worst_legit = max(v["max_loss_rel_diff"] for v in legit)
        smallest_bug = min(max(v["max_loss_rel_diff"], v["max_grad_norm_rel_diff"] / 10) for v in bugs)
        out += ["", f"Worst legitimate loss difference: {worst_legit:.2e}; smallest bug difference "
                f"(loss, or grad norm / 10): {smallest_bug:.2e}; loss tolerance {tol.loss_rel:.1e}.", ""]
        print("\n".join(out))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(out))


if __name__ == "__main__":
    main()
