"""Which efficiency parameters a set of measurements can pin down, decided before they are fitted.

A least-squares fit moves every parameter it is given. One the measurements cannot see (the per-send latency
of a set of runs without a pipeline) or cannot tell from another (the GEMM efficiency and the GEMM half-size
when every run has the same microbatch) still ends somewhere, and wherever it ends is an artefact of noise that
a prediction for other configs then inherits (``matmul_eff`` 0.21 / 0.79 / 0.98 in three fits of the same
slices). So the fit is told only what the measurements separate, and the rest stay at their prior, named, with
the reason.

The test is on the fit's sensitivity matrix at the starting values: ``J[i, j]`` = d(predicted_i / measured_i) /
d x_j, a small step of one parameter (towards where ``MIN_EFFECT`` is judged), so a column is what that
parameter does to every relative residual; a column's scale does not change what the others explain of it. A
parameter is kept when

* **its effect shows**: doubling it (a fraction: moving it halfway to the bound it is farther from) moves some
  measurement by at least
  ``MIN_EFFECT`` (2%, below the run-to-run noise a median of a few runs leaves); and
* **it is separable**: regressed on the columns of the parameters kept before it, at most ``MAX_R2`` (0.95) of its
  column is explained (a variance inflation factor under 20: Belsley, Kuh & Welsch 1980, ch. 3).

Candidates come in priority order (the primary efficiency before its refinements) and join one at a time: each
is regressed on those already kept, so of two parameters that do the same thing the one asked for first stays. Pure: the planner's own
formulas, no runs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from .calibrate import _SCALE, BOUNDS, _config, _evaluate_batch, _metrics, _residual_terms
from .config import PlanConfig

MIN_EFFECT = 0.02
"""Smallest relative change of some measurement, for a doubling of the parameter, that counts as visible."""
MAX_R2 = 0.95
"""Largest share of a parameter's effect the other kept parameters may explain."""


@dataclass(frozen=True)
class Identified:
    """What the measurements can fit, and why the rest is held."""

    fit: tuple[str, ...]
    """The parameters to fit, in the order asked."""
    held: dict[str, str]
    """Parameter -> why it stays at its prior (one sentence)."""
    effect: dict[str, float]
    """Parameter -> the largest relative change of a measurement when it doubles (all candidates)."""
    weighs_most: dict[str, str]
    """Parameter -> the label of the measurement it moves most (to measure more when it is not pinned down)."""


def _columns(records: Sequence[Mapping[str, Any]], base: PlanConfig, names: Sequence[str]
             ) -> tuple[np.ndarray, np.ndarray]:
    """(J, D): the sensitivity of every relative residual to a unit step of each fitted coordinate, and to the
    parameter's doubling (or, for a fraction, to half the distance to its upper bound)."""
    prepared = [(_config(r, base, i), _metrics(r)) for i, r in enumerate(records)]
    eff0 = base.efficiency
    batches, terms, n = _residual_terms(prepared, {}, eff0)

    def resid(eff: Any) -> np.ndarray:
        out = np.empty(n)
        for batch, ts in zip(batches, terms):
            pred = _evaluate_batch(batch, eff, memory=any(t.metric == "peak_memory_bytes" for t in ts))
            for t in ts:
                out[t.at] = (pred[t.metric][t.rows] - t.value) / t.denom
        return out

    r0 = resid(eff0)
    J = np.zeros((n, len(names)))
    D = np.zeros((n, len(names)))
    for j, name in enumerate(names):
        x0 = float(getattr(eff0, name) if getattr(eff0, name) is not None else 0.0)
        lo, hi = BOUNDS[name]
        if hi <= 1.0:  # a fraction: halfway to the bound it is farther from
            big = x0 + (hi - x0) / 2 if x0 - lo < hi - x0 else x0 - (x0 - lo) / 2
        else:
            big = max(2 * x0, x0 + 10 * _SCALE.get(name, 1.0))
        # The slope, by a small step towards ``big`` in the parameter's own units: a column's scale does not change
        # what the others explain of it, and a step in the fit's coordinates would be flat at a fraction's bound.
        step = (big - x0) * 1e-2
        J[:, j] = (resid(dataclasses.replace(eff0, **{name: x0 + step})) - r0) / abs(step)
        D[:, j] = resid(dataclasses.replace(eff0, **{name: big})) - r0
    return J, D


def identify(records: Sequence[Mapping[str, Any]], base: PlanConfig, candidates: Sequence[str],
             labels: Sequence[str] | None = None, min_effect: float = MIN_EFFECT, max_r2: float = MAX_R2) -> Identified:
    """Split ``candidates`` (efficiency fields ``calibrate`` can fit) into those ``records`` pin down and those held
    at ``base``'s values (module docstring). ``labels``: one per residual, in ``calibrate``'s order (record by
    record, each record's metrics in its own order), to name the measurement a parameter weighs on most."""
    for name in candidates:
        if name not in BOUNDS:
            raise ValueError(f"candidates: {name!r} is not a fittable efficiency field")
        if getattr(base.efficiency, name, 0.0) is None and not name.endswith("_latency_us"):
            raise ValueError(f"candidates: {name} has no starting value in the base efficiency")
    base = dataclasses.replace(base, efficiency=dataclasses.replace(
        base.efficiency, **{n: 0.0 for n in candidates if getattr(base.efficiency, n) is None}))
    J, D = _columns(records, base, candidates)
    effect = {n: float(np.max(np.abs(D[:, j]))) if len(D) else 0.0 for j, n in enumerate(candidates)}
    names = list(candidates)
    labels = list(labels) if labels is not None else [f"measurement {i}" for i in range(len(J))]
    weighs = {n: labels[int(np.argmax(np.abs(J[:, j])))] if len(J) else "" for j, n in enumerate(candidates)}
    held: dict[str, str] = {}
    for n in names:
        if effect[n] < min_effect:
            held[n] = (f"no visible effect: doubling it moves no measurement by {100 * min_effect:.0f}% or more "
                       f"(at most {100 * effect[n]:.1f}%)")
    keep: list[str] = []
    for n in names:  # in priority order: a parameter joins when what is already kept does not explain it
        if n in held:
            continue
        r2 = _r2(J, candidates, n, keep)
        if keep and r2 > max_r2:
            partners = _partners(J, candidates, n, keep)
            held[n] = (f"not separable from {', '.join(partners)}: {100 * r2:.1f}% of its effect on these "
                       f"measurements is theirs (more than {100 * max_r2:.0f}%)")
        else:
            keep.append(n)
    return Identified(tuple(n for n in candidates if n in keep), {n: held[n] for n in candidates if n in held},
                      effect, weighs)


def _r2(J: np.ndarray, names: Sequence[str], target: str, others: Sequence[str]) -> float:
    """Share of ``target``'s column the ``others``' columns explain (least squares, no intercept)."""
    y = J[:, list(names).index(target)]
    if not others or not np.any(y):
        return 0.0 if np.any(y) else 1.0
    X = J[:, [list(names).index(o) for o in others]]
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    rest = y - X @ coef
    return float(1.0 - (rest @ rest) / (y @ y))


def _partners(J: np.ndarray, names: Sequence[str], target: str, others: Sequence[str], top: int = 2) -> list[str]:
    """The other parameters whose columns explain ``target``'s most, each alone, best first."""
    scored = sorted(others, key=lambda o: -_r2(J, names, target, [o]))
    return scored[:top]
