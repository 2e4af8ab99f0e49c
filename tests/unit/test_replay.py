"""bench/replay.py: a replay is a function of its seed; settling judged by the sweep's own decision."""

from __future__ import annotations

import dataclasses
import math
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import replay as R  # noqa: E402

from orchestrator.records import answer as A  # noqa: E402
from orchestrator.calibration.prefilter import load_cluster  # noqa: E402


@pytest.fixture(scope="module")
def world():
    _, prior = load_cluster(ROOT / "search_spaces/clusters/cpu-local.yaml")
    truth = dataclasses.replace(prior, matmul_eff=0.15, op_overhead_us=600.0)
    land = R.Landscape.from_doc(R.synthetic(truth, noise_rel=0.05, seed=2))
    return land, R.ranking_for(land)


@pytest.mark.parametrize("strategy", ["random", "tpe", "guided"])
def test_replay_is_deterministic_for_a_seed(world, strategy):
    land, ranking = world
    a = R.replay(strategy, land, 7, cap=20, budget=10, ranking=ranking)
    b = R.replay(strategy, land, 7, cap=20, budget=10, ranking=ranking)
    assert a == b
    others = [R.replay(strategy, land, s, cap=20, budget=10, ranking=ranking) for s in (8, 9)]
    assert any(o.reach != a.reach or o.planner_err != a.planner_err or o.extra_runs != a.extra_runs
               for o in others)  # the seed matters


