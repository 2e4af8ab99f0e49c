"""Trial backends (``Backend``, orchestrator.backends.base): how a space's params become a runnable config,
how a config becomes an outcome, and how an outcome is judged and recorded.

``ray`` (``RayTrials``): a real multi-rank training run on a warm worker group, measured.
``model`` (``PlannerPredictions``): the planner's prediction for a cluster that is not here.
``command`` (``CommandTrials``): the team's own launch command (Megatron-LM, torchtitan, steptune's trainer as a
black box) through torchrun on Ray-placed node actors (``command_runner``), read by a framework adapter.

The sweep loop, the ledger and tracking do not care which ran. ``build`` is the one place a backend's name
is looked at; ``load_sweep`` builds it once (validating the whole space against it) and the sweep reuses it.
The Ray side lives here too: ``workers`` (one actor per rank, warm across trials), ``capacity``, ``ray_runner``.

May import: calibration, planner, records, search, parity, frameworks, units
"""

from __future__ import annotations

from typing import Any

from orchestrator.backends.base import Backend, Judgement, RunOutcome
from orchestrator.backends.command import CommandTrials
from orchestrator.backends.planner_predictions import PlannerPredictions
from orchestrator.backends.ray_trials import RayTrials

__all__ = ["BACKENDS", "Backend", "CommandTrials", "Judgement", "PlannerPredictions", "RayTrials", "RunOutcome", "build"]

BACKENDS: dict[str, type] = {RayTrials.name: RayTrials, PlannerPredictions.name: PlannerPredictions,
                             CommandTrials.name: CommandTrials}
"""The sweep file's ``backend:`` names."""


def build(cfg: Any) -> Backend:
    """The backend a SweepConfig names, its sections validated (ValueError naming the field)."""
    return BACKENDS[cfg.backend](cfg)
