"""The settling rounds' model: log step times as config effect + round level + noise, and Student-t quantiles.

Rounds are blocks (F-race's instances, a randomized complete block design when every config runs in every
round): what a round shares (the machine's state while it ran) is its level, and cancels from every comparison of
two configs. Configs need not all run in every round; least squares over the rounds that ran two configs or more
estimates each config's effect relative to the baseline, and the pooled residual gives every contrast its
standard error. orchestrator.records.answer decides with it.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np


@functools.lru_cache(maxsize=256)
def t_quantile(p: float, df: int) -> float:
    """Student's t quantile: ``p`` in (0.5, 1), ``df`` >= 1 degrees of freedom. Exact forms for 1 and 2 degrees
    of freedom; otherwise the Cornish-Fisher expansion (Abramowitz & Stegun 26.7.5) refined by Newton steps on
    the t density integrated numerically (within 1e-6 of the exact quantile)."""
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        return (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    z = statistics.NormalDist().inv_cdf(p)
    x = (z + (z ** 3 + z) / 4 / df + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96 / df ** 2
         + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384 / df ** 3
         + (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160 / df ** 4)
    c = math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)

    def density(u: Any) -> Any:
        return c * (1 + u * u / df) ** (-(df + 1) / 2)

    for _ in range(4):
        u = np.linspace(0.0, x, 2001)
        f = density(u)
        cdf = 0.5 + (x / 2000) * (f.sum() - (f[0] + f[-1]) / 2)
        x -= (cdf - p) / density(x)
    return float(x)


@dataclass(frozen=True)
class RoundModel:
    """The settling rounds' runs as one additive model of log step times: log t(config, round) = effect(config) +
    level(round) + noise, the baseline's effect 0, fitted by least squares over the rounds that ran two configs
    or more (a two-way layout with rounds as blocks; configs need not all run in every round). Only configs
    linked to the baseline through shared rounds are in it."""

    keys: tuple[str, ...]
    """The configs in the model, the baseline first."""
    effect: Mapping[str, float]
    """Config -> log of its time over the baseline's."""
    unit_cov: np.ndarray
    """Covariance of the effects (``keys`` order) over the noise variance: a contrast's variance is sigma^2 times
    its quadratic form."""
    sigma: float
    """The residual spread of a log step time (pooled over every config and round); without a residual yet (as
    many unknowns as runs: one round), the spread assumed for a single run, read as one standard deviation and
    worth one degree of freedom."""
    df: int
    """Degrees of freedom of ``sigma`` (1 for the assumed one)."""
    rounds: Mapping[str, frozenset[int]]
    """Config -> the model's rounds it ran in."""
    logs: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    """Config -> round -> log of its step time, the model's rounds only."""

    def se(self, a: str, b: str | None = None) -> float:
        """Standard error of effect(a) - effect(b) (b None: the baseline's, 0)."""
        i = self.keys.index(a)
        var = self.unit_cov[i, i]
        if b is not None:
            j = self.keys.index(b)
            var += self.unit_cov[j, j] - 2 * self.unit_cov[i, j]
        return self.sigma * math.sqrt(max(var, 0.0))

    def half_width(self, se: float, confidence: float) -> float:
        return t_quantile((1 + confidence) / 2, self.df) * se

    def common(self, a: str, b: str) -> int:
        return len(self.rounds[a] & self.rounds[b])

    def paired(self, a: str, b: str) -> tuple[float, float]:
        """log(a / b) over the rounds both ran in, the mean of their per-round differences, and its standard
        error with the pooled residual (each difference of two runs of one round: variance 2 sigma^2): the
        paired comparison of two configs, blind to rounds only one of them ran in."""
        common = sorted(self.rounds[a] & self.rounds[b])
        d = statistics.fmean(self.logs[a][n] - self.logs[b][n] for n in common)
        return d, self.sigma * math.sqrt(2 / len(common))


def round_model(by_round: Mapping[str, Mapping[int, float]], base: str | None,
                assumed_sd: float) -> RoundModel | None:
    """Fit the model to ``key -> round -> step time`` (the baseline ``base``); None when the baseline shares no
    round with another config. ``assumed_sd``: the spread of a log step time until the rounds leave a residual."""
    members: dict[int, list[str]] = {}
    for k in sorted(by_round):  # sorted: the fit, to the last bit, does not depend on the ledger's order
        for n in by_round[k]:
            members.setdefault(n, []).append(k)
    members = {n: ks for n, ks in members.items() if len(ks) > 1}  # a run alone in its round pairs with nothing
    if base is None or not any(base in ks for ks in members.values()):
        return None
    linked, grew = {base}, True
    while grew:
        grew = False
        for ks in members.values():
            if linked.intersection(ks) and not linked.issuperset(ks):
                linked.update(ks)
                grew = True
    rounds = sorted(n for n, ks in members.items() if ks[0] in linked)
    keys = (base, *sorted(linked - {base}))
    col = {k: i for i, k in enumerate(keys[1:])}
    n_cfg = len(col)
    rows, y = [], []
    for j, n in enumerate(rounds):
        for k in members[n]:
            x = np.zeros(n_cfg + len(rounds))
            if k != base:
                x[col[k]] = 1.0
            x[n_cfg + j] = 1.0
            rows.append(x)
            y.append(math.log(by_round[k][n]))
    X, Y = np.array(rows), np.array(y)
    inv = np.linalg.pinv(X.T @ X)
    theta = inv @ X.T @ Y
    df = len(Y) - int(np.linalg.matrix_rank(X))
    rss = float(np.sum((Y - X @ theta) ** 2))
    cov = np.zeros((len(keys), len(keys)))
    cov[1:, 1:] = inv[:n_cfg, :n_cfg]
    effect = {base: 0.0, **{k: float(theta[i]) for k, i in col.items()}}
    in_rounds = {k: frozenset(n for n in rounds if k in members[n]) for k in keys}
    logs = {k: {n: math.log(by_round[k][n]) for n in in_rounds[k]} for k in keys}
    # The residual pooled with the assumed spread as PRIOR_DF degrees of freedom: with the few rounds a sweep
    # affords, a residual that came out small by chance would otherwise tell configs apart that are not (and the
    # racing would act on exactly those draws).
    nu0 = PRIOR_DF
    if df + nu0 == 0:
        return RoundModel(keys, effect, cov, assumed_sd, 1, in_rounds, logs)
    return RoundModel(keys, effect, cov, math.sqrt((rss + nu0 * assumed_sd ** 2) / (df + nu0)), df + nu0,
                      in_rounds, logs)


PRIOR_DF = 2
"""Degrees of freedom the assumed spread of a run (``assumed_sd``) counts for beside the rounds' residual: the
spread of unpaired runs, an upper bound for what pairing leaves, so the prior errs wide."""
