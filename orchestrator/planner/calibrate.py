"""Fit the efficiency parameters to measured runs; report the fit error per metric.

A record is a mapping holding a config and what was measured:

* the config: ``config`` (or ``params``) as flat dotted knobs applied to ``base_cfg``, a full ``planner:``
  mapping, or a ``PlanConfig``;
* measurements, at the top level or under ``measured``: any of ``step_time_s``, the ``Prediction``
  breakdown names (``forward_s``, ``dp_exposed_s``, ...), ``compute_track_s``, ``peak_memory_bytes``;
  the trainer's ``Result`` shape works too (``summary.step_time_s``, ``summary.peak_memory_bytes``,
  ``phases.<forward|backward|optimizer|dp_comm_wait|pipeline_idle|tp_comm>.max``).

Residuals are relative errors, so a step time and a memory peak weigh alike; a weak pull towards the
starting values keeps parameters the data cannot see where the preset put them. Solved with scipy's
``least_squares`` when scipy is installed, else with a small Levenberg-Marquardt below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .cluster import Efficiency
from .config import PlanConfig
from .knobs import Consts, encode
from .memory import stage_memory
from .parse import apply_params, plan_config_from_dict
from .timing import step_times

BOUNDS: dict[str, tuple[float, float]] = {
    "matmul_eff": (0.02, 0.99), "attention_eff": (0.02, 0.99), "flash_attention_eff": (0.02, 0.99), "tp_bw_eff": (0.02, 0.99),
    "pp_bw_eff": (0.02, 0.99), "dp_bw_eff": (0.01, 0.99), "optimizer_bw_eff": (0.02, 0.99), "elementwise_bw_eff": (0.02, 0.99),
    "gemm_tokens_half": (0.0, 1e5), "op_overhead_us": (0.0, 1e5),
    "collective_latency_us": (0.0, 1e5), "dp_latency_us": (0.0, 1e5), "dp_overlap_eff": (0.0, 1.0),
    "pp_latency_us": (0.0, 1e5), "pass_overhead_us": (0.0, 1e5), "optimizer_tensor_us": (0.0, 1e5),
    "step_overhead_us": (0.0, 1e6),
    "mem_reserved_gb": (0.0, 100.0), "mem_activation_factor": (0.5, 4.0),
}
"""Fractions are fitted through a logit between their bounds; the rest through log(x + scale), so a
parameter starting at 0 can still move."""
_SCALE = {"gemm_tokens_half": 16.0, "op_overhead_us": 5.0, "collective_latency_us": 20.0, "dp_latency_us": 20.0,
          "pp_latency_us": 20.0, "pass_overhead_us": 5.0, "optimizer_tensor_us": 1.0, "step_overhead_us": 20.0,
          "mem_reserved_gb": 0.5,
          "mem_activation_factor": 0.1}
DEFAULT_FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "tp_bw_eff", "dp_bw_eff",
               "mem_reserved_gb", "mem_activation_factor")
TIME_METRICS = ("step_time_s", "forward_s", "backward_s", "recompute_s", "dp_exposed_s", "dp_total_s",
                "pp_bubble_s", "pp_p2p_s", "tp_comm_s", "optimizer_s", "compute_track_s",
                "backward_incl_recompute_s", "pp_idle_s")
METRICS = TIME_METRICS + ("peak_memory_bytes",)
TRAINER_PHASES = {"forward": "forward_s", "backward": "backward_incl_recompute_s", "optimizer": "optimizer_s",
                  "dp_comm_wait": "dp_exposed_s", "pipeline_idle": "pp_idle_s", "tp_comm": "tp_comm_s"}
"""The trainer's phases (per rank, summed over microbatches; max over ranks) by the planner's names."""
NESTED_IN_TP = ("forward", "backward", "optimizer")
"""Phases the trainer's tp_comm time sits inside (its collectives block within them) while the planner's
compute terms exclude it: with tensor parallelism they are not comparable and are left out."""


def trainer_phase_metrics(phases: Mapping[str, Any], tensor_parallel: bool = False) -> dict[str, float]:
    """A trainer result's ``phases`` as the planner's metric names (see TRAINER_PHASES, NESTED_IN_TP).

    ``tensor_parallel``: the run had tp > 1. Its forward/backward/optimizer times then hold TP communication
    (timed as ``tp_comm``, or hidden inside compiled blocks under comm_overlap, where tp_comm reads 0)."""
    out = {}
    for phase, name in TRAINER_PHASES.items():
        value = phases.get(phase)
        if isinstance(value, Mapping):
            value = value.get("max")
        if value is not None and not (tensor_parallel and phase in NESTED_IN_TP):
            out[name] = float(value)
    return out


PRIOR_WEIGHT = 0.01
SOLVER_TOL = 1e-12
"""scipy's xtol/ftol for a fit whose fitted values are the product (``plan calibrate``, profile, netcal). A caller
that only ranks configs by the fit may pass a looser one (orchestrator.calibration.guided.REFIT_TOL)."""
MAX_EVALS = 4000
"""scipy's max_nfev for such a fit. A caller that only ranks configs may stop sooner (guided.REFIT_MAX_EVALS)."""
SOLVER_METHODS = ("lm", "trf")
"""scipy least_squares methods a fit may use: "lm" (MINPACK's Levenberg-Marquardt, the default) or "trf" (trust
region reflective), which the guided refit uses (guided.REFIT_METHOD)."""


