"""Planner predictions: the ``model`` backend, for a cluster that is not here (orchestrator.planner).

Owns the sweep file's ``planner`` and ``baseline`` sections. Its outcomes carry ``prediction`` and never a
``result``: a prediction is never presented as a measurement. Every prediction carries its step-time
interval (``prediction.interval``, orchestrator/calibration/interval.py), which the answer's target verdict reads.
Its judgement is the planner's own (a predicted OOM) plus ``resources.memory_budget_gb`` on the predicted peak;
it adds ``prediction`` to the ledger and nothing else (no overhead, no probe, nothing to confirm: a prediction
repeats exactly).
"""

from __future__ import annotations

import time
import logging
from typing import Any, Callable, Mapping, Sequence

from orchestrator import planner as pl
from orchestrator.calibration import sources as S
from orchestrator.calibration.interval import step_intervals
from orchestrator.backends.base import Judgement, RunOutcome, SpaceConfigs, within_budget
from orchestrator.search.space import Space, params_for
from trainer.config import flatten

log = logging.getLogger(__name__)


class PlannerConfigs(SpaceConfigs):
    """Planner configs: planner section + baseline params + a trial's params."""

    def __init__(self, planner: dict, baseline: dict, base_dir=None):
        planner, self.sources = S.resolve(planner, base_dir)
        try:
            self.base = pl.plan_config_from_dict(planner)
        except ValueError as e:
            raise ValueError(f"planner: {e}") from None
        try:
            self.baseline = pl.apply_params(self.base, dict(baseline))
        except ValueError as e:
            raise ValueError(f"baseline: {e}") from None
        self.fixed = flatten(self.baseline.to_dict())
        # The planner's first/last split counts layers per pipeline rank (virtual stages subdivide each).
        self.split_context = pl.layer_split_context(self.baseline)

    def build(self, overrides: Mapping[str, Any]) -> Any:
        return pl.apply_params(self.baseline, dict(overrides))

    def baseline_params(self, space: Space) -> dict[str, Any]:
        return params_for(space, self.fixed, list(self.baseline.stage_layers))

    def load(self, d: dict[str, Any]) -> Any:
        return pl.plan_config_from_dict(d)

    def probe(self, cfg: Any, measured_steps: int) -> None:
        return None  # a prediction costs microseconds; nothing to prune


class ModelRunner:
    """Predictions from the planner: synchronous, one slot, deterministic."""

    slots, builds = 1, 0
    where = "the planner (predictions, not measurements)"

    def __init__(self, sources: S.Sources | None = None) -> None:
        self._done: list[tuple[int, RunOutcome]] = []
        self.sources = sources

    def submit(self, slot: int, cfg: Any) -> None:
        t0 = time.perf_counter()
        try:
            oom, why = pl.predicts_oom(cfg)
            prediction = pl.predict(cfg).to_dict()
            prediction["interval"] = step_intervals([cfg], self.sources)[0].to_dict()
            if self.sources is not None:  # which parts are measured travels with every prediction
                prediction["sources"] = {"network": self.sources.network, "compute": self.sources.compute}
            out = RunOutcome("oom" if oom else "ok", f"predicted: {why}" if oom else None, prediction=prediction)
        except ValueError as e:
            out = RunOutcome("failed", f"planner: {e}")
        out.wall_s = time.perf_counter() - t0
        self._done.append((slot, out))

    def poll(self, timeout_s: float) -> list[tuple[int, RunOutcome]]:
        done, self._done = self._done, []
        return done

    def close(self) -> None:
        pass


class PlannerPredictions:
    """The ``model`` backend."""

    name = "model"
    predicted = True
    confirms = False
    prefilter = None  # the planner predicts every config anyway

    def __init__(self, cfg: Any):
        if not cfg.planner:
            raise ValueError("planner: backend: model needs a planner: section (the cluster and model to predict)")
        if cfg.prefilter:
            raise ValueError("prefilter: only real (ray) sweeps are pre-filtered; the model backend predicts anyway")
        self.cfg = cfg
        from pathlib import Path

        self.configs = PlannerConfigs(cfg.planner, cfg.baseline, Path(cfg.source).parent if cfg.source else None)

    def join(self) -> None:
        pass  # nothing to connect to

    def runner(self) -> ModelRunner:
        return ModelRunner(self.configs.sources)

    def release(self) -> None:
        pass  # join starts nothing ahead

    def reference_run(self, gate: Any, baseline: Any) -> None:
        return None  # no result to compare: parity is a property of measured runs

    def suspect_runs(self, gate: Any, baseline: Any, outcome: RunOutcome) -> list:
        return []  # nothing to blame: a prediction has no parity

    def judge(self, kind: str, outcome: RunOutcome, gate: Any, runs: Sequence[RunOutcome]) -> Judgement:
        peak = (outcome.prediction or {}).get("peak_memory_bytes")
        return Judgement(*within_budget(outcome.status, outcome.reason, peak, self.cfg.resources.memory_budget_gb))

    def resume(self, baseline: Any) -> None:
        pass  # predictions keep nothing between trials

    def guided_sampler(self, base: Any, records: Callable[[], Sequence[Any]]) -> Any:
        log.info("note: sampler.kind=guided: the model backend is the planner itself; using TPE")
        return base

    def ledger_fields(self, kind: str, config: Any, outcome: RunOutcome, status: str,
                      runs: Sequence[RunOutcome]) -> dict[str, Any]:
        return {"overhead_s": None}
