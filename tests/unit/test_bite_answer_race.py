"""Behaviour tests of the answer rule's racing settle and predicted intervals (orchestrator.records.answer) that its
mutants showed missing: each gap to the leader (``Gap``: told apart, more rounds), the tie's band, the verdict of a
winner raced beside rivals or alone, and the interval a prediction carries. Ledgers built with test_answer's helpers.
"""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.records import answer as A
from orchestrator.records import rounds as M
from orchestrator.records.selection import selected_low
from orchestrator.search.target import Target
from tests.unit.test_answer import NONE, PARAMS, REL, line, rounds
from tests.unit.test_bite_answer import _raced, confirm, fig, pred

KEY = {t: A.key_of(p) for t, p in PARAMS.items()}


def rep(trial: int, t: float, k: int):
    """Trial ``trial``'s run in settling round ``k``."""
    return line(trial, t, "repeat", k, k)


def _paired_tie(c: float) -> A.Answer:
    """Trial 2 runs ``c`` against the leader's 0.5 in three rounds, within a few percent of it round by round."""
    ledger = [line(0, 1.0), line(1, 0.5), line(2, c)] + rounds(
        {0: [1.0, 1.1, 0.95], 1: [0.5, 0.52, 0.49], 2: [c, c * 1.05, c * 0.98]})
    return A.decide(ledger, NONE)


# ---- gaps to the leader ---------------------------------------------------------------------------------------


def test_a_prediction_against_a_predicted_leader_is_apart_by_any_excess_and_no_round_can_change_that():
    # A prediction repeats exactly: its gap is the ratio of the two predictions, a point; equal ones tie and no
    # number of rounds can tell them apart (None), a slower one is apart already (0 more rounds).
    a = A.decide([pred(0, 1.0), pred(1, 0.5), pred(2, 0.5), pred(3, 0.6)], NONE)
    assert a.gaps[KEY[3]] == A.Gap(pytest.approx(1.2), (pytest.approx(1.2), pytest.approx(1.2)), 0, True, 0)
    assert a.gaps[KEY[0]] == A.Gap(2.0, (2.0, 2.0), 0, True, 0)
    assert a.gaps[KEY[2]] == A.Gap(1.0, (1.0, 1.0), 0, False, None)
    assert a.band == 0.0  # equal predictions: no member can be slower than another


def test_a_contender_told_apart_in_the_rounds_needs_no_more_rounds():
    g = _raced(2).gaps[KEY[2]]
    assert g.apart and g.more_rounds == 0


def test_a_paired_tie_needs_the_rounds_at_which_its_interval_would_clear_the_threshold():
    # 1/sqrt(n): more = ceil(n (half / (log ratio - log(1 + threshold)))^2) - n, at least 1, with the half-width
    # below the ratio that decides apart: the one read given the leader's pick (``Gap.low``), wider than the
    # interval's own.
    g = _paired_tie(0.53).gaps[KEY[2]]
    assert not g.apart and g.rounds == 3
    half = math.log(g.interval[1] / g.interval[0]) / 2
    assert g.interval == pytest.approx((g.ratio * math.exp(-half), g.ratio * math.exp(half)))
    below = math.log(g.ratio / g.low)
    assert below > half
    wanted = 3 * (below / (math.log(g.ratio) - math.log1p(0.01))) ** 2
    assert wanted > 6.45  # the interval's own half-width would want 6.45: 4 more rounds
    assert g.more_rounds == math.ceil(wanted) - 3


def test_a_paired_ratio_exactly_at_the_threshold_is_one_no_number_of_rounds_can_tell_apart():
    # The leader runs 1.0 s in both rounds and trial 2 1.25 s: log(1.25) is exactly log1p(0.25), the threshold.
    assert math.log(1.25) == math.log1p(0.25)
    ledger = [line(0, 2.0), line(1, 1.0), line(2, 1.25)] + rounds({0: [2.0, 2.0], 1: [1.0, 1.0], 2: [1.25, 1.25]})
    g = A.decide(ledger, NONE, A.SettleRule(threshold=0.25)).gaps[KEY[2]]
    assert g.rounds == 2 and not g.apart and g.more_rounds is None