@dataclass(frozen=True)
class Calibration:
    """Fitted efficiency parameters and how well the model then matches the measurements."""

    efficiency: Efficiency
    """The base config's efficiency with the fitted fields replaced."""
    fitted: dict[str, float]
    errors_before: dict[str, dict[str, float]]
    """Per metric: n, mean_abs_pct, max_abs_pct, with the starting parameters."""
    errors_after: dict[str, dict[str, float]]
    """The same after the fit."""
    n_records: int
    solver: str

    def apply(self, cfg: PlanConfig) -> PlanConfig:
        return dataclasses.replace(cfg, efficiency=self.efficiency)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _metrics(record: Mapping[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    for source in (record.get("summary", {}), record.get("measured", {}), record):
        for name in METRICS:
            if name in source and name not in found and source[name] is not None:
                found[name] = float(source[name])
    cfg = record.get("config")
    cfg = cfg if isinstance(cfg, Mapping) else {}
    tp = (cfg.get("tensor_parallel") or {}).get("size", cfg.get("tensor_parallel.size", 1)) > 1
    for name, value in trainer_phase_metrics(record.get("phases", {}), tp).items():
        found.setdefault(name, value)
    return found


def _config(record: Mapping[str, Any], base: PlanConfig, i: int) -> PlanConfig:
    cfg = record.get("config", record.get("params", {}))
    if isinstance(cfg, PlanConfig):
        return cfg
    if not isinstance(cfg, Mapping):
        raise ValueError(f"records[{i}].config: expected knobs, a planner mapping or a PlanConfig")
    if {"cluster", "model", "job"} & set(cfg):
        return plan_config_from_dict(cfg, where=f"records[{i}].config")
    try:
        return apply_params(base, cfg)
    except ValueError as err:
        raise ValueError(f"records[{i}].config.{err}") from None


def _evaluate(cfg: PlanConfig, knobs: Any, eff: Efficiency) -> dict[str, float]:
    C = Consts.of(cfg, eff)
    t = {k: float(v[0]) for k, v in step_times(C, knobs).items()}
    t["backward_incl_recompute_s"] = t["backward_s"] + t["recompute_s"]
    t["pp_idle_s"] = t["pp_bubble_s"] + t["pp_p2p_s"]
    t["peak_memory_bytes"] = float(stage_memory(C, knobs)["peak"][0])
    return t


@dataclass(frozen=True)
class _Batch:
    """Records the vectorised model can evaluate in one call: their configs give equal ``Consts``."""

    cfg: PlanConfig
    """Any one of them: what ``Consts.of`` reads of it, the others share."""
    knobs: Any
    """``encode`` of all of them, in ``rows``' order."""
    rows: np.ndarray
    """Their positions among the prepared records."""


def _batches(cfgs: Sequence[PlanConfig], eff: Efficiency) -> list[_Batch]:
    """``cfgs`` grouped so that each group shares one ``Consts``: ``step_times`` and ``stage_memory`` take
    everything else per config (``Knobs``), so a group's predictions are the per-record ones, in one call.

    Keyed by ``Consts.of`` itself (model, cluster, job, layout, sequence parallelism, precision...), so two
    records are merged only when the model cannot tell their fixed context apart. The key is built with one
    efficiency, but it holds for any: the link bandwidths are the only fields it scales, and which link a group
    uses follows from fields in the key (t, d, p, gpus_per_node, intra_bw, inter_bw)."""
    groups: dict[Consts, list[int]] = {}
    for i, cfg in enumerate(cfgs):
        groups.setdefault(Consts.of(cfg, eff), []).append(i)
    return [_Batch(cfgs[rows[0]], encode([cfgs[i] for i in rows]), np.asarray(rows)) for rows in groups.values()]


def _evaluate_batch(batch: _Batch, eff: Efficiency, memory: bool = True) -> dict[str, np.ndarray]:
    """``_evaluate`` for every record of ``batch`` at once: metric -> (len(rows),). ``memory``: False leaves
    out ``peak_memory_bytes``: a time-only fit (the guided refit) would pay ``stage_memory`` for nothing."""
    C = Consts.of(batch.cfg, eff)
    t = dict(step_times(C, batch.knobs))
    t["backward_incl_recompute_s"] = t["backward_s"] + t["recompute_s"]
    t["pp_idle_s"] = t["pp_bubble_s"] + t["pp_p2p_s"]
    if memory:
        t["peak_memory_bytes"] = stage_memory(C, batch.knobs)["peak"]
    return t


@dataclass(frozen=True)
class _Terms:
    """One batch's residual terms of one metric: ``weight * (pred[rows] - value) / denom`` at ``at``."""

    metric: str
    rows: np.ndarray
    """Rows of the batch."""
    at: np.ndarray
    """Positions in the residual vector."""
    value: np.ndarray
    weight: np.ndarray
    denom: np.ndarray


def _to_z(name: str, x: float) -> float:
    lo, hi = BOUNDS[name]
    if hi <= 1.0:
        # A start on a bound (dp_overlap_eff 1, a measured network's 1) starts just inside it, where the
        # logit still has a slope; exactly on it the fit could never move.
        u = min(max((x - lo) / (hi - lo), 1e-3), 1 - 1e-3)
        return float(np.log(u / (1 - u)))
    return float(np.log(min(max(x, lo), hi) + _SCALE[name]))


def _from_z(name: str, z: float) -> float:
    lo, hi = BOUNDS[name]
    if hi <= 1.0:
        return float(lo + (hi - lo) / (1.0 + np.exp(-z)))
    return float(np.clip(np.exp(z) - _SCALE[name], lo, hi))


def _errors(rows: list[tuple[dict[str, float], dict[str, float]]]) -> dict[str, dict[str, float]]:
    by_metric: dict[str, list[float]] = {}
    for pred, meas in rows:
        for name, value in meas.items():
            if value != 0:
                by_metric.setdefault(name, []).append(100.0 * (pred[name] - value) / abs(value))
    return {name: {"n": len(e), "mean_abs_pct": float(np.mean(np.abs(e))), "max_abs_pct": float(np.max(np.abs(e)))}
            for name, e in sorted(by_metric.items())}


def calibrate(records: Sequence[Mapping[str, Any]], base_cfg: PlanConfig, fit: Sequence[str] | None = None,
              weights: Mapping[str, float] | None = None, use_scipy: bool = True,
              prior_weight: float = PRIOR_WEIGHT, tol: float = SOLVER_TOL, max_evals: int = MAX_EVALS,
              method: str = "lm") -> Calibration:
    """Fit ``fit`` (default ``DEFAULT_FIT``) efficiency fields so predictions match ``records``.

    ``weights`` scales a metric's residuals; ``prior_weight`` is the pull towards the starting values
    (in the fitted coordinates), 0 for a pure least-squares fit; ``tol``: scipy's xtol and ftol; ``max_evals``:
    scipy's max_nfev; ``method``: scipy's least_squares method, one of ``SOLVER_METHODS`` (the numpy fallback
    ignores all three), whose max_nfev counts what that method counts ("lm": its residual evaluations outside
    the finite-difference Jacobians).
    """
    if not records:
        raise ValueError("records: need at least one measured record")
    if not 0 < tol < 1:
        raise ValueError(f"tol: expected a number in (0, 1), got {tol!r}")
    if max_evals < 1:
        raise ValueError(f"max_evals: expected a whole number >= 1, got {max_evals!r}")
    if method not in SOLVER_METHODS:
        raise ValueError(f"method: expected one of {', '.join(SOLVER_METHODS)}, got {method!r}")
    names = tuple(fit or DEFAULT_FIT)
    for name in names:
        if name not in BOUNDS:
            raise ValueError(f"fit: {name!r} is not a fittable efficiency field; choose from {', '.join(BOUNDS)}")
    weights = dict(weights or {})
    prepared = []
    for i, rec in enumerate(records):
        meas = _metrics(rec)
        if not meas:
            raise ValueError(f"records[{i}]: no measured metric; give any of {', '.join(METRICS)}")
        cfg = _config(rec, base_cfg, i)
        prepared.append((cfg, meas))
    eff0 = base_cfg.efficiency
    z0 = np.array([_to_z(n, getattr(eff0, n)) for n in names])

    def eff_of(z: np.ndarray) -> Efficiency:
        return dataclasses.replace(eff0, **{n: _from_z(n, v) for n, v in zip(names, z)})

    batches, terms, n_meas = _residual_terms(prepared, weights, eff0)

    def residuals(z: np.ndarray) -> np.ndarray:
        eff = eff_of(z)
        out = np.empty(n_meas + len(z))
        for batch, ts in zip(batches, terms):
            pred = _evaluate_batch(batch, eff, memory=any(t.metric == "peak_memory_bytes" for t in ts))
            for t in ts:
                out[t.at] = t.weight * (pred[t.metric][t.rows] - t.value) / t.denom
        out[n_meas:] = prior_weight * (z - z0)
        return out

    solver = "scipy.optimize.least_squares" if use_scipy and _scipy_solver() else "levenberg-marquardt (numpy)"
    z = _scipy_solver(tol, max_evals, method)(residuals, z0) if solver.startswith("scipy") else \
        _levenberg_marquardt(residuals, z0)
    # Labelled fitted; a caller that solved it from the very timeline it will predict relabels it calibrated.
    eff = dataclasses.replace(eff_of(z), basis="fitted")
    before = [(pred, m) for pred, (_, m) in zip(_predict_all(batches, eff0, len(prepared)), prepared)]
    after = [(pred, m) for pred, (_, m) in zip(_predict_all(batches, eff, len(prepared)), prepared)]
    return Calibration(efficiency=eff, fitted={n: getattr(eff, n) for n in names}, errors_before=_errors(before),
                       errors_after=_errors(after), n_records=len(prepared), solver=solver)


def _residual_terms(prepared: Sequence[tuple[PlanConfig, dict[str, float]]], weights: Mapping[str, float],
                    eff: Efficiency) -> tuple[list[_Batch], list[list[_Terms]], int]:
    """(the records' batches, each batch's terms, how many there are in all), the terms at the positions the
    record-by-record loop gave them: record by record, each record's metrics in its own order.

    A time's residual is relative to the larger of it and 2% of the record's step time (else 1 ms), so a
    near-zero phase cannot dominate; a memory peak's to itself."""
    batches = _batches([cfg for cfg, _ in prepared], eff)
    where = {int(i): (b, r) for b, batch in enumerate(batches) for r, i in enumerate(batch.rows)}
    cells: dict[tuple[int, str], list[tuple[int, int, float, float, float]]] = {}
    n = 0
    for i, (_, meas) in enumerate(prepared):
        b, row = where[i]
        floor = 0.02 * meas.get("step_time_s", 0.0) or 1e-3
        for name, value in meas.items():
            denom = max(abs(value), floor) if name != "peak_memory_bytes" else abs(value)
            cells.setdefault((b, name), []).append((row, n, value, weights.get(name, 1.0), denom))
            n += 1
    terms: list[list[_Terms]] = [[] for _ in batches]
    for (b, name), cols in cells.items():
        row, at, value, weight, denom = (np.asarray(c) for c in zip(*cols))
        terms[b].append(_Terms(name, row.astype(int), at.astype(int), value.astype(float), weight.astype(float),
                               denom.astype(float)))
    return batches, terms, n


def _predict_all(batches: Sequence[_Batch], eff: Efficiency, n: int) -> list[dict[str, float]]:
    """``_evaluate`` of every record (n in all, by position), through the batches."""
    out: list[dict[str, float]] = [{} for _ in range(n)]
    for batch in batches:
        pred = _evaluate_batch(batch, eff)
        for r, i in enumerate(batch.rows):
            out[i] = {k: float(v[r]) for k, v in pred.items()}
    return out


def load_solver() -> bool:
    """Import the least-squares solver now rather than at the first ``calibrate`` (scipy.optimize: 0.15-0.35 s on a
    2-core machine); False without scipy (``calibrate`` then uses its own Levenberg-Marquardt)."""
    return _scipy_solver() is not None


def _scipy_solver(tol: float = SOLVER_TOL, max_evals: int = MAX_EVALS, method: str = "lm") -> Callable | None:
    try:
        from scipy.optimize import least_squares
    except ImportError:
        return None
    return lambda f, z0: least_squares(f, z0, method=method, xtol=tol, ftol=tol, max_nfev=max_evals).x


def _levenberg_marquardt(f: Callable[[np.ndarray], np.ndarray], z: np.ndarray, iters: int = 200) -> np.ndarray:
    """Minimise ||f(z)||^2: damped Gauss-Newton steps, forward-difference Jacobian."""
    r = f(z)
    cost, lam = float(r @ r), 1e-3
    for _ in range(iters):
        J = np.empty((len(r), len(z)))
        for j in range(len(z)):
            dz = np.zeros_like(z)
            dz[j] = 1e-6 * max(1.0, abs(z[j]))
            J[:, j] = (f(z + dz) - r) / dz[j]
        g, H = J.T @ r, J.T @ J
        improved = False
        while lam < 1e12:
            step = np.linalg.solve(H + lam * np.diag(np.diag(H) + 1e-12), -g)
            r_new = f(z + step)
            cost_new = float(r_new @ r_new)
            if cost_new < cost:
                z, r, lam, improved = z + step, r_new, max(lam / 3.0, 1e-12), True
                converged = cost - cost_new < 1e-14 * max(cost, 1e-30)
                cost = cost_new
                break
            lam *= 4.0
        if not improved or converged or np.linalg.norm(g) < 1e-12:
            break
    return z
