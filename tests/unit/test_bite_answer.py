"""Behaviour tests of the answer rule (orchestrator.records.answer) that its mutants showed missing (issue 30).

Each gives a ledger and the answer it must get; the ledgers are built with test_answer's helpers.
"""

from __future__ import annotations

import pytest

from orchestrator.records import answer as A
from orchestrator.records.record import ParityVerdict
from orchestrator.search.target import Target
from tests.unit.test_answer import NONE, PARAMS, line, rounds


def test_a_tie_of_equally_changed_configs_goes_to_the_lower_peak_memory():
    base = {"mbs": 1, "pp": 2}
    p1, p2 = {"mbs": 2, "pp": 2}, {"mbs": 4, "pp": 2}  # one param changed each
    ledger = [line(0, 1.0, params=base), line(1, 0.500, params=p1, mem=2000.0),
              line(2, 0.501, params=p2, mem=1500.0)]
    a = A.decide(ledger, NONE)
    assert a.tie and a.winner.trial == 2 and a.leader.trial == 1
    assert [c.trial for c in a.ties] == [2, 1] and [c.trial for c in a.ranked] == [2, 1, 0]


def test_no_ok_run_is_no_answer():
    bad = line(1, 0.5, status="failed")
    a = A.decide([bad], NONE)
    assert a.winner is None and a.ranked == () and a.settled and a.target.state == A.NO_TARGET
    assert a.why_unsettled == "no config ran ok and passed parity"


def pred(trial: int, t: float, **kw):
    """A planner prediction (model backend): no measured result, a prediction."""
    r = line(trial, t, **kw)
    r.prediction = {"step_time_s": t}
    return r


def confirm(trial: int, t: float, n: int = 1, **kw):
    """A re-run outside the settling rounds."""
    return line(trial, t, kind="confirm", repeat=n, **kw)


def fig(a, trial):
    return a.figure_of(A.key_of(PARAMS[trial]))


# ---- the rule's own fields ------------------------------------------------------------------------------


@pytest.mark.parametrize("kw", [{"top_k": 1}, {"min_rounds": 1}, {"max_rounds": 0}, {"resamples": 100},
                                {"threshold": 0.49}, {"single_run_spread": 0.5}, {"single_run_spread": 1.99}])
def test_the_rule_accepts_its_bounds(kw):
    A.SettleRule(**kw)


@pytest.mark.parametrize("kw", [{"top_k": True}, {"threshold": 0.5}, {"single_run_spread": 2.0},
                                {"single_run_spread": True}, {"confidence": 0.999}])
def test_the_rule_refuses_past_its_bounds(kw):
    with pytest.raises(ValueError, match=f"winner.{next(iter(kw))}="):
        A.SettleRule(**kw)


def test_a_config_key_does_not_depend_on_the_order_of_its_params():
    assert A.key_of({"b": 1, "a": 2}) == A.key_of({"a": 2, "b": 1})


# ---- the bootstrap interval ---------------------------------------------------------------------------------


def test_the_bootstrap_interval_of_one_value_is_that_value_and_of_two_spans_them():
    assert A.ci_median([0.7], 0.9, 2000) == (0.7, 0.7)
    lo, hi = A.ci_median([3.0, 1.0], 0.9, 2000)
    assert lo == 1.0 and hi == 3.0


def test_the_bootstrap_interval_is_deterministic_and_narrows_with_the_confidence():
    values = [0.4, 0.45, 0.5, 0.52, 0.55, 0.6, 0.7]
    first = A.ci_median(values, 0.9, 2000)
    assert A.ci_median(list(reversed(values)), 0.9, 2000) == first
    assert A.ci_median(values, 0.9, 2000) == pytest.approx((0.45, 0.6))
    lo, hi = A.ci_median(values, 0.6, 2000)
    assert first[0] <= lo < hi <= first[1] and (lo, hi) != first


# ---- figures ----------------------------------------------------------------------------------------------


def test_unpaired_figures_are_over_the_baseline_median_and_a_single_run_is_widened_by_the_assumed_spread():
    ledger = [line(0, 2.0), confirm(0, 2.2), line(1, 1.0), line(2, 1.2), confirm(2, 1.6)]
    a = A.decide(ledger, NONE)
    assert a.baseline_s == pytest.approx(2.1) and a.baseline.trial == 0 and a.baseline.ratio == 1.0
    assert a.baseline.interval == pytest.approx((2.0 / 2.1, 2.2 / 2.1))
    assert fig(a, 1).ratio == pytest.approx(1.0 / 2.1)
    assert fig(a, 1).interval == pytest.approx((1.0 / 2.1 * 0.925, 1.0 / 2.1 * 1.075))  # spread 0.15
    assert fig(a, 2).ratio == pytest.approx(1.4 / 2.1) and fig(a, 2).interval == pytest.approx((1.2 / 2.1, 1.6 / 2.1))
    assert fig(a, 2).describe() == "median of 2 runs 1.400 s" and fig(a, 1).describe() == "single run 1.000 s"
    assert a.baseline.describe() == "median of 2 runs 2.100 s"