def _threshold_with_log1p(x: float) -> float:
    """A threshold whose log1p is exactly ``x`` (a float next to expm1(x))."""
    t = math.expm1(x)
    for _ in range(64):
        if math.log1p(t) == x:
            return t
        t = math.nextafter(t, math.inf if math.log1p(t) < x else -math.inf)
    raise AssertionError(f"no float threshold has log1p == {x!r}")


def test_a_paired_interval_whose_lower_end_is_exactly_at_the_threshold_is_not_told_apart():
    # Apart means the lower end that decides (the paired interval's, read given the leader's pick) is ABOVE
    # 1 + threshold: at it, still a tie.
    ledger = [line(0, 2.0), line(1, 1.0), line(2, 1.3)] + rounds({0: [2.0, 2.1], 1: [1.0, 1.02], 2: [1.3, 1.35]})
    rule = A.RULE
    # The paired interval of the rounds' model, as the rule states it (docs/search.md#one-answer).
    model = M.round_model({KEY[t]: {k: r.metrics.step_time_s for r in ledger if r.trial == t and (k := r.round)}
                           for t in (0, 1, 2)}, KEY[0], rule.single_run_spread / 2)
    d, se = model.paired(KEY[2], KEY[1])
    z = statistics.NormalDist().inv_cdf((1 + rule.confidence) / 2)
    low = selected_low(d, model.half_width(se, rule.confidence) / z, rule.confidence)
    assert 0 < low < d - model.half_width(se, rule.confidence) < math.log1p(0.5)
    at = _threshold_with_log1p(low)
    assert not A.decide(ledger, NONE, A.SettleRule(threshold=at)).gaps[KEY[2]].apart
    assert A.decide(ledger, NONE, A.SettleRule(threshold=at * 0.999)).gaps[KEY[2]].apart


def test_a_rival_the_leaders_pick_may_have_put_behind_stays_in_the_tie():
    # The paired interval of trial 2 against the leader clears a threshold set just under its lower end, so a
    # pair fixed in advance would be told apart; read given that the leader was picked as the lower of the two
    # by these runs, its lower end reaches below the threshold: still tied, and ``low`` says where it ends.
    ledger = [line(0, 2.0), line(1, 1.0), line(2, 1.3)] + rounds({0: [2.0, 2.1], 1: [1.0, 1.02], 2: [1.3, 1.35]})
    plain = A.decide(ledger, NONE).gaps[KEY[2]]
    between = math.expm1((math.log(plain.low) + math.log(plain.interval[0])) / 2)
    g = A.decide(ledger, NONE, A.SettleRule(threshold=between)).gaps[KEY[2]]
    assert g.interval[0] > 1 + between > g.low
    assert not g.apart and g.more_rounds >= 1


def test_an_unpaired_gap_widens_each_configs_median_by_the_assumed_spread_of_its_runs():
    # No rounds: trial 2 (3 runs of 0.6) against the leader (2 runs of 0.5), each run off by the assumed spread
    # (0.15, read as a standard deviation of 0.075): half width z * 0.075 * sqrt(1/3 + 1/2).
    ledger = [line(0, 1.0), line(1, 0.5), confirm(1, 0.5), line(2, 0.6), confirm(2, 0.6), confirm(2, 0.6, 2),
              line(3, 0.51)]
    a = A.decide(ledger, NONE)
    half = statistics.NormalDist().inv_cdf(0.95) * 0.075 * math.sqrt(1 / 3 + 1 / 2)
    g = a.gaps[KEY[2]]
    assert g.ratio == pytest.approx(1.2) and g.interval == pytest.approx((1.2 * math.exp(-half), 1.2 * math.exp(half)))
    assert g.rounds == 0 and g.apart and g.more_rounds == 0  # apart by its runs: no round needed
    # The lower end that decided it: the gap read given the leader's pick, with the runs' own standard error.
    assert g.low == pytest.approx(math.exp(selected_low(math.log(1.2), 0.075 * math.sqrt(1 / 3 + 1 / 2), 0.9)))
    tied = a.gaps[KEY[3]]
    # Tied by its single run; it never ran beside the leader in a round, so no paired ratio says how many would do.
    assert not tied.apart and tied.more_rounds is None
    assert [c.trial for c in a.ties] == [1, 3]


