"""Optuna TPE vs random search on the preset: trials until a config within 2% of the true optimum.

    .venv/bin/python bench/planner_search.py [--seeds 10] [--tpe-cap 600] [--random-cap 6000]

The true optimum comes from enumerating the whole space (bench/planner_speed.py's enumerator), with the
bucket size refined continuously around the best grid points. Both samplers start from the article's
baseline (trial 0, as a sweep enqueues it); configs the model predicts do not fit in memory are
infeasible through ``Trial.set_constraint`` (Optuna 5's replacement for ``constraints_func``), and
configs PlanConfig rejects (e.g. a split that does not divide) count as infeasible trials too. A sampler that does not get there within its cap is reported as ">cap".
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_file import write_and_print  # noqa: E402 (bench/ is the script's own folder)

from orchestrator.planner import apply_params, knob_values, plan_config_from_dict, predict  # noqa: E402
from orchestrator.planner.grid import best_config  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def active(spec: dict, chosen: dict, fixed: dict) -> bool:
    return all(chosen.get(k, fixed.get(k)) in (v if isinstance(v, list) else [v])
               for k, v in spec.get("when", {}).items())


def feasible_splits(spec: dict, layers: int, stages: int) -> dict[int, list[int]]:
    mid, out = stages - 2, {}
    for first in range(spec["first"][0], spec["first"][1] + 1):
        for last in range(spec["last"][0], spec["last"][1] + 1):
            rest = layers - first - last
            if (mid == 0 and rest == 0) or (mid > 0 and rest >= mid and rest % mid == 0):
                out.setdefault(first, []).append(last)
    return out


def suggest(trial: optuna.Trial, space: dict, fixed: dict, layers: int, stages: int) -> dict[str, Any]:
    """The sweep's define-by-run reading of ``space.params`` (categorical, int, float, layer_split, when)."""
    chosen: dict[str, Any] = {}
    for name, spec in space.items():
        if not active(spec, chosen, fixed):
            if "default" in spec:
                chosen[name] = spec["default"]
            continue
        kind = spec["type"]
        if kind == "categorical":
            chosen[name] = trial.suggest_categorical(name, spec["choices"])
        elif kind == "int":
            chosen[name] = trial.suggest_int(name, spec["low"], spec["high"], step=spec.get("step", 1))
        elif kind == "float":
            chosen[name] = trial.suggest_float(name, spec["low"], spec["high"], log=spec.get("log", False))
        else:
            pairs = feasible_splits(spec, layers, stages)
            firsts = sorted(pairs)
            first = trial.suggest_int(f"{name}.first", firsts[0], firsts[-1], step=_step(firsts))
            lasts = sorted(pairs.get(first, [spec["last"][0]]))
            last = trial.suggest_int(f"{name}.last", lasts[0], lasts[-1], step=_step(lasts))
            chosen.update({f"{name}.kind": "first_last", f"{name}.first": first, f"{name}.last": last})
    return chosen


def _step(values: list[int]) -> int:
    return values[1] - values[0] if len(values) > 1 else 1


def true_optimum(base, space: dict) -> tuple[float, dict]:
    """The space's best config: orchestrator.planner.grid.best_config (the grid, then the bucket size refined)."""
    return best_config(base, space)


def run(sampler: optuna.samplers.BaseSampler, base, space: dict, baseline: dict, target: float, cap: int) -> int | None:
    fixed = {**knob_values(base), **baseline}
    layers, stages = base.model.num_layers, base.parallel.pp
    found: list[int] = []

    def objective(trial: optuna.Trial) -> float:
        try:
            cfg = apply_params(base, suggest(trial, space, fixed, layers, stages))
        except ValueError:
            trial.set_constraint("invalid_config", 1.0)
            trial.set_constraint("memory_over_gb", 0.0)
            return 2.0 * target
        p = predict(cfg)
        over = (p.peak_memory_bytes - cfg.cluster.hbm_bytes) / 1e9
        trial.set_constraint("invalid_config", 0.0)
        trial.set_constraint("memory_over_gb", over)
        if over <= 0 and p.step_time_s <= target and not found:
            found.append(trial.number + 1)
            trial.study.stop()
        return p.step_time_s

    study = optuna.create_study(direction="minimize", sampler=sampler)
    study.enqueue_trial(_as_trial_params(baseline, space))
    study.optimize(objective, n_trials=cap)
    return found[0] if found else None


def _as_trial_params(baseline: dict, space: dict) -> dict:
    return {k: v for k, v in baseline.items() if k in space}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default=str(ROOT / "search_spaces/preset-500b.yaml"))
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--within", type=float, default=0.02)
    ap.add_argument("--tpe-cap", type=int, default=600)
    ap.add_argument("--random-cap", type=int, default=6000)
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner_search.md"))
    args = ap.parse_args()
    preset = yaml.safe_load(Path(args.preset).read_text())
    base = apply_params(plan_config_from_dict(preset["planner"]), preset["baseline"])
    space = preset["space"]["params"]
    opt, opt_params = true_optimum(base, space)
    target = opt * (1 + args.within)
    rows = []
    for seed in range(args.seeds):
        t0 = time.perf_counter()
        tpe = run(optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True),
                  base, space, preset["baseline"], target, args.tpe_cap)
        t1 = time.perf_counter()
        rnd = run(optuna.samplers.RandomSampler(seed=seed), base, space, preset["baseline"], target, args.random_cap)
        rows.append((seed, tpe, rnd, t1 - t0, time.perf_counter() - t1))
        print(f"seed {seed}: TPE {tpe}  random {rnd}  ({t1 - t0:.0f} s, {time.perf_counter() - t1:.0f} s)", flush=True)
    show = lambda n, cap: str(n) if n is not None else f">{cap}"  # noqa: E731
    value = lambda n, cap: n if n is not None else cap + 1  # noqa: E731
    tpe_n = [value(r[1], args.tpe_cap) for r in rows]
    rnd_n = [value(r[2], args.random_cap) for r in rows]
    lines = [
        "# Planner search quality: TPE vs random", "",
        f"Command: `.venv/bin/python bench/planner_search.py --seeds {args.seeds} --tpe-cap {args.tpe_cap} "
        f"--random-cap {args.random_cap}`", "",
        f"Optuna {optuna.__version__}; TPESampler(multivariate=True, group=True) vs RandomSampler. Memory is a "
        "constraint (``Trial.set_constraint``, which replaces ``constraints_func`` in Optuna 5): peak GB over the "
        "GPU's HBM, plus 1 for configs PlanConfig rejects. The article's baseline is trial 0 for both.", "",
        f"True optimum {opt:.3f} s/update (enumerated space, bucket refined); target: feasible and <= {target:.3f} s "
        f"(within {100 * args.within:g}%).", "", "```", *(f"{k}: {v}" for k, v in opt_params.items()), "```", "",
        "| seed | TPE trials | random trials |", "|---:|---:|---:|",
        *(f"| {s} | {show(t, args.tpe_cap)} | {show(r, args.random_cap)} |" for s, t, r, _, _ in rows),
        f"| median | {np.median(tpe_n):.0f} | {np.median(rnd_n):.0f} |",
        f"| mean | {np.mean(tpe_n):.0f} | {np.mean(rnd_n):.0f} |", "",
        f"TPE needs {np.median(tpe_n) / np.median(rnd_n):.2f}x random's trials (median; capped runs count as cap + 1, "
        "which flatters whichever sampler hit its cap).", "",
    ]
    write_and_print("\n".join(lines), args.out)


if __name__ == "__main__":
    main()
