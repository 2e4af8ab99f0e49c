"""bench/slice_proof.py's pure parts: which configs the refinement re-measures, and the pick judged by the truth."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import proof_measure as PM  # noqa: E402
import replay as R  # noqa: E402
import slice_proof as SP  # noqa: E402


def _land(medians: dict[str, float | None], ratios: dict[str, float] | None = None) -> R.Landscape:
    rows = {k: {"key": k, "params": {"k": k}, "status": "ok" if m else "oom", "median_s": m,
                "step_time_samples_s": [m] if m else []} for k, m in medians.items()}
    doc = {"baseline_key": "base", "configs": list(rows.values()), "refined": {"ratio": ratios} if ratios else None}
    return R.Landscape(doc=doc, cfg=None, configs=None, rows=rows, floats={}, truth=R.truth_of(doc))


def test_the_refinement_takes_the_fastest_by_median_and_each_planners_picks_once():
    land = _land({"base": 1.0, "a": 0.30, "b": 0.31, "c": 0.32, "d": 0.50, "e": 0.60, "oom": None})
    a = SimpleNamespace(land=land, preds={"priors": {"e": 0.1, "d": 0.2, "a": 0.3, "b": 0.4, "oom": 0.01},
                                          "slice-calibrated": {"b": 0.1, "c": 0.2, "base": 0.3, "e": 0.4}})
    # two fastest by median, then each planner's three predicted fastest that ran ok, each key once, in that order
    assert SP.refine_picks(a, 2) == ["a", "b", "e", "d", "c", "base"]
    assert SP.refine_picks(a, 0, per_planner=1) == ["e", "b"]


def test_the_pick_is_judged_by_the_refined_truth_not_by_its_three_run_median():
    # "a" looked fastest over its three runs (0.30 s) but its paired rounds put it 10% over "b" (0.33 vs 0.30 of
    # the baseline's 1.0 s); the planner that picked "b" picked the best.
    medians = {"base": 1.0, "a": 0.30, "b": 0.31, "c": 0.40}
    land = _land(medians, {"base": 1.0, "a": 0.33, "b": 0.30})
    v = SP.verdict("x", {"base": 1.0, "a": 0.35, "b": 0.31, "c": 0.45}, land)
    assert v.predicted_best_key == "b" and v.best_gap_pct == pytest.approx(0.0)
    v = SP.verdict("y", {"base": 1.0, "a": 0.29, "b": 0.31, "c": 0.45}, land)
    assert v.predicted_best_key == "a" and v.best_gap_pct == pytest.approx(10.0)
    assert v.median_abs_err_pct == pytest.approx(R.statistics.median([0, 100 * 0.01 / 0.30, 0, 100 * 0.05 / 0.40]))
    # without a refinement the truth is each median over the baseline's: the gap is the medians'
    plain = SP.verdict("y", {"base": 1.0, "a": 0.29, "b": 0.31, "c": 0.45}, _land(medians))
    assert plain.predicted_best_key == "a" and plain.best_gap_pct == pytest.approx(0.0)
    assert SP.verdict("z", {"base": 1.0, "a": 0.5, "b": 0.5, "c": 0.1}, _land(medians)).best_gap_pct == \
        pytest.approx(100 * (0.40 / 0.30 - 1))


def test_the_stratified_sample_keeps_the_baseline_first_and_every_stratum():
    params = [{"parallel.pp": pp, "batch.micro_batch_size": m, "recompute.kind": r, "data_parallel.bucket_mb": b}
              for pp in (1, 2) for m in (1, 2, 4) for r in ("none", "full") for b in (0.1, 1.0, 10.0)]
    base = params[0]
    got = PM.stratified_sample(params, base, 13)
    assert got[0] == base and len(got) == 13 and base not in got[1:]
    assert {PM.strata_of(p) for p in got[1:]} == {PM.strata_of(p) for p in params}  # 12 strata, one each
    assert PM.stratified_sample(params[:5], base, 13)[0] == base
