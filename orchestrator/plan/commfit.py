"""Data-parallel communication from slices: 2-rank slices at several bucket sizes, overlap on and off ->
``dp_latency_us``, ``dp_bw_eff``, ``dp_overlap_eff``, each with its uncertainty, or a refusal.

The planner's own formulas (``planner.timing.dp_times``) are the model: with overlap off a step's DP wait is
n buckets x the latency of one bucket's collective (``dp_latency_us``: what the trainer's buckets pay, hook,
dispatch and rendezvous included, in place of the link's hops x latency) + the gradient bytes over the bus
bandwidth x ``dp_bw_eff``, linear in the latency and in 1/``dp_bw_eff``; with overlap on the same buckets hide under
``dp_overlap_eff`` of the backward. The slices' measured ``dp_comm_wait`` (the trainer's phase, slowest rank)
is fitted in two steps: the two linear terms on the overlap-off slices (relative least squares), then the
overlap share on the overlap-on slices (a bounded one-dimensional search). Two bucket counts tell the
per-message term from the bandwidth term; one overlap-on slice with more than one bucket tells the overlap
share. Anything less is refused up front, naming the slice that would pin it.

Each slice runs several times (interleaved with the others, so a burst of load hits every slice alike): the
fit uses the median per slice, and its uncertainty is a bootstrap over the runs (resample each slice's runs,
take the median, refit). A parameter whose 90% interval is wider than ``PIN`` of its value is not pinned
down: ``fit_dp_comm`` says so and which slice to measure more (``CommFit.refusal``); the caller does not write
it. Pure: nothing here runs.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from orchestrator.planner import Efficiency
from orchestrator.planner.config import PlanConfig

DP_FIT = ("dp_latency_us", "dp_bw_eff", "dp_overlap_eff")
"""What the data-parallel slices fit."""
PIN = {"dp_latency_us": 0.5, "dp_bw_eff": 0.5, "dp_overlap_eff": 0.25}
"""Largest accepted half-width of the bootstrap 90% interval: relative to the value for the first two, absolute
(a share of the window) for the overlap."""
BOUNDS = {"dp_latency_us": (0.0, 1e6), "dp_bw_eff": (0.01, 1.0), "dp_overlap_eff": (0.0, 1.0)}


@dataclass(frozen=True)
class DPObservation:
    """One data-parallel slice and what it measured."""

    name: str
    plan: PlanConfig
    """The planner's view of the slice (``prefilter.plan_for_trial``)."""
    samples_s: tuple[float, ...]
    """Its measured DP wait per run (the trainer's ``dp_comm_wait``, slowest rank, the median update)."""

    @property
    def overlap(self) -> bool:
        return bool(self.plan.data_parallel.overlap_grad_reduce)

    @property
    def bucket_mb(self) -> float:
        return float(self.plan.data_parallel.bucket_mb)


@dataclass(frozen=True)
class CommFit:
    values: dict[str, float]
    """The fitted parameters (medians of the runs)."""
    intervals: dict[str, tuple[float, float]]
    """Bootstrap 5th-95th percentile of each parameter."""
    rows: tuple[tuple[str, float, float, float], ...]
    """(slice, measured median DP wait, the prior's prediction, the fitted prediction), seconds."""
    buckets: dict[str, int]
    """Buckets per step of each slice, as the planner counts them."""
    refusal: str | None = None
    """Why the fit may not be written (a parameter not pinned down, and what to measure), or None."""

    def efficiency(self, base: Efficiency) -> Efficiency:
        return dataclasses.replace(base, **self.values)


def _dp(plan: PlanConfig, eff: Efficiency) -> float:
    """The planner's exposed DP seconds of one config."""
    from orchestrator.planner.calibrate import _evaluate
    from orchestrator.planner.knobs import encode

    return _evaluate(plan, encode([plan]), eff)["dp_exposed_s"]


Terms = tuple[float, float, float, float]
"""(buckets, latency seconds not fitted (0: dp_latency_us replaces the link's), bandwidth seconds at dp_bw_eff
1, the backward window) of one slice."""


