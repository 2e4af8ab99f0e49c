"""Slices predict what they never ran: the planner calibrated from 1-2 layer slices of a sweep's model and a gloo
netcal table on this machine, judged on every config of that sweep's measured landscape (bench/landscape.py).

    PYTHONPATH=. .venv/bin/python bench/slice_proof.py [--config search_spaces/default.yaml]
        [--landscape bench/results/landscape_default.json] [--steps 8] [--repeats 3] [--refit-trials 20]
        [--seed 0] [--out bench/results/slice_proof.md]

1. Network: ``steptune netcal --measure 2 --ops all_reduce,all_gather`` over cpu-local.yaml (gloo, 2 ranks on
   this host) -> ``<out>_cluster.yaml`` (+ the two nccl-tests-format tables beside it).
2. Compute and data-parallel communication: ``slices.derive_any`` of ``--config`` (its trainer section) at 1 and
   2 ranks, 1 and 2 layers (pp 1), every micro-batch size and recompute kind of the space once each, plus the
   2-rank data-parallel slices (each bucket size of the space, overlap off and on); every slice ``--repeats``
   times, round by round; compute fitted with ``profile.fit_slices`` on each slice's median run, DP
   communication with ``commfit.fit_dp_comm`` (medians, bootstrap intervals) -> ``<out>_calibration.yaml``.
3. Three planners predict every landscape config (``guided.PlannerRanking``: ``prefilter.plan_for_trial`` as a
   sweep maps it): priors (cpu-local.yaml as is); slice-calibrated (1 + 2); refitted on the first
   ``--refit-trials`` runs a guided replay (bench/replay.py's ``guided`` strategy, seed ``--seed``) measures,
   i.e. the guided sampler's own online refit (``PlannerRanking.refit``) on those runs.
Reported per planner: median and worst |error| against each config's measured median step time, Spearman rank
correlation, and whether the predicted-best config's measured median is within 5% of the measured best; then
where the error comes from, by knob family and per phase (the landscape stores the trainer's phase times).

Refused before anything runs: a landscape measured for another sweep file than ``--config``, or on other
hardware than this host (its ``machine.cpu`` against this CPU model): slices of one machine say nothing about
another's landscape. ``--other-hardware`` runs it anyway and the report is headed as a cross-hardware
diagnostic, not a proof.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
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

from orchestrator.plan import commfit, guided, hardware  # noqa: E402
from orchestrator.plan.calibration import DEFAULT_CLUSTER, write_calibration  # noqa: E402
from orchestrator.plan.prefilter import load_cluster  # noqa: E402
from orchestrator.plan.prefilter import plan_for_trial  # noqa: E402
from orchestrator.plan.profile import fit_slices, hardware_name, now, run_slices as run_on  # noqa: E402
from orchestrator.plan.stability import median_run  # noqa: E402
from orchestrator.plan.slices import SlicePlan, derive_any  # noqa: E402
from orchestrator.planner import predict  # noqa: E402

GOALS = {"median_abs_err_pct": 10.0, "spearman": 0.9, "best_within_pct": 5.0}
"""Issues 23 and 28: what the slice-calibrated planner must reach."""
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


def run_slices(sweep: Mapping[str, Any], steps: int, repeats: int) -> tuple[SlicePlan, list[Any], tuple, dict, float]:
    """Every slice ``repeats`` times, round by round; (the compute slices that ran, their median runs, the DP
    slices, every run per slice name, seconds)."""
    plan, comm = derive_any(sweep, [1, 2], [1, 2], steps=steps)
    every = list(plan.slices) + list(comm)
    t0 = time.perf_counter()
    runs: dict[str, list[Any]] = {s.name: [] for s in every}
    for rnd in range(repeats):
        results, _ = run_on([s.config for s in every], "cpu", None)
        for s, r in zip(every, results):
            if isinstance(r, BaseException):
                print(f"slice {s.name} (round {rnd + 1}) failed: {str(r).splitlines()[0][:200]}")
            else:
                runs[s.name].append(r)
    kept = [s for s in plan.slices if runs[s.name]]
    return (dataclasses.replace(plan, slices=tuple(kept)), [median_run(runs[s.name]) for s in kept], comm, runs,
            time.perf_counter() - t0)


def same_hardware(land: R.Landscape, config: Path, allow_other: bool) -> str | None:
    """Refuse (SystemExit) a landscape of another sweep file or another machine; with ``allow_other`` the
    hardware difference is returned for the report's heading instead."""
    src = land.doc.get("source")
    if src and Path(src).resolve() != config.resolve() and (ROOT / src).resolve() != config.resolve():
        raise SystemExit(f"--landscape was measured for {src}, --config is {_rel(config)}: give the sweep file it "
                         f"was measured for")
    theirs, ours = str(land.doc["machine"].get("cpu", "?")), hardware.cpu_model().removeprefix("CPU: ")
    if theirs == ours:
        return None
    why = (f"the landscape was measured on {theirs} ({land.doc['machine'].get('cpus')} CPUs), this host is {ours} "
           f"({os.cpu_count()} CPUs)")
    if not allow_other:
        raise SystemExit(f"refused: {why}; slices of this machine say nothing about that landscape. Measure the "
                         f"landscape here (bench/landscape.py --config {_rel(config)}) or run this on that machine "
                         f"(--other-hardware runs it anyway, as a labelled diagnostic)")
    return why


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
    ap.add_argument("--config", help="the sweep file the landscape was measured for (default: the landscape's own)")
    ap.add_argument("--landscape", default=str(ROOT / "bench/results/landscape_default.json"))
    ap.add_argument("--steps", type=int, default=8, help="updates per slice, the first a warm-up (default: 8)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of every slice, round by round (default: 3)")
    ap.add_argument("--refit-trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0, help="the guided replay's seed for the refit planner")
    ap.add_argument("--other-hardware", action="store_true",
                    help="compare even when the landscape was measured on another machine (a labelled diagnostic)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/slice_proof.md"))
    args = ap.parse_args(argv)
    land = R.Landscape.load(args.landscape)
    config = Path(args.config or ROOT / land.doc.get("source", "search_spaces/default.yaml"))
    cross = same_hardware(land, config, args.other_hardware)  # refuses before anything runs
    sweep = yaml.safe_load(config.read_text())
    out = Path(args.out)
    t0 = time.perf_counter()
    started = now()
    cluster_path = measure_network(out.with_name(out.stem + "_cluster.yaml"))
    net_s = time.perf_counter() - t0
    cluster, net_eff = load_cluster(cluster_path)  # netcal set dp/pp/tp_bw_eff to 1: one host, measured link
    plan, results, comm, runs, slices_s = run_slices(sweep, args.steps, args.repeats)
    fitted = fit_slices(plan, results, cluster, net_eff)
    slice_eff = fitted.calibration.efficiency
    comm_fit, comm_note = None, ""
    obs = [commfit.DPObservation(c.name, plan_for_trial(c.config, cluster, slice_eff), tuple(
        float((r.phases.get("dp_comm_wait") or {}).get("max") or 0.0) for r in runs[c.name]))
        for c in comm if runs[c.name]]
    try:
        comm_fit = commfit.fit_dp_comm(obs, slice_eff)
        if comm_fit.refusal:
            comm_note = f"refused: {comm_fit.refusal}"
        else:
            slice_eff = comm_fit.efficiency(slice_eff)
    except ValueError as e:
        comm_note = f"refused: {e}"
    name = sweep.get("name", config.stem)
    cal_path = out.with_name(out.stem + "_calibration.yaml")
    write_calibration(dataclasses.replace(fitted.calibration, efficiency=dataclasses.replace(
        slice_eff, basis="fitted", basis_note=f"bench/slice_proof.py: slices of the {name} sweep on this host"),
        fitted={**fitted.calibration.fitted, **(comm_fit.values if comm_fit and not comm_note else {})}),
        cal_path, cluster_file=_rel(cluster_path),
        provenance={"basis": "measured", "command": "bench/slice_proof.py", "date": started,
                    **hardware.identity(results, cluster.peak_tflops), "shape": dict(plan.shape),
                    "repeats": args.repeats,
                    "slices": [{"name": n, "measured_step_s": round(raw, 6), "fitted_step_s": round(p, 6)}
                               for n, raw, _, p in fitted.rows],
                    "dp_comm": commfit.provenance(comm_fit) if comm_fit else comm_note,
                    "fitted": sorted(fitted.calibration.fitted),
                    "network": f"{cluster_path.name} (steptune netcal --measure 2)"},
        header=f"# Planner efficiency fitted by bench/slice_proof.py to 1-2 layer slices of the {name} sweep.\n"
               "# Use it as sampler.calibration=THIS (guided) or prefilter.calibration; only efficiency: is read back.\n")

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
    guided_runs = runs_to_best(land, sliced, range(5))
    wall = time.perf_counter() - t0
    doc = {"command": _command(args), "date": started, "wall_s": round(wall, 1), "netcal_s": round(net_s, 1),
           "slices_s": round(slices_s, 1), "landscape": Path(args.landscape).name, "config": _rel(config),
           "sweep_name": name, "cross_hardware": cross,
           "landscape_measured": [land.doc.get("first_run_at"), land.doc.get("last_run_at")],
           "goals": GOALS, "cluster_file": cluster_path.name, "calibration_file": cal_path.name,
           "slice_fit": {"fitted": fitted.calibration.fitted,
                         "rows": [{"name": n, "measured_s": raw, "compared_s": m, "fitted_s": p}
                                  for n, raw, m, p in fitted.rows]},
           "dp_comm": commfit.provenance(comm_fit) if comm_fit else None, "dp_comm_note": comm_note,
           "guided_runs_to_within_2pct": guided_runs,
           "hardware": hardware_name(results), "load_average": _loadavg(),
           "refit_trials": [land.key(_params(land, ln)) for ln in lines],
           "planners": [{**dataclasses.asdict(v), "best_gap_pct": v.best_gap_pct} for v in verdicts]}
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    write_and_print(report(doc, verdicts, fitted, comm_fit, rankings, preds, land, args, lines), out)


