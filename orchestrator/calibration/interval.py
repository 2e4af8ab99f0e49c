"""The step-time interval a model-backend prediction carries, and its verdict against a target.

One interval per prediction, from the first of these that applies:

1. **The fit's uncertainty** (``Sources.uncertainty``: a corpus set named by ``planner.uncertainty``, or a
   calibration file's ``uncertainty:`` section), propagated through the planner config by config
   (``planner.uncertainty.intervals``: each bootstrap replicate's prediction times a drawn residual): 90%.
   It applies only to the efficiency set it was fitted around (``SetUncertainty.applies``): an override of a
   fitted field (the article-calibrated set) falls back to 2.
2. **The corpus band** (``planner.band``): 80%, one relative band for every config, cut from the held-out
   published runs' errors. It says how wrong the planner has been on runs it was not fitted to, not how sure
   this efficiency set is, and the basis says so.

The verdict is ``records.answer.interval_state`` on that interval: met, not met or undecided, the rule the
sweep's answer applies to every winner, measured or predicted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from orchestrator.calibration.sources import NO_UNCERTAINTY, Sources
from orchestrator.planner.band import load_band
from orchestrator.planner.config import PlanConfig
from orchestrator.planner.uncertainty import Interval, intervals
from orchestrator.records.answer import interval_state


PHASES = ("forward_s", "backward_s", "recompute_s", "dp_exposed_s", "pp_bubble_s", "pp_p2p_s", "tp_comm_s",
          "optimizer_s")
"""The breakdown's phases that carry their own interval (``planner.uncertainty.PHASES``, the step time aside)."""


@dataclass(frozen=True)
class StepInterval:
    """A prediction's step time with its interval, and where the interval comes from."""

    interval: Interval
    basis: str
    """What the interval is (its level and source), for the reader of the prediction."""
    from_fit: bool
    """True: propagated from the fit's uncertainty; False: the corpus band (no applicable uncertainty)."""
    phases: dict[str, Interval] = field(default_factory=dict)
    """Each phase of the breakdown (``PHASES``) with its interval, from the same replicates; empty for the band,
    which is one relative band of the step time only."""

    def text(self) -> str:
        return self.interval.text()

    def verdict(self, target_s: float) -> str:
        """met, not met or undecided (``records.answer.interval_state``)."""
        return interval_state(self.interval.low, self.interval.high, target_s)

    def to_dict(self) -> dict[str, Any]:
        """What a ledger line's ``prediction.interval`` holds (``records.answer.predicted_interval`` reads it)."""
        out = {**self.interval.to_dict(), "basis": self.basis, "from_fit": self.from_fit}
        if self.phases:
            out["phases"] = {k: v.to_dict() for k, v in self.phases.items()}
        return out


def step_intervals(cfgs: Sequence[PlanConfig], sources: Sources | None) -> list[StepInterval]:
    """Each config's step-time interval (module docstring), in order."""
    fit = sources.uncertainty if sources is not None else None
    no_fit = sources.no_uncertainty if sources is not None else NO_UNCERTAINTY
    band = load_band()
    out: list[StepInterval | None] = [None] * len(cfgs)
    by_eff: dict[Any, list[int]] = {}
    for i, c in enumerate(cfgs):  # intervals() predicts a batch with one efficiency set
        by_eff.setdefault(c.efficiency, []).append(i)
    for eff, rows in by_eff.items():
        why = no_fit if fit is None else fit.applies(eff)
        plans = [cfgs[i] for i in rows]
        if why is None:
            u = fit.uncertainty
            basis = f"{round(100 * u.level)}% interval from the fit's uncertainty ({fit.source}: {u.basis})"
            for i, iv in zip(rows, intervals(plans, eff, u, metrics=("step_time_s",) + PHASES)):
                out[i] = StepInterval(iv["step_time_s"], basis, True, {k: iv[k] for k in PHASES})
            continue
        basis = f"the corpus band, not the fit's uncertainty ({why}): {band.basis}"
        for i, iv in zip(rows, intervals(plans, eff, None)):
            point = iv["step_time_s"].point
            low, high = band.apply(point)
            out[i] = StepInterval(Interval(low, point, high, band.coverage), basis, False)
    return [s for s in out if s is not None]
