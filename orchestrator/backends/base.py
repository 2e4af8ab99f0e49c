"""What a backend is: the ``Backend`` protocol, and the ``RunOutcome`` its runner hands back for one run.

A backend owns everything that differs between real trials and predictions: its config sections, how a
config is built and run, how a result is judged and which ledger fields it adds. The sweep loop, the
ledger and tracking only ever talk to it through this protocol.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from orchestrator.search.space import Space, suggest
from orchestrator.units import fmt_bytes


@dataclass
class RunOutcome:
    status: str
    """ok | failed | oom | timeout | nan (the sweep adds pruned and skipped) | lost: a node or an actor was lost
    (the infrastructure's doing, not the config's): the sweep re-queues the trial and records no verdict."""
    reason: str | None
    result: Any = None
    """trainer.measure.result.Result of a measured run."""
    prediction: dict | None = None
    wall_s: float = 0.0
    work_s: float = 0.0
    """Seconds of training updates inside wall_s (what is not overhead)."""
    traces: dict[str, bytes] | None = None
    """File name -> gzipped torch.profiler trace, per rank, when the config set run.profile_step."""
    placement: list[dict] | None = None
    """Per rank (rank order): host, ip, Ray node_id, gpu_ids, pid (ray backend); written to the ledger line."""
    parsed: Any = None
    """command backend: what its framework's log said (orchestrator.frameworks.log.ParsedLog)."""
    repeat: Any = None
    """command backend, the baseline: the ParsedLog of its second run (calibrates black-box parity)."""
    command: dict | None = None
    """command backend: the exact argv per node and the environment the run was started with."""

    def save_traces(self, directory: Path) -> list[str]:
        """Write the traces under ``directory``, point the result's ranks at them; the paths written."""
        if not self.traces:
            return []
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in self.traces.items():
            (directory / name).write_bytes(data)
        if self.result is not None:
            from trainer.measure.result import trace_name

            for r in self.result.ranks:
                r.trace_file = str(directory / trace_name(r.rank)) if trace_name(r.rank) in self.traces else None
        return [str(directory / name) for name in sorted(self.traces)]


@dataclass(frozen=True)
class Judgement:
    """A backend's verdict on one finished run."""

    status: str
    """The outcome's status, or ``infeasible`` where parity or the memory budget rejected an ok run."""
    reason: str | None
    """Why, when not ok."""
    parity: dict | None = None
    """The parity verdict (orchestrator.parity.verdict), where a result was compared."""


class Configs(Protocol):
    """Pure config handling (no cluster): what ``check_sweep`` validates a space with before launch."""

    baseline: Any
    """The baseline's built config."""
    fixed: dict[str, Any]
    """The baseline as flat dotted values (what a space param not drawn keeps)."""

    def build(self, overrides: Mapping[str, Any]) -> Any: ...
    def split_context(self, flat: Mapping[str, Any]) -> tuple[int, int]: ...
    def baseline_params(self, space: Space) -> dict[str, Any]: ...
    def overrides_for(self, space: Space, params: Mapping[str, Any]) -> dict[str, Any]: ...
    def to_dict(self, cfg: Any) -> dict[str, Any]: ...
    def load(self, d: dict[str, Any]) -> Any: ...
    def probe(self, cfg: Any, measured_steps: int) -> Any | None: ...


class Runner(Protocol):
    """Runs configs on ``slots`` independent places; ``poll`` hands back whatever finished."""

    slots: int
    builds: int
    """Worker groups built so far (0 for predictions)."""
    where: str
    """Where the runs go, for the log."""

    def submit(self, slot: int, cfg: Any) -> None:
        """Start ``cfg`` on ``slot``; a tuple of configs (the canonical run and its self-check, from a backend's
        ``reference_run``) runs in one go and comes back as a tuple of outcomes, in its order."""

    def poll(self, timeout_s: float) -> list[tuple[int, RunOutcome | tuple[RunOutcome, ...]]]: ...
    def close(self) -> None: ...