def _rows(d):
    return {k: {"key": k, "params": {"k": k}, "status": "ok", "step_time_samples_s": v,
                "median_s": sorted(v)[len(v) // 2]} for k, v in d.items()}


def _land(rows, refined=None):
    refined = refined or {}
    return R.Landscape(doc={"baseline_key": "base"}, cfg=None, configs=None, rows=rows, floats={}, refined=refined,
                       refined_rounds=len({n for v in refined.values() for n in v}))


def test_settling_runs_rounds_and_drops_a_lucky_sample():
    rows = _rows({"base": [0.200, 0.201, 0.199], "lucky": [0.130, 0.130, 0.130],  # one 80 ms sample by luck
                  "steady": [0.089, 0.090, 0.091], "slow": [0.190, 0.190, 0.190]})
    land = _land(rows)
    seen = {"base": [0.2], "lucky": [0.080], "steady": [0.090], "slow": [0.190]}
    assert min(seen, key=lambda k: min(seen[k])) == "lucky"
    ties, extra = R.declare(seen, land, random.Random(0), base="base")
    assert ties == ["steady"]
    assert 0 < extra <= A.RULE.max_rounds * (1 + A.RULE.top_k)


def test_configs_the_landscape_cannot_separate_are_declared_a_tie_not_a_wrong_single_winner():
    # "b" is truly 3% slower than "a", inside their own run-to-run noise (about 30%): over many seeds the answer
    # is a tie of both, or "a" alone, never "b" named alone as if certain.
    rows = _rows({"base": [0.2, 0.22, 0.18], "a": [0.09, 0.10, 0.11, 0.12], "b": [0.093, 0.103, 0.113, 0.124]})
    land = _land(rows)
    answers = [R.declare({"base": [0.2], "a": [0.1], "b": [0.103]}, land, random.Random(seed), base="base")[0]
               for seed in range(12)]
    assert all(sorted(t) == ["a", "b"] or t == ["a"] for t in answers), answers
    assert sum(len(t) == 2 for t in answers) >= 6  # mostly a declared tie


def test_the_sweep_summary_reports_the_same_decision_from_a_ledger():
    from datetime import datetime, timezone

    from orchestrator.records.record import Metrics, ParityVerdict, TrialRecord
    from orchestrator.review import report
    from orchestrator.search.target import Target

    def line(trial, kind, params, t, rnd=None):
        now = datetime.now(timezone.utc)
        return TrialRecord(sweep="s", trial=trial, kind=kind, backend="ray", params=params, config={}, status="ok",
                           reason=None, metrics=Metrics(step_time_s=t), meets_target=False, wall_s=1.0, overhead_s=None,
                           started_at=now, finished_at=now, repeat=rnd, round=rnd,
                           parity=None if kind in ("baseline", "canonical") else ParityVerdict(passed=True))

    a, b, base = {"mbs": 8}, {"mbs": 4}, {"mbs": 1}
    # The canonical reference run shares the baseline's trial number: its time is not the baseline config's.
    recs = [line(0, "canonical", {}, 0.01), line(0, "baseline", base, 0.3), line(1, "trial", a, 0.08),
            line(2, "trial", b, 0.09)]
    answer = A.decide(recs, Target(), A.SettleRule(min_rounds=3))
    assert answer.winner.trial == 1 and answer.tie and not answer.settled  # one run each: not told apart yet
    for k, (x, y, z) in enumerate([(0.3, 0.12, 0.09), (0.31, 0.13, 0.091), (0.29, 0.125, 0.089)], 1):
        recs += [line(0, "repeat", base, x, k), line(1, "repeat", a, y, k), line(2, "repeat", b, z, k)]
    answer = A.decide(recs, Target(), A.SettleRule(min_rounds=3))
    assert (answer.winner.trial, answer.tie, answer.settled) == (2, False, True)
    summary = report.summarize(recs, Target(), A.SettleRule(min_rounds=3))
    assert summary["best"]["trial"] == 2 and summary["answer"]["rounds"] == 3


def test_the_landscape_resolution_is_one_without_noise_and_falls_with_overlapping_runs():
    def land(rows):
        rows = {k: {"key": k, "status": "ok", "step_time_samples_s": v, "median_s": sorted(v)[len(v) // 2]}
                for k, v in rows.items()}
        return R.Landscape(doc={}, cfg=None, configs=None, rows=rows, floats={})

    clear = land({"a": [1.0, 1.0, 1.0], "b": [1.1, 1.1, 1.1], "c": [2.0, 2.0, 2.0]})
    assert R.resolution(clear, 0.02, draws=200) == 1.0
    # "b" is 5% slower by its median but one of its runs beats every run of "a": a fresh 3-run measurement
    # sometimes names it, so the resolution at 2% is below one and at 10% it is one again.
    tied = land({"a": [1.00, 1.00, 1.30], "b": [0.90, 1.05, 1.05], "c": [2.0, 2.0, 2.0]})
    assert 0.3 < R.resolution(tied, 0.02, draws=400) < 0.95
    assert R.resolution(tied, 0.10, draws=200) == 1.0




def test_a_refined_landscape_pairs_the_settling_rounds_so_shared_drift_cancels():
    # The machine alternates between a fast and a slow state (x1.0 / x1.4) from one round to the next; "a" is truly
    # 15% faster than "b" in every round. Drawn run by run (no pairing), the drift hides it; drawn a round at a
    # time, as a sweep's settling round runs, every paired ratio says it and "a" alone is the answer.
    state = [1.0, 1.4] * 10
    refined = {"base": {n: 0.2 * f for n, f in enumerate(state)}, "a": {n: 0.085 * f for n, f in enumerate(state)},
               "b": {n: 0.1 * f for n, f in enumerate(state)}}
    rows = _rows({k: list(v.values()) for k, v in refined.items()})
    seen = {"base": [0.2], "a": [0.085], "b": [0.1]}
    paired = [R.declare(seen, _land(rows, refined), random.Random(s), base="base")[0] for s in range(10)]
    assert all(t == ["a"] for t in paired), paired
    unpaired = [R.declare(seen, _land(rows), random.Random(s), base="base")[0] for s in range(10)]
    assert sum(len(t) > 1 for t in unpaired) >= 5, unpaired


def test_truth_comes_from_the_refined_paired_ratio():
    rows = _rows({"base": [0.2, 0.2, 0.2], "a": [0.09, 0.09, 0.09], "b": [0.1, 0.1, 0.1]})
    doc = {"baseline_key": "base", "configs": list(rows.values()),
           "refined": {"ratio": {"base": 1.0, "b": 0.44, "a": 0.47}, "runs": {}}}
    truth = R.truth_of(doc)
    assert truth == {"base": 1.0, "a": 0.47, "b": 0.44}
    del doc["refined"]["ratio"]["a"]  # not refined: its median over the baseline's
    assert R.truth_of(doc)["a"] == pytest.approx(0.45)
    land = R.Landscape(doc=doc, cfg=None, configs=None, rows=rows, floats={}, truth=truth)
    assert land.best_key == "b" and land.within("a", 0.07) and not land.within("a", 0.05)
    assert land.best_s == 0.09  # the landscape's own fastest median, for slice_proof


def test_the_refined_resolution_rises_with_rounds_and_is_one_for_separated_configs():
    rng = random.Random(0)
    # "b" is truly 8% slower than "a"; each run is off by up to 15%: one round often names "b", thirty hardly ever.
    noisy = {"base": {n: 0.2 for n in range(30)}, "a": {n: 0.100 * rng.uniform(0.85, 1.15) for n in range(30)},
             "b": {n: 0.108 * rng.uniform(0.85, 1.15) for n in range(30)}}
    rows = _rows({k: list(v.values()) for k, v in noisy.items()})
    land = _land(rows, noisy)
    land.truth = {"base": 1.0, "a": 0.5, "b": 0.54}
    low, high = R.refined_resolution(land, 0.02, 1, draws=400), R.refined_resolution(land, 0.02, 30, draws=400)
    assert 0.4 < low < 0.9 < high
    land.truth = {"base": 1.0, "a": 0.5, "b": 0.7}
    clear = {"base": noisy["base"], "a": {n: 0.1 for n in range(30)}, "b": {n: 0.14 for n in range(30)}}
    land.refined = clear
    assert R.refined_resolution(land, 0.02, 1, draws=100) == 1.0
    assert R.refined_resolution(_land(rows), 0.02, 4) is None


def test_settling_draws_are_brought_to_the_landscapes_level():
    # The refinement ran 30% slower than the landscape (another machine state): a refined run is scaled back by
    # the baseline's stored median over its refined median; "c", never refined, keeps its stored level times the
    # round's drift (the baseline's run of the round over its refined median).
    rows = _rows({"base": [0.20, 0.20, 0.20], "a": [0.09, 0.09, 0.09], "c": [0.10, 0.10, 0.10]})
    refined = {"base": {0: 0.25, 1: 0.27, 2: 0.26}, "a": {0: 0.13, 1: 0.13, 2: 0.13}}
    land = _land(rows, refined)
    assert land.settling_sample("a", 1, random.Random(0)) == pytest.approx(0.13 * 0.20 / 0.26)
    assert land.settling_sample("c", 1, random.Random(0)) == pytest.approx(0.10 * 0.27 / 0.26)
    assert land.settling_sample("base", 2, random.Random(0)) == pytest.approx(0.20)
    assert land.settling_sample("c", None, random.Random(0)) == 0.10


def test_round_noise_sees_a_shared_round_effect_and_the_bootstrap_a_clear_best():
    import round_noise

    rng = random.Random(3)
    state = [rng.uniform(0.7, 1.3) for _ in range(40)]  # each round's machine state, shared by all its runs
    ref = {"baseline_key": "base", "runs": {
        "base": {str(n): 0.2 * f * rng.uniform(0.99, 1.01) for n, f in enumerate(state)},
        "a": {str(n): 0.10 * f * rng.uniform(0.99, 1.01) for n, f in enumerate(state)},
        "b": {str(n): 0.13 * f * rng.uniform(0.99, 1.01) for n, f in enumerate(state)}}}
    ref["ratio"] = {"base": 1.0, "a": 0.5, "b": 0.65}
    n = round_noise.noise(ref)
    assert n["correlation"] > 0.95 and n["paired_sd"] < 0.03 < n["unpaired_sd"] and n["round_sd"] > 0.1
    boot = round_noise.truth_bootstrap(ref, resamples=200)
    assert list(boot) == ["a", "b"] and boot["a"] == {"best": 1.0, "within_2": 1.0, "within_5": 1.0}
    assert boot["b"]["within_5"] == 0.0


def test_a_config_refined_in_other_rounds_shares_the_rounds_level_not_the_baselines_own_deviation():
    # "m" was refined in rounds 0 and 1 only; round 2's level comes from the configs refined in it. In round 2 the
    # baseline alone ran 30% slow: "m" must not inherit that (it would, as its ratio times the baseline's run).
    rows = _rows({"base": [0.2, 0.2, 0.2], "a": [0.1, 0.1, 0.1], "m": [0.12, 0.12, 0.12]})
    refined = {"base": {0: 0.2, 1: 0.2, 2: 0.26}, "a": {0: 0.1, 1: 0.1, 2: 0.1}, "m": {0: 0.12, 1: 0.126}}
    land = _land(rows, refined)
    land.truth = {"base": 1.0, "a": 0.5, "m": 0.6}
    levels = land._round_levels()
    assert levels[0] == pytest.approx(0.2) and levels[2] == pytest.approx(math.sqrt(0.26 * 0.2))
    draws = {round(land._refined_elsewhere("m", 2, random.Random(s)), 6) for s in range(20)}
    # its truth x round 2's level x one of its two residuals (1.0 in round 0, 1.05 in round 1)
    assert draws == {round(0.6 * levels[2] * e, 6) for e in (0.12 / (0.6 * levels[0]), 0.126 / (0.6 * levels[1]))}
    # (brought to the landscape's level: the baseline's stored median over its refined median, here 1)
    assert any(land.settling_sample("m", 2, random.Random(0)) == pytest.approx(d, rel=1e-4) for d in draws)
