"""Slices predict what they never ran: the planner calibrated from slices of a sweep's model at the job's density,
judged on that model's landscape, each prediction with its 90% interval; on two models, measured on one host in
one run.

    PYTHONPATH=. .venv/bin/python bench/slice_proof.py --measure-landscape [--config search_spaces/default.yaml
        --config search_spaces/wide-cpu.yaml] [--sample 80] [--landscape-repeats 3] [--slice-repeats 6]
    PYTHONPATH=. .venv/bin/python bench/slice_proof.py --landscape bench/results/landscape_default.json

**--measure-landscape** (``bench/proof_measure.py``): for each ``--config`` (default: the default sweep and
``search_spaces/wide-cpu.yaml``, another shape), its landscape (every config, or a stratified sample of
``--sample``, each run ``--landscape-repeats`` times) and its slices (``slices.derive_any`` at the job's density:
compute at 1 and 2 layers, data-parallel, pipeline; each ``--slice-repeats`` times), all models' runs in the same
interleaved rounds on one warm Ray worker group; the network first (``steptune netcal --measure 2``, repeated until
each table's fit error is <= 20% or its cap). Samples: ``<out-dir>/<name>.samples.jsonl`` (resumable), each model's
landscape as ``<name>_<model>.json`` (bench/landscape.py's format: bench/replay.py reads it). Then the configs the
goals turn on (the ``--refine-top`` fastest by median and each planner's 3 predicted fastest) are measured again
with their baseline in ``--refine-rounds`` paired rounds (``<name>_<model>.refine.jsonl``): the landscape's
``refined`` block, whose paired ratios are the truth the pick and the guided search are judged by (3-run medians
under a shared machine's noise cannot tell the top configs apart). A rerun resumes every stage.
**--landscape FILE** (one committed landscape, measured earlier on this hardware): only the slices are measured now.

Then, per model: the slices fitted (``calibration.slicefit``: what they pin down, each fitted parameter with its interval
over the rounds, the rest held and named), and every landscape config predicted by the priors (the cluster
file as is) and by the slice calibration, with its 90% interval (``planner.uncertainty``). Reported against each
config's measured median: median and worst |error|, Spearman rank correlation, whether the predicted best is
within 5% of the measured best, how many measured medians the intervals hold, and how many runs a guided search
started from the slice calibration needs to come within 2% of the best (bench/replay.py's guided strategy, seeds
0..``--seeds``-1). Refused before anything runs: a landscape measured for another sweep file than ``--config``, or
on other hardware (``--other-hardware`` runs it anyway, headed as a diagnostic).
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

import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import landscape as LS  # noqa: E402
import proof_measure as PM  # noqa: E402
import replay as R  # noqa: E402

from orchestrator.calibration import guided, hardware, slicefit  # noqa: E402
from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER, write_calibration  # noqa: E402
from orchestrator.calibration.prefilter import load_cluster  # noqa: E402
from orchestrator.planner import predict  # noqa: E402
from orchestrator.planner.uncertainty import intervals  # noqa: E402

GOALS = {"median_abs_err_pct": 10.0, "spearman": 0.9, "best_within_pct": 5.0, "coverage_pct": 80.0,
         "guided_runs": 3}
"""Issue 35: what the slice-calibrated planner must reach on each landscape."""
PHASES = {"forward": ("forward_s",), "backward": ("backward_s", "recompute_s"), "optimizer": ("optimizer_s",),
          "dp_comm_wait": ("dp_exposed_s",), "pipeline_idle": ("pp_bubble_s", "pp_p2p_s")}
"""The trainer's phase (as the landscape stores it) -> the planner's terms that price it."""
DEFAULT_CONFIGS = ("search_spaces/default.yaml", "search_spaces/wide-cpu.yaml")


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
    coverage_pct: float | None = None
    """Share of configs whose measured median lies in the prediction's 90% interval (None: no interval)."""
    median_width_pct: float | None = None
    """The intervals' median width, relative to the point."""

    @property
    def best_gap_pct(self) -> float:
        """How much slower (measured) the predicted-best config is than the measured best."""
        return 100.0 * (self.predicted_best_measured_s / self.true_best_s - 1.0)


