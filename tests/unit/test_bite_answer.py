"""Behaviour tests of the answer rule (orchestrator.records.answer) that its mutants showed missing (issue 30).

Each gives a ledger and the answer it must get; the ledgers are built with test_answer's helpers.
"""

from __future__ import annotations

import math
import statistics
from types import SimpleNamespace

import pytest

from orchestrator.records import answer as A
from orchestrator.search.target import Target
from tests.unit.test_answer import NONE, PARAMS, line, rounds
from tests.unit.test_parity import make_result

REL_HALF = Target(relative_to_baseline=0.5)


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
    assert A.ci_ratio([0.7], 0.9, 2000) == (0.7, 0.7)
    lo, hi = A.ci_ratio([3.0, 1.0], 0.9, 2000)  # resamples of two: both low, mixed or both high
    assert lo == pytest.approx(1.0) and hi == pytest.approx(3.0)


def test_the_bootstrap_interval_is_deterministic_and_narrows_with_the_confidence():
    values = [0.4, 0.45, 0.5, 0.52, 0.55, 0.6, 0.7]
    first = A.ci_ratio(values, 0.9, 2000)
    assert A.ci_ratio(list(reversed(values)), 0.9, 2000) == first
    assert A.ci_ratio(values, 0.9, 2000) == pytest.approx((0.46995, 0.57826), rel=1e-4)
    lo, hi = A.ci_ratio(values, 0.6, 2000)
    assert first[0] <= lo < hi <= first[1] and (lo, hi) != first


def test_the_bootstrap_interval_is_pinned_by_its_fixed_seed():
    # The same interval on every machine and every call: a changed seed or percentile shows here.
    values = [0.31, 0.42, 0.47, 0.5, 0.53, 0.58, 0.66, 0.8, 0.45, 0.61, 0.38, 0.72]
    assert A.ci_ratio(values, 0.9, 100) == pytest.approx((0.46445, 0.58777), rel=1e-4)
    assert A.ci_ratio(values, 0.9, 2000) == pytest.approx((0.45590, 0.58654), rel=1e-4)


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


def test_paired_figures_come_from_the_rounds_model_and_the_baseline_pairs_to_one():
    ledger = [line(0, 2.4), line(1, 1.0), line(2, 1.0)]
    ledger += rounds({0: [2.0, 2.0, 2.0, 2.0, 2.0], 1: [0.8, 0.9, 1.0, 1.1, 1.3]})
    ledger += [line(2, 1.0, "repeat", 1, 1)]
    a = A.decide(ledger, NONE, A.SettleRule(confidence=0.6))
    assert a.baseline.paired == (1.0,) * 5 and a.rounds == 5 and a.baseline.rounds == 5
    t1, t2 = fig(a, 1), fig(a, 2)
    assert t1.paired == pytest.approx((0.4, 0.45, 0.5, 0.55, 0.65)) and t1.rounds == 5
    # Every round holds the baseline: the figure is the geometric mean of the per-round ratios.
    assert t1.ratio == pytest.approx(statistics.geometric_mean(t1.paired))
    assert 0.4 < t1.interval[0] < t1.ratio < t1.interval[1] < 0.65
    # One round: its own interval is wider than the five-round one's (the pooled residual, one run).
    assert t2.rounds == 1 and t2.interval[1] / t2.interval[0] > t1.interval[1] / t1.interval[0]


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


def test_a_measured_trial_without_a_parity_verdict_is_no_candidate_and_a_measured_baseline_needs_none():
    base, unchecked = line(0, 1.0), line(1, 0.5)
    base.result = unchecked.result = make_result([2.0, 1.9])
    unchecked.parity = None
    a = A.decide([base, unchecked, line(2, 0.7)], NONE)
    assert a.baseline.trial == 0 and [c.trial for c in a.ranked] == [2, 0]


def test_a_baseline_that_is_no_run_leaves_the_figures_unscaled():
    ledger = [line(0, 0.0), line(1, 0.5)]
    a = A.decide(ledger, REL_HALF)
    assert a.baseline_s is None and a.baseline is None and a.noise.baseline_runs == 0
    assert a.winner.ratio == 0.5
    assert a.target == A.TargetVerdict(A.UNDECIDED, None, None, None, False, relative=True)



# ---- tie set and winner ---------------------------------------------------------------------------------


