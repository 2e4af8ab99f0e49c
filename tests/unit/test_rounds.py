"""The settling rounds' model (orchestrator.records.rounds): t quantiles and the additive fit, from tables."""

from __future__ import annotations

import math
import statistics

import pytest

from orchestrator.records import rounds as M


@pytest.mark.parametrize("p,df,expected", [
    (0.95, 1, 6.3138), (0.95, 2, 2.9200), (0.95, 3, 2.3534), (0.95, 4, 2.1318), (0.95, 10, 1.8125),
    (0.95, 30, 1.6973), (0.975, 5, 2.5706), (0.975, 20, 2.0860), (0.995, 3, 5.8409), (0.75, 6, 0.7176),
])
def test_t_quantiles_match_the_table(p, df, expected):
    assert M.t_quantile(p, df) == pytest.approx(expected, abs=2e-4)


def test_every_config_in_every_round_gives_the_mean_log_ratio_and_the_pooled_residual():
    # Three rounds of the baseline and one config; the machine's level changes from round to round.
    level = [1.0, 1.3, 0.9]
    ratio = [0.50, 0.55, 0.45]
    fit = M.round_model({"b": {k: level[k] for k in range(3)}, "c": {k: level[k] * ratio[k] for k in range(3)}},
                        "b", assumed_sd=0.1)
    logs = [math.log(r) for r in ratio]
    assert fit.effect["c"] == pytest.approx(statistics.mean(logs))  # the geometric mean of the per-round ratios
    # Residuals of a two-config layout: half the spread of the log ratios each; 6 runs, 4 unknowns: 2 df, plus
    # the prior's 2 at the assumed spread.
    rss = sum((x - statistics.mean(logs)) ** 2 for x in logs) / 2
    assert fit.df == 2 + M.PRIOR_DF
    assert fit.sigma == pytest.approx(math.sqrt((rss + M.PRIOR_DF * 0.1 ** 2) / fit.df))
    assert fit.se("c") == pytest.approx(fit.sigma * math.sqrt(2 / 3))  # a mean of three paired differences
    assert fit.rounds == {"b": frozenset({0, 1, 2}), "c": frozenset({0, 1, 2})} and fit.common("b", "c") == 3


def test_configs_paired_through_other_configs_and_what_is_left_out():
    # Round 2 has no baseline: "c" and "d" are compared there, and "d" reaches the baseline through "c".
    # "e" ran alone in its round (it pairs with nothing) and "f" shares a round only with "e": both are left out.
    runs = {"b": {0: 1.0, 1: 1.0}, "c": {0: 0.5, 1: 0.5, 2: 0.6}, "d": {2: 0.9}, "e": {3: 0.7}, "f": {4: 0.7}}
    fit = M.round_model(runs, "b", assumed_sd=0.1)
    assert fit.keys == ("b", "c", "d")
    assert fit.effect["d"] == pytest.approx(math.log(0.5 * 0.9 / 0.6))  # c's ratio times d over c in round 2
    assert fit.se("d", "c") < fit.se("d")  # compared directly with c, through c with the baseline
    assert M.round_model({"c": {0: 0.5}, "d": {0: 0.6}}, "b", 0.1) is None  # the baseline in no round


def test_the_fit_does_not_depend_on_the_order_of_its_input():
    a = {"b": {0: 1.0, 1: 1.1}, "c": {0: 0.5, 1: 0.52}, "d": {1: 0.6}}
    b = {k: a[k] for k in reversed(a)}
    fa, fb = M.round_model(a, "b", 0.1), M.round_model(b, "b", 0.1)
    assert fa.effect == fb.effect and fa.sigma == fb.sigma


def test_one_round_leaves_no_residual_and_the_assumed_spread_stands():
    fit = M.round_model({"b": {0: 1.0}, "c": {0: 0.5}}, "b", assumed_sd=0.1)
    assert fit.df == M.PRIOR_DF and fit.sigma == pytest.approx(0.1)