def _terms(plan: PlanConfig, eff: Efficiency) -> Terms:
    """Read off the planner by evaluating it at known parameters with overlap off, so these are its formulas;
    the window is its backward per microbatch (the last microbatch's backward is what a bucket hides under)."""
    from orchestrator.planner.knobs import Consts, encode
    from orchestrator.planner.timing import stage_times

    off = dataclasses.replace(plan, data_parallel=dataclasses.replace(plan.data_parallel, overlap_grad_reduce=False))
    base = dataclasses.replace(eff, dp_latency_us=0.0, dp_bw_eff=1.0, dp_overlap_eff=1.0)
    a0 = _dp(off, base)  # the bandwidth term alone
    nb = (_dp(off, dataclasses.replace(base, dp_latency_us=1.0)) - a0) / 1e-6
    window = float(stage_times(Consts.of(plan, eff), encode([plan]))["B"][0].max())
    return nb, 0.0, a0, window


def _predict(t: Terms, overlap: bool, msg_s: float, bw_eff: float, ov) -> np.ndarray:
    """The planner's DP wait of a pp-1 slice (timing.dp_times with no drain slack): n messages back to back,
    or, overlapped, what ``comm.bucket_tail`` leaves of them after ``ov`` of the window."""
    from orchestrator.planner.comm import bucket_tail

    nb, hop, bw, window = t
    total = nb * msg_s + hop + bw / bw_eff
    if not overlap:
        return np.full(np.shape(ov), total)
    return bucket_tail(total / nb, nb, window * np.asarray(ov, dtype=float))


_GRID = np.linspace(0.0, 1.0, 101)


def _solve(obs: Sequence[DPObservation], y: Sequence[float], terms: dict[str, Terms]) -> dict[str, float]:
    off = [(o, v) for o, v in zip(obs, y) if not o.overlap]
    rows = np.array([[terms[o.name][0] / v, terms[o.name][2] / v] for o, v in off])
    rhs = np.array([1.0 - terms[o.name][1] / v for o, v in off])
    (msg, inv_eff), *_ = np.linalg.lstsq(rows, rhs, rcond=None)
    msg = max(0.0, float(msg))
    if msg == 0.0:
        inv_eff = float(np.dot(rows[:, 1], rhs) / np.dot(rows[:, 1], rows[:, 1]))
    bw_eff = float(min(1.0, max(BOUNDS["dp_bw_eff"][0], 1.0 / inv_eff if inv_eff > 0 else 1.0)))
    err = np.zeros_like(_GRID)
    for o, v in zip(obs, y):
        if o.overlap:
            err += (_predict(terms[o.name], True, msg, bw_eff, _GRID) / v - 1.0) ** 2
    return {"dp_latency_us": msg * 1e6, "dp_bw_eff": bw_eff, "dp_overlap_eff": float(_GRID[int(np.argmin(err))])}


def identifiability(obs: Sequence[DPObservation], eff: Efficiency) -> tuple[dict[str, Terms], str | None]:
    """Each slice's planner terms, and what is missing for the three parameters to be identifiable (or None)."""
    terms = {o.name: _terms(o.plan, eff) for o in obs}
    if any(o.plan.parallel.dp < 2 for o in obs):
        bad = next(o for o in obs if o.plan.parallel.dp < 2)
        return terms, f"slice {bad.name} has no data parallelism (dp {bad.plan.parallel.dp}); DP slices run at dp >= 2"
    off = [o for o in obs if not o.overlap]
    counts = sorted({round(terms[o.name][0]) for o in off})
    smallest = min((o.bucket_mb for o in obs), default=0.0)
    if len(counts) < 2:
        have = f"{len(off)} overlap-off slice(s) with {counts[0] if counts else 0} bucket(s)" if off else "none"
        return terms, ("dp_latency_us and dp_bw_eff cannot be told apart: the overlap-off DP slices need "
                       f"two different bucket counts ({have}); add an overlap-off slice at bucket_mb "
                       f"{smallest / 10 if smallest else 0.05:g} (more buckets) beside one with a single bucket")
    on = [o for o in obs if o.overlap and terms[o.name][0] > 1.5]
    if not on:
        return terms, ("dp_overlap_eff cannot be pinned: no overlap-on DP slice with more than one bucket (one "
                       f"bucket is always exposed); add an overlap-on slice at bucket_mb {smallest or 0.05:g}")
    return terms, None