# ---- the tie's band -------------------------------------------------------------------------------------------


def test_the_band_is_the_highest_upper_end_over_the_lowest_lower_end_of_the_tie_the_leaders_being_one():
    a = _paired_tie(0.53)
    lo, hi = a.gaps[KEY[2]].interval
    assert lo < 1 < hi and [c.trial for c in a.ties] == [1, 2]
    assert a.band == pytest.approx(hi / lo - 1)


def test_a_member_slower_in_every_round_but_not_told_apart_sets_the_band_from_the_leaders_one():
    # Trial 2's whole interval lies above the leader (lower end 1.005 < 1.01: still tied): the lowest lower end
    # of the tie is the leader's own 1.
    a = _paired_tie(0.54)
    lo, hi = a.gaps[KEY[2]].interval
    assert 1 < lo < 1.01 and [c.trial for c in a.ties] == [1, 2]
    assert a.band == pytest.approx(hi - 1)


# ---- the target verdict of a raced winner ---------------------------------------------------------------------


def test_a_winner_with_one_round_is_judged_on_its_paired_interval():
    ledger = [line(0, 1.0), line(1, 0.5), rep(0, 1.0, 1), rep(1, 0.5, 1)]
    a = A.decide(ledger, Target(relative_to_baseline=0.3))
    assert a.winner.rounds == 1 and a.baseline_s == 1.0
    assert a.target == A.TargetVerdict(A.NOT_MET, 0.3, pytest.approx(a.winner.interval), None, True, relative=True)


def test_a_winner_raced_beside_rivals_only_is_judged_on_its_model_rounds():
    # The baseline ran in rounds 1-2 beside trial 2; trial 1 only in rounds 3-4 beside trial 2 (the race pairs
    # rivals with the leader, not the baseline, once it has its two rounds). Trial 1 has no per-round ratio to
    # the baseline, but the model reaches it through trial 2: 2 rounds, a paired figure.
    ledger = [line(0, 1.0), line(1, 0.5), line(2, 0.6), rep(0, 1.0, 1), rep(2, 0.6, 1), rep(0, 1.1, 2),
              rep(2, 0.63, 2), rep(1, 0.5, 3), rep(2, 0.62, 3), rep(1, 0.52, 4), rep(2, 0.6, 4)]
    a = A.decide(ledger, Target(relative_to_baseline=0.45))
    w = a.winner
    assert w.trial == 1 and w.rounds == 2 and w.paired == ()
    v = a.target
    assert v.state == A.UNDECIDED and v.paired and v.interval_s == pytest.approx(w.interval)  # baseline median 1.0
    # Its 2 model rounds are the n the interval shrinks from: ceil(2 (half / gap)^2) - 2.
    half, gap = (w.interval[1] - w.interval[0]) / 2, w.ratio - 0.45
    assert v.more_rounds == max(1, math.ceil(2 * (half / gap) ** 2) - 2) == 7


def test_the_baseline_raced_alone_for_its_verdict_is_judged_on_its_own_rounds():
    # The baseline leads; a relative target's check runs it alone (nothing to pair with: no model round), twice.
    # Its paired figure is its runs over their median; the rounds that would decide it count from its 2 rounds.
    ledger = [line(0, 1.0), line(1, 1.5), rep(0, 0.9, 1), rep(0, 1.1, 2)]
    a = A.decide(ledger, Target(relative_to_baseline=0.93))
    w = a.winner
    assert w.is_baseline and w.rounds == 0 and w.paired == (1.0, 1.0)
    v = a.target
    assert v.state == A.UNDECIDED and v.paired and v.relative and v.interval_s == pytest.approx((0.9, 1.1))
    assert v.more_rounds == math.ceil(2 * (0.1 / 0.07) ** 2) - 2 == 3


