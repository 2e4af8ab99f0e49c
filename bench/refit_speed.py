"""The guided sampler's refit time on a real ledger: the calibration as it was (``--before``) against the working tree.

    PYTHONPATH=. .venv/bin/python bench/refit_speed.py --ledger results/default/trials.jsonl [--ledger ...]
        [--before 7bf8572] [--points sweep|grid] [--first 4] [--every 2] [--repeats 3] [--out FILE]

Replays the refits a guided sweep makes (``PlannerRanking.refit``: ``ledger_fit.ledger_records`` ->
``planner.calibrate`` with ``guided.FIT``, each warm-started from the previous fit) on growing prefixes of
the ledger lines: ``--points sweep`` where the sweep refitted (before each line whose ``planner.fits`` count
rose), ``--points grid`` every ``--every`` lines from ``--first`` (more refits, some of them on the few,
ill-conditioned early records that run the solver to its max_nfev). Once with ``orchestrator/planner/calibrate.py``
as it was at ``--before`` (read with ``git show``), once with the working tree's. Each refit is timed
(best of ``--repeats``); the table gives both times and the largest relative difference of the fitted
fields and of the records' predicted step times between the two chains. Several ``--ledger``s are
concatenated (more records, more layouts than one sweep measures).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.calibration import guided  # noqa: E402
from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER, ledger_records  # noqa: E402
from orchestrator.calibration.prefilter import load_cluster  # noqa: E402
from orchestrator.planner import calibrate as calibrate_now  # noqa: E402
from orchestrator.planner.calibrate import _evaluate  # noqa: E402
from orchestrator.planner.knobs import encode  # noqa: E402
from orchestrator.records.ledger import read_records  # noqa: E402

BEFORE = "7bf8572"
"""The last commit whose calibrate evaluated the model record by record."""


def calibrate_at(rev: str):
    """``calibrate`` from ``orchestrator/planner/calibrate.py`` as committed at ``rev``, beside today's."""
    src = subprocess.run(["git", "show", f"{rev}:orchestrator/planner/calibrate.py"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    name = "orchestrator.planner._calibrate_before"
    mod = types.ModuleType(name)
    mod.__package__ = "orchestrator.planner"
    sys.modules[name] = mod  # dataclasses look their module up while the class is made
    exec(compile(src, f"{rev}:orchestrator/planner/calibrate.py", "exec"), mod.__dict__)
    return mod.calibrate


def replay(fn, lines, points, cluster, prior, repeats):
    """(records, seconds, efficiency) per refit point, each refit warm-started from the one before."""
    eff, out = prior, []
    for k in points:
        records, _, _ = ledger_records(lines[:k], cluster, prior, metrics=guided.TIME_METRICS)
        if not records:
            continue
        base = dataclasses.replace(records[0]["config"], efficiency=eff)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fitted = fn(records, base, fit=guided.FIT).efficiency
            best = min(best, time.perf_counter() - t0)
        eff = fitted
        out.append((records, best, eff))
    return out


def sweep_points(paths: list[str]) -> list[int]:
    """Line counts (over the concatenated ledgers) the sweeps refitted on: a line whose ``planner.fits`` is
    higher than every line's before it in its ledger was predicted after a refit to the lines before it."""
    points, offset = [], 0
    for path in paths:
        fits = 0
        lines = [json.loads(t) for t in Path(path).read_text().splitlines() if t.strip()]
        for i, line in enumerate(lines):
            n = (line.get("planner") or {}).get("fits") or 0
            if n > fits:
                fits = n
                points.append(offset + i)
        offset += len(lines)
    return points


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-300)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", action="append", required=True)
    ap.add_argument("--before", default=BEFORE)
    ap.add_argument("--points", choices=("sweep", "grid"), default="sweep")
    ap.add_argument("--first", type=int, default=4)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None, help="default bench/results/refit_speed_<points>.md")
    args = ap.parse_args(argv)
    lines = [line for path in args.ledger for line in read_records(Path(path))]
    cluster, prior = load_cluster(ROOT / DEFAULT_CLUSTER)
    if args.points == "sweep":
        points = sweep_points(args.ledger)
        where = f"where the sweep refitted, after lines {', '.join(map(str, points))}"
    else:
        points = list(range(args.first, len(lines), args.every)) + [len(lines)]
        where = f"every {args.every} lines from line {args.first}"
    old = replay(calibrate_at(args.before), lines, points, cluster, prior, args.repeats)
    new = replay(calibrate_now, lines, points, cluster, prior, args.repeats)
    rows = []
    for i, ((records, t_old, e_old), (_, t_new, e_new)) in enumerate(zip(old, new)):
        d_fit = max(rel(getattr(e_old, f), getattr(e_new, f)) for f in guided.FIT)
        d_pred = max(rel(_evaluate(r["config"], encode([r["config"]]), e_old)["step_time_s"],
                         _evaluate(r["config"], encode([r["config"]]), e_new)["step_time_s"]) for r in records)
        layouts = len({(r["config"].parallel.pp, r["config"].parallel.dp, r["config"].tensor_parallel.size)
                       for r in records})
        rows.append(f"| {i + 1} | {len(records)} | {layouts} | {t_old * 1e3:.0f} | {t_new * 1e3:.0f} | "
                    f"{t_old / t_new:.1f}x | {d_fit:.1e} | {d_pred:.1e} |")
    total_old, total_new = sum(t for _, t, _ in old), sum(t for _, t, _ in new)
    text = "\n".join([
        "# Guided refit time: record-by-record residuals against batched ones",
        "",
        f"`python bench/refit_speed.py --before {args.before} "
        + " ".join(f"--ledger {p}" for p in args.ledger) + f" --points {args.points}"
        + (f" --first {args.first} --every {args.every}`" if args.points == "grid" else "`"),
        "",
        f"{len(lines)} ledger lines; a refit {where}, each warm-started from the one before "
        f"(fit: {', '.join(guided.FIT)}); best of {args.repeats} per refit.",
        "",
        "| refit | records | layouts | before ms | after ms | speedup | max rel diff fitted | "
        "max rel diff predicted step |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"All refits: {total_old:.2f} s before, {total_new:.2f} s after ({total_old / total_new:.1f}x).",
        "",
    ])
    write_and_print(text, args.out or ROOT / f"bench/results/refit_speed_{args.points}.md")


if __name__ == "__main__":
    main()
