"""The ``command`` backend: each trial runs the team's own launch command (Megatron-LM, torchtitan, steptune's
trainer as a black box) through torchrun on Ray-placed node actors (orchestrator.backends.command_runner).

Owns the sweep file's ``command`` section (with ``trainer``, ``baseline`` and ``resources``, which build each
trial's config as for the ``ray`` backend); the framework adapter (orchestrator.frameworks) refuses at load the
knobs it cannot express, renders a trial's knobs as flags, and reads its log. A trial is judged by its log's
status, black-box parity (its per-iteration loss curve against the baseline's, with a tolerance from the
baseline run twice) and the memory budget; the ledger keeps the exact command line and environment it ran with.
"""

from __future__ import annotations

import logging
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from orchestrator import REPO_ROOT
from orchestrator.backends.base import Judgement, RunOutcome, check_measured_sweep, within_budget
from orchestrator.backends.command_runner import Launch, NodeGroup, NodeRun
from orchestrator.backends.ray_trials import TrainerConfigs
from orchestrator.frameworks import blackbox_parity
from orchestrator.frameworks.adapters import Framework, framework
from orchestrator.frameworks.log import ParsedLog

log = logging.getLogger(__name__)


class RenderedConfigs(TrainerConfigs):
    """Trainer configs whose every build is also rendered by the framework adapter, so ``check_sweep`` refuses at
    load each config of the space the framework cannot express (a value with no flag, a flag set it refuses)."""

    def __init__(self, backend: "CommandTrials", *args: Any):
        self.backend = None
        super().__init__(*args)
        self.backend = backend

    def build(self, overrides):
        config = super().build(overrides)
        if self.backend is not None:
            self.backend.launch_for(config)
        return config

    def probe(self, cfg: Any, measured_steps: int) -> Any | None:
        """A pruning probe cuts run.steps, which only steptune's trainer reads from the config: another framework's
        iteration count is the user's own flag, so its trials are never cut short (no probe)."""
        if self.backend is not None and self.backend.framework.result_file is None:
            return None
        return super().probe(cfg, measured_steps)


