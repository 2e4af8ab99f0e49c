"""The lower end of a rival's gap to a leader picked by the same runs (orchestrator.records.selection), from tables
and one seeded simulation; no processes."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest

from orchestrator.records.selection import SPAN, selected_low, upper_tail

Z90 = statistics.NormalDist().inv_cdf(0.95)


@pytest.mark.parametrize("d,scale", [(1.0, 0.1), (0.5, 0.05), (3.0, 0.2)])
def test_far_from_the_cut_the_bound_is_the_ordinary_one(d, scale):
    # Ten standard errors and more above zero: the pick excluded nothing a draw could reach.
    assert selected_low(d, scale, 0.9) == pytest.approx(d - Z90 * scale, abs=1e-9)


@pytest.mark.parametrize("d,scale,conf", [(0.1, 0.075, 0.9), (0.2, 0.075, 0.9), (0.05, 0.02, 0.8),
                                          (0.3, 0.1, 0.95)])
def test_the_bound_solves_the_truncated_pivot_and_lies_below_the_ordinary_one(d, scale, conf):
    low = selected_low(d, scale, conf)
    alpha = (1 - conf) / 2
    pivot = upper_tail((d - low) / scale) / upper_tail((0.0 - low) / scale)
    assert pivot == pytest.approx(alpha, rel=1e-9)
    assert low < d - statistics.NormalDist().inv_cdf(1 - alpha) * scale


@pytest.mark.parametrize("d", [0.0, -0.01, -0.3])
def test_a_gap_at_or_below_the_cut_excludes_nothing(d):
    # At the cut every mean leaves a draw this high as likely as any: the bound is the search's floor.
    assert selected_low(d, 0.1, 0.9) == pytest.approx(d - SPAN * 0.1)


def test_the_bound_rises_with_the_gap_and_falls_with_the_confidence():
    lows = [selected_low(d, 0.075, 0.9) for d in (0.05, 0.1, 0.15, 0.2, 0.3)]
    assert lows == sorted(lows) and len(set(lows)) == len(lows)
    assert selected_low(0.2, 0.075, 0.95) < selected_low(0.2, 0.075, 0.9) < selected_low(0.2, 0.075, 0.8)


@pytest.mark.parametrize("conf", [1.0, 0.0, -0.1, 1.5])
def test_a_gap_known_exactly_is_its_own_bound_and_a_bad_confidence_is_refused(conf):
    assert selected_low(0.2, 0.0, 0.9) == 0.2
    with pytest.raises(ValueError, match="confidence"):
        selected_low(0.2, 0.1, conf)


@pytest.mark.parametrize("z,tail", [(0.0, 0.5), (Z90, 0.05), (-Z90, 0.95), (1.0, 0.15865525393145705),
                                    (-math.inf, 1.0), (math.inf, 0.0), (12.0, 1.7764821120776e-33)])
def test_the_normal_upper_tail(z, tail):
    assert upper_tail(z) == pytest.approx(tail, rel=1e-9, abs=0.0)


@pytest.mark.parametrize("mu,ordinary_at_most", [(0.0, 0.92), (0.05, 0.935), (0.3, 1.0)])
def test_given_the_pick_the_bound_covers_the_true_gap_at_its_confidence_where_the_ordinary_one_does_not(
        mu, ordinary_at_most):
    # Gaps drawn around mu (standard error 0.1), kept only where the pick happened (the gap came out >= 0), as the
    # leader's rivals are: the selective bound is under mu in 95% of them (one-sided, confidence 0.9); the
    # ordinary bound, near the cut, in fewer (90% at the cut itself; far from it the two agree).
    rng = np.random.default_rng(0)
    draws = rng.normal(mu, 0.1, 40_000)
    kept = draws[draws >= 0][:8000]
    selective = np.mean([selected_low(float(d), 0.1, 0.9) <= mu for d in kept])
    ordinary = np.mean(kept - Z90 * 0.1 <= mu)
    assert abs(selective - 0.95) < 0.01
    assert ordinary <= ordinary_at_most
