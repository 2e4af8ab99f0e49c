"""Parity margins: tolerances from the largest legitimate difference, and each seeded bug's margin above them.

    .venv/bin/python bench/parity_margins.py [--precisions fp32,bf16] [--spaces default,tp-cpu]
                                             [--out bench/results/parity_margins.md]

Every row is a real run on local gloo ranks (trainer.launch.spawn_many) against the canonical run of the same maths
(orchestrator.parity.trust.canonical_config: one rank, the whole batch as one microbatch).

1. Calibration set: legitimate layouts of the tiny test model covering every family (data parallelism replicate
   with and without overlap, FSDP2, torch DDP; pp 2 with each schedule and an uneven split; tp 2 with and without
   sequence parallelism; every recompute kind; the canonical run's own self-check decomposition), and three
   layouts of each search space's own model (SPACE_CALIBRATION). Per metric and precision the tolerance is
   HEADROOM x the largest difference measured there, rounded up to one significant digit
   (orchestrator.parity.verdict.derive_tolerance).
2. Seeded bugs (tests/distributed/seeded_bugs.py): each bug's margin is its largest difference over the
   tolerance, per metric, the best metric named; the first step the gate fails it at.
3. False alarms: every layout of the default and TP search spaces (their own model and steps; bucket sizes at
   the space's ends) against its canonical run under the derived fp32 tolerance.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.parity.certify import self_check_config  # noqa: E402
from orchestrator.parity.trust import canonical_config  # noqa: E402
from orchestrator.parity.verdict import (DEFAULT_TOLERANCE, HEADROOM, Tolerance, compare,  # noqa: E402
                                         derive_tolerance, reference_from_result)
from tests.distributed._common import TINY  # noqa: E402
from tests.distributed import seeded_bugs as bugs  # noqa: E402
from trainer.config import TrainConfig, apply_overrides  # noqa: E402
from trainer.launch import RankFailed, spawn_many  # noqa: E402

STEPS = 20
"""Updates per calibration and bug run: the default space's run length, so parameter drift is measured as long as a
sweep's trials run."""

CALIBRATION = {
    "dp2 replicate overlap, 0.02 MB buckets, mbs 1": {"parallel.dp": 2, "batch.micro_batch_size": 1},
    "dp2 replicate no overlap, mbs 4": {"parallel.dp": 2, "batch.micro_batch_size": 4,
                                        "data_parallel.overlap_grad_reduce": False},
    "dp2 fsdp, mbs 2": {"parallel.dp": 2, "data_parallel.kind": "fsdp"},
    "dp2 torch_ddp, op recompute": {"parallel.dp": 2, "data_parallel.kind": "torch_ddp", "recompute.kind": "op"},
    "pp2 gpipe, mbs 4": {"parallel.pp": 2, "pipeline.schedule": "gpipe", "batch.micro_batch_size": 4},
    "pp2 1f1b, split 1/3, full recompute": {"parallel.pp": 2, "pipeline.split": {"kind": "first_last", "first": 1,
                                                                                 "last": 3}, "recompute.kind": "full"},
    "pp2 interleaved v2, mbs 1, full block recompute": {
        "parallel.pp": 2, "pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2,
        "batch.micro_batch_size": 1, "recompute.kind": "full", "recompute.method": "block"},
    "tp2 sp": {"tensor_parallel.size": 2},
    "tp2 no sp, selective recompute (all modules)": {
        "tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": False, "recompute.kind": "selective",
        "recompute.modules": ["core_attn", "mlp", "norm"]},
    "tp2 sp, dp2, mbs 1": {"tensor_parallel.size": 2, "parallel.dp": 2, "batch.micro_batch_size": 1},
    "tp2 sp, pp2, selective recompute": {"tensor_parallel.size": 2, "parallel.pp": 2, "recompute.kind": "selective"},
    "pp2 dp2 fsdp, mbs 1": {"parallel.pp": 2, "parallel.dp": 2, "data_parallel.kind": "fsdp",
                            "batch.micro_batch_size": 1},
}
"""Legitimate layouts of the tiny model: every family, tp 1 and 2, pp 1 and 2, FSDP2, every recompute kind."""