def fit_dp_comm(obs: Sequence[DPObservation], eff: Efficiency, n_boot: int = 200, seed: int = 0) -> CommFit:
    """Fit ``DP_FIT`` to the slices' DP waits (see the module docstring). ValueError when the slices cannot
    identify a parameter (naming the slice to add); a ``CommFit`` with ``refusal`` set when they could but
    the runs scatter too much to pin it."""
    if not obs:
        raise ValueError("no data-parallel slices: run profile with --ranks 2 (or more) for the DP slices")
    if empty := [o.name for o in obs if not o.samples_s]:
        raise ValueError(f"slice {empty[0]}: no measured runs")
    terms, missing = identifiability(obs, eff)
    if missing:
        raise ValueError(missing)
    med = [statistics.median(o.samples_s) for o in obs]
    values = _solve(obs, med, terms)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(n_boot):
        y = [float(np.median(rng.choice(o.samples_s, size=len(o.samples_s)))) for o in obs]
        boots.append(_solve(obs, y, terms))
    intervals = {k: (float(np.percentile([b[k] for b in boots], 5)), float(np.percentile([b[k] for b in boots], 95)))
                 for k in DP_FIT}
    fitted = dataclasses.replace(eff, **values)
    prior_eff = eff
    rows = tuple((o.name, m, _dp(o.plan, prior_eff), _dp(o.plan, fitted)) for o, m in zip(obs, med))
    refusal = None
    for k in DP_FIT:
        lo, hi = intervals[k]
        half = (hi - lo) / 2
        limit = PIN[k] if k == "dp_overlap_eff" else PIN[k] * max(abs(values[k]), 1e-9)
        if half > limit:
            which = _pinning_slice(k, obs, terms)
            refusal = (f"{k} is not pinned down: bootstrap 90% interval {lo:.4g} to {hi:.4g} around {values[k]:.4g} "
                       f"(wider than {'+-' + format(PIN[k], 'g') if k == 'dp_overlap_eff' else format(PIN[k], '.0%')}"
                       f"); measure slice {which} more often (--repeats) or on a quieter machine")
            break
    return CommFit(values, intervals, rows, {o.name: int(round(terms[o.name][0])) for o in obs}, refusal)


def _pinning_slice(param: str, obs: Sequence[DPObservation], terms: dict[str, Terms]) -> str:
    """The slice whose measurement weighs most on ``param``: the most buckets for the per-message cost, the
    fewest for the bandwidth, the overlap-on slice with the most buckets for the overlap share."""
    off = [o for o in obs if not o.overlap]
    if param == "dp_latency_us":
        return max(off, key=lambda o: terms[o.name][0]).name
    if param == "dp_bw_eff":
        return min(off, key=lambda o: terms[o.name][0]).name
    return max((o for o in obs if o.overlap), key=lambda o: terms[o.name][0]).name


def format_comm_fit(fit: CommFit) -> str:
    w = max(len(r[0]) for r in fit.rows)
    lines = [f"{'DP slice':<{w}}  {'buckets':>7}  {'measured ms':>11}  {'prior ms':>8}  {'fitted ms':>9}  {'error':>6}"]
    lines += [f"{n:<{w}}  {fit.buckets[n]:7d}  {1e3 * m:11.2f}  {1e3 * p:8.2f}  {1e3 * f:9.2f}  "
              f"{100 * (f - m) / m if m > 0 else math.nan:+5.0f}%" for n, m, p, f in fit.rows]
    lines.append("fitted: " + ", ".join(f"{k} = {fit.values[k]:.4g} (90% {fit.intervals[k][0]:.4g}-"
                                        f"{fit.intervals[k][1]:.4g})" for k in DP_FIT))
    return "\n".join(lines)


def provenance(fit: CommFit) -> dict[str, Any]:
    """The calibration file's record of the DP fit."""
    return {"fitted": list(DP_FIT), "values": {k: round(v, 6) for k, v in fit.values.items()},
            "interval_90": {k: [round(lo, 6), round(hi, 6)] for k, (lo, hi) in fit.intervals.items()},
            "method": "median of each slice's runs; bootstrap over runs for the intervals",
            "slices": [{"name": n, "buckets": fit.buckets[n], "measured_dp_wait_s": round(m, 6),
                        "prior_s": round(p, 6), "fitted_s": round(f, 6)} for n, m, p, f in fit.rows]}
