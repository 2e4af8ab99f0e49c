"""Trial backends: how a space's params become a runnable config, and how a config becomes an outcome.

``ray``: a real multi-rank training run on a warm worker group (orchestrator.workers), measured.
``model``: the planner's prediction for a cluster that is not here (orchestrator.planner), never presented
as a measurement: its outcomes carry ``prediction`` and no ``result``.

Both expose the same two parts, so the sweep loop, ledger, tracking and export do not care which ran:
a *configs* object (pure: build / describe / probe a config; used to validate a sweep before launch) and
a *runner* (``slots``, ``submit(slot, cfg)``, ``poll(timeout)``, ``close()``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from orchestrator.space import Space, params_for, suggest

log = logging.getLogger(__name__)


@dataclass
class RunOutcome:
    status: str
    """ok | failed | oom | timeout | nan (the sweep adds pruned and skipped) | lost: a node or an actor was lost
    (the infrastructure's doing, not the config's): the sweep re-queues the trial and records no verdict."""
    reason: str | None
    result: Any = None
    """trainer.result.Result of a measured run."""
    prediction: dict | None = None
    wall_s: float = 0.0
    work_s: float = 0.0
    """Seconds of training updates inside wall_s (what is not overhead)."""
    traces: dict[str, bytes] | None = None
    """File name -> gzipped torch.profiler trace, per rank, when the config set run.profile_step."""
    placement: list[dict] | None = None
    """Per rank (rank order): host, ip, Ray node_id, gpu_ids, pid (ray backend); written to the ledger line."""

    def save_traces(self, directory: Path) -> list[str]:
        """Write the traces under ``directory``, point the result's ranks at them; the paths written."""
        if not self.traces:
            return []
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.traces.items():
            (directory / name).write_bytes(data)
        if self.result is not None:
            from trainer.profile import trace_name

            for r in self.result.ranks:
                r.trace_file = str(directory / trace_name(r.rank)) if trace_name(r.rank) in self.traces else None
        return [str(directory / name) for name in sorted(self.traces)]


def metrics_of(outcome: RunOutcome) -> dict[str, Any]:
    """The ledger's ``metrics`` for a measured Result or a planner prediction (same keys either way)."""
    if outcome.result is not None:
        s = outcome.result.summary
        return {"step_time_s": s.step_time_s, "step_time_min_s": s.step_time_min_s,
                "step_time_max_s": s.step_time_max_s,
                "n_measured_steps": s.n_measured_steps, "tokens_per_s": s.tokens_per_s, "mfu": s.mfu, "hfu": s.hfu,
                "peak_memory_bytes": s.peak_memory_bytes}
    if outcome.prediction is not None:
        keys = ("step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes")
        return {k: outcome.prediction.get(k) for k in keys}
    return {}


class _Replay:
    """Answers a define-by-run suggest from a mapping of param values (the enqueue: entries)."""

    def __init__(self, values: Mapping[str, Any]):
        self.values = values

    def _get(self, name: str, *_: Any, **__: Any) -> Any:
        if name not in self.values:
            raise ValueError(f"no value for {name}, which the space asks for with these values")
        return self.values[name]

    suggest_categorical = suggest_int = suggest_float = _get


# ---- configs ---------------------------------------------------------------------------------