BEFORE = {"fp32": Tolerance(loss_rel=1e-5, grad_norm_rel=1e-4, param_rel=1e-4, replica_abs=1e-6),
          "bf16": Tolerance(loss_rel=1e-4, grad_norm_rel=1e-3, param_rel=5e-2, replica_abs=1e-6)}
"""The hand-set tolerances before issue 27, for the margins' "before" column."""

SPACE_CALIBRATION = {
    "default": [{}, {"parallel.pp": 1, "batch.micro_batch_size": 8, "data_parallel.overlap_grad_reduce": True,
                     "data_parallel.bucket_mb": 0.05, "recompute.kind": "none"},
                {"pipeline.schedule": "interleaved_1f1b", "pipeline.virtual_stages": 2, "recompute.kind": "selective"}],
    "tp-cpu": [{}, {"tensor_parallel.size": 2, "recompute.kind": "none"},
               {"tensor_parallel.size": 2, "tensor_parallel.sequence_parallel": False, "batch.micro_batch_size": 4,
                "recompute.kind": "selective"}],
}
"""Three layouts of each search space's own model and run length (its baseline first, as overrides of it): the
differences a legitimate layout makes grow with the model and the number of updates, so the calibration covers
the models the gate judges, not only the tiny one. They are also among the layouts the false-alarm sweep runs."""

METRICS = (("loss", "max_loss_rel_diff", "loss_rel"), ("grad norm", "max_grad_norm_rel_diff", "grad_norm_rel"),
           ("parameters", "max_fingerprint_rel_diff", "param_rel"))


def cfg(over: dict, precision: str, steps: int = STEPS) -> TrainConfig:
    return TrainConfig.from_dict(apply_overrides(TINY, {**over, "run.precision": precision, "run.steps": steps}))


def run_grouped(configs: list[TrainConfig], setup=None, chunk: int = 16) -> list[Any]:
    """Each config's Result (or RankFailed), one local world per world size and ``chunk`` configs."""
    out: dict[int, Any] = {}
    for world in sorted({c.world_size for c in configs}):
        group = [i for i, c in enumerate(configs) if c.world_size == world]
        for start in range(0, len(group), chunk):
            part = group[start:start + chunk]
            try:
                results = spawn_many([configs[i] for i in part], setup=setup)
            except RankFailed as e:
                results = [e] * len(part)
            out.update(zip(part, results))
            if len(configs) > chunk:
                print(f"  {len(out)}/{len(configs)} runs", flush=True)
    return [out[i] for i in range(len(configs))]


def diffs(ref: dict, result: Any, tol: Tolerance) -> dict[str, Any]:
    v = compare(ref, result, tolerance=tol)
    return {"passed": v["passed"], "step": v["first_fail_step"], "metric": v["first_fail_metric"],
            **{key: v[key] for _, key, _ in METRICS}, "replicas": v["replica_max_abs_diff"]}


def margin(d: dict, tol: Tolerance) -> tuple[float, str]:
    """The bug's largest difference over its tolerance, and the metric it is in."""
    best = max(((d[key] or 0.0) / getattr(tol, field), name) for name, key, field in METRICS)
    return best


