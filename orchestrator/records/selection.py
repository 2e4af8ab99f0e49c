"""A rival's gap to a leader picked by the same runs: the lower end of that gap, read given the pick.

The answer's leader is the config with the lowest figure, so every rival's estimated gap to it (log of their ratio)
came out at or above zero *because* the leader was chosen that way. An interval built as if the gap had been fixed in
advance ignores this: on a noisy machine, of twenty configs whose true times lie within a few percent, the leader is
the one whose runs came out luckiest, and its rivals look farther behind than they are. On the replay of the default
landscape, a winner declared alone, each rival tested at 90% as if the pair had been fixed in advance, was truly
within the threshold of the best in only 87-89% of the seeds that claimed it (bench/results/replay_claims_trf*.md,
``race-unadjusted`` in replay_claims_selective.md).

The correction is the one selective inference makes for a statistic reported because it crossed a line (Lee, Sun,
Sun & Taylor 2016, "Exact post-selection inference"; Fithian, Sun & Taylor 2014, "Optimal inference after model
selection"): the gap ``d`` is read as a normal draw with standard error ``scale`` *truncated to the region the pick
allowed*, ``D >= min(d, 0)``, and its lower confidence bound is the ``mu`` at which the truncated pivot

    P(D >= d | D >= a; mu) = Q((d - mu) / scale) / Q((a - mu) / scale),   Q the normal upper tail,

equals ``(1 - confidence) / 2``. The pivot rises with ``mu`` (the truncated normal family has a monotone likelihood
ratio), so the bound is found by bisection. Far from the cut (a gap of many standard errors) the denominator is 1
and the bound is the ordinary one; at the cut (a rival the pick barely put behind) no finite gap is excluded, so no
rival that close is ever told apart.

What it conditions on is the pick against this rival alone (its gap came out non-negative), not the full event
that the leader beat every rival at once, which would correct further; the replay (docs/search.md) measures what is
left.
"""

from __future__ import annotations

import math

SPAN = 12.0
"""Standard errors below the gap the bisection searches: a bound further down is reported at ``d - SPAN * scale``
(it excludes nothing a sweep could act on, and the normal tails stay representable)."""


def upper_tail(z: float) -> float:
    """P(Z > z) for a standard normal Z, accurate far into both tails."""
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def selected_low(d: float, scale: float, confidence: float) -> float:
    """The lower ``confidence`` bound (one-sided ``(1 - confidence) / 2``) of a rival's log gap to a leader that
    was picked because its figure came out lower: the gap ``d`` read as a normal draw with standard error ``scale``
    truncated to ``D >= min(d, 0)`` (the module docstring). ``scale`` 0 (a gap known exactly): ``d`` itself."""
    if scale <= 0:
        return d
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r}: a number in (0, 1)")
    alpha = (1.0 - confidence) / 2.0
    cut = min(d, 0.0)

    def pivot(mu: float) -> float:
        # mu >= d - SPAN * scale keeps (cut - mu) / scale <= SPAN: the denominator is > 1e-33, never 0.
        return upper_tail((d - mu) / scale) / upper_tail((cut - mu) / scale)

    lo, hi = d - SPAN * scale, d
    if pivot(lo) >= alpha:
        return lo
    for _ in range(60):  # halves a bracket of SPAN standard errors to ~1e-17 of it
        mid = (lo + hi) / 2.0
        if pivot(mid) < alpha:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2.0
