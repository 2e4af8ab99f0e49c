"""How sure a fitted efficiency set is, and what that makes of a prediction: a 90% interval on every figure.

A fit (``calibrate``: to slices, to a ledger, to published runs) is repeated on resampled measurements (the
bootstrap: Efron & Tibshirani 1993, ch. 6 and 13; resampling whole rounds of interleaved runs, so what a round
shares stays together): its replicates are ``Uncertainty.samples``. The fit's own relative residuals, log(measured /
predicted) per metric, are kept beside them (``residuals``): a model that misses what it was fitted to by 8%
will miss a new config by as much, and an interval of the parameters' spread alone would not say so.

A prediction's interval (``intervals``) is the 5th-95th percentile, for ``level`` 0.9, of the prediction at every
replicate times the exponential of a residual drawn for it (a residual bootstrap on top of the parameter one:
Davison & Hinkley 1997, sec. 6.3.3, prediction intervals). Replicates keep their parameters together, so two
parameters that trade off against each other (a fast GEMM with a slow overhead, or the reverse) widen the
interval only by what the trade-off changes in the prediction at hand.

Pure: numpy and the planner's own formulas; nothing here fits or runs.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from .cluster import Efficiency
from .config import PlanConfig
from .knobs import Consts, encode
from .timing import step_times

LEVEL = 0.9
"""The stated coverage of every interval: the 5th to the 95th percentile."""
DRAWS_PER_SAMPLE = 8
"""Residuals drawn per replicate: smooths the percentiles of a few dozen replicates."""
PHASES = ("step_time_s", "forward_s", "backward_s", "recompute_s", "optimizer_s", "dp_exposed_s", "pp_bubble_s",
          "pp_p2p_s", "tp_comm_s", "compute_track_s")
"""The figures an interval can be asked for: the planner's breakdown names."""


@dataclass(frozen=True)
class Interval:
    """A figure with its interval: ``low`` <= ``point`` <= ``high`` at the stated ``level`` (e.g. 0.9)."""

    low: float
    point: float
    high: float
    level: float = LEVEL

    def __post_init__(self) -> None:
        for name in ("low", "point", "high"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"interval.{name}: expected a finite number, got {v!r}")
        if not self.low <= self.high:
            raise ValueError(f"interval: low {self.low} above high {self.high}")
        if not 0 < self.level < 1:
            raise ValueError(f"interval.level: expected a fraction in (0, 1), got {self.level!r}")

    def contains(self, x: float) -> bool:
        return self.low <= x <= self.high

    def text(self, unit: str = "s", scale: float = 1.0, digits: int = 2) -> str:
        """``9.12 s (90%: 8.80-9.61 s)``."""
        f = lambda v: f"{v * scale:.{digits}f}"  # noqa: E731
        return f"{f(self.point)} {unit} ({round(100 * self.level)}%: {f(self.low)}-{f(self.high)} {unit})"

    def to_dict(self) -> dict[str, float]:
        return {"low": self.low, "point": self.point, "high": self.high, "level": self.level}


@dataclass(frozen=True)
class Uncertainty:
    """A fitted efficiency set's uncertainty: the fitted fields' values in each bootstrap replicate of the fit, and
    the fit's relative residuals per metric."""

    samples: tuple[Mapping[str, float], ...]
    """One mapping per replicate: fitted field -> its value in that refit (fields held at their prior are absent:
    they take the point set's value)."""
    residuals: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    """Metric (``step_time_s``, ``forward_s``, ...) -> log(measured / predicted) of every measurement the point fit
    was judged on. A metric without residuals gets the parameters' spread alone."""
    level: float = LEVEL
    """Coverage the intervals state."""
    basis: str = ""
    """Where the replicates come from (e.g. "bootstrap over 5 rounds of 42 slices, 40 refits")."""
    run_sd: float = 0.0
    """Standard deviation of log(step time) of one run around its config's own level, measured on the runs the fit
    rests on (the median over slices of the spread across rounds); 0 where no run was measured (a fit to published
    runs). An interval asked for a measurement of ``runs`` runs widens by the noise of their median."""

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("uncertainty.samples: need at least one bootstrap replicate")
        known = {f.name for f in dataclasses.fields(Efficiency)}
        for i, s in enumerate(self.samples):
            if bad := sorted(set(s) - known):
                raise ValueError(f"uncertainty.samples[{i}].{bad[0]}: not an efficiency field")
        if not 0 < self.level < 1:
            raise ValueError(f"uncertainty.level: expected a fraction in (0, 1), got {self.level!r}")
        if not isinstance(self.run_sd, (int, float)) or not 0 <= self.run_sd < 5:
            raise ValueError(f"uncertainty.run_sd: expected a log standard deviation in [0, 5), got {self.run_sd!r}")
        for k, v in self.residuals.items():
            if not all(isinstance(x, (int, float)) and math.isfinite(x) for x in v):
                raise ValueError(f"uncertainty.residuals.{k}: expected finite numbers")

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(k for s in self.samples for k in s))

    def efficiencies(self, point: Efficiency) -> list[Efficiency]:
        """The point set with each replicate's fitted values in place."""
        return [dataclasses.replace(point, **s) for s in self.samples]

    def field_interval(self, name: str, point: float) -> Interval:
        """A fitted field's own interval over the replicates (its ``point`` value beside it)."""
        vals = [float(s[name]) for s in self.samples if name in s]
        if not vals:
            raise ValueError(f"{name}: not fitted (no replicate holds it)")
        lo, hi = np.percentile(vals, [50 * (1 - self.level), 50 * (1 + self.level)])
        return Interval(float(min(lo, point)), float(point), float(max(hi, point)), self.level)

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "basis": self.basis, "run_sd": round(float(self.run_sd), 6),
                "samples": [{k: float(v) for k, v in s.items()} for s in self.samples],
                "residuals": {k: [round(float(x), 6) for x in v] for k, v in self.residuals.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "uncertainty") -> "Uncertainty":
        if not isinstance(d, Mapping):
            raise ValueError(f"{where}: expected a mapping (level, basis, samples, residuals)")
        samples = d.get("samples")
        if not isinstance(samples, list) or not all(isinstance(s, Mapping) for s in samples):
            raise ValueError(f"{where}.samples: expected a list of mappings (field -> value)")
        res = d.get("residuals") or {}
        if not isinstance(res, Mapping):
            raise ValueError(f"{where}.residuals: expected a mapping (metric -> list of numbers)")
        try:
            return cls(tuple({k: float(v) for k, v in s.items()} for s in samples),
                       {k: tuple(float(x) for x in v) for k, v in res.items()}, float(d.get("level", LEVEL)),
                       str(d.get("basis", "")), float(d.get("run_sd", 0.0)))
        except (TypeError, ValueError) as e:
            raise ValueError(f"{where}: {e}") from None