def test_intervals_a_threshold_apart_tie_and_beyond_it_differ():
    # Two runs each: their intervals are their min/max. 0.505 starts within 1% of the leader's 0.500; 0.506 not.
    ledger = [line(0, 1.0), line(1, 0.500), confirm(1, 0.500), line(2, 0.505), confirm(2, 0.505),
              line(3, 0.506), confirm(3, 0.506)]
    a = A.decide(ledger, NONE)
    assert [c.trial for c in a.ties] == [1, 2]


def test_two_common_rounds_are_judged_by_their_paired_ratio_not_their_intervals():
    # Trial 2 is 10% slower than trial 1 in both rounds, but the rounds drift against the baseline, so their
    # intervals overlap: the per-round ratio tells them apart.
    # (the machine is 60% slower in round 2: every run moves, the ratios do not)
    ledger = [line(0, 1.0), line(1, 0.5), line(2, 0.55)]
    ledger += rounds({0: [1.0, 1.6], 1: [0.5, 0.8], 2: [0.625, 1.0]})
    a = A.decide(ledger, NONE)
    assert [c.trial for c in a.ties] == [1]
    g = a.gaps[A.key_of(PARAMS[2])]
    assert g.apart and g.rounds == 2 and g.ratio == pytest.approx(1.25)


def test_a_paired_ratio_exactly_at_the_threshold_is_a_tie():
    # 0.625 / 0.5 = 1.25 exactly, and log(1.25) == log1p(0.25): not more than the threshold above the leader.
    ledger = [line(0, 1.0), line(1, 0.5), line(2, 0.625)] + rounds({0: [1.0, 1.0], 1: [0.5, 0.5], 2: [0.625, 0.625]})
    a = A.decide(ledger, NONE, A.SettleRule(threshold=0.25))
    assert [c.trial for c in a.ties] == [1, 2]


def test_a_config_exactly_at_the_threshold_over_the_leader_is_in_the_band_and_wins_the_tie_break():
    base = {"mbs": 1, "pp": 2}
    p1, p2 = {"mbs": 2, "pp": 1}, {"mbs": 2, "pp": 2}
    ledger = [line(0, 1.0, params=base), line(1, 0.5, params=p1), line(2, 0.505, params=p2)]
    a = A.decide(ledger, NONE)
    assert a.leader.trial == 1 and a.winner.trial == 2


def test_an_unknown_peak_memory_loses_the_memory_tie_break():
    ledger = [line(0, 1.0), line(1, 0.500, params={"mbs": 3}, mem=None), line(2, 0.501, params={"mbs": 5})]
    a = A.decide(ledger, NONE)
    assert a.winner.trial == 2 and a.winner.peak_memory_bytes == 1000.0


def test_predictions_tie_only_when_equal_and_a_prediction_beside_a_run_is_judged_by_intervals():
    a = A.decide([pred(0, 1.0), pred(1, 0.5), pred(2, 0.5), pred(3, 0.5005)], NONE)
    assert [c.trial for c in a.ties] == [1, 2] and fig(a, 3).interval == (0.5005, 0.5005)
    assert a.settled and a.why_unsettled is None
    assert a.winner.describe() == "predicted ~500.0 ms" and a.baseline.interval == (1.0, 1.0)
    v = A.decide([pred(0, 1.0), pred(1, 0.5)], Target(step_time_s=0.5)).target
    assert v == A.TargetVerdict(A.MET, 0.5, (0.5, 0.5), None, False)
    b = A.decide([line(0, 1.0), line(1, 0.5), pred(2, 0.5005)], NONE)
    assert [c.trial for c in b.ties] == [1, 2]


# ---- target verdict ------------------------------------------------------------------------------------------


WINNER_RUNS = [0.4, 0.45, 0.5, 0.52, 0.55, 0.6, 0.7]  # at confidence 0.6 the interval is (0.50, 0.55)
SIXTY = A.SettleRule(confidence=0.6)


def _absolute(target_s: float, rule=SIXTY):
    ledger = [line(0, 1.0), line(1, WINNER_RUNS[0])] + [confirm(1, t, n) for n, t in enumerate(WINNER_RUNS[1:], 1)]
    return A.decide(ledger, Target(step_time_s=target_s), rule).target