def test_a_predicted_winner_states_its_intervals_level_and_a_relative_target():
    p = pred(1, 0.5)
    p.prediction["interval"] = {"low": 0.44, "high": 0.57, "level": 0.9}
    a = A.decide([pred(0, 1.0), p], REL)
    assert a.target == A.TargetVerdict(A.UNDECIDED, 0.5, (0.44, 0.57), None, False, 0.9, True)
    b = pred(1, 0.5)
    b.prediction.update(step_time_low_s=0.52, step_time_high_s=0.6)  # an older line's band
    assert A.decide([pred(0, 1.0), b], REL).target == A.TargetVerdict(A.NOT_MET, 0.5, (0.52, 0.6), None, False,
                                                                        A.BAND_LEVEL, True)


def test_no_config_at_all_still_says_the_target_is_relative():
    a = A.decide([line(1, 0.5, status="failed")], REL)
    assert a.target == A.TargetVerdict(A.UNDECIDED, None, None, None, False, relative=True)


# ---- figures when the baseline is out of the rounds -------------------------------------------------------------


def test_rounds_without_the_baseline_pair_nothing_and_keep_each_configs_runs_by_round():
    ledger = [line(0, 2.0), line(1, 0.5), line(2, 0.6), rep(1, 0.4, 1), rep(2, 0.66, 1), rep(1, 0.44, 2),
              rep(2, 0.6, 2)]
    a = A.decide(ledger, NONE)
    t1, t2 = fig(a, 1), fig(a, 2)
    assert t1.paired == () and t1.rounds == 0 and t1.by_round == {1: 0.4, 2: 0.44}
    # No model: the figure is unpaired, its median run over the baseline's median.
    assert t1.ratio == t1.unpaired == pytest.approx(0.44 / 2.0) and t2.unpaired == pytest.approx(0.6 / 2.0)
    assert a.baseline.by_round == {} and a.gaps[KEY[2]].rounds == 0


# ---- a prediction's interval ----------------------------------------------------------------------------------


def _predicted(**prediction):
    r = pred(1, 0.5)
    r.prediction.update(prediction)
    return r


@pytest.mark.parametrize("prediction,expected", [
    # The model backend's interval, whatever band the line also carries.
    ({"interval": {"low": 0.4, "high": 0.6, "level": 0.9}}, (0.4, 0.6, 0.9)),
    ({"interval": {"low": 1, "high": 2, "level": 0.9}, "step_time_low_s": 0.3, "step_time_high_s": 0.7},
     (1.0, 2.0, 0.9)),
    # An incomplete interval is none: the band, at its stated level 0.8.
    ({"interval": {"low": 0.4, "high": 0.6}, "step_time_low_s": 0.3, "step_time_high_s": 0.7}, (0.3, 0.7, 0.8)),
    ({"interval": [0.4, 0.6, 0.9], "step_time_low_s": 0.3, "step_time_high_s": 0.7}, (0.3, 0.7, 0.8)),
    ({"step_time_low_s": 0.3, "step_time_high_s": 0.7}, (0.3, 0.7, 0.8)),
    # Half a band, or neither: no interval.
    ({"step_time_low_s": 0.3}, None),
    ({"step_time_high_s": 0.7}, None),
    ({"interval": {"low": "0.4", "high": 0.6, "level": 0.9}}, None),
    ({}, None),
])
def test_a_predictions_interval_is_its_own_else_its_band_else_none(prediction, expected):
    got = A.predicted_interval(_predicted(**prediction))
    assert got == expected and (got is None or all(type(x) is float for x in got))


def test_a_measured_line_carries_no_predicted_interval():
    assert A.predicted_interval(line(1, 0.5)) is None