def runs_to_best(land: R.Landscape, ranking: guided.PlannerRanking, seeds: Any, frac: float = 0.02,
                 cap: int = 40) -> list[int | None]:
    """Per seed: how many runs a guided replay started from ``ranking`` (the slice calibration) needs until one
    of its configs is truly within ``frac`` of the best (None: not within ``cap`` runs)."""
    out = []
    for seed in seeds:
        lines = guided_lines(land, ranking.fresh(), seed, cap)
        hit = next((i + 1 for i, ln in enumerate(lines) if land.within(land.key(_params(land, ln)), frac)), None)
        out.append(hit)
    return out


def _params(land: R.Landscape, line: Any) -> dict[str, Any]:
    """The landscape params of a replayed ledger line (``_line`` keeps the config, not the params)."""
    return next(r["params"] for r in land.rows.values() if R._CONFIGS.get(r["key"]) is line.config)


def _command(args: Any) -> str:
    extra = (f" --config {args.config}" if args.config else "") + (
        f" --landscape {_rel(Path(args.landscape))}" if args.landscape else "") + (
        " --other-hardware" if args.other_hardware else "")
    return (f"PYTHONPATH=. .venv/bin/python bench/slice_proof.py{extra} --steps {args.steps} --repeats "
            f"{args.repeats} --refit-trials {args.refit_trials} --seed {args.seed}")


