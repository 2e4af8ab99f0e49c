"""How far a model-backend answer can be trusted: its interval, where that comes from, and which efficiency set.

Every model-backend prediction carries a step-time interval (``prediction.interval``: the fit's uncertainty,
or the corpus band where none applies; orchestrator/calibration/interval.py). Two picks are read from a ledger:

* **point**: the fastest point estimate. It stays the ledger's "best" and the optimiser's objective, so a model
  sweep and a measured sweep rank the same way, and it is the answer's winner.
* **lowest upper end**: the config whose interval ends lowest. Intervals propagated from a fit depend on the
  config (one with more exposed communication leans more on dp_bw_eff), so it may be another config; the
  summary names it when it is.

The target verdict is the answer's (``records.answer.interval_state`` on the point pick's interval: met, not
met or undecided), not a rule of its own. The efficiency set's ``basis`` (prior, blind, calibrated, fitted;
planner/cluster.py) is named beside it, because a calibrated answer reproduces the timeline it was solved from
and is not a prediction of it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from orchestrator.records import query as Q
from orchestrator.records.answer import interval_state, predicted_interval
from orchestrator.records.record import Status, TrialRecord


def efficiency_basis(record: TrialRecord) -> tuple[str, str]:
    """(basis, note) of the efficiency set a model-backend record was predicted with; 'unrecorded' for old lines."""
    eff = (record.config or {}).get("efficiency") or {}  # the planner's plan: its keys are the planner's schema
    basis = eff.get("basis") or (record.prediction or {}).get("efficiency_basis") or "unrecorded"
    return str(basis), str(eff.get("basis_note") or "")


def _interval_basis(record: TrialRecord) -> str | None:
    pred = record.prediction or {}
    iv = pred.get("interval")
    return iv.get("basis") if isinstance(iv, Mapping) else pred.get("band_basis")


def verdict(records: Iterable[TrialRecord], target_s: float | None) -> dict[str, Any] | None:
    """The point pick, the lowest upper end and the target state of a model-backend ledger; None for measured
    sweeps."""
    rows = [r for r in Q.measured(records) if r.predicted and r.status is Status.OK and r.metrics.step_time_s]
    if not rows:
        return None
    point = min(rows, key=lambda r: r.metrics.step_time_s)
    with_iv = [(r, iv) for r in rows if (iv := predicted_interval(r)) is not None]
    robust, robust_iv = min(with_iv, key=lambda p: p[1][1], default=(None, None))
    iv = predicted_interval(point)
    basis, note = efficiency_basis(point)
    return {
        "target_s": target_s, "efficiency_basis": basis, "efficiency_note": note,
        "verdict": interval_state(iv[0], iv[1], target_s) if iv is not None and target_s is not None else None,
        "interval_basis": _interval_basis(point), "sources": (point.prediction or {}).get("sources"),
        "point_trial": point.trial, "point_s": point.metrics.step_time_s,
        "point_low_s": iv[0] if iv else None, "point_high_s": iv[1] if iv else None, "level": iv[2] if iv else None,
        "robust_trial": robust.trial if robust else None, "robust_s": robust.metrics.step_time_s if robust else None,
        "robust_high_s": robust_iv[1] if robust_iv else None,
        "robust_verdict": interval_state(robust_iv[0], robust_iv[1], target_s)
        if robust_iv is not None and target_s is not None else None,
    }


def verdict_lines(v: Mapping[str, Any] | None) -> list[str]:
    """The summary's lines for a verdict (nothing for a measured sweep). The target's own line is the answer's."""
    if not v:
        return []
    out = [f"efficiency set: {v['efficiency_basis']}" + (f" ({v['efficiency_note']})" if v["efficiency_note"] else "")
           + (" - CALIBRATED to the timeline it answers about, not a prediction of it"
              if v["efficiency_basis"] == "calibrated" else "")]
    if v.get("sources"):
        out.append(f"network: {v['sources']['network']}")
    if v["point_high_s"] is None:
        return out + ["interval: not recorded in this ledger (predicted before intervals and bands existed)"]
    out.append(f"interval (trial {v['point_trial']}): ~{v['point_s']:.2f} s ({v['level']:.0%}: "
               f"{v['point_low_s']:.2f}-{v['point_high_s']:.2f} s); {v['interval_basis']}")
    if v["robust_trial"] != v["point_trial"]:
        better = (f"; against the target: {v['robust_verdict']}" if v.get("robust_verdict") not in (None, v["verdict"])
                  else "")
        out.append(f"lowest upper end: trial {v['robust_trial']}, ~{v['robust_s']:.2f} s, upper end "
                   f"~{v['robust_high_s']:.2f} s{better}")
    return out
