"""Slices predict what they never ran: the planner calibrated from 1-2 layer slices of the default model and a
gloo netcal table on this machine, judged on every config of the measured landscape (bench/landscape.py).

    PYTHONPATH=. .venv/bin/python bench/slice_proof.py [--landscape bench/results/landscape_default.json]
        [--steps 8] [--refit-trials 20] [--seed 0] [--out bench/results/slice_proof.md]

1. Network: ``steptune netcal --measure 2 --ops all_reduce,all_gather`` over cpu-local.yaml (gloo, 2 ranks on
   this host) -> ``slice_proof_cluster.yaml`` (+ the two nccl-tests-format tables beside it).
2. Compute: ``slices.derive_trainer_slices`` of search_spaces/default.yaml's trainer section at 1 and 2 ranks,
   1 and 2 layers (pp 1: the default space itself has 6 layers, so none of its configs is run), every
   micro-batch size and recompute kind of the space once each; run on the trainer's local launcher; fitted with
   ``profile.fit_slices`` (compute efficiencies only) -> ``slice_proof_calibration.yaml``.
3. Three planners predict every landscape config (``guided.PlannerRanking``: ``prefilter.plan_for_trial`` as a
   sweep maps it): priors (cpu-local.yaml as is); slice-calibrated (1 + 2); refitted on the first
   ``--refit-trials`` runs a guided replay (bench/replay.py's ``guided`` strategy, seed ``--seed``) measures,
   i.e. the guided sampler's own online refit (``PlannerRanking.refit``) on those runs.
Reported per planner: median and worst |error| against each config's measured median step time, Spearman rank
correlation, and whether the predicted-best config's measured median is within 5% of the measured best; then
where the error comes from, by knob family and per phase (the landscape stores the trainer's phase times).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import replay as R  # noqa: E402

from orchestrator.plan import guided  # noqa: E402
from orchestrator.plan.calibration import DEFAULT_CLUSTER, write_calibration  # noqa: E402
from orchestrator.plan.prefilter import load_cluster  # noqa: E402
from orchestrator.plan.profile import fit_slices, hardware_name, now  # noqa: E402
from orchestrator.plan.slices import SlicePlan, derive_trainer_slices  # noqa: E402
from orchestrator.planner import predict  # noqa: E402

GOALS = {"median_abs_err_pct": 10.0, "spearman": 0.9, "best_within_pct": 5.0}
"""Issue 23, item 4: what the slice-calibrated planner must reach."""
PHASES = {"forward": ("forward_s",), "backward": ("backward_s", "recompute_s"), "optimizer": ("optimizer_s",),
          "dp_comm_wait": ("dp_exposed_s",), "pipeline_idle": ("pp_bubble_s", "pp_p2p_s")}
"""The trainer's phase (as the landscape stores it) -> the planner's terms that price it."""


@dataclass(frozen=True)
class Verdict:
    name: str
    n: int
    median_abs_err_pct: float
    worst_abs_err_pct: float
    worst_key: str
    spearman: float
    predicted_best_key: str
    predicted_best_measured_s: float
    true_best_s: float

    @property
    def best_gap_pct(self) -> float:
        """How much slower (measured) the predicted-best config is than the measured best."""
        return 100.0 * (self.predicted_best_measured_s / self.true_best_s - 1.0)


def measure_network(out: Path) -> Path:
    cmd = [sys.executable, "-m", "orchestrator", "netcal", "--measure", "2", "--ops", "all_reduce,all_gather",
           "--base", DEFAULT_CLUSTER, "--out", _rel(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"netcal failed: {done.stderr.strip().splitlines()[-1:]}")
    print("\n".join(line for line in done.stdout.splitlines() if line.strip()))
    return out


def run_slices(steps: int) -> tuple[SlicePlan, list[Any], float]:
    """Every slice, one local world per (ranks, layers); the results in the plan's order."""
    from trainer.launch import RankFailed, spawn_many

    sweep = yaml.safe_load((ROOT / "search_spaces/default.yaml").read_text())
    slices, results = [], []
    t0 = time.perf_counter()
    for ranks in (1, 2):
        for layers in (1, 2):
            plan = derive_trainer_slices(sweep, ranks=ranks, layers=layers, steps=steps)
            for s, r in zip(plan.slices, spawn_many([s.config for s in plan.slices])):
                if isinstance(r, RankFailed):
                    print(f"slice {s.name} failed: {str(r).splitlines()[0][:200]}")
                    continue
                slices.append(s)
                results.append(r)
    return dataclasses.replace(plan, slices=tuple(slices), ranks=0, layers=0), results, time.perf_counter() - t0