def measure_network(out: Path) -> Path:
    """``steptune netcal --measure 2`` (gloo all-reduce and all-gather between 2 local ranks), repeated until each
    table's fit error is <= 20% or netcal's cap: the cluster file the slices are fitted against."""
    cmd = [sys.executable, "-m", "orchestrator", "netcal", "--measure", "2", "--ops", "all_reduce,all_gather",
           "--base", DEFAULT_CLUSTER, "--out", _rel(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"netcal failed: {done.stderr.strip().splitlines()[-1:]}")
    print("\n".join(line for line in (done.stdout + done.stderr).splitlines() if line.strip()))
    return out


def same_hardware(land_doc: dict, config: Path, allow_other: bool) -> str | None:
    """Refuse (SystemExit) a landscape of another sweep file or another machine; with ``allow_other`` the
    hardware difference is returned for the report's heading instead."""
    src = land_doc.get("source")
    if src and Path(src).resolve() != config.resolve() and (ROOT / src).resolve() != config.resolve():
        raise SystemExit(f"--landscape was measured for {src}, --config is {_rel(config)}: give the sweep file it "
                         f"was measured for")
    theirs, ours = str(land_doc["machine"].get("cpu", "?")), hardware.cpu_model().removeprefix("CPU: ")
    if theirs == ours:
        return None
    why = (f"the landscape was measured on {theirs} ({land_doc['machine'].get('cpus')} CPUs), this host is {ours} "
           f"({os.cpu_count()} CPUs)")
    if not allow_other:
        raise SystemExit(f"refused: {why}; slices of this machine say nothing about that landscape. Measure both "
                         f"here in one run (bench/slice_proof.py --measure-landscape --config {_rel(config)}) or run "
                         f"this on that machine (--other-hardware runs it anyway, as a labelled diagnostic)")
    return why


def verdict(name: str, pred: Mapping[str, float], land: R.Landscape,
            iv: Mapping[str, Any] | None = None) -> Verdict:
    from scipy.stats import spearmanr

    rows = [r for r in land.rows.values() if R.Landscape.usable(r) and r["key"] in pred]
    errs = {r["key"]: 100.0 * (pred[r["key"]] - r["median_s"]) / r["median_s"] for r in rows}
    worst = max(errs, key=lambda k: abs(errs[k]))
    best = min(rows, key=lambda r: pred[r["key"]])
    # The pick against the best by the landscape's truth: where refined, each config's paired ratio to the baseline
    # over the refinement's rounds, else its median over the baseline's (bench/replay.py's truth_of), in seconds.
    scale = _truth_scale(land)
    rho = spearmanr([pred[r["key"]] for r in rows], [r["median_s"] for r in rows]).statistic
    cover = width = None
    if iv:
        held = [iv[r["key"]].contains(r["median_s"]) for r in rows if r["key"] in iv]
        cover = 100.0 * sum(held) / len(held)
        width = 100.0 * statistics.median((iv[k].high - iv[k].low) / iv[k].point for k in iv)
    return Verdict(name, len(rows), statistics.median(abs(e) for e in errs.values()), abs(errs[worst]), worst,
                   float(rho), best["key"], land.truth[best["key"]] * scale, land.best * scale, cover, width)


def _truth_scale(land: R.Landscape) -> float:
    """Seconds per unit of ``land.truth``: the baseline's median (truth is a time over the baseline's), else 1."""
    base = land.rows.get(land.doc.get("baseline_key", ""))
    return base["median_s"] if base is not None and R.Landscape.usable(base) else 1.0


def refine_picks(a: "Analysis", top: int, per_planner: int = 3) -> list[str]:
    """The configs the goals turn on: the ``top`` fastest by their median, and each planner's ``per_planner``
    predicted fastest (what "predicted best within 5%" and the guided search compare)."""
    rows = sorted((r for r in a.land.rows.values() if R.Landscape.usable(r)), key=lambda r: r["median_s"])
    keys = [r["key"] for r in rows[:top]]
    for pred in a.preds.values():
        keys += sorted((k for k in pred if k in a.land.rows and R.Landscape.usable(a.land.rows[k])),
                       key=pred.get)[:per_planner]
    return list(dict.fromkeys(keys))


def guided_lines(land: R.Landscape, ranking: guided.PlannerRanking, seed: int, n: int) -> list[Any]:
    """The first ``n`` runs of a guided replay (bench/replay.py's loop, baseline first), as ledger lines. A config
    a sampled landscape did not measure is skipped as bench/replay.py skips it: a trial, but no run."""
    rng = random.Random(seed)
    lines: list[Any] = []
    sampler = R.make_sampler("guided", land, seed, lambda: lines, ranking)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    cfg, configs = land.cfg, land.configs
    base = configs.baseline_params(cfg.space)
    study.enqueue_trial(base)
    skipped = 10.0 * land.rows[land.key(base)]["median_s"]
    seen: dict[str, float] = {}
    for _ in range(20 * n):  # repeated proposals cost no run; bounded all the same
        if len(lines) == n:
            break
        trial = study.ask()
        params, _ = R.suggest(trial, cfg.space, configs.fixed, configs.split_context)
        exact, row = guided.key_of(params), land.rows.get(land.key(params))
        if row is None or not R.Landscape.usable(row):
            R._tell(study, trial, skipped, None)
            continue
        if exact not in seen:
            i = rng.randrange(len(row["step_time_samples_s"]))
            seen[exact] = row["step_time_samples_s"][i]
            lines.append(R._line(land, trial.number, params, row, i))
        R._tell(study, trial, seen[exact], row)
    return lines



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
            if k not in land.rows:
                continue
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
            if k not in land.rows:
                continue
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



@dataclass
class Analysis:
    """One model's proof: its slice fit, its landscape, the planners' predictions and their verdicts."""

    model: PM.Model
    land: R.Landscape
    fit: Any
    rankings: dict[str, guided.PlannerRanking]
    preds: dict[str, dict[str, float]]
    iv: dict[str, Any]
    verdicts: list[Verdict]
    guided_runs: list[int | None]
    cross: str | None = None

    @property
    def sliced(self) -> Verdict:
        return next(v for v in self.verdicts if v.name == "slice-calibrated")

    def goals(self) -> list[tuple[str, bool, str]]:
        s, g = self.sliced, self.guided_runs
        g_med = statistics.median(x if x is not None else 10 ** 6 for x in g)
        return [
            ("median |error| <= 10%", s.median_abs_err_pct <= GOALS["median_abs_err_pct"], f"{s.median_abs_err_pct:.1f}%"),
            ("Spearman >= 0.9", s.spearman >= GOALS["spearman"], f"{s.spearman:.3f}"),
            ("predicted best within 5% of the measured best", s.best_gap_pct <= GOALS["best_within_pct"],
             f"{s.best_gap_pct:+.1f}%"),
            ("the 90% intervals hold >= 80% of the measured medians", (s.coverage_pct or 0) >= GOALS["coverage_pct"],
             f"{s.coverage_pct:.0f}% (median width {s.median_width_pct:.0f}%)"),
            (f"guided search from the slice calibration within 2% of the best in <= {GOALS['guided_runs']} runs "
             f"(median over seeds)", g_med <= GOALS["guided_runs"],
             "runs per seed: " + ", ".join(str(x) if x else ">40" for x in g)),
        ]


def analyse(model: PM.Model, land_doc: dict, runs: Mapping[str, Mapping[int, Any]], cluster: Any, net_eff: Any,
            seeds: int, cross: str | None = None) -> Analysis:
    land = R.Landscape.from_doc(land_doc)
    ran = [s for s in model.slices if runs.get(s.name)]
    fit = slicefit.fit(ran, runs, cluster, net_eff)
    n_float = len(next(iter(land.floats.values()), [0, 0, 0]))
    prior_cluster, prior_eff = load_cluster(ROOT / DEFAULT_CLUSTER)
    prior = guided.PlannerRanking(land.cfg.space, land.configs, prior_cluster, prior_eff, n_float=n_float)
    sliced = guided.PlannerRanking(land.cfg.space, land.configs, cluster, fit.efficiency, n_float=n_float)
    rankings = {"priors": prior, "slice-calibrated": sliced}
    preds = {n: r.predictions() for n, r in rankings.items()}
    keys = [k for k in sliced.plans if k in land.rows and R.Landscape.usable(land.rows[k])]
    # The interval of what the landscape measured: the median of its runs of each config.
    got = intervals([sliced.plans[k] for k in keys], fit.efficiency, fit.uncertainty, runs=land.doc["repeats"])
    iv = {k: g["step_time_s"] for k, g in zip(keys, got)}
    verdicts = [verdict("priors", preds["priors"], land), verdict("slice-calibrated", preds["slice-calibrated"], land, iv)]
    return Analysis(model, land, fit, rankings, preds, iv, verdicts, runs_to_best(land, sliced, range(seeds)), cross)


def write_model(a: Analysis, out_dir: Path, stem: str, doc: dict, cluster_path: Path) -> Path:
    """The model's calibration file and its report; returns the report's path."""
    from results_file import write_and_print

    cal_path = out_dir / f"{stem}_{a.model.name}_calibration.yaml"
    eff = dataclasses.replace(a.fit.efficiency, basis="fitted",
                              basis_note=f"bench/slice_proof.py: slices of the {a.model.name} sweep on this host")
    write_calibration(dataclasses.replace(a.fit.calibration, efficiency=eff), cal_path,
                      cluster_file=_rel(cluster_path), uncertainty=a.fit.uncertainty,
                      provenance={"basis": "measured", "command": doc["command"], "date": doc["date"],
                                  "hardware": doc["hardware"], "density_ranks": doc["ranks"],
                                  "fitted": {k: [round(v, 6), *[round(x, 6) for x in a.fit.interval(k)]]
                                             for k, v in a.fit.fitted.items()},
                                  "held": dict(a.fit.identified.held),
                                  "slices": [{"name": r.name, "role": r.role, "runs": r.runs,
                                              "measured_step_s": round(r.measured_step_s, 6),
                                              "fitted_step_s": round(r.fitted_step_s, 6)} for r in a.fit.rows]},
                      header=f"# Planner efficiency fitted by bench/slice_proof.py to slices of the {a.model.name} "
                             f"sweep.\n# Use it as sampler.calibration=THIS (guided) or planner.calibration_file=THIS.\n")
    path = out_dir / f"{stem}_{a.model.name}.md"
    write_and_print(report(a, doc, cal_path), path)
    return path


def report(a: Analysis, doc: dict, cal_path: Path) -> str:
    land, m = a.land, a.land.doc["machine"]
    usable = [r for r in land.rows.values() if R.Landscape.usable(r)]
    spreads = [r["spread_rel"] for r in usable if r.get("spread_rel") is not None]
    loads = [x for r in land.rows.values() for x in r.get("load_1min", [])]
    title = (f"# Slices against a landscape of OTHER hardware ({a.model.name}): a diagnostic, not a proof"
             if a.cross else f"# Slices predict what they never ran: the {a.model.name} model")
    out = [title, ""]
    if a.cross:
        out += [f"**Not the same hardware: {a.cross}.**", ""]
    out += [f"Command: `{doc['command']}` ({doc['wall_s'] / 60:.0f} min in all, every model of the run).", "",
            f"Run {doc['date']} on {doc['hardware']} ({os.cpu_count()} CPUs; 1-minute load average during the landscape "
            f"runs: median {statistics.median(loads):.1f}, max {max(loads):.1f}). " if loads else "",
            f"Landscape `{Path(doc['landscapes'][a.model.name]).name}`: {len(usable)} configs of the `{a.model.name}` "
            f"space (`{a.model.source}`, {a.model.grid} in all{', a stratified sample' if len(usable) < a.model.grid else ''}"
            f"), {land.doc['repeats']} runs each, measured {str(land.doc.get('first_run_at'))[:16]} to "
            f"{str(land.doc.get('last_run_at'))[:16]} UTC on {m['cpu']}; median run-to-run spread of a config "
            f"{100 * statistics.median(spreads):.0f}%. Errors are against each config's median run.", "",
            f"## The fit, from slices only ({doc['ranks']} ranks each: the job's density)", "",
            f"Network: `{doc['cluster_file']}` (`steptune netcal --measure 2`, repeated until each table's fit error "
            f"is <= 20% or its cap). Slices (`slices.derive_any`, fitted by `calibration.slicefit` -> `{cal_path.name}`):", "",
            "| slice | role | runs | measured step (ms, median run) | fitted (ms) | 90% interval (ms) | error |",
            "|---|---|---:|---:|---:|---|---:|",
            *[f"| {r.name} | {r.role} | {r.runs} | {1e3 * r.measured_step_s:.2f} | {1e3 * r.fitted_step_s:.2f} | "
              f"{1e3 * r.low_s:.2f} - {1e3 * r.high_s:.2f} | {r.error_pct:+.1f}% |" for r in a.fit.rows], "",
            "| fitted | value | 90% interval (bootstrap over the rounds) |", "|---|---:|---|",
            *[f"| `{k}` | {v:.4g} | {a.fit.interval(k)[0]:.4g} - {a.fit.interval(k)[1]:.4g} |"
              for k, v in a.fit.fitted.items()], "",
            "Held at the cluster file's prior (`planner.identify`):", "",
            *[f"- `{k}` = {getattr(a.fit.efficiency, k)}: {why}" for k, why in a.fit.identified.held.items()], ""]
    if a.fit.unpinned:
        out += ["Not pinned down:", "", *[f"- {u.text()}" for u in a.fit.unpinned], ""]
    out += ["## Every landscape config predicted", "",
            "| planner | configs | median abs error | worst abs error | Spearman | predicted best: its measured figure "
            "vs the measured best's | 90% interval holds the median |", "|---|---:|---:|---:|---:|---|---:|"]
    for v in a.verdicts:
        cov = f"{v.coverage_pct:.0f}% (median width {v.median_width_pct:.0f}%)" if v.coverage_pct is not None else "-"
        out.append(f"| {v.name} | {v.n} | {v.median_abs_err_pct:.1f}% | {v.worst_abs_err_pct:.0f}% | {v.spearman:.3f} "
                   f"| {1e3 * v.predicted_best_measured_s:.1f} ms vs {1e3 * v.true_best_s:.1f} ms: {v.best_gap_pct:+.1f}% "
                   f"| {cov} |")
    true_key, scale = land.best_key, _truth_scale(land)
    refined = land.doc.get("refined") or {}
    if refined:
        out += ["", f"A config's measured figure: where refined, its paired ratio to the baseline over "
                    f"{refined['rounds']} refinement rounds (geometric mean) times the baseline's median; else its "
                    f"median. Refined: the baseline, the {len(refined['ratio']) - 1} others that were the fastest "
                    f"by median or a planner's 3 predicted fastest (`--refine-top`, `--refine-rounds`)."]
    out += ["", "The predicted best against the measured best:", "",
            "| config | measured median (ms) | measured figure (ms) | "
            + " | ".join(f"{v.name} (ms)" for v in a.verdicts) + " | 90% interval (ms) |",
            "|---|---:|---:|" + "---:|" * len(a.verdicts) + "---|"]
    for label, k in [("measured best", true_key)] + [(f"{v.name}'s pick", v.predicted_best_key) for v in a.verdicts]:
        iv = a.iv.get(k)
        out.append(f"| {label}: `{k}` | {1e3 * land.rows[k]['median_s']:.1f} | {1e3 * land.truth[k] * scale:.1f} | "
                   + " | ".join(f"{1e3 * a.preds[v.name][k]:.1f}" for v in a.verdicts)
                   + (f" | {1e3 * iv.low:.1f} - {1e3 * iv.high:.1f} |" if iv else " | - |"))
    out += ["", "## Goals (slice-calibrated)", "",
            *[f"- {g}: {'met' if ok else 'MISSED'} ({val})" for g, ok, val in a.goals()], "",
            "## Where the error is", "", where_text(a.sliced, true_key, land, a.rankings), "",
            "Median signed error (predicted / measured - 1) per group of configs:", "",
            *family_table(a.preds, land), "",
            "Per phase (the landscape keeps the trainer's phase times: each rank's sum over microbatches, the slowest "
            "rank), predicted by each planner's breakdown:", "", *phase_table(a.rankings, land), ""]
    return "\n".join(out)


def summary(analyses: Sequence[Analysis], doc: dict, paths: Mapping[str, Path]) -> str:
    out = ["# Slices predict what they never ran: the proof on this machine", "",
           f"Command: `{doc['command']}`; run {doc['date']} on {doc['hardware']} ({os.cpu_count()} CPUs), "
           f"{doc['wall_s'] / 60:.0f} min: the network, then every model's landscape and slices in the same "
           f"interleaved rounds, then the configs the goals turn on in paired rounds. Slices at the job's density ({doc['ranks']} ranks). Per model, the details: "
           + ", ".join(f"[{n}]({p.name})" for n, p in paths.items()) + ".", "",
           "| goal (slice-calibrated planner) | " + " | ".join(a.model.name for a in analyses) + " |",
           "|---|" + "---|" * len(analyses)]
    for i, (g, _, _) in enumerate(analyses[0].goals()):
        out.append(f"| {g} | " + " | ".join(f"{'met' if a.goals()[i][1] else 'MISSED'}: {a.goals()[i][2]}"
                                           for a in analyses) + " |")
    out += ["", "| model | configs measured | priors: median abs error | slice-calibrated: median abs error | "
            "fitted | held at the prior |", "|---|---:|---:|---:|---|---|"]
    for a in analyses:
        pri = next(v for v in a.verdicts if v.name == "priors")
        out.append(f"| {a.model.name} | {a.sliced.n} of {a.model.grid} | {pri.median_abs_err_pct:.1f}% | "
                   f"{a.sliced.median_abs_err_pct:.1f}% | {', '.join(a.fit.fitted)} | "
                   f"{', '.join(a.fit.identified.held)} |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    from results_file import write_and_print

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure-landscape", action="store_true",
                    help="measure each --config's landscape and its slices on this host in one run")
    ap.add_argument("--config", action="append", help="a sweep file (repeat for several; default: "
                    + ", ".join(DEFAULT_CONFIGS) + " with --measure-landscape, else the landscape's own)")
    ap.add_argument("--landscape", help="a landscape measured earlier on this hardware (bench/landscape.py): only the "
                    "slices are measured now")
    ap.add_argument("--sample", type=int, default=80, help="landscape configs per model when the grid is larger "
                    "(a stratified sample, the baseline first; default 80)")
    ap.add_argument("--landscape-repeats", type=int, default=3, help="runs of every landscape config (default 3)")
    ap.add_argument("--slice-repeats", type=int, default=6, help="runs of every slice (default 6)")
    ap.add_argument("--refine-top", type=int, default=8, help="after the landscape: the N fastest configs by median "
                    "and each planner's 3 predicted fastest, re-measured with the baseline in paired rounds (default 8)")
    ap.add_argument("--refine-rounds", type=int, default=8, help="paired rounds of that refinement (0: none; "
                    "default 8)")
    ap.add_argument("--steps", type=int, default=8, help="updates per slice, the first a warm-up (default: 8)")
    ap.add_argument("--seeds", type=int, default=5, help="guided replays from the slice calibration (default 5)")
    ap.add_argument("--seed", type=int, default=0, help="the sample's and the rounds' shuffles")
    ap.add_argument("--other-hardware", action="store_true",
                    help="with --landscape: compare even when it was measured on another machine (a diagnostic)")
    ap.add_argument("--analyse-only", action="store_true", help="measure nothing: analyse the samples file as it is")
    ap.add_argument("--out-dir", default=str(ROOT / "bench/results"))
    ap.add_argument("--name", default="slice_proof", help="stem of every file written (default: slice_proof)")
    args = ap.parse_args(argv)
    if args.refine_rounds < 0:
        raise SystemExit("--refine-rounds: 0 (no refinement) or more")
    if bool(args.measure_landscape) == bool(args.landscape):
        raise SystemExit("give --measure-landscape (landscape and slices measured here) or --landscape FILE")
    for flag, v in (("--sample", args.sample), ("--landscape-repeats", args.landscape_repeats),
                    ("--slice-repeats", args.slice_repeats), ("--seeds", args.seeds), ("--refine-top", args.refine_top)):
        if v < 1:
            raise SystemExit(f"{flag}: need at least 1")
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    samples_path = out_dir / f"{args.name}.samples.jsonl"
    given = None
    if args.landscape:
        given = json.loads(Path(args.landscape).read_text())
        configs = [Path(c) for c in (args.config or [ROOT / given.get("source", DEFAULT_CONFIGS[0])])]
        cross = same_hardware(given, configs[0], args.other_hardware)  # refuses before anything runs
    else:
        configs = [ROOT / c for c in DEFAULT_CONFIGS] if not args.config else [Path(c) for c in args.config]
        cross = None
    models = [PM.plan_model(c, ROOT, args.sample, 2, [1, 2], args.steps, args.seed) for c in configs]
    if given is not None:  # the committed landscape's configs, not a new sample
        models[0].params = [r["params"] for r in given["configs"]]
    if len({m.name for m in models}) < len(models):
        raise SystemExit("--config: two sweep files with the same name: their files would collide")
    ranks = _density(models)
    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), time.perf_counter()
    cluster_path = out_dir / f"{args.name}_cluster.yaml"
    before = out_dir / f"{args.name}.json"
    resumed = samples_path.exists() and before.exists()
    if not args.analyse_only:
        if not (cluster_path.exists() and samples_path.exists()):  # a rerun resumes the run: its network stays
            measure_network(cluster_path)
        PM.measure(models, samples_path, args.landscape_repeats if given is None else 0, args.slice_repeats,
                   seed=args.seed)
    samples = PM.read_samples(samples_path)
    cluster, net_eff = load_cluster(cluster_path)  # netcal set dp/pp/tp_bw_eff to 1: one host, measured link
    doc = {"command": _command(argv), "date": started, "wall_s": time.perf_counter() - t0, "ranks": ranks,
           "hardware": hardware.cpu_model(), "cluster_file": cluster_path.name, "landscapes": {}}
    def analyse_all() -> list[Analysis]:
        out = []
        for m in models:
            if given is not None:
                land_doc, land_path = given, Path(args.landscape)
            else:
                land_path = out_dir / f"{args.name}_{m.name}.json"
                land_doc = landscape_doc(m, samples, land_path, args, doc)
            doc["landscapes"][m.name] = str(land_path)
            out.append(analyse(m, land_doc, PM.slice_runs(samples, m.name), cluster, net_eff, args.seeds, cross))
        return out

    analyses = analyse_all()
    if given is None and args.refine_rounds and not args.analyse_only:
        # The first analysis names the configs the goals turn on; their figures come from paired rounds.
        PM.refine(models, {m.name: out_dir / f"{args.name}_{m.name}.refine.jsonl" for m in models},
                  {a.model.name: refine_picks(a, args.refine_top) for a in analyses}, args.refine_rounds,
                  _command(argv), seed=args.seed)
        analyses = analyse_all()
    doc["wall_s"] = 0.0 if args.analyse_only else time.perf_counter() - t0
    if resumed:  # the run this one resumed (or analyses again): its start, and the walls of every part
        prev = json.loads(before.read_text())
        doc["date"], doc["wall_s"] = prev.get("date", doc["date"]), prev.get("wall_s", 0.0) + doc["wall_s"]
    paths = {a.model.name: write_model(a, out_dir, args.name, doc, cluster_path) for a in analyses}
    (out_dir / f"{args.name}.json").write_text(json.dumps({**doc, "models": {a.model.name: {
        "verdicts": [{**dataclasses.asdict(v), "best_gap_pct": v.best_gap_pct} for v in a.verdicts],
        "guided_runs_to_within_2pct": a.guided_runs, "fitted": a.fit.fitted, "held": a.fit.identified.held,
        "goals": [{"goal": g, "met": ok, "value": val} for g, ok, val in a.goals()]} for a in analyses}}, indent=1))
    write_and_print(summary(analyses, doc, paths), out_dir / f"{args.name}.md")