class CommandTrials:
    """The ``command`` backend: measured runs of the user's own training command."""

    name = "command"
    predicted = False
    confirms = True
    prefilter = None

    def __init__(self, cfg: Any):
        check_measured_sweep(cfg, planner=True)
        c, res = cfg.command, cfg.resources
        self.framework: Framework = framework(c.framework, declared=c.custom, world_size=res.world_size,
                                              version=c.framework_version)
        if not c.argv or not all(isinstance(a, str) for a in c.argv):
            raise ValueError('command.argv: required, a list of strings: what torchrun runs, e.g. ["-m", "trainer"] '
                             'or ["pretrain_gpt.py", "--num-layers", "24", ...]')
        if not isinstance(c.nodes, int) or c.nodes < 1 or res.world_size % c.nodes:
            raise ValueError(f"command.nodes={c.nodes!r}: a whole number >= 1 that divides resources.world_size="
                             f"{res.world_size} (each node runs world_size / nodes ranks)")
        bad_env = [k for k, v in c.env.items() if not isinstance(v, (str, int, float))]
        if bad_env:
            raise ValueError(f"command.env.{bad_env[0]}: a string value")
        self.framework.refuse(cfg.space.override_keys)  # names the knob and the framework
        self.cfg = cfg
        self.keys = sorted(cfg.space.override_keys)
        self.configs = RenderedConfigs(self, cfg.trainer, cfg.baseline, res.world_size, res.gpus_per_rank)
        self.launch_for(self.configs.baseline)  # the baseline's flags checked now, not at trial 1
        self.floor = blackbox_parity.CurveTolerance(
            c.parity_loss_rel, c.parity_grad_norm_rel, self.framework.resolution.get("loss", 0.0),
            self.framework.resolution.get("grad_norm", 0.0))
        self.reference: tuple[ParsedLog, blackbox_parity.CurveTolerance] | None = None
        self.planner, self.ranking = self._planner(cfg)

    def _planner(self, cfg: Any) -> tuple[Any, Any]:
        """The declared model (``planner:``) and, for ``sampler.kind: guided``, its ranking of the space, built now so
        a sweep the planner cannot guide is refused before anything runs."""
        from orchestrator.calibration import command_planner

        base_dir = Path(cfg.source).parent if cfg.source else None
        planner = command_planner.load(cfg.planner, self.configs.baseline, base_dir) if cfg.planner else None
        if cfg.sampler.kind != "guided":
            return planner, None
        if planner is None:
            raise ValueError("sampler.kind=guided: the command backend needs a planner: section, the model your "
                             "command trains and its cluster (model:, job: {seq_len}, cluster_file:), so the planner "
                             "can rank the space and learn from the trials; or use sampler.kind=tpe")
        return planner, command_planner.ranking_for(planner, cfg, self.configs)

    def launch_for(self, config: Any) -> Launch:
        """A trial config as the command every node starts (ValueError: a flag set the framework would refuse)."""
        flags, files = self.framework.render(config, self.keys)
        knob_env = self.framework.render_env(config, self.keys) if self.framework.render_env else {}
        env = {**self.framework.env, **{k: str(v) for k, v in self.cfg.command.env.items()}, **knob_env}
        return Launch(list(self.cfg.command.argv) + flags, env, files, self.framework.result_file, flags)

    def warmup(self, config: Any) -> int:
        w = self.cfg.command.warmup
        return w if w is not None else max(1, config.run.warmup_steps)

    def join(self) -> None:
        from orchestrator.backends.ray_runner import connect
        from orchestrator.backends.workers import GroupStartError

        try:
            connect(self.cfg)
        except GroupStartError as e:
            raise ValueError(str(e)) from None

    def runner(self) -> "CommandRunner":
        return CommandRunner(self)

    def release(self) -> None:
        pass  # join starts nothing ahead

    def reference_run(self, gate: Any, baseline: Any) -> None:
        return None  # a production job has no one-rank canonical run: the loss curve is judged instead

    def suspect_runs(self, gate: Any, baseline: Any, outcome: RunOutcome) -> list:
        return []

    def judge(self, kind: str, outcome: RunOutcome, gate: Any, runs: Sequence[RunOutcome]) -> Judgement:
        status, reason, verdict = outcome.status, outcome.reason, None
        parsed = getattr(outcome, "parsed", None)
        if status in ("ok", "pruned") and parsed is not None:
            if kind != "baseline" and self.reference is None:
                return Judgement("infeasible", "parity: no loss-curve reference to compare with (the baseline's "
                                               "ledger line holds no per-iteration losses); rerun the sweep from "
                                               "scratch", None)
            if kind == "baseline":
                repeat = getattr(outcome, "repeat", None)
                tol = blackbox_parity.calibrate(parsed, repeat, blackbox_parity.printed(self.floor, parsed))
                verdict = blackbox_parity.compare(parsed, repeat or parsed, tol)
                if verdict["passed"]:
                    self.reference = (parsed, tol)
            else:
                verdict = blackbox_parity.compare(self.reference[0], parsed, self.reference[1])
            if not verdict["passed"]:
                status, reason = "infeasible", f"parity: {blackbox_parity.describe(verdict)} (vs the baseline)"
                if kind == "baseline":
                    reason = f"{reason[:-1]}'s own repeat)"
        if outcome.result is not None:
            status, reason = within_budget(status, reason, outcome.result.summary.peak_memory_bytes,
                                           self.cfg.resources.memory_budget_gb)
        return Judgement(status, reason, verdict)

    def resume(self, baseline: Any) -> None:
        """The loss-curve reference from the baseline's ledger line: its per-iteration losses and grad norms (a
        reference line keeps them, orchestrator.records.detail.REFERENCE_KINDS) and the tolerance its verdict set."""
        verdict = baseline.parity
        tol = (verdict.extra or {}).get("curve_tolerance") if verdict is not None else None
        if baseline.result is None or not baseline.result.steps or not tol:
            log.warning("resume: the baseline's ledger line holds no loss curve to judge trials by")
            return
        self.reference = (reference_log(self.framework.name, baseline.result), blackbox_parity.CurveTolerance(**tol))

    def guided_sampler(self, base: Any, records: Callable[[], Sequence[Any]]) -> Any:
        """The guided sampler on the planner section's model, refitted on this sweep's measured step times."""
        from orchestrator.calibration import command_planner

        return command_planner.sampler_for(self.ranking, self.cfg, base, records)

    def ledger_fields(self, kind: str, config: Any, outcome: RunOutcome, status: str,
                      runs: Sequence[RunOutcome]) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "overhead_s": sum(r.wall_s for r in runs) - sum(r.work_s for r in runs) if runs else None}
        if outcome.placement:  # per node: host, ip, Ray node id, GPU ids, the actor's pid, its ranks
            fields["placement"] = outcome.placement
        if outcome.command is not None:  # what export hands over: the exact command line and environment
            fields["extra"] = {"command": outcome.command,
                               "framework_log": outcome.parsed.summary() if outcome.parsed is not None else None}
        return fields