def guided_lines(land: R.Landscape, ranking: guided.PlannerRanking, seed: int, n: int) -> list[Any]:
    """The first ``n`` runs of a guided replay (bench/replay.py's loop, baseline first), as ledger lines."""
    rng = random.Random(seed)
    lines: list[Any] = []
    sampler = R.make_sampler("guided", land, seed, lambda: lines, ranking)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    cfg, configs = land.cfg, land.configs
    study.enqueue_trial(configs.baseline_params(cfg.space))
    seen: dict[str, float] = {}
    for _ in range(20 * n):  # repeated proposals cost no run; bounded all the same
        if len(lines) == n:
            break
        trial = study.ask()
        params, _ = R.suggest(trial, cfg.space, configs.fixed, configs.split_context)
        exact, row = guided.key_of(params), land.rows[land.key(params)]
        if exact not in seen:
            i = rng.randrange(len(row["step_time_samples_s"]))
            seen[exact] = row["step_time_samples_s"][i]
            lines.append(R._line(land, trial.number, params, row, i))
        R._tell(study, trial, seen[exact], row)
    return lines


def verdict(name: str, pred: Mapping[str, float], land: R.Landscape) -> Verdict:
    from scipy.stats import spearmanr

    rows = [r for r in land.rows.values() if R.Landscape.usable(r) and r["key"] in pred]
    errs = {r["key"]: 100.0 * (pred[r["key"]] - r["median_s"]) / r["median_s"] for r in rows}
    worst = max(errs, key=lambda k: abs(errs[k]))
    best = min(rows, key=lambda r: pred[r["key"]])
    rho = spearmanr([pred[r["key"]] for r in rows], [r["median_s"] for r in rows]).statistic
    return Verdict(name, len(rows), statistics.median(abs(e) for e in errs.values()), abs(errs[worst]), worst,
                   float(rho), best["key"], best["median_s"], land.best_s)


def families(params: Mapping[str, Any]) -> list[str]:
    """The knob-family groups a config belongs to, for the error breakdown."""
    pp = params["parallel.pp"]
    out = [f"pp={pp}" + (f" {params['pipeline.schedule']}" if pp == 2 else ""),
           f"recompute={params['recompute.kind']}", f"mbs={params['batch.micro_batch_size']}"]
    if pp == 1:
        out.append(f"pp=1 overlap={'on' if params['data_parallel.overlap_grad_reduce'] else 'off'}")
        out.append(f"pp=1 bucket_mb={params['data_parallel.bucket_mb']}")
    return out


def family_table(preds: Mapping[str, Mapping[str, float]], land: R.Landscape) -> list[str]:
    groups: dict[str, list[str]] = {}
    for r in land.rows.values():
        if R.Landscape.usable(r):
            for g in families(r["params"]):
                groups.setdefault(g, []).append(r["key"])
    names = list(preds)
    lines = ["| configs | n | measured median (ms) | " + " | ".join(f"{n}: median error" for n in names) + " |",
             "|---|---:|---:|" + "---:|" * len(names)]
    for g in sorted(groups):
        keys = groups[g]
        meas = statistics.median(land.rows[k]["median_s"] for k in keys)
        cells = [f"{statistics.median(100 * (preds[n][k] / land.rows[k]['median_s'] - 1) for k in keys):+.0f}%"
                 for n in names]
        lines.append(f"| {g} | {len(keys)} | {1e3 * meas:.1f} | " + " | ".join(cells) + " |")
    return lines