def _groups(plans: Sequence[PlanConfig], eff: Efficiency) -> list[list[int]]:
    """Plans that share one ``Consts`` (the vectorised formulas take one parallel layout per call)."""
    groups: dict[Consts, list[int]] = {}
    for i, p in enumerate(plans):
        groups.setdefault(Consts.of(p, eff), []).append(i)
    return list(groups.values())


def predictions(plans: Sequence[PlanConfig], eff: Efficiency, metrics: Sequence[str] = PHASES
                ) -> dict[str, np.ndarray]:
    """Every plan predicted with ``eff``: metric -> (len(plans),)."""
    out = {m: np.zeros(len(plans)) for m in metrics}
    for rows in _groups(plans, eff):
        t = step_times(Consts.of(plans[rows[0]], eff), encode([plans[i] for i in rows]))
        for m in metrics:
            out[m][rows] = t[m]
    return out


def intervals(plans: Sequence[PlanConfig], point: Efficiency, u: Uncertainty | None,
              metrics: Sequence[str] = ("step_time_s",), seed: int = 0, runs: int | None = None
              ) -> list[dict[str, Interval]]:
    """Per plan, per metric: the point prediction and its ``u.level`` interval (module docstring). Without an
    ``Uncertainty`` every interval is the point itself (nothing says how sure it is).

    ``runs``: the interval is for a measurement, the median of that many runs, so each draw also carries that
    median's noise (``u.run_sd`` x 1.25 / sqrt(runs): the median's standard error, Kenney & Keeping 1962); None:
    for the config's own level, no measurement noise."""
    if runs is not None and runs < 1:
        raise ValueError(f"runs: expected a number of runs >= 1, got {runs!r}")
    for m in metrics:
        if m not in PHASES:
            raise ValueError(f"metrics: {m!r} is not a planner figure; choose from {', '.join(PHASES)}")
    mid = predictions(plans, point, metrics)
    if u is None:
        return [{m: Interval(float(mid[m][i]), float(mid[m][i]), float(mid[m][i])) for m in metrics}
                for i in range(len(plans))]
    reps = [predictions(plans, e, metrics) for e in u.efficiencies(point)]
    rng = np.random.default_rng(seed)
    lo_q, hi_q = 50 * (1 - u.level), 50 * (1 + u.level)
    bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for m in metrics:
        draws = np.stack([r[m] for r in reps])  # (replicates, plans)
        res = np.asarray(u.residuals.get(m) or u.residuals.get("step_time_s") or (0.0,), dtype=float)
        picks = rng.choice(res, size=(len(reps), DRAWS_PER_SAMPLE))  # the same draw for every plan of a replicate
        spread = (draws[:, None, :] * np.exp(picks)[:, :, None]).reshape(-1, len(plans))
        if runs is not None and u.run_sd > 0:
            spread = spread * np.exp(rng.normal(0.0, 1.2533 * u.run_sd / math.sqrt(runs), size=spread.shape))
        bounds[m] = (np.percentile(spread, lo_q, axis=0), np.percentile(spread, hi_q, axis=0))
    return [{m: Interval(float(min(bounds[m][0][i], mid[m][i])), float(mid[m][i]),
                         float(max(bounds[m][1][i], mid[m][i])), u.level) for m in metrics}
            for i in range(len(plans))]