class CommandRunner:
    """One node group (``command.nodes`` actors), one trial at a time, reused across trials."""

    def __init__(self, backend: CommandTrials):
        from orchestrator.backends.ray_runner import connect

        cfg = backend.cfg
        self.backend, self.cfg = backend, cfg
        self.where = connect(cfg)
        res, c = cfg.resources, cfg.command
        self.group = NodeGroup(c.nodes, res.world_size // c.nodes, res.cpus_per_rank, res.gpus_per_rank,
                               sys.executable, c.cwd or str(REPO_ROOT), start_timeout_s=max(60.0, res.trial_timeout_s))
        self.group.start()
        self.slots = 1
        self.artifacts = cfg.results_dir / "command"
        self._job: tuple[Any, Launch, int, bool] | None = None
        self._first: list[NodeRun] | None = None
        """The baseline's first run while its repeat runs."""
        self._n = 0

    @property
    def builds(self) -> int:
        return self.group.builds

    def submit(self, slot: int, cfg: Any) -> None:
        launch = self.backend.launch_for(cfg)
        # The baseline runs twice the first time: its own spread calibrates black-box parity.
        twice = self.backend.reference is None and cfg == self.backend.configs.baseline
        self._n += 1
        self._job, self._first = (cfg, launch, self._n, twice), None
        self.group.launch(launch, f"{self._n:04d}", self.cfg.resources.trial_timeout_s)

    def poll(self, timeout_s: float) -> list[tuple[int, RunOutcome]]:
        if self._job is None:
            return []
        runs = self.group.collect(timeout_s)
        if runs is None:
            return []
        cfg, launch, n, twice = self._job
        if twice and self._first is None and all(r.kind == "exit" and r.rc == 0 for r in runs):
            self._first = runs
            self.group.launch(launch, f"{n:04d}-repeat", self.cfg.resources.trial_timeout_s)
            return []
        first = self._first
        self._job, self._first = None, None
        outcome = outcome_of(self.backend, cfg, launch, first or runs, self.group.ran_on,
                             self.artifacts / f"run-{n:04d}")
        if first is not None:
            _keep_logs(runs, self.artifacts / f"run-{n:04d}" / "repeat")
            outcome.repeat = parse_runs(self.backend, cfg, runs)
            if outcome.repeat.status != "ok":
                outcome.repeat = None
        return [(0, outcome)]

    def close(self) -> None:
        self.group.kill()


def parse_runs(backend: CommandTrials, cfg: Any, runs: list[NodeRun]) -> ParsedLog:
    fw = backend.framework
    return fw.parse(_text(backend, runs), backend.warmup(cfg) if fw.result_file is None else None, None)


def _text(backend: CommandTrials, runs: list[NodeRun]) -> str:
    """The framework's figures: its result file from the first node, the first node's stdout (rank 0's), or every
    node's stdout together."""
    fw = backend.framework
    if fw.result_file:
        return runs[0].result or ""
    return "\n".join(r.stdout for r in (runs[:1] if fw.first_node else runs))