def phase_table(rankings: Mapping[str, guided.PlannerRanking], land: R.Landscape) -> list[str]:
    """Per trainer phase: the measured median over configs, and each planner's median signed error where the
    phase is over 1 ms (a few-microsecond empty wait would read as thousands of percent)."""
    measured = {ph: {} for ph in PHASES}
    for r in land.rows.values():
        for ph, v in (r.get("phases_median_s") or {}).items():
            if ph in measured and R.Landscape.usable(r):
                measured[ph][r["key"]] = v
    predicted: dict[str, dict[str, dict[str, float]]] = {}
    for name, rk in rankings.items():
        per = predicted[name] = {ph: {} for ph in PHASES}
        for k, plan in rk.plans.items():
            p = predict(dataclasses.replace(plan, efficiency=rk.efficiency))
            for ph, terms in PHASES.items():
                per[ph][k] = sum(getattr(p, t) for t in terms)
    names = list(rankings)
    lines = ["| phase | configs over 1 ms | measured median (ms) | " + " | ".join(
        f"{n}: predicted median (ms) / median error" for n in names) + " |", "|---|---:|---:|" + "---|" * len(names)]
    for ph, meas in measured.items():
        keys = [k for k, v in meas.items() if v > 1e-3 and all(k in predicted[n][ph] for n in names)]
        if not keys:
            lines.append(f"| {ph} | 0 | {1e3 * statistics.median(meas.values()):.3f} | " + " | ".join(
                f"{1e3 * statistics.median(predicted[n][ph].values()):.3f} / -" for n in names) + " |")
            continue
        cells = [f"{1e3 * statistics.median(predicted[n][ph][k] for k in keys):.1f} / "
                 f"{statistics.median(100 * (predicted[n][ph][k] / meas[k] - 1) for k in keys):+.0f}%" for n in names]
        lines.append(f"| {ph} | {len(keys)} | {1e3 * statistics.median(meas[k] for k in keys):.1f} | "
                     + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    from results_file import write_and_print

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscape", default=str(ROOT / "bench/results/landscape_default.json"))
    ap.add_argument("--steps", type=int, default=8, help="updates per slice, the first 2 warm-up (default: 8)")
    ap.add_argument("--refit-trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="the guided replay's seed for the refit planner")
    ap.add_argument("--out", default=str(ROOT / "bench/results/slice_proof.md"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    t0 = time.perf_counter()
    started = now()
    cluster_path = measure_network(out.with_name(out.stem + "_cluster.yaml"))
    net_s = time.perf_counter() - t0
    cluster, net_eff = load_cluster(cluster_path)
    # netcal sets only tp_bw_eff to 1 for the intra-node tier it measured (on a multi-node cluster DP and PP
    # cross nodes); on this one host DP's all-reduce and PP's sends run over that same measured gloo link, so
    # the achieved bus bandwidth is theirs too.
    net_eff = dataclasses.replace(net_eff, dp_bw_eff=1.0, pp_bw_eff=1.0)
    plan, results, slices_s = run_slices(args.steps)
    fitted = fit_slices(plan, results, cluster, net_eff)
    slice_eff = fitted.calibration.efficiency
    cal_path = out.with_name(out.stem + "_calibration.yaml")
    write_calibration(dataclasses.replace(fitted.calibration, efficiency=dataclasses.replace(
        slice_eff, basis="fitted", basis_note="bench/slice_proof.py: slices of the default model on this host")),
        cal_path, cluster_file=_rel(cluster_path),
        provenance={"basis": "measured", "command": "bench/slice_proof.py", "date": started,
                    "hardware": hardware_name(results), "shape": dict(plan.shape),
                    "slices": [{"name": n, "measured_step_s": round(raw, 6), "fitted_step_s": round(p, 6)}
                               for n, raw, _, p in fitted.rows],
                    "fitted": sorted(fitted.calibration.fitted),
                    "network": f"{cluster_path.name} (steptune netcal --measure 2), dp/pp_bw_eff 1 on one host"},
        header="# Planner efficiency fitted by bench/slice_proof.py to 1-2 layer slices of the default model.\n"
               "# Use it as sampler.calibration=THIS (guided) or prefilter.calibration; only efficiency: is read back.\n")

    land = R.Landscape.load(args.landscape)
    n_float = len(next(iter(land.floats.values()), [0, 0, 0]))
    prior_cluster, prior_eff = load_cluster(ROOT / DEFAULT_CLUSTER)
    prior = guided.PlannerRanking(land.cfg.space, land.configs, prior_cluster, prior_eff, n_float=n_float)
    sliced = guided.PlannerRanking(land.cfg.space, land.configs, cluster, slice_eff, n_float=n_float)
    lines = guided_lines(land, prior, args.seed, args.refit_trials)
    refit = prior.fresh()
    refit.refit(lines)
    rankings = {"priors": prior, "slice-calibrated": sliced, f"refit on {args.refit_trials} guided trials": refit}
    preds = {n: r.predictions() for n, r in rankings.items()}
    verdicts = [verdict(n, p, land) for n, p in preds.items()]
    wall = time.perf_counter() - t0
    doc = {"command": _command(args), "date": started, "wall_s": round(wall, 1), "netcal_s": round(net_s, 1),
           "slices_s": round(slices_s, 1), "landscape": Path(args.landscape).name,
           "landscape_measured": [land.doc.get("first_run_at"), land.doc.get("last_run_at")],
           "goals": GOALS, "cluster_file": cluster_path.name, "calibration_file": cal_path.name,
           "slice_fit": {"fitted": fitted.calibration.fitted,
                         "rows": [{"name": n, "measured_s": raw, "compared_s": m, "fitted_s": p}
                                  for n, raw, m, p in fitted.rows]},
           "hardware": hardware_name(results), "load_average": _loadavg(),
           "refit_trials": [land.key(_params(land, ln)) for ln in lines],
           "planners": [{**dataclasses.asdict(v), "best_gap_pct": v.best_gap_pct} for v in verdicts]}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    write_and_print(report(doc, verdicts, fitted, rankings, preds, land, args, lines), out)


def _params(land: R.Landscape, line: Any) -> dict[str, Any]:
    """The landscape params of a replayed ledger line (``_line`` keeps the config, not the params)."""
    return next(r["params"] for r in land.rows.values() if R._CONFIGS.get(r["key"]) is line.config)


def _command(args: Any) -> str:
    return (f"PYTHONPATH=. .venv/bin/python bench/slice_proof.py --steps {args.steps} --refit-trials "
            f"{args.refit_trials} --seed {args.seed}")


def report(doc: dict, verdicts: list[Verdict], fitted: Any, rankings: Mapping[str, guided.PlannerRanking],
           preds: Mapping[str, Mapping[str, float]], land: R.Landscape, args: Any, lines: list[Any]) -> str:
    m = land.doc["machine"]
    usable = [r for r in land.rows.values() if R.Landscape.usable(r)]
    spreads = [r["spread_rel"] for r in usable if r.get("spread_rel") is not None]
    out = [
        "# Slices predict what they never ran", "",
        "Command (netcal + slices + predictions; this run took "
        f"{doc['wall_s']:.0f} s: netcal {doc['netcal_s']:.0f} s, slices {doc['slices_s']:.0f} s):", "",
        f"    {doc['command']}", "",
        f"Run {doc['date']} on {doc['hardware']} (1-minute load average at the end: {doc['load_average']}). Landscape `{doc['landscape']}`: {len(usable)} configs of the default "
        f"space measured {str(doc['landscape_measured'][0])[:16]} to {str(doc['landscape_measured'][1])[:16]} UTC "
        f"on {m['cpu']}, {m['cpus']} CPUs, an earlier day, on a machine shared with other jobs (median run-to-run "
        f"spread of a config: {100 * statistics.median(spreads):.0f}%); the slices and netcal ran today, also "
        f"under other sessions' load. Errors are against each config's median of "
        f"{land.doc['repeats']} runs.", "",
        "## Calibration, from slices only", "",
        f"Network: `{doc['cluster_file']}` (`steptune netcal --measure 2 --ops all_reduce,all_gather --base "
        f"{DEFAULT_CLUSTER}`; gloo, 2 ranks): intra-node bus bandwidth "
        f"{rankings['slice-calibrated'].cluster.intra_node_bw_GBps:.3g} GB/s, latency "
        f"{rankings['slice-calibrated'].cluster.intra_node_latency_us:.0f} us (the cpu-local prior: "
        f"{rankings['priors'].cluster.intra_node_bw_GBps:.3g} GB/s, "
        f"{rankings['priors'].cluster.intra_node_latency_us:.0f} us); dp/pp/tp_bw_eff set to 1 (one host: every "
        f"collective runs over the measured link).", "",
        f"Compute: {len(fitted.rows)} slices (`slices.derive_trainer_slices` of the default sweep's trainer "
        "section: 1 and 2 layers, 1 and 2 ranks, pp 1, micro-batch 1/2/4/8 and recompute none/selective/full, "
        f"{args.steps} updates of which 2 warm-up), fitted with `profile.fit_slices` (2-rank slices on their "
        f"phases only) -> `{doc['calibration_file']}`:", "",
        "| slice | measured step (ms) | fitted (ms) | error |", "|---|---:|---:|---:|",
        *[f"| {n} | {1e3 * m_:.1f} | {1e3 * p:.1f} | {100 * (p - m_) / m_:+.0f}% |" for n, _, m_, p in fitted.rows],
        "", "fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in fitted.calibration.fitted.items()), "",
        "## Every landscape config predicted", "",
        f"| planner | configs | median abs error | worst abs error | Spearman | predicted best: its measured median "
        f"vs the true best |", "|---|---:|---:|---:|---:|---|",
    ]
    for v in verdicts:
        out.append(f"| {v.name} | {v.n} | {v.median_abs_err_pct:.1f}% | {v.worst_abs_err_pct:.0f}% | "
                   f"{v.spearman:.3f} | {1e3 * v.predicted_best_measured_s:.1f} ms vs {1e3 * v.true_best_s:.1f} ms: "
                   f"{v.best_gap_pct:+.1f}% ({'within' if v.best_gap_pct <= GOALS['best_within_pct'] else 'NOT within'} 5%) |")
    refit_keys = [land.key(_params(land, ln)) for ln in lines]
    out += ["", f"The refit planner: the guided sampler's own refit (`PlannerRanking.refit`, fields "
            f"`guided.FIT`, from the cpu-local priors) on the first {len(lines)} runs of a guided replay "
            f"(bench/replay.py's `guided` strategy, seed {args.seed}: baseline, 3 spread picks, then refitted "
            f"picks and TPE in turn; one stored sample per run, as a sweep measures it once). "
            f"{sum(k in set(refit_keys) for k in land.rows)} distinct configs; their errors count in its column, "
            f"so it is partly judged on what it was fitted to, unlike the other two."]
    s = next(v for v in verdicts if v.name == "slice-calibrated")
    goals = [("median abs error <= 10%", s.median_abs_err_pct <= GOALS["median_abs_err_pct"],
              f"{s.median_abs_err_pct:.1f}%"),
             ("Spearman >= 0.9", s.spearman >= GOALS["spearman"], f"{s.spearman:.3f}"),
             ("predicted best within 5% of the true best", s.best_gap_pct <= GOALS["best_within_pct"],
              f"{s.best_gap_pct:+.1f}%")]
    true_key = min(usable, key=lambda r: r["median_s"])["key"]
    out += ["", "The predicted best against the true best, each planner's prediction and the measured median:", "",
            "| config | measured (ms) | " + " | ".join(f"{v.name} (ms)" for v in verdicts) + " |",
            "|---|---:|" + "---:|" * len(verdicts)]
    for label, k in [("true best", true_key)] + [(f"{v.name}'s pick", v.predicted_best_key) for v in verdicts]:
        out.append(f"| {label}: `{k}` | {1e3 * land.rows[k]['median_s']:.1f} | "
                   + " | ".join(f"{1e3 * preds[v.name][k]:.1f}" for v in verdicts) + " |")
    out += ["", "## Goals (slice-calibrated)", "",
            *[f"- {g}: {'met' if ok else 'MISSED'} ({val}" + ("" if ok else _by(g, s)) + ")" for g, ok, val in goals],
            "", "## Where the error is", "",
            "Read with the tables below. (1) The best-config miss is the DP bucket size: every planner ranks "
            "`bucket_mb` 0.05 (overlapped, mbs 8, pp 1, no recompute) first, the measurement puts 5 MB first. The "
            "planner underprices a small bucket (the `pp=1 bucket_mb=0.05` rows are under-predicted, the 5 MB rows "
            "over-predicted) because the exposed DP wait (`dp_comm_wait`) is far below the measured one: gloo "
            "pays its ~0.2 ms latency and a dispatch per bucket, on ranks that share 2 cores, and the 2-rank slices "
            "show the same (their step, which holds the DP all-reduce, is predicted far below what they measured; "
            "profile fits compute only, so nothing in the slice fit can absorb it). (2) The pipeline terms: "
            "`pipeline_idle` is under-predicted for every planner (pp=2 1f1b and gpipe over-predicted overall "
            "because the compute is over-priced there while the idle is under-priced; interleaved under-predicted). "
            "(3) `optimizer` is under-predicted by the slice fit: a 1-2 layer slice's optimizer is dominated by "
            "the embeddings and head, so `optimizer_bw_eff` fitted on it does not carry to 6 layers. The refit "
            "planner, fitted to full 6-layer trials, gets the phase split closer but makes the same bucket "
            "choice. (4) Slice noise: the slices run under whatever else loads the machine (the load average "
            "above), and the calibration moves with it from run to run (repeated runs: "
            "docs/planner-validation.md).", "",
            "Median signed error (predicted / measured - 1) per group of configs:", "",
            *family_table(preds, land), "",
            "Per phase (the landscape keeps the trainer's phase times; each rank's sum over microbatches, the "
            "slowest rank), predicted by each planner's breakdown:", "", *phase_table(rankings, land), ""]
    return "\n".join(out)


def _by(goal: str, v: Verdict) -> str:
    if goal.startswith("median"):
        return f", {v.median_abs_err_pct - GOALS['median_abs_err_pct']:.1f} points over"
    if goal.startswith("Spearman"):
        return f", {GOALS['spearman'] - v.spearman:.3f} short"
    return f", {v.best_gap_pct - GOALS['best_within_pct']:.1f} points over"


def _rel(path: Path) -> str:
    """A path as the committed files name it: relative to the repository when inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split()[0]
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