class TrainerConfigs:
    """Trainer configs for the ray backend: trainer base + baseline overrides + a trial's overrides.

    ``parallel.dp`` is always derived: world_size / parallel.pp.
    """

    backend = "ray"

    def __init__(self, trainer: dict, baseline: dict, world_size: int, gpus_per_rank: float):
        from trainer.config import apply_overrides, flatten

        self.world_size = world_size
        self.base = apply_overrides(trainer, {k: v for k, v in baseline.items() if k != "parallel.dp"})
        given_dp = {**flatten(trainer), **baseline}.get("parallel.dp")
        try:
            self.baseline = self.build({})
        except ValueError as e:
            raise ValueError(f"baseline (trainer + baseline overrides): {e}") from None
        # Trials start from the resolved baseline: every option carries its kind, so an override of one field
        # of it (data_parallel.bucket_mb) lands in a complete option.
        self.base = self.baseline.to_dict()
        if given_dp is not None and given_dp != self.baseline.parallel.dp:
            raise ValueError(f"baseline: parallel.dp={given_dp} but resources.world_size / parallel.pp = "
                             f"{self.baseline.parallel.dp}; leave parallel.dp out, it is derived")
        if (self.baseline.run.device == "cuda") != (gpus_per_rank > 0):
            raise ValueError(f"resources.gpus_per_rank={gpus_per_rank} does not match the baseline's run.device="
                             f"{self.baseline.run.device!r}: use gpus_per_rank >= 1 with cuda, 0 with cpu")
        self.fixed = flatten(self.baseline.to_dict())

    @property
    def device(self) -> str:
        return self.baseline.run.device

    def build(self, overrides: Mapping[str, Any]) -> Any:
        from trainer.config import TrainConfig, apply_overrides

        pp = overrides.get("parallel.pp", self.base.get("parallel", {}).get("pp", 1))
        if not isinstance(pp, int) or pp < 1 or self.world_size % pp:
            raise ValueError(f"parallel.pp={pp} does not divide resources.world_size={self.world_size} "
                             f"(parallel.dp is derived as world_size / pp)")
        return TrainConfig.from_dict(apply_overrides(self.base, {**overrides, "parallel.dp": self.world_size // pp}))

    def split_context(self, flat: Mapping[str, Any]) -> tuple[int, int]:
        return flat["model.n_layers"], flat["parallel.pp"] * flat["pipeline.virtual_stages"]

    def baseline_params(self, space: Space) -> dict[str, Any]:
        return params_for(space, self.fixed, [len(s) for s in self.baseline.stage_layers()])

    def overrides_for(self, space: Space, params: Mapping[str, Any]) -> dict[str, Any]:
        return suggest(_Replay(params), space, self.fixed, self.split_context)[1]

    def to_dict(self, cfg: Any) -> dict[str, Any]:
        return cfg.to_dict()

    def load(self, d: dict[str, Any]) -> Any:
        from trainer.config import TrainConfig

        return TrainConfig.from_dict(d)

    def probe(self, cfg: Any, measured_steps: int) -> Any | None:
        """The same config cut to warm-up + ``measured_steps`` updates, or None when that saves nothing."""
        steps = cfg.run.warmup_steps + measured_steps
        if steps >= cfg.run.steps:
            return None
        return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, steps=steps))


class PlannerConfigs:
    """Planner configs for the model backend: planner section + baseline params + a trial's params."""

    backend = "model"

    def __init__(self, planner: dict, baseline: dict):
        from orchestrator import planner as pl
        from trainer.config import flatten

        self._pl = pl
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
        return self._pl.apply_params(self.baseline, dict(overrides))

    def baseline_params(self, space: Space) -> dict[str, Any]:
        return params_for(space, self.fixed, list(self.baseline.stage_layers))

    def overrides_for(self, space: Space, params: Mapping[str, Any]) -> dict[str, Any]:
        return suggest(_Replay(params), space, self.fixed, self.split_context)[1]

    def to_dict(self, cfg: Any) -> dict[str, Any]:
        return cfg.to_dict()

    def probe(self, cfg: Any, measured_steps: int) -> None:
        return None  # a prediction costs microseconds; nothing to prune


def configs_for(cfg: Any) -> TrainerConfigs | PlannerConfigs:
    """The configs object for a SweepConfig (raises ValueError naming what is wrong with its baseline)."""
    if cfg.backend == "model":
        return PlannerConfigs(cfg.planner, cfg.baseline)
    return TrainerConfigs(cfg.trainer, cfg.baseline, cfg.resources.world_size, cfg.resources.gpus_per_rank)


# ---- runners ---------------------------------------------------------------------------------

class RayRunner:
    """Real runs on ``slots`` warm worker groups (one trial per group at a time)."""

    def __init__(self, cfg: Any, configs: TrainerConfigs):
        from orchestrator import workers

        res = cfg.resources
        self.where = _connect(cfg)
        n = workers.groups_that_fit(res.world_size, res.cpus_per_rank, res.gpus_per_rank, res.concurrent_trials)
        if n < res.concurrent_trials:
            log.info(f"note: the cluster holds {n} worker group(s) of {res.world_size} ranks, not "
                     f"resources.concurrent_trials={res.concurrent_trials}; running {n} at a time")
        self.groups = [workers.WorkerGroup(res.world_size, res.cpus_per_rank, res.gpus_per_rank, res.placement,
                                           configs.device, start_timeout_s=max(60.0, res.trial_timeout_s))
                       for _ in range(n)]
        self.timeout_s = res.trial_timeout_s
        self._cfgs: dict[int, Any] = {}
        # After a failure the group is killed at once; the other ranks' pending results then die unread, on
        # purpose. Ray would log each as an "unhandled error".
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        self.groups[0].start()  # fail fast, before any trial, if the cluster cannot hold a group

    @property
    def slots(self) -> int:
        return len(self.groups)

    @property
    def builds(self) -> int:
        return sum(g.builds for g in self.groups)

    def submit(self, slot: int, cfg: Any) -> None:
        """Run ``cfg`` on group ``slot``, rebuilding it first if a failure killed it.

        A group that cannot be rebuilt twice in a row is an infrastructure problem, not the config's: it raises
        (GroupStartError) instead of being recorded against the trial, which would teach the sampler nonsense.
        """
        from orchestrator.workers import ClusterTooSmall, GroupStartError

        try:
            self.groups[slot].submit(cfg.to_dict(), self.timeout_s)
        except ClusterTooSmall:
            raise  # the alive nodes cannot hold the group: another try cannot help
        except GroupStartError as e:
            log.warning(f"rebuilding worker group {slot} failed ({e}); trying once more")
            self.groups[slot].submit(cfg.to_dict(), self.timeout_s)
        self._cfgs[slot] = cfg

    def poll(self, timeout_s: float) -> list[tuple[int, RunOutcome]]:
        import ray

        done = []
        pending = [r for g in self.groups for r in g.pending]
        if pending:  # wakes on the first rank result anywhere, or after timeout_s to check the deadlines
            ray.wait(pending, num_returns=1, timeout=timeout_s)
        for slot, g in enumerate(self.groups):
            if g.busy and (run := g.collect()) is not None:
                done.append((slot, _outcome(self._cfgs.pop(slot), run)))
        return done

    def close(self) -> None:
        for g in self.groups:
            g.kill()


def join(cfg: Any) -> None:
    """Join Ray before the sweep writes anything; a ray.address nothing answers at is bad input (ValueError)."""
    if cfg.backend != "ray":
        return
    from orchestrator.workers import GroupStartError

    try:
        _connect(cfg)
    except GroupStartError as e:
        raise ValueError(str(e)) from None


def _connect(cfg: Any) -> str:
    from orchestrator import workers

    res = cfg.resources
    return workers.connect(cfg.ray.address, _runtime_env(cfg), temp_dir=cfg.ray.temp_dir, dashboard=cfg.ray.dashboard,
                           num_cpus=int(math.ceil(res.world_size * res.cpus_per_rank)))


def _runtime_env(cfg: Any) -> dict | None:
    """On an existing cluster the actors need this repository's code: ship it as Ray's working_dir."""
    if cfg.ray.runtime_env is not None or cfg.ray.address is None:
        return cfg.ray.runtime_env
    from orchestrator.config import REPO_ROOT

    return {"working_dir": str(REPO_ROOT),
            "excludes": [".venv/", ".git/", "results/", "mlruns/", "**/__pycache__/", ".pytest_cache/"]}


def _outcome(cfg: Any, run: Any) -> RunOutcome:
    """Classify what came back: a Result, or the status and reason of the failure; where the ranks ran."""
    outcome = _classify(cfg, run)
    outcome.placement = run.placement
    return outcome


def _classify(cfg: Any, run: Any) -> RunOutcome:
    from trainer.run import NonFiniteLoss, finalize

    if run.kind == "ok":
        result = finalize(cfg, run.ranks)
        work = sum(s.time_s for s in result.steps)
        bad = [s.step for s in result.steps if not (math.isfinite(s.loss) and math.isfinite(s.grad_norm))]
        if bad:
            return RunOutcome("nan", f"non-finite loss or gradient norm at step {bad[0]}", result, wall_s=run.wall_s,
                              work_s=work)
        return RunOutcome("ok", None, result, wall_s=run.wall_s, work_s=work, traces=_traces(result, run.traces))
    if run.kind == "timeout":
        return RunOutcome("timeout", f"{run.error}; the worker group was killed and is rebuilt", wall_s=run.wall_s)
    cause = getattr(run.error, "cause", None) or run.error
    notes = " ".join(getattr(run.error, "__notes__", []))
    text = f"{type(cause).__name__}: {_last_line(cause)}" + (f" ({notes})" if notes else "")
    if run.kind == "lost_node":  # the notes: "node <id> (<host>, <ip>) lost", then "rank <r>"
        lost, *rest = getattr(run.error, "__notes__", ["a node lost"])
        return RunOutcome("lost", lost + (f" (with {' '.join(rest)})" if rest else ""), wall_s=run.wall_s)
    if run.kind == "lost_actor":
        return RunOutcome("lost", f"actor lost: a rank's actor was killed from outside (ray.kill) ({notes})",
                          wall_s=run.wall_s)
    if isinstance(cause, NonFiniteLoss):
        return RunOutcome("nan", text, wall_s=run.wall_s)
    if isinstance(cause, MemoryError) or "out of memory" in str(cause).lower() or "OutOfMemory" in type(cause).__name__:
        return RunOutcome("oom", text, wall_s=run.wall_s)
    if run.kind == "lost_rank":  # Ray's own text is a page of possible causes: its first sentence leads, for
        # the progress line and the table (report.one_line); the page follows, for the ledger.
        page = str(cause).strip()
        first = page.splitlines()[0].split(". ")[0] if page else type(cause).__name__
        return RunOutcome("failed", f"lost a rank: {first} ({notes})\n{page}", wall_s=run.wall_s)
    return RunOutcome("failed", text, wall_s=run.wall_s)


def _traces(result: Any, traces: list[bytes | None] | None) -> dict[str, bytes] | None:
    from trainer.profile import trace_name

    named = {trace_name(r.rank): t for r, t in zip(result.ranks, traces or []) if t}
    return named or None


def _last_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:500]


class ModelRunner:
    """Predictions from the planner: synchronous, one slot, deterministic."""

    slots, builds = 1, 0
    where = "the planner (predictions, not measurements)"

    def __init__(self, cfg: Any, configs: PlannerConfigs):
        self._pl = configs._pl
        self._done: list[tuple[int, RunOutcome]] = []

    def submit(self, slot: int, cfg: Any) -> None:
        t0 = time.perf_counter()
        try:
            oom, why = self._pl.predicts_oom(cfg)
            pred = self._pl.predict(cfg)
            prediction = pred.to_dict()
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


def runner_for(cfg: Any, configs: Any) -> RayRunner | ModelRunner:
    return ModelRunner(cfg, configs) if cfg.backend == "model" else RayRunner(cfg, configs)
