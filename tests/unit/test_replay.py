"""bench/replay.py: a replay is a function of its seed; the noise-aware winner rule."""

from __future__ import annotations

import dataclasses
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import replay as R  # noqa: E402

from orchestrator.records import winner  # noqa: E402
from orchestrator.plan.prefilter import load_cluster  # noqa: E402


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


def test_noise_aware_rule_remeasures_an_overlapping_top_and_drops_a_lucky_sample():
    rows = {"lucky": {"step_time_samples_s": [0.130, 0.130, 0.130]},  # one 80 ms sample came in by luck
            "steady": {"step_time_samples_s": [0.089, 0.090, 0.091]},
            "slow": {"step_time_samples_s": [0.200, 0.200, 0.200]}}
    land = SimpleNamespace(rows=rows)
    seen = {"lucky": [0.080], "steady": [0.090], "slow": [0.200]}
    assert min(seen, key=lambda k: min(seen[k])) == "lucky"
    declared, extra = R.declare(seen, land, random.Random(0))
    assert declared == "steady"
    assert 0 < extra <= winner.RULE.top_k * (winner.RULE.min_runs - 1)
    # Separated intervals: nothing to re-measure.
    assert R.declare({"a": [0.1, 0.1], "b": [0.2, 0.2]}, SimpleNamespace(rows={}), random.Random(0)) == ("a", 0)


def test_the_sweep_summary_reports_the_same_rule_from_a_ledger():
    from datetime import datetime, timezone

    from orchestrator.records.record import Metrics, TrialRecord

    def line(trial, kind, params, t):
        now = datetime.now(timezone.utc)
        return TrialRecord(sweep="s", trial=trial, kind=kind, backend="ray", params=params, config={}, status="ok",
                           reason=None, metrics=Metrics(step_time_s=t), meets_target=False, wall_s=1.0, overhead_s=None,
                           started_at=now, finished_at=now, repeat=1 if kind == "confirm" else None)

    a, b = {"mbs": 8}, {"mbs": 4}
    # The canonical reference run shares the baseline's trial number: its time is not the baseline config's.
    recs = [line(0, "canonical", {}, 0.01), line(0, "baseline", {"mbs": 1}, 0.3), line(1, "trial", a, 0.08),
            line(2, "trial", b, 0.09)]
    rule = winner.WinnerRule(min_runs=3)
    w = winner.summary(recs, rule)
    assert (w["trial"], w["remeasure_trials"]) == (1, [1, 2])  # one run each: cannot be told apart yet
    recs += [line(1, "confirm", a, 0.13), line(1, "confirm", a, 0.12), line(2, "confirm", b, 0.091),
             line(2, "confirm", b, 0.089)]
    w = winner.summary(recs, rule)
    # medians 0.09 vs 0.12; the intervals still touch, but each config has its min_runs: settled
    assert (w["trial"], w["runs"], w["remeasure_trials"]) == (2, 3, [])
    assert winner.summary(recs)["remeasure_trials"] == [2, 1]  # the default rule (4 runs) asks for one more each
    assert winner.settling_text(w) is None  # settled, with no re-measurement (these are confirm runs)


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


@pytest.mark.parametrize("others, asked", [
    # The real default sweep's case: only the leader has two runs, 0.2% apart. The declared 15% still widens
    # the single runs, so the 1%- and 3%-slower configs are run again (their intervals overlap the leader's).
    ({}, ["lead", "second", "third"]),
    # Three configs with several tight runs: their median spread (~0.2%) replaces the declared one, and the
    # 1% gap then separates the leader from the single-run second: settled.
    ({"x": [50.0, 50.1], "y": [52.0, 52.1]}, []),
])
def test_a_spread_measured_on_too_few_configs_does_not_narrow_the_single_runs(others, asked):
    runs = {"lead": [45.3, 45.4], "second": [45.9], "third": [46.8], **others}
    keys = winner.to_remeasure(runs, winner.WinnerRule(top_k=3, min_runs=4))
    assert keys == asked