def outcome_of(backend: CommandTrials, cfg: Any, launch: Launch, runs: list[NodeRun], placement: list[dict],
               artifacts: Path) -> RunOutcome:
    """Classify the nodes' runs: lost, timeout, failed (or oom), nan, or ok with a Result from the parsed log."""
    _keep_logs(runs, artifacts)
    wall = max((r.wall_s for r in runs), default=0.0)
    where = f"; logs: {artifacts}"
    lost = [r for r in runs if r.kind == "lost"]
    if lost:
        at = placement[lost[0].node_rank] if lost[0].node_rank < len(placement) else {}
        node = f"{at.get('node_id', '?')} ({at.get('host', '?')}, {at.get('ip', '?')})"
        out = RunOutcome("lost", f"node {node} lost, node rank {lost[0].node_rank} ({lost[0].error}); the other "
                                 f"nodes' process groups were killed{where}", wall_s=wall)
    elif timed := [r for r in runs if r.kind == "timeout"]:
        out = RunOutcome("timeout", f"no exit within resources.trial_timeout_s={backend.cfg.resources.trial_timeout_s:g}"
                                    f" s: process group {timed[0].pgid} on node {timed[0].node_rank} killed{where}",
                         wall_s=wall)
    else:
        parsed = parse_runs(backend, cfg, runs)
        failed = [r for r in runs if r.rc != 0]
        if failed:
            text = failed[0].stderr + failed[0].stdout
            status = "oom" if "out of memory" in text.lower() else "failed"
            out = RunOutcome(status, f"node {failed[0].node_rank} exited {failed[0].rc}: "
                                     f"{failure_line(failed[0].stderr or failed[0].stdout)}{where}", wall_s=wall)
        elif parsed.status == "nan":
            out = RunOutcome("nan", f"{parsed.reason}{where}", _result(cfg, parsed, backend, _text(backend, runs)),
                             wall_s=wall)
        elif parsed.status != "ok":
            out = RunOutcome("failed", f"{backend.framework.name} log {parsed.status}: {parsed.reason}{where}",
                             wall_s=wall)
        else:
            result = _result(cfg, parsed, backend, _text(backend, runs))
            out = RunOutcome("ok", None, result, wall_s=wall, work_s=sum(s.time_s for s in result.steps
                                                                         if math.isfinite(s.time_s)))
        out.parsed = parsed
    out.placement = placement
    out.command = {"framework": backend.framework.name, "flags": list(launch.flags),
                   "cwd": backend.cfg.command.cwd or str(REPO_ROOT),
                   "argv": runs[0].argv if runs else [], "env": dict(launch.env),
                   "per_node_argv": [r.argv for r in runs], "per_node_trial_dir": [r.folder for r in runs],
                   "files": sorted(launch.files)}
    return out


def reference_log(name: str, result: Any) -> ParsedLog:
    """A measured Result's per-step loss and grad norm as the iterations black-box parity compares (steps are
    0-based in a Result, iterations 1-based; a figure the log did not carry is NaN there and None here)."""
    from orchestrator.frameworks.log import Iteration, judge

    def figure(v: float) -> float | None:
        return v if v is not None and math.isfinite(v) else None

    its = [Iteration(step=s.step + 1, first_step=s.step + 1, loss=figure(s.loss), grad_norm=figure(s.grad_norm))
           for s in result.steps]
    return judge(name, its, 0, None)


def _keep_logs(runs: list[NodeRun], folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for r in runs:
        (folder / f"node{r.node_rank}.stdout.log").write_text(r.stdout)
        (folder / f"node{r.node_rank}.stderr.log").write_text(r.stderr)


def failure_line(text: str) -> str:
    """The ranks' own last words, not torchrun's report after them (its traceback and ChildFailedError block),
    with the root cause's rank and exit code from that report."""
    lines = text.splitlines()
    cut = next((i for i, ln in enumerate(lines) if "torch/distributed/elastic/multiprocessing/api.py" in ln
                or "ChildFailedError" in ln), len(lines))
    own = next((ln.strip() for ln in reversed(lines[:cut]) if ln.strip()), "")
    root = text[text.find("Root Cause"):] if "Root Cause" in text else ""
    rank = re.search(r"rank\s*:\s*(\d+)", root)
    code = re.search(r"exitcode\s*:\s*(-?\d+)", root)
    cause = f" (root cause: rank {rank.group(1)}, exit code {code.group(1)})" if rank and code else ""
    return (own[:300] or "no output") + cause


def _result(cfg: Any, parsed: ParsedLog, backend: CommandTrials, text: str) -> Any:
    """The trainer Result the sweep records: steptune's own result JSON as is; for another framework one built
    from its log (what the log does not carry stays empty or None, never estimated)."""
    from trainer.measure.result import Result, StepRecord, Summary

    if backend.framework.result_file:
        import json

        return Result.from_dict(json.loads(text))
    tokens = cfg.batch.global_batch * cfg.model.seq_len
    steps = [StepRecord(it.step - 1, it.time_s if it.time_s is not None else math.nan,
                        it.loss if it.loss is not None else math.nan,
                        it.grad_norm if it.grad_norm is not None else math.nan, tokens) for it in parsed.iterations]
    times = [it.time_s for it in parsed.steady if it.time_s is not None]
    step_s = statistics.median(times) if times else math.nan
    summary = Summary(step_s, min(times, default=math.nan), max(times, default=math.nan), len(times), tokens,
                      tokens / step_s if times else 0.0, 0.0, 0.0, parsed.median("mfu"), None, None,
                      f"{backend.framework.name}'s own", parsed.peak_memory_bytes or 0,
                      f"{backend.framework.name} log")
    return Result(cfg.to_dict(), cfg.world_size, 0, steps, summary, {}, {}, None, {}, 0.0, [])