def test_an_absolute_target_is_judged_by_the_bootstrap_interval_of_the_winners_runs():
    V = A.TargetVerdict
    lo, hi = A.ci_ratio(WINNER_RUNS, SIXTY.confidence, SIXTY.resamples)
    assert lo < statistics.median(WINNER_RUNS) < hi
    assert _absolute(1.0) == V(A.MET, 1.0, (lo, hi), None, False)
    assert _absolute(hi) == V(A.MET, hi, (lo, hi), None, False)  # the whole interval at the target
    assert _absolute(lo * 0.99) == V(A.NOT_MET, lo * 0.99, (lo, hi), None, False)
    # Inside the interval: undecided, with about (half width / gap)^2 x runs - runs more rounds.
    near_hi = hi - 0.001
    gap, half, n = abs(statistics.median(WINNER_RUNS) - near_hi), (hi - lo) / 2, len(WINNER_RUNS)
    assert _absolute(near_hi) == V(A.UNDECIDED, near_hi, (lo, hi), max(1, math.ceil(n * (half / gap) ** 2) - n),
                                   False)
    on = statistics.median(WINNER_RUNS)
    assert _absolute(on) == V(A.UNDECIDED, on, (lo, hi), None, False)  # on the target: no rounds decide it


def test_an_absolute_target_widens_a_single_run_by_the_declared_spread():
    ledger = [line(0, 1.0), line(1, 0.5)]
    v = A.decide(ledger, Target(step_time_s=2.0), A.SettleRule(single_run_spread=0.2)).target
    assert v.state == A.MET and v.interval_s == pytest.approx((0.45, 0.55)) and not v.paired


def test_an_absolute_target_is_not_judged_on_paired_figures():
    ledger = [line(0, 2.0), line(1, 1.0)] + rounds({0: [2.0, 2.0, 2.0], 1: [0.9, 1.0, 1.1]})
    v = A.decide(ledger, Target(step_time_s=0.5)).target
    assert v.state == A.NOT_MET and not v.paired and v.interval_s == A.ci_ratio([1.0, 0.9, 1.0, 1.1], 0.9, 2000)


def test_a_relative_target_is_judged_on_the_paired_interval_times_the_baseline_median():
    ledger = [line(0, 2.0), line(1, 1.0)] + rounds({0: [2.0, 2.0, 2.0], 1: [0.9, 1.0, 1.1]})
    a = A.decide(ledger, Target(relative_to_baseline=0.48))
    lo, hi = a.winner.interval
    assert a.winner.ratio == pytest.approx(statistics.geometric_mean([0.45, 0.5, 0.55]))
    assert lo < a.winner.ratio < hi
    v = a.target
    assert v.state == A.UNDECIDED and v.paired and v.relative and v.target_s == pytest.approx(0.96)
    assert v.interval_s == pytest.approx((2 * lo, 2 * hi))  # times the baseline's median, 2.0 s
    gap = 2 * a.winner.ratio - 0.96
    assert v.more_rounds == max(1, math.ceil(3 * ((hi - lo) / gap) ** 2) - 3)  # (half width / gap)^2 x 3 rounds
    assert a.seconds_of(a.winner) == pytest.approx(2 * a.winner.ratio)
    assert A.decide(ledger, Target(relative_to_baseline=0.6)).target == A.TargetVerdict(
        A.MET, pytest.approx(1.2), (pytest.approx(2 * lo), pytest.approx(2 * hi)), None, True, relative=True)
    assert A.decide(ledger, Target(relative_to_baseline=0.4)).target.paired is True


def test_a_relative_target_before_any_round_is_judged_on_absolute_runs():
    ledger = [line(0, 2.0), line(1, 1.0)]
    v = A.decide(ledger, Target(relative_to_baseline=0.6), A.SettleRule(single_run_spread=0.2)).target
    assert v == A.TargetVerdict(A.MET, pytest.approx(1.2), (pytest.approx(0.9), pytest.approx(1.1)), None, False,
                                relative=True)


def test_no_target_is_its_own_verdict():
    a = A.decide([line(0, 1.0), line(1, 0.5)], NONE)
    assert a.target == A.TargetVerdict(A.NO_TARGET, None, None, None, False)
    assert not a.meets(PARAMS[1])