def calibrate(precision: str) -> tuple[dict, list[dict], Tolerance, dict]:
    base = cfg({}, precision)
    canon = canonical_config(base)
    layouts = {"the canonical's self-check (one rank, 8 microbatches of 1)": self_check_config(canon),
               **{name: cfg(over, precision) for name, over in CALIBRATION.items()}}
    results = run_grouped([canon, canon, *layouts.values()])
    ref = reference_from_result(results[0], role="canonical")
    loose = Tolerance(1.0, 1.0, 1.0, 1.0)
    rows = [{"run": "canonical, run again", **diffs(ref, results[1], loose)}]
    for name, r in zip(layouts, results[2:]):
        if isinstance(r, RankFailed):
            raise SystemExit(f"calibration layout {name} failed to run: {r}")
        rows.append({"run": name, **diffs(ref, r, loose)})
    for space, overrides in SPACE_CALIBRATION.items():
        configs = space_configs(ROOT / "search_spaces" / f"{space}.yaml")
        runs = [TrainConfig.from_dict(apply_overrides(configs.build(o).to_dict(), {
            "run.precision": precision, "run.timeline_steps": 0})) for o in overrides]
        results = run_grouped([canonical_config(runs[0]), *runs])
        ref_s = reference_from_result(results[0], role="canonical")
        for o, r in zip(overrides, results[1:]):
            if isinstance(r, RankFailed):
                raise SystemExit(f"calibration layout {space} {o} failed to run: {r}")
            rows.append({"run": f"{space}: {'baseline' if not o else 'baseline + ' + json.dumps(o)}",
                         **diffs(ref_s, r, loose)})
    largest = {field: max(row[key] or 0.0 for row in rows) for _, key, field in METRICS}
    tol = derive_tolerance(largest, DEFAULT_TOLERANCE[precision].replica_abs)
    return ref, rows, tol, largest


def seeded(ref_by_precision: dict, precision: str, tol: Tolerance) -> list[dict]:
    ref = ref_by_precision[precision]
    rows = []
    cases = [(b, layout) for b, layout, _, _ in bugs.BUGS] + list(bugs.THIN_BUGS)
    for bug, layout in cases:
        (r,) = run_grouped([cfg(layout, precision)], setup=bug)
        if isinstance(r, RankFailed):
            rows.append({"bug": bug.__name__, "error": str(r)[:200]})
            continue
        d = diffs(ref, r, tol)
        m, metric = margin(d, tol)
        before = diffs(ref, r, BEFORE[precision])
        rows.append({"bug": bug.__name__, "thin": (bug, layout) in bugs.THIN_BUGS, **d, "margin": m,
                     "margin_metric": metric, "before": margin(before, BEFORE[precision])[0],
                     "before_step": before["step"]})
    # The bug in the canonical run itself: only the self-check sees it (the canonical vs several microbatches).
    canon = canonical_config(cfg({}, precision))
    c, s = run_grouped([canon, self_check_config(canon)], setup=bugs.bug_loss_scaled_for_large_microbatch)
    d = diffs(reference_from_result(c, role="canonical"), s, tol)
    m, metric = margin(d, tol)
    before = diffs(reference_from_result(c, role="canonical"), s, BEFORE[precision])
    rows.append({"bug": "bug_loss_scaled_for_large_microbatch (canonical vs its self-check)", "thin": False, **d,
                 "margin": m, "margin_metric": metric, "before": margin(before, BEFORE[precision])[0],
                 "before_step": before["step"]})
    return rows


def space_configs(path: Path) -> Any:
    """The sweep file's TrainerConfigs (the ray backend's: baseline + overrides, dp derived)."""
    from orchestrator import backends
    from orchestrator.sweep.config import load_sweep

    return backends.build(load_sweep(str(path), [], check=False)).configs


def space_layouts(path: Path) -> list[tuple[str, TrainConfig]]:
    from bench.landscape import landscape_configs
    from orchestrator.sweep.config import load_sweep

    sweep = load_sweep(str(path), [], check=False)
    configs = space_configs(path)
    space = sweep.space
    buckets = [p for p in space.params if p.name == "data_parallel.bucket_mb"]
    ends = [buckets[0].low, buckets[0].high] if buckets else [0.05]
    out = []
    for params in landscape_configs(sweep, configs, ends):
        overrides = configs.overrides_for(space, params)
        c = configs.build(overrides)
        out.append((json.dumps(params, sort_keys=True), TrainConfig.from_dict(apply_overrides(
            c.to_dict(), {"run.timeline_steps": 0}))))
    return out


