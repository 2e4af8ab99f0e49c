"""The guided sampler's online refit alone, on a measured landscape: no slices, nothing measured anew.

    PYTHONPATH=. .venv/bin/python bench/refit_replay.py [--fit FIELD,FIELD,...] [--trials 20] [--seed 0]
        [--landscape bench/results/landscape_default.json]

The planner from cpu-local.yaml's priors is refitted (``PlannerRanking.refit``, fields ``--fit``, default
``guided.FIT``) on the first ``--trials`` runs of a guided replay (bench/replay.py's ``guided`` strategy) and
judged on every config of the landscape (median |error|, Spearman, the predicted best's measured median against
the true best), then the runs a guided replay from the priors needs to come within 2% of the best (seeds 0-2).
Planner arithmetic on the landscape's own measurements, so there is no hardware to mismatch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import replay as R  # noqa: E402
import slice_proof as SP  # noqa: E402

from orchestrator.calibration import guided  # noqa: E402
from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER  # noqa: E402
from orchestrator.calibration.prefilter import load_cluster  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fit", default=",".join(guided.FIT))
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--landscape", default=str(ROOT / "bench/results/landscape_default.json"))
    args = ap.parse_args(argv)
    guided.FIT = tuple(f for f in args.fit.split(",") if f)
    land = R.Landscape.load(args.landscape)
    n_float = len(next(iter(land.floats.values()), [0, 0, 0]))
    cluster, eff = load_cluster(ROOT / DEFAULT_CLUSTER)
    prior = guided.PlannerRanking(land.cfg.space, land.configs, cluster, eff, n_float=n_float)
    refit = prior.fresh()
    refit.refit(SP.guided_lines(land, prior, args.seed, args.trials))
    v = SP.verdict("refit", refit.predictions(), land)
    print(f"fit {','.join(guided.FIT)}: median |error| {v.median_abs_err_pct:.1f}%, Spearman {v.spearman:.3f}, "
          f"predicted best {v.best_gap_pct:+.1f}% vs the true best; pick {v.predicted_best_key}")
    print("fitted: " + ", ".join(f"{k} = {getattr(refit.efficiency, k):.4g}" for k in guided.FIT))
    print("guided runs to within 2% from the priors (seeds 0-2, cap 12):", SP.runs_to_best(land, prior, range(3), cap=12))


if __name__ == "__main__":
    main()