def report(doc: dict, verdicts: list[Verdict], fitted: Any, comm_fit: Any, rankings: Mapping[str, guided.PlannerRanking],
           preds: Mapping[str, Mapping[str, float]], land: R.Landscape, args: Any, lines: list[Any]) -> str:
    m = land.doc["machine"]
    name = doc["sweep_name"]
    usable = [r for r in land.rows.values() if R.Landscape.usable(r)]
    spreads = [r["spread_rel"] for r in usable if r.get("spread_rel") is not None]
    sl = rankings["slice-calibrated"]
    title = ("# Slices against a landscape of OTHER hardware: a diagnostic, not a proof" if doc["cross_hardware"]
             else "# Slices predict what they never ran")
    net = yaml.safe_load((Path(args.out).parent / doc["cluster_file"]).read_text())
    tables = ", ".join(f"{s_['collective']} fit error {100 * s_['fit_rel_rms']:.0f}%"
                       for s_ in net["provenance"]["sources"])
    out = [title, ""]
    if doc["cross_hardware"]:
        out += [f"**Not the same hardware: {doc['cross_hardware']}.** The figures below compare slices of this "
                "host with a landscape of another; they say whether the pricing ranks configs the same way, not "
                "how well slices predict their own machine.", ""]
    out += [
        "Command (netcal + slices + predictions; this run took "
        f"{doc['wall_s']:.0f} s: netcal {doc['netcal_s']:.0f} s, slices {doc['slices_s']:.0f} s):", "",
        f"    {doc['command']}", "",
        f"Run {doc['date']} on {doc['hardware']} (1-minute load average at the end: {doc['load_average']}). "
        f"Landscape `{doc['landscape']}`: {len(usable)} configs of the `{name}` space (`{doc['config']}`) measured "
        f"{str(doc['landscape_measured'][0])[:16]} to {str(doc['landscape_measured'][1])[:16]} UTC on {m['cpu']}, "
        f"{m['cpus']} CPUs (median run-to-run spread of a config: {100 * statistics.median(spreads):.0f}%); the "
        f"slices and netcal ran today, under other sessions' load. Errors are against each config's median of "
        f"{land.doc['repeats']} runs.", "",
        "## Calibration, from slices only", "",
        f"Network: `{doc['cluster_file']}` (`steptune netcal --measure 2 --ops all_reduce,all_gather --base "
        f"{DEFAULT_CLUSTER}`; gloo, 2 ranks): intra-node bus bandwidth {sl.cluster.intra_node_bw_GBps:.3g} GB/s, "
        f"latency {sl.cluster.intra_node_latency_us:.0f} us per hop ({tables}; the cpu-local prior: "
        f"{rankings['priors'].cluster.intra_node_bw_GBps:.3g} GB/s, "
        f"{rankings['priors'].cluster.intra_node_latency_us:.0f} us); netcal wrote dp/pp/tp_bw_eff 1 (one host: "
        f"every group runs over the measured link).", "",
        f"Compute: {len(fitted.rows)} slices (`slices.derive_any` of the `{name}` sweep's trainer section: "
        f"{', '.join(f'{k} {v}' for k, v in sorted(land.doc.get('trainer', {}).get('model', {}).items()))}; 1 and 2 "
        f"layers, 1 and 2 ranks, pp 1, each micro-batch size and recompute kind of the space once; {args.steps} "
        f"updates of which 1 warm-up; {args.repeats} rounds, each slice's median run), fitted with "
        f"`profile.fit_slices` (2-rank slices on their phases only) -> `{doc['calibration_file']}`:", "",
        "| slice | measured step (ms, median run) | fitted (ms) | error |", "|---|---:|---:|---:|",
        *[f"| {n} | {1e3 * m_:.1f} | {1e3 * p:.1f} | {100 * (p - m_) / m_:+.0f}% |" for n, _, m_, p in fitted.rows],
        "", "fitted: " + ", ".join(f"{k} = {v:.4g}" for k, v in fitted.calibration.fitted.items()), "",
        "Data-parallel communication (`commfit.fit_dp_comm`: 2-rank, most-layers slices at each bucket size, "
        "overlap off and on; each slice's median `dp_comm_wait` over its rounds; 90% intervals by bootstrap over "
        "the rounds):", ""]
    if comm_fit is not None:
        out += ["```", commfit.format_comm_fit(comm_fit), "```", ""]
    if doc["dp_comm_note"]:
        out += [f"DP fit {doc['dp_comm_note']}; the slice-calibrated planner keeps the cluster file's DP terms.", ""]
    out += ["## Every landscape config predicted", "",
            "| planner | configs | median abs error | worst abs error | Spearman | predicted best: its measured median "
            "vs the true best |", "|---|---:|---:|---:|---:|---|"]
    for v in verdicts:
        out.append(f"| {v.name} | {v.n} | {v.median_abs_err_pct:.1f}% | {v.worst_abs_err_pct:.0f}% | "
                   f"{v.spearman:.3f} | {1e3 * v.predicted_best_measured_s:.1f} ms vs {1e3 * v.true_best_s:.1f} ms: "
                   f"{v.best_gap_pct:+.1f}% ({'within' if v.best_gap_pct <= GOALS['best_within_pct'] else 'NOT within'} 5%) |")
    refit_keys = [land.key(_params(land, ln)) for ln in lines]
    out += ["", f"The refit planner: the guided sampler's own refit (`PlannerRanking.refit`, fields "
            f"`guided.FIT`, from the cpu-local priors) on the first {len(lines)} runs of a guided replay "
            f"(bench/replay.py's `guided` strategy, seed {args.seed}). "
            f"{sum(k in set(refit_keys) for k in land.rows)} distinct configs; their errors count in its column, "
            f"so it is partly judged on what it was fitted to, unlike the other two."]
    s = next(v for v in verdicts if v.name == "slice-calibrated")
    g = doc["guided_runs_to_within_2pct"]
    g_med = statistics.median(x if x is not None else 10 ** 6 for x in g)
    goals = [("median abs error <= 10%", s.median_abs_err_pct <= GOALS["median_abs_err_pct"],
              f"{s.median_abs_err_pct:.1f}%"),
             ("Spearman >= 0.9", s.spearman >= GOALS["spearman"], f"{s.spearman:.3f}"),
             ("predicted best within 5% of the true best", s.best_gap_pct <= GOALS["best_within_pct"],
              f"{s.best_gap_pct:+.1f}%"),
             ("guided search from the slice calibration within 2% of the best in <= 3 runs (median over seeds 0-4)",
              g_med <= 3, f"runs per seed: {', '.join(str(x) if x else '>40' for x in g)}")]
    true_key = min(usable, key=lambda r: r["median_s"])["key"]
    out += ["", "The predicted best against the true best, each planner's prediction and the measured median:", "",
            "| config | measured (ms) | " + " | ".join(f"{v.name} (ms)" for v in verdicts) + " |",
            "|---|---:|" + "---:|" * len(verdicts)]
    for label, k in [("true best", true_key)] + [(f"{v.name}'s pick", v.predicted_best_key) for v in verdicts]:
        out.append(f"| {label}: `{k}` | {1e3 * land.rows[k]['median_s']:.1f} | "
                   + " | ".join(f"{1e3 * preds[v.name][k]:.1f}" for v in verdicts) + " |")
    out += ["", "## Goals (slice-calibrated)", "",
            *[f"- {g_}: {'met' if ok else 'MISSED'} ({val}" + ("" if ok or 'guided' in g_ else _by(g_, s)) + ")"
              for g_, ok, val in goals],
            "", "## Where the error is", "", where_text(s, true_key, land, rankings), "",
            "Median signed error (predicted / measured - 1) per group of configs:", "",
            *family_table(preds, land), "",
            "Per phase (the landscape keeps the trainer's phase times; each rank's sum over microbatches, the "
            "slowest rank), predicted by each planner's breakdown:", "", *phase_table(rankings, land), ""]
    return "\n".join(out)