def test_the_baseline_as_winner_is_judged_on_its_paired_figures():
    ledger = [line(0, 2.0), line(1, 2.5)] + rounds({0: [2.0, 2.2, 1.8], 1: [2.5, 2.6, 2.4]})
    a = A.decide(ledger, Target(relative_to_baseline=1.0))
    assert a.winner.is_baseline and a.winner.paired == (1.0, 1.0, 1.0)
    assert a.target.paired and a.target.target_s == pytest.approx(2.0)


def test_meets_reads_each_configs_own_figure_against_the_target():
    # Round 2 ran slow for everyone: paired, trial 1 is 0.5 of the baseline (1.0 s at its 2.0 s median) and
    # trial 2 0.8 (1.6 s); their median runs are 1.25 s and 2.0 s.
    ledger = [line(0, 2.0), line(1, 1.6), line(2, 3.0)] + rounds(
        {0: [2.0, 3.0, 2.0], 1: [1.0, 1.5, 1.0], 2: [1.6, 2.4, 1.6]})
    a = A.decide(ledger, Target(relative_to_baseline=0.6))
    assert a.target.paired and a.target.target_s == pytest.approx(1.2)
    assert a.meets(PARAMS[1]) and not a.meets(PARAMS[2]) and not a.meets({"mbs": 99})
    assert a.seconds_of(fig(a, 1)) == pytest.approx(1.0) and a.seconds_of(fig(a, 2)) == pytest.approx(1.6)
    b = A.decide(ledger, Target(step_time_s=1.1))  # an absolute target: the median run, not the paired figure
    assert not b.target.paired and b.seconds_of(fig(b, 1)) == pytest.approx(1.25) and not b.meets(PARAMS[1])
    assert A.decide(ledger, Target(step_time_s=1.25)).meets(PARAMS[1])  # at the target: meets it


def test_no_config_at_all_still_states_the_target_and_the_rule():
    rule = A.SettleRule(top_k=2)
    a = A.decide([line(1, 0.5, status="failed")], Target(step_time_s=0.5), rule)
    assert a.target == A.TargetVerdict(A.UNDECIDED, 0.5, None, None, False)
    assert a.ties == () and a.rounds == 0 and a.noise.baseline_runs == 0
    assert a.rule is rule and a.baseline is None


def test_a_baseline_measured_only_by_its_reruns_still_scales_a_relative_target():
    # Its own line is no run (step time 0), so no config can be named, but its re-run is the baseline's median.
    a = A.decide([line(0, 0.0), confirm(0, 2.0)], REL_HALF)
    assert a.winner is None and a.baseline_s == 2.0 and a.target.target_s == 1.0


# ---- settling ------------------------------------------------------------------------------------------------


def test_a_tie_within_the_threshold_after_the_minimum_rounds_stays_a_tie_no_round_can_open():
    ledger = [line(0, 1.0), line(1, 0.5), line(2, 0.5)] + rounds(
        {0: [1.0, 1.0, 1.0], 1: [0.5, 0.5, 0.5], 2: [0.5, 0.5, 0.5]})
    a = A.decide(ledger, NONE, A.SettleRule(top_k=1))
    assert a.rounds == 3 and a.rule.top_k == 1
    assert not a.settled and a.why_unsettled == "trials 1, 2 cannot be told apart"
    g = a.gaps[A.key_of(PARAMS[2])]
    assert not g.apart and g.rounds == 3 and g.more_rounds is None  # equal: no number of rounds separates them
    assert a.band is not None and a.band > 0


def test_a_clear_leader_short_of_rounds_is_not_called_a_tie():
    a = A.decide([line(0, 1.0), line(1, 0.4), line(2, 0.9)], NONE)
    assert [c.trial for c in a.ties] == [1] and a.band is None
    assert a.why_unsettled == "trials 1 have fewer than winner.min_rounds=3 paired runs"


def test_the_baseline_as_the_winner_is_unsettled_while_its_own_verdict_is_undecided():
    ledger = [line(0, 1.0), confirm(0, 1.1), confirm(0, 0.9, 2)]
    a = A.decide(ledger, Target(step_time_s=1.05))
    assert a.winner.is_baseline and a.target.state == A.UNDECIDED and a.target.more_rounds >= 1
    assert not a.settled and a.why_unsettled == "the target verdict is undecided"
    b = A.decide(ledger, Target(step_time_s=5.0))
    assert b.target.state == A.MET and b.settled and b.why_unsettled is None