def _density(models: Sequence[PM.Model]) -> int:
    """The ranks every slice runs on: each model's job density (they must agree: one worker group runs them all)."""
    from orchestrator.calibration.slices import density, job_world

    cluster, _ = load_cluster(ROOT / DEFAULT_CLUSTER)
    got = {density(job_world({"backend": "ray", "resources": {"world_size": m.cfg.resources.world_size}}),
                   cluster.gpus_per_node, os.cpu_count()) for m in models}
    if len(got) != 1:
        raise SystemExit(f"--config: the models' jobs keep different numbers of ranks busy ({sorted(got)}); prove "
                         f"them in separate runs")
    return got.pop()


def landscape_doc(m: PM.Model, samples: Sequence[dict], path: Path, args: Any, doc: dict) -> dict:
    """The model's landscape in bench/landscape.py's format (bench/replay.py reads it), written to ``path``."""
    header = {"space": m.name, "source": m.source, "command": doc["command"], "repeats": args.landscape_repeats,
              "discretised": {LS.BUCKET: m.buckets}, "baseline_key": m.baseline_key, "machine": LS.machine(),
              "started_at": doc["date"], "trainer": m.cfg.trainer, "world_size": m.cfg.resources.world_size,
              "sampled": {"configs": len(m.params), "of": m.grid, "how": "stratified over pipeline layout x "
                          "micro-batch size x recompute kind, the baseline first (bench/proof_measure.py)"},
              "note": "step_time_s per sample: median over measured updates of the slowest rank (trainer summary)"}
    return LS.write(path, header, m.params, PM.landscape_samples(samples, m.name))


def _command(argv: Sequence[str] | None) -> str:
    return "PYTHONPATH=. .venv/bin/python bench/slice_proof.py " + " ".join(
        a for a in (argv if argv is not None else sys.argv[1:]) if a != "--analyse-only")


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