def false_alarms(path: Path, tol: Tolerance, limit: int | None) -> dict:
    layouts = space_layouts(path)
    total = len(layouts)
    if limit and total > limit:
        layouts = layouts[:: max(1, total // limit)][:limit]
    print(f"{path.name}: {len(layouts)} of {total} layouts", flush=True)
    canon = canonical_config(layouts[0][1])
    results = run_grouped([canon] + [c for _, c in layouts])
    ref = reference_from_result(results[0], role="canonical")
    rows, failed_to_run = [], []
    for (name, _), r in zip(layouts, results[1:]):
        if isinstance(r, RankFailed):
            failed_to_run.append(name)
            continue
        d = diffs(ref, r, tol)
        rows.append({"layout": name, **d, "ratio": margin(d, tol)})
    alarms = [r for r in rows if not r["passed"]]
    worst = {name: max((row[key] or 0.0) for row in rows) for name, key, _ in METRICS}
    return {"space": path.name, "layouts": len(layouts), "of": total, "ran": len(rows), "failed_to_run": failed_to_run,
            "false_alarms": [(r["layout"], r["metric"], r["step"]) for r in alarms], "worst": worst,
            "worst_ratio": max(rows, key=lambda r: r["ratio"][0])["ratio"] if rows else None}


def e(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,bf16")
    parser.add_argument("--spaces", default="default,tp-cpu", help="search_spaces/<name>.yaml for the false-alarm sweep"
                                                                   " (fp32); empty: none")
    parser.add_argument("--limit", type=int, help="at most this many layouts per space (evenly spread)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/parity_margins.md")
    parser.add_argument("--render-only", action="store_true", help="write the .md from the .json of the last run")
    parser.add_argument("--false-alarms-only", action="store_true",
                        help="keep the last run's calibration, tolerances and seeded bugs (the .json beside --out) and "
                             "run only the false-alarm sweep of --spaces under its fp32 tolerance")
    args = parser.parse_args()
    if args.render_only:
        doc = json.loads(args.out.with_suffix(".json").read_text())
        args.out.write_text(render(doc, doc.get("argv", "")))
        return
    t0 = time.time()
    doc: dict[str, Any] = {"headroom": HEADROOM, "steps": STEPS, "precisions": {}}
    if args.false_alarms_only:
        if not args.out.with_suffix(".json").is_file():
            raise SystemExit(f"--false-alarms-only: {args.out.with_suffix('.json')} does not exist; run the bench "
                             f"without --false-alarms-only first (it writes the calibration there)")
        doc = json.loads(args.out.with_suffix(".json").read_text())
        doc["calibration_argv"], doc["calibration_wall_s"] = doc.get("argv", ""), doc["wall_s"]
    refs = {}
    for precision in ([] if args.false_alarms_only else args.precisions.split(",")):
        ref, rows, tol, largest = calibrate(precision)
        refs[precision] = ref
        print(f"{precision}: largest legitimate {largest} -> tolerance {tol}", flush=True)
        doc["precisions"][precision] = {"calibration": rows, "largest": largest, "tolerance": tol.__dict__,
                                        "bugs": seeded(refs, precision, tol)}
    rerun = {f"{s}.yaml" for s in args.spaces.split(",") if s}
    kept = [s for s in doc.get("spaces", []) if args.false_alarms_only and s["space"] not in rerun]
    doc["spaces"] = kept + [false_alarms(ROOT / "search_spaces" / f"{s}.yaml", Tolerance(**doc["precisions"]["fp32"][
        "tolerance"]), args.limit) for s in args.spaces.split(",") if s]
    doc["wall_s"] = time.time() - t0 + (doc.get("calibration_wall_s") or 0.0)
    doc["argv"] = " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(doc, indent=1, default=str))
    args.out.write_text(render(doc, doc["argv"]))
    print(args.out.read_text())


def render(doc: dict, argv: str) -> str:
    def command(a: str) -> str:
        return f"`.venv/bin/python bench/parity_margins.py{(' ' + a) if a else ''}`"

    if "calibration_argv" in doc:  # a --false-alarms-only run on top of an earlier calibration
        ran = (f"Commands: {command(doc['calibration_argv'])} (calibration, seeded bugs; "
               f"{doc['calibration_wall_s'] / 60:.0f} min), then {command(argv)} (the false-alarm sweep; "
               f"{(doc['wall_s'] - doc['calibration_wall_s']) / 60:.0f} min); CPU gloo on a shared 2-core machine.")
    else:
        ran = f"Command: {command(argv)} (CPU gloo, {doc['wall_s'] / 60:.0f} min on a shared 2-core machine)."
    out = ["# Parity margins", "",
           f"{ran} Headroom: tolerance = {doc['headroom']:g} x "
           f"the largest legitimate difference, rounded up to one significant digit. Tiny GPT "
           f"(tests/distributed/_common.py), {doc['steps']} updates, against its canonical run.", ""]
    for precision, p in doc["precisions"].items():
        tol = p["tolerance"]
        out += [f"## {precision}", "", "Calibration set (legitimate layouts):", "",
                "| run | max loss rel | max grad-norm rel | max param rel | replicas abs |", "|---|---|---|---|---|"]
        out += [f"| {r['run']} | {e(r['max_loss_rel_diff'])} | {e(r['max_grad_norm_rel_diff'])} | "
                f"{e(r['max_fingerprint_rel_diff'])} | {e(r['replicas'])} |" for r in p["calibration"]]
        out += ["", "| metric | largest legitimate | tolerance | before |", "|---|---|---|---|"]
        out += [f"| {name} | {e(p['largest'][field])} | {e(tol[field])} | "
                f"{e(getattr(BEFORE[precision], field))} |" for name, _, field in METRICS]
        out += ["", "Seeded bugs against that tolerance (margin: the largest difference over its tolerance):", "",
                "| bug | caught | first step | metric | max loss rel | max grad-norm rel | max param rel | margin | "
                "before: margin (first step) |",
                "|---|---|---|---|---|---|---|---|---|"]
        for b in p["bugs"]:
            if "error" in b:
                out.append(f"| {b['bug']} | did not run: {b['error']} | | | | | | | |")
                continue
            out.append(f"| {b['bug']}{' (thin)' if b['thin'] else ''} | {'no' if b['passed'] else 'yes'} | {b['step']} "
                       f"| {b['metric']} | {e(b['max_loss_rel_diff'])} | {e(b['max_grad_norm_rel_diff'])} | "
                       f"{e(b['max_fingerprint_rel_diff'])} | {b['margin']:.1f}x ({b['margin_metric']}) | "
                       f"{b['before']:.1f}x ({b['before_step']}) |")
        thin = [b for b in p["bugs"] if "margin" in b]
        low = min(thin, key=lambda b: b["margin"])
        out += ["", f"Thinnest margin: {low['margin']:.1f}x ({low['bug']}).", ""]
    for s in doc.get("spaces", []):
        out += [f"## False alarms: search_spaces/{s['space']} (fp32, its own model and steps)", "",
                f"{s['ran']} of {s['layouts']} layouts ran (the space has {s['of']}; "
                f"{'all' if s['layouts'] == s['of'] else 'evenly spread'}) ({len(s['failed_to_run'])} did not: "
                f"{', '.join(s['failed_to_run']) or 'none'}); false alarms: {len(s['false_alarms'])} "
                f"{s['false_alarms'] or ''}. Largest differences: loss {e(s['worst']['loss'])}, grad norm "
                f"{e(s['worst']['grad norm'])}, parameters {e(s['worst']['parameters'])}; the closest layout came to "
                f"{s['worst_ratio'][0]:.2f}x its tolerance ({s['worst_ratio'][1]}).", ""]
    return "\n".join(out)


if __name__ == "__main__":
    main()
