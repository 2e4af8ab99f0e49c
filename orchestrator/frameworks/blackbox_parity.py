"""Parity for a black box: a trial's per-iteration loss (and grad norm where logged) against the baseline's.

A production job has no one-rank canonical run to earn its reference, so this gate sees only what the log
prints: the loss curve over the same iterations. Its tolerance is calibrated from the baseline run twice (the
approach of Megatron-LM's functional tests, whose golden values are compared under a tolerance): the larger of
a floor and ``SPREAD_FACTOR`` x the relative spread between the two baseline runs, plus the framework's print
resolution (a loss printed with 4 decimals cannot agree closer than that). Pure: from ParsedLogs to a verdict.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

from orchestrator.frameworks.log import ParsedLog

SPREAD_FACTOR = 10.0
"""How far past the baseline's own run-to-run spread a trial may be (as the trainer's gate widens for bf16)."""
METRICS = ("loss", "grad_norm")


@dataclass(frozen=True)
class CurveTolerance:
    loss_rel: float
    grad_norm_rel: float
    loss_abs: float = 0.0
    """The framework's print resolution of the loss (half its last printed digit)."""
    grad_norm_abs: float = 0.0


def spread(a: ParsedLog, b: ParsedLog) -> dict[str, float]:
    """Largest relative difference per metric between two runs of one config over their common iterations."""
    return {m: max((d for _, d in _diffs(a, b, m)), default=0.0) for m in METRICS}


def printed(floor: CurveTolerance, log: ParsedLog) -> CurveTolerance:
    """``floor`` with its absolute parts at least the print resolution a parser read off the log's numbers."""
    return dataclasses.replace(floor, loss_abs=max(floor.loss_abs, log.resolution.get("loss", 0.0)),
                               grad_norm_abs=max(floor.grad_norm_abs, log.resolution.get("grad_norm", 0.0)))


def calibrate(baseline: ParsedLog, repeat: ParsedLog | None, floor: CurveTolerance) -> CurveTolerance:
    """The tolerance a trial is judged with: the floor, widened by the baseline's own spread where measured."""
    s = spread(baseline, repeat) if repeat is not None else {m: 0.0 for m in METRICS}
    return CurveTolerance(max(floor.loss_rel, SPREAD_FACTOR * s["loss"]),
                          max(floor.grad_norm_rel, SPREAD_FACTOR * s["grad_norm"]), floor.loss_abs, floor.grad_norm_abs)


def compare(baseline: ParsedLog, trial: ParsedLog, tol: CurveTolerance) -> dict[str, Any]:
    """The verdict, in the keys of the ledger's parity verdict (orchestrator.records.record.ParityVerdict): passed,
    the first failing iteration and metric with its difference and tolerance, the worst differences, the iterations
    compared (``steps``); ``gate: loss_curve`` and the ``curve_tolerance``. A trial sharing no logged iteration with
    the baseline fails: nothing was compared."""
    steps = sorted({it.step for it in baseline.iterations} & {it.step for it in trial.iterations})
    out: dict[str, Any] = {"passed": bool(steps), "gate": "loss_curve", "curve_tolerance": asdict(tol),
                           "steps": len(steps), "max_loss_rel_diff": 0.0, "max_grad_norm_rel_diff": 0.0,
                           # the trainer gate's tolerance shape; a black box's parameters and replicas are not
                           # seen, so their tolerances are NaN (not compared), never a number that was not applied
                           "tolerance": {"loss_rel": tol.loss_rel, "grad_norm_rel": tol.grad_norm_rel,
                                         "param_rel": math.nan, "replica_abs": math.nan}}
    if not steps:
        out.update(first_fail_metric="steps", first_fail_step=None)
        return out
    fails = []
    for m in METRICS:
        rel, ab = getattr(tol, f"{m}_rel"), getattr(tol, f"{m}_abs")
        for step, d, a, b in _diffs_abs(baseline, trial, m):
            out[f"max_{m}_rel_diff"] = max(out[f"max_{m}_rel_diff"], d)
            if not abs(a - b) <= rel * max(abs(a), 1e-12) + ab:  # NaN fails too
                fails.append((step, m, d, rel + ab / max(abs(a), 1e-12)))
    if fails:
        step, m, d, allowed = min(fails)
        out.update(passed=False, first_fail_step=step, first_fail_metric=m, first_fail_diff=d,
                   first_fail_tolerance=allowed)
    return out


def describe(verdict: dict[str, Any]) -> str:
    m = verdict.get("first_fail_metric")
    if m == "steps":
        return "no logged iteration in common with the baseline"
    what = "loss" if m == "loss" else "grad norm"
    return (f"{what} differs at iteration {verdict['first_fail_step']}: relative difference "
            f"{verdict['first_fail_diff']:.2e} > tolerance {verdict['first_fail_tolerance']:.1e} (loss curve, "
            f"{verdict['steps']} iterations compared)")


def _values(log: ParsedLog, m: str) -> dict[int, float]:
    return {it.step: getattr(it, m) for it in log.iterations if getattr(it, m) is not None}


def _diffs_abs(a: ParsedLog, b: ParsedLog, m: str):
    va, vb = _values(a, m), _values(b, m)
    for step in sorted(set(va) & set(vb)):
        x, y = va[step], vb[step]
        d = abs(x - y) / max(abs(x), 1e-12) if math.isfinite(x) and math.isfinite(y) else math.inf
        yield step, d, x, y


def _diffs(a: ParsedLog, b: ParsedLog, m: str):
    for step, d, _, _ in _diffs_abs(a, b, m):
        yield step, d
