"""Real runs on Ray: warm worker groups (orchestrator.backends.workers), one trial per group at a time, and the
classification of what came back (a Result, or why not: oom, timeout, nan, a lost node or actor)."""

from __future__ import annotations

import logging
import math
import os
from typing import Any

from orchestrator import REPO_ROOT
from orchestrator.backends.base import RunOutcome

log = logging.getLogger(__name__)


class RayRunner:
    """Real runs on ``slots`` warm worker groups (one trial per group at a time)."""

    def __init__(self, cfg: Any, device: str, wait: bool = True):
        """``wait=False``: the first group is launched (workers.WorkerGroup.launch), not waited for; ``ready`` waits."""
        from orchestrator.backends import workers

        res = cfg.resources
        self.where = connect(cfg)
        n = workers.groups_that_fit(res.world_size, res.cpus_per_rank, res.gpus_per_rank, res.concurrent_trials)
        if n < res.concurrent_trials:
            log.info(f"note: the cluster holds {n} worker group(s) of {res.world_size} ranks, not "
                     f"resources.concurrent_trials={res.concurrent_trials}; running {n} at a time")
        self.groups = [workers.WorkerGroup(res.world_size, res.cpus_per_rank, res.gpus_per_rank, res.placement,
                                           device, start_timeout_s=max(60.0, res.trial_timeout_s))
                       for _ in range(n)]
        self.timeout_s = res.trial_timeout_s
        self._cfgs: dict[int, Any] = {}
        # After a failure the group is killed at once; the other ranks' pending results then die unread, on
        # purpose. Ray would log each as an "unhandled error".
        os.environ["RAY_IGNORE_UNHANDLED_ERRORS"] = "1"
        self.groups[0].launch()
        if wait:
            self.ready()

    def ready(self) -> None:
        """Wait for the first group's actors: fail fast, before any trial, if the cluster cannot hold a group."""
        self.groups[0].start()

    @property
    def slots(self) -> int:
        return len(self.groups)

    @property
    def builds(self) -> int:
        return sum(g.builds for g in self.groups)

    def submit(self, slot: int, cfg: Any) -> None:
        """Run ``cfg`` on group ``slot``, rebuilding it first if a failure killed it. A tuple of configs runs in
        one go (its outcome: a tuple, one per config): one world of fewer ranks than the group (the canonical
        run and its self-check), launched once; ``timeout_s`` then applies to each of them.

        A group that cannot be rebuilt twice in a row is an infrastructure problem, not the config's: it raises
        (GroupStartError) instead of being recorded against the trial, which would teach the sampler nonsense.
        """
        from orchestrator.backends.workers import ClusterTooSmall, GroupStartError

        cfgs = cfg if isinstance(cfg, tuple) else (cfg,)
        local = runs_local(cfg, self.groups[slot].world_size)
        what = [c.to_dict() for c in cfgs] if local else cfg.to_dict()
        try:
            self.groups[slot].submit(what, self.timeout_s * len(cfgs))
        except ClusterTooSmall:
            raise  # the alive nodes cannot hold the group: another try cannot help
        except GroupStartError as e:
            log.warning(f"rebuilding worker group {slot} failed ({e}); trying once more")
            self.groups[slot].submit(what, self.timeout_s * len(cfgs))
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


def run_each(runner: RayRunner, cfgs: list[Any], poll_s: float = 1.0) -> list[RunOutcome]:
    """Each config in turn on slot 0's warm group (``steptune profile``'s slices: one world for all of them,
    rebuilt only after a failure), the outcomes in the configs' order."""
    out: list[RunOutcome] = []
    for cfg in cfgs:
        runner.submit(0, cfg)
        done: list[tuple[int, RunOutcome]] = []
        while not done:
            done = runner.poll(poll_s)
        out.append(done[0][1])
    return out


def connect(cfg: Any) -> str:
    from orchestrator.backends import workers

    res = cfg.resources
    return workers.connect(cfg.ray.address, _runtime_env(cfg), temp_dir=cfg.ray.temp_dir, dashboard=cfg.ray.dashboard,
                           num_cpus=int(math.ceil(res.world_size * res.cpus_per_rank)))


def _runtime_env(cfg: Any) -> dict | None:
    """On an existing cluster the actors need this repository's code: ship it as Ray's working_dir."""
    if cfg.ray.runtime_env is not None or cfg.ray.address is None:
        return cfg.ray.runtime_env
    return {"working_dir": str(REPO_ROOT),
            "excludes": [".venv/", ".git/", "results/", "mlruns/", "**/__pycache__/", ".pytest_cache/"]}


def runs_local(cfg: Any, group_world_size: int) -> bool:
    """Whether a job runs as its own world of local processes beside rank 0 (RankWorker.run_local) rather than on
    the group's ranks: a config of fewer ranks than the group (the canonical run, a suspect of a refused
    baseline), and configs run together (a tuple: one world launched for all of them), whatever the group's size
    (a one-rank group's canonical run and self-check too)."""
    return isinstance(cfg, tuple) or cfg.world_size < group_world_size


def _outcome(cfg: Any, run: Any) -> RunOutcome | tuple[RunOutcome, ...]:
    """Classify what came back: a Result, or the status and reason of the failure; where the ranks ran. Configs
    run together (a tuple): a tuple of outcomes, the one world's launch charged to the first (workers.RunDone.each):
    each later config's wall is its updates', the first's the rest, so their walls still add up to the run's."""
    if not isinstance(cfg, tuple) and run.local is None:
        outcome = _classify(cfg, run)
        outcome.placement = run.placement
        return outcome
    cfgs = cfg if isinstance(cfg, tuple) else (cfg,)
    outcomes = tuple(_outcome(c, part) for c, part in zip(cfgs, run.each(len(cfgs))))
    for later in outcomes[1:]:
        later.wall_s = later.work_s
    outcomes[0].wall_s = run.wall_s - sum(o.wall_s for o in outcomes[1:])
    return outcomes if isinstance(cfg, tuple) else outcomes[0]


def _classify(cfg: Any, run: Any) -> RunOutcome:
    from trainer.measure.result import NonFiniteLoss, finalize

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
    if run.kind == "late":
        return RunOutcome("timeout", str(run.error), wall_s=run.wall_s)
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
    from trainer.measure.result import trace_name

    named = {trace_name(r.rank): t for r, t in zip(result.ranks, traces or []) if t}
    return named or None


def _last_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:500]
