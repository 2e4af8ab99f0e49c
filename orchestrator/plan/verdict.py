"""How far a model-backend answer can be trusted: its band, the robust pick, and which efficiency set made it.

Every planner prediction carries a band (``step_time_low_s``..``step_time_high_s``, from the corpus's held-out
residuals; orchestrator/planner/band.py). Two picks are read from a model-backend ledger:

* **point**: the fastest point estimate. This stays the ledger's "best" and the optimiser's objective, so a
  model sweep and a measured sweep rank the same way.
* **robust**: the config with the lowest upper end. With today's single relative band it is the same config
  as the point pick (the upper end is the point times a constant); it is computed on its own so that a band
  that depends on the config (e.g. wider for more exposed communication) changes the pick, not the code.

The verdict on the target: **robust** when the robust pick's upper end is within it, **point only** when
some point estimate is but no upper end, else **not met**. The efficiency set's ``basis`` (prior, blind,
calibrated, fitted; planner/cluster.py) is named beside it, because a calibrated answer reproduces the
timeline it was solved from and is not a prediction of it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from orchestrator.records import query as Q
from orchestrator.records.record import Status, TrialRecord

VERDICTS = ("robust", "point only", "not met")


def _high(r: TrialRecord) -> float | None:
    v = (r.prediction or {}).get("step_time_high_s")
    return float(v) if isinstance(v, (int, float)) else None


def efficiency_basis(record: TrialRecord) -> tuple[str, str]:
    """(basis, note) of the efficiency set a model-backend record was predicted with; 'unrecorded' for old lines."""
    eff = (record.config or {}).get("efficiency") or {}  # the planner's plan: its keys are the planner's schema
    basis = eff.get("basis") or (record.prediction or {}).get("efficiency_basis") or "unrecorded"
    return str(basis), str(eff.get("basis_note") or "")


def verdict(records: Iterable[TrialRecord], target_s: float | None) -> dict[str, Any] | None:
    """Point and robust picks of a model-backend ledger and the target verdict; None for measured sweeps."""
    rows = [r for r in Q.measured(records) if r.predicted and r.status is Status.OK and r.metrics.step_time_s]
    if not rows:
        return None
    point = min(rows, key=lambda r: r.metrics.step_time_s)
    banded = [r for r in rows if _high(r) is not None]
    robust = min(banded, key=_high, default=None)
    if target_s is None:
        met = None
    elif robust is not None and _high(robust) <= target_s:
        met = "robust"
    elif point.metrics.step_time_s <= target_s:
        met = "point only"
    else:
        met = "not met"
    basis, note = efficiency_basis(point)
    pred = point.prediction or {}
    return {
        "target_s": target_s, "verdict": met, "efficiency_basis": basis, "efficiency_note": note,
        "band_basis": pred.get("band_basis"), "sources": pred.get("sources"),
        "point_trial": point.trial, "point_s": point.metrics.step_time_s,
        "point_high_s": _high(point), "point_low_s": pred.get("step_time_low_s"),
        "robust_trial": robust.trial if robust else None, "robust_high_s": _high(robust) if robust else None,
        "robust_s": robust.metrics.step_time_s if robust else None,
    }


def verdict_lines(v: Mapping[str, Any] | None) -> list[str]:
    """The summary's lines for a verdict (nothing for a measured sweep)."""
    if not v:
        return []
    out = [f"efficiency set: {v['efficiency_basis']}" + (f" ({v['efficiency_note']})" if v["efficiency_note"] else "")
           + (" - CALIBRATED to the timeline it answers about, not a prediction of it"
              if v["efficiency_basis"] == "calibrated" else "")]
    if v.get("sources"):
        out.append(f"network: {v['sources']['network']}")
    if v["point_high_s"] is None:
        return out + ["band: not recorded in this ledger (predicted before bands existed)"]
    out.append(f"band (trial {v['point_trial']}): ~{v['point_low_s']:.2f}-{v['point_high_s']:.2f} s "
               f"around ~{v['point_s']:.2f} s; {v['band_basis']}")
    if v["robust_trial"] != v["point_trial"]:
        out.append(f"robust pick (lowest upper end): trial {v['robust_trial']}, ~{v['robust_s']:.2f} s, "
                   f"upper end ~{v['robust_high_s']:.2f} s")
    t = v["target_s"]
    if v["verdict"] == "robust":
        out.append(f"target {t:.2f} s met ROBUSTLY: the upper end of trial {v['robust_trial']}'s band "
                   f"(~{v['robust_high_s']:.2f} s) is within it")
    elif v["verdict"] == "point only":
        out.append(f"target {t:.2f} s met at the POINT ESTIMATE ONLY: ~{v['point_s']:.2f} s, but the lowest upper "
                   f"end is ~{v['robust_high_s']:.2f} s (trial {v['robust_trial']}); not robust")
    elif v["verdict"] == "not met":
        out.append(f"target {t:.2f} s not met even at the point estimate (best ~{v['point_s']:.2f} s)")
    return out