def where_text(v: Verdict, true_key: str, land: R.Landscape, rankings: Mapping[str, guided.PlannerRanking]) -> str:
    """The slice-calibrated planner's miss in words, from the data: how its pick differs from the true best,
    and the phase whose median error is largest."""
    pick, best = land.rows[v.predicted_best_key]["params"], land.rows[true_key]["params"]
    diff = [f"`{k}` {pick.get(k)} where the best has {best.get(k)}" for k in sorted(set(pick) | set(best))
            if pick.get(k) != best.get(k)]
    rk = rankings["slice-calibrated"]
    errs = {}
    for ph, terms in PHASES.items():
        e = []
        for k, plan in rk.plans.items():
            meas = (land.rows[k].get("phases_median_s") or {}).get(ph)
            if meas and meas > 1e-3 and R.Landscape.usable(land.rows[k]):
                p = predict(dataclasses.replace(plan, efficiency=rk.efficiency))
                e.append(100 * (sum(getattr(p, t) for t in terms) / meas - 1))
        if e:
            errs[ph] = statistics.median(e)
    worst = max(errs, key=lambda k: abs(errs[k])) if errs else None
    pick_txt = ("Its pick is the true best." if not diff else
                f"Its pick differs from the true best in {'; '.join(diff)} ({v.best_gap_pct:+.1f}% measured).")
    phase_txt = (f" The phase it prices worst is `{worst}` (median error {errs[worst]:+.0f}% over configs where it "
                 f"is over 1 ms); per phase: " + ", ".join(f"{k} {e_:+.0f}%" for k, e_ in errs.items()) + "."
                 if worst else "")
    return f"Slice-calibrated planner: {pick_txt}{phase_txt}"


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