def test_without_a_baseline_the_figure_is_the_median_run():
    a = A.decide([line(1, 0.04), confirm(1, 0.05), line(2, 0.06)], NONE)
    assert a.baseline is None and a.baseline_s is None
    assert a.winner.trial == 1 and a.winner.ratio == pytest.approx(0.045)
    assert a.winner.describe() == "median of 2 runs 45.0 ms" and fig(a, 2).describe() == "single run 60.0 ms"


def test_three_configs_measured_again_give_the_assumed_spread_of_single_runs():
    # Spreads 0.4, 0.4 and 0.4: the single run of trial 3 is widened by 0.4, not the declared 0.15.
    ledger = [line(0, 0.8), confirm(0, 1.2), line(1, 0.4), confirm(1, 0.6), line(2, 0.6), confirm(2, 0.9),
              line(3, 0.5)]
    a = A.decide(ledger, NONE)
    assert fig(a, 3).interval == pytest.approx((0.4, 0.6))
    # Two configs measured again are not enough: the declared spread holds.
    b = A.decide(ledger[:4] + [line(2, 0.6), line(3, 0.5)], NONE)
    assert fig(b, 3).interval == pytest.approx((0.5 * 0.925, 0.5 * 1.075))


def test_paired_figures_one_round_is_widened_several_are_bootstrapped_and_the_baseline_pairs_to_one():
    ledger = [line(0, 2.4), line(1, 1.0), line(2, 1.0)]
    ledger += rounds({0: [2.0, 2.0, 2.0, 2.0, 2.0], 1: [0.8, 0.9, 1.0, 1.1, 1.3]})
    ledger += [line(2, 1.0, "repeat", 1, 1)]
    a = A.decide(ledger, NONE, A.SettleRule(confidence=0.6))
    assert a.baseline.paired == (1.0,) * 5 and a.rounds == 5
    t1 = fig(a, 1)
    assert t1.paired == pytest.approx((0.4, 0.45, 0.5, 0.55, 0.65)) and t1.ratio == pytest.approx(0.5)
    assert t1.interval == A.ci_median(t1.paired, 0.6, 2000) and t1.interval != (0.4, 0.65)
    # One round: widened by the assumed spread, the median of the three re-measured (0.2, 0.5 and 0).
    assert fig(a, 2).interval == pytest.approx((0.5 * 0.9, 0.5 * 1.1))


def test_changed_params_count_each_param_that_differs_either_way():
    base = {"mbs": 1}
    ledger = [line(0, 1.0, params=base), line(1, 0.5, params={"mbs": 1, "pp": 2}),
              line(2, 0.6, params={"mbs": 2, "pp": 2})]
    a = A.decide(ledger, NONE)
    assert [c.changed for c in a.ranked] == [1, 2, 0]


def test_peak_memory_is_the_highest_of_a_configs_runs():
    ledger = [line(0, 1.0, mem=0.0), line(1, 0.5, mem=2000.0), confirm(1, 0.5, mem=1000.0)]
    a = A.decide(ledger, NONE)
    assert fig(a, 1).peak_memory_bytes == 2000.0 and a.baseline.peak_memory_bytes == 0.0


def test_a_rerun_counts_for_its_trials_config_and_an_orphan_rerun_names_no_config():
    ledger = [line(0, 1.0), line(1, 0.5), confirm(1, 0.7, params={"other": 1}), confirm(5, 0.1, params={"x": 1})]
    a = A.decide(ledger, NONE)
    assert fig(a, 1).runs == (0.5, 0.7) and [c.trial for c in a.ranked] == [1, 0]


def test_the_config_is_named_by_its_first_line():
    ledger = [line(0, 1.0), line(0, 1.2), line(1, 0.5)]
    a = A.decide(ledger, NONE)
    assert a.baseline.record is ledger[0] and a.baseline.runs == (1.0, 1.2)


def test_a_line_without_a_parity_verdict_counts_only_when_nothing_was_measured():
    t = line(1, 0.5)
    t.parity = None  # e.g. a prediction, or a line from before parity was stored
    a = A.decide([line(0, 1.0), t], NONE)
    assert a.winner.trial == 1


def test_a_baseline_that_is_no_run_leaves_the_figures_unscaled():
    ledger = [line(0, 0.0), line(1, 0.5)]
    a = A.decide(ledger, REL_HALF)
    assert a.baseline_s is None and a.baseline is None and a.noise.baseline_runs == 0
    assert a.winner.ratio == 0.5
    assert a.target == A.TargetVerdict(A.UNDECIDED, None, None, None, False)


REL_HALF = Target(relative_to_baseline=0.5)