# ---- noise -------------------------------------------------------------------------------------------------


def test_noise_of_remeasured_and_paired_configs_and_of_the_load():
    ledger = [line(0, 1.0), line(1, 0.5)] + rounds({0: [1.0, 1.0, 1.0], 1: [0.4, 0.5, 0.6]})
    for r, load in zip(ledger, [1.0, 2.0, 6.0, 3.0, 0.5, 1.5, 4.0, 5.0]):
        r.load_1m = load
    n = A.decide(ledger, NONE).noise
    # The rounds' residual: two configs, three rounds (2 degrees of freedom), pooled with the declared spread of
    # a run (0.15 / 2 as a standard deviation) counted as two more.
    logs = [math.log(x) for x in (0.4, 0.5, 0.6)]
    rss = sum((x - statistics.mean(logs)) ** 2 for x in logs) / 2
    assert n == A.Noise(baseline_runs=4, baseline_spread=0.0, remeasured_spread=pytest.approx(0.4),
                        paired_spread=pytest.approx(0.4), load_median=2.5, load_max=6.0,
                        round_spread=pytest.approx(math.sqrt((rss + 2 * 0.075 ** 2) / 4)))


def test_noise_of_single_and_double_runs():
    n = A.decide([line(0, 2.0), line(1, 0.4), confirm(1, 0.6)], NONE).noise
    assert n.baseline_runs == 1 and n.baseline_spread is None and n.remeasured_spread == pytest.approx(0.4)
    assert n.paired_spread is None and n.load_median is None and n.load_max is None


def test_two_runs_of_an_absolute_targets_winner_are_bootstrapped_too():
    # At a confidence near 0.5 the bootstrap interval of two values is narrower than their min/max.
    rule = A.SettleRule(confidence=0.51)
    v = A.decide([line(0, 2.0), line(1, 0.3), confirm(1, 0.9)], Target(step_time_s=5.0), rule).target
    assert v.interval_s == A.ci_ratio([0.3, 0.9], 0.51, 2000) and v.interval_s != (0.3, 0.9)


def test_a_verdict_whose_interval_starts_exactly_at_the_target_is_undecided():
    lo, _ = A.ci_ratio(WINNER_RUNS, SIXTY.confidence, SIXTY.resamples)
    assert _absolute(lo).state == A.UNDECIDED  # not "not met": part of the interval is at the target


def _raced(k_rounds: int) -> A.Answer:
    """Trial 2's search run (0.42) was lucky: by it alone it ties with trial 1 (0.40); in every round it runs
    0.55 against trial 1's 0.40. ``k_rounds`` rounds of the three."""
    ledger = [line(0, 1.0), line(1, 0.40), line(2, 0.42)]
    for k in range(1, k_rounds + 1):
        ledger += [line(0, 1.0, "repeat", k, k), line(1, 0.40, "repeat", k, k), line(2, 0.55, "repeat", k, k)]
    return A.decide(ledger, Target(), A.SettleRule(min_rounds=3))


def test_a_contender_leaves_the_tie_by_its_paired_interval_after_two_common_rounds():
    key = A.key_of(PARAMS[2])
    assert [c.trial for c in _raced(0).ties] == [1, 2]  # one run each: tied
    one = _raced(1)
    assert key in {c.key for c in one.ties} and one.gaps[key].rounds == 1  # paired once: not judged yet
    assert one.gaps[key].more_rounds == 1  # ... but one more round would tell it apart, at this ratio
    two = _raced(2)
    assert [c.trial for c in two.ties] == [1] and two.gaps[key].apart and two.gaps[key].rounds == 2
    assert two.gaps[key].interval[0] > 1.01 and two.gaps[key].ratio == pytest.approx(0.55 / 0.40)


def test_figures_equal_but_for_the_fits_last_bits_rank_by_trial_number_on_every_machine():
    # One machine's fit gives 0.5 and 0.5000000000000001 for two configs another machine gives the other way round.
    same = [A._rank_figure(SimpleNamespace(ratio=r)) for r in (0.5, 0.5000000000000001, 0.49999999999999994)]
    assert same[0] == same[1] == same[2]
    assert A._rank_figure(SimpleNamespace(ratio=0.50000000001)) > A._rank_figure(SimpleNamespace(ratio=0.5))