class Backend(Protocol):
    """Real trials on Ray (``RayTrials``) or planner predictions (``PlannerPredictions``)."""

    name: str
    """What the sweep file's ``backend:`` says and every ledger line records."""
    predicted: bool
    """Its numbers are predictions, never to be shown as measurements."""
    confirms: bool
    """A winner is run again before the target counts as met (a prediction repeats exactly: no)."""
    configs: Configs
    prefilter: Any
    """Skips trials predicted over the memory budget before launch (orchestrator.calibration.prefilter), or None."""

    def join(self) -> None:
        """Connect to whatever runs the trials, before the sweep writes anything (ValueError: bad input)."""

    def runner(self) -> Runner: ...

    def release(self) -> None:
        """Stop what ``join`` started ahead that no ``runner`` took (a sweep refused before its first run)."""

    def reference_run(self, gate: Any, baseline: Any) -> Any | None:
        """The config to judge the baseline against before it becomes the reference (None: none)."""

    def suspect_runs(self, gate: Any, baseline: Any, outcome: RunOutcome) -> list[tuple[str, Any]]:
        """When the baseline's run disagrees with its reference run: (family, config with that family set back, or
        why it cannot be) to run before the sweep stops, to name the family to blame ([]: none)."""

    def judge(self, kind: str, outcome: RunOutcome, gate: Any, runs: Sequence[RunOutcome]) -> Judgement: ...

    def resume(self, baseline: Any) -> None:
        """A resumed sweep: restore what the backend judges trials by from the baseline's ledger line (a
        ``TrialRecord`` that ran ok), since the driver that measured it is gone."""

    def guided_sampler(self, base: Any, records: Callable[[], Sequence[Any]]) -> Any:
        """``sampler.kind: guided``: the planner-guided sampler over ``base`` (orchestrator.calibration.guided), or ``base``
        alone where the planner cannot map this backend's configs, saying why."""

    def ledger_fields(self, kind: str, config: Any, outcome: RunOutcome, status: str,
                      runs: Sequence[RunOutcome]) -> dict[str, Any]:
        """The TrialRecord fields this backend adds (overhead_s, probe, extra)."""


class _Replay:
    """Answers a define-by-run suggest from a mapping of param values (the enqueue: entries)."""

    def __init__(self, values: Mapping[str, Any]):
        self.values = values

    def _get(self, name: str, *_: Any, **__: Any) -> Any:
        if name not in self.values:
            raise ValueError(f"no value for {name}, which the space asks for with these values")
        return self.values[name]

    suggest_categorical = suggest_int = suggest_float = _get


class SpaceConfigs:
    """What both ``Configs`` implementations share: params -> overrides through the space's own suggest, and a
    config's dict (each subclass sets ``fixed`` and ``split_context``)."""

    fixed: Mapping[str, Any]
    split_context: Any

    def overrides_for(self, space: Space, params: Mapping[str, Any]) -> dict[str, Any]:
        """The overrides a set of param values makes (the enqueue: entries)."""
        return suggest(_Replay(params), space, self.fixed, self.split_context)[1]

    def to_dict(self, cfg: Any) -> dict[str, Any]:
        return cfg.to_dict()


def within_budget(status: str, reason: str | None, peak_bytes: float | None,
                  budget_gb: float | None) -> tuple[str, str | None]:
    """resources.memory_budget_gb applied to an ok run's peak (measured or predicted)."""
    if status == "ok" and budget_gb and (peak_bytes or 0) > budget_gb * 2**30:
        return "infeasible", f"memory: peak {fmt_bytes(peak_bytes)} > resources.memory_budget_gb={budget_gb:g} GiB"
    return status, reason


def check_measured_sweep(cfg: Any, planner: bool = False) -> None:
    """What every backend that measures real trials refuses at load (one definition for ray and command);
    ``planner``: the backend reads a ``planner:`` section (the command backend: the model its command trains)."""
    if cfg.planner and not planner:
        raise ValueError("planner: only used with backend: model (the planner's config) or backend: command (the "
                         "model the command trains, for sampler.kind: guided)")
    if "parallel.dp" in cfg.space.override_keys:
        raise ValueError("space.params.parallel.dp: dp is derived per trial as resources.world_size / "
                         "(tensor_parallel.size x parallel.pp)")
