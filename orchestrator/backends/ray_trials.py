"""Real trials on Ray: the trainer configs a space makes, their runs on warm worker groups, and their judgement.

Owns the sweep file's ``trainer``/``trainer_config``, ``baseline``, ``resources``, ``ray`` and ``prefilter``
sections; judges a result by parity (orchestrator.parity.trust) and ``resources.memory_budget_gb``; adds
``overhead_s``, ``probe`` and the ranks' ``placement`` to the ledger.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from orchestrator.parity import verdict as parity
from orchestrator.parity import trust
from orchestrator.backends.base import (Judgement, RunOutcome, SpaceConfigs, check_measured_sweep,
                                        within_budget)
from orchestrator.backends.ray_runner import RayRunner, connect
from orchestrator.calibration.ledger_fit import load_calibration
from orchestrator.calibration.prefilter import SETTINGS, MemoryPrefilter, load_cluster
from orchestrator.calibration.sources import resolve_path
from orchestrator.records.record import Probe
from orchestrator.search.space import Space, params_for
from trainer.config import TrainConfig, apply_overrides, flatten


class TrainerConfigs(SpaceConfigs):
    """Trainer configs: trainer base + baseline overrides + a trial's overrides.

    ``parallel.dp`` is always derived: world_size / (tensor_parallel.size x parallel.pp).
    """

    def __init__(self, trainer: dict, baseline: dict, world_size: int, gpus_per_rank: float):
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
            raise ValueError(f"baseline: parallel.dp={given_dp} but resources.world_size / (tensor_parallel.size x "
                             f"parallel.pp) = {self.baseline.parallel.dp}; leave parallel.dp out, it is derived")
        if (self.baseline.run.device == "cuda") != (gpus_per_rank > 0):
            raise ValueError(f"resources.gpus_per_rank={gpus_per_rank} does not match the baseline's run.device="
                             f"{self.baseline.run.device!r}: use gpus_per_rank >= 1 with cuda, 0 with cpu")
        self.fixed = flatten(self.baseline.to_dict())

    @property
    def device(self) -> str:
        return self.baseline.run.device

    def build(self, overrides: Mapping[str, Any]) -> TrainConfig:
        pp = overrides.get("parallel.pp", self.base.get("parallel", {}).get("pp", 1))
        tp = overrides.get("tensor_parallel.size", self.base.get("tensor_parallel", {}).get("size", 1))
        for name, v in (("parallel.pp", pp), ("tensor_parallel.size", tp)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}={v!r}: expected an integer >= 1")
        if self.world_size % (tp * pp):
            raise ValueError(f"tensor_parallel.size x parallel.pp = {tp} x {pp} = {tp * pp} does not divide "
                             f"resources.world_size={self.world_size} (parallel.dp is derived as world_size / (tp x pp))")
        dp = self.world_size // (tp * pp)
        return TrainConfig.from_dict(apply_overrides(self.base, {**overrides, "parallel.dp": dp}))

    def split_context(self, flat: Mapping[str, Any]) -> tuple[int, int]:
        return flat["model.n_layers"], flat["parallel.pp"] * flat["pipeline.virtual_stages"]

    def baseline_params(self, space: Space) -> dict[str, Any]:
        return params_for(space, self.fixed, [len(s) for s in self.baseline.stage_layers()])

    def load(self, d: dict[str, Any]) -> TrainConfig:
        return TrainConfig.from_dict(d)

    def probe(self, cfg: TrainConfig, measured_steps: int) -> TrainConfig | None:
        """The same config cut to warm-up + ``measured_steps`` updates (at least trust.PROBE_MIN_UPDATES, so parity
        judges two), or None when that saves nothing."""
        steps = max(cfg.run.warmup_steps + measured_steps, trust.PROBE_MIN_UPDATES)
        if steps >= cfg.run.steps:
            return None
        return dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, steps=steps))


class RayTrials:
    """The ``ray`` backend: measured multi-rank training runs."""

    name = "ray"
    predicted = False
    confirms = True

    def __init__(self, cfg: Any):
        check_measured_sweep(cfg)
        self.cfg = cfg
        res = cfg.resources
        self.configs = TrainerConfigs(cfg.trainer, cfg.baseline, res.world_size, res.gpus_per_rank)
        base_dir = Path(cfg.source).parent if cfg.source else Path(".")
        self.prefilter = prefilter_from_settings(cfg.prefilter, base_dir, res.memory_budget_gb)
        """Skips trials whose predicted peak memory exceeds the budget (orchestrator.calibration.prefilter); None: launch all."""
        self._launched: RayRunner | None = None
        """The runner ``join`` launched, until ``runner`` hands it out or ``release`` stops it."""

    def join(self) -> None:
        """Join Ray before the sweep writes anything; a ray.address nothing answers at is bad input (ValueError).
        Then the first worker group is launched, not waited for: its ranks import torch while the driver opens
        its stores (the MLflow parent run, the Optuna study), and ``runner`` waits for them."""
        from orchestrator.backends.workers import GroupStartError

        try:
            connect(self.cfg)
        except GroupStartError as e:
            raise ValueError(str(e)) from None
        if self._launched is None:
            self._launched = RayRunner(self.cfg, self.configs.device, wait=False)

    def runner(self) -> RayRunner:
        runner, self._launched = self._launched, None
        if runner is None:
            return RayRunner(self.cfg, self.configs.device)
        try:
            runner.ready()
        except BaseException:
            runner.close()
            raise
        return runner

    def release(self) -> None:
        if self._launched is not None:
            self._launched.close()
            self._launched = None

    def reference_run(self, gate: trust.ParityGate, baseline: TrainConfig) -> TrainConfig | None:
        """The canonical run; its microbatch the whole batch, or the largest the memory pre-filter lets fit."""
        prefilter = self.prefilter
        if prefilter is None:
            return gate.canonical_to_run(baseline)
        return gate.canonical_to_run(baseline, lambda cfg: not prefilter.verdict(cfg).skip)

    def suspect_runs(self, gate: trust.ParityGate, baseline: TrainConfig,
                     outcome: RunOutcome) -> Iterator[tuple[str, TrainConfig | str]]:
        """A baseline that disagrees with the canonical run: its active families, each set back alone; then, when
        none of them agreed once run (the sweep records each before asking for the next), every two together."""
        if outcome.status != "ok" or outcome.result is None:
            return
        yield from gate.suspects(baseline, outcome.result)
        yield from gate.pairs(baseline)

    def judge(self, kind: str, outcome: RunOutcome, gate: trust.ParityGate,
              runs: Sequence[RunOutcome]) -> Judgement:
        """Parity against the trust chain (canonical -> baseline -> trials), then the memory budget."""
        status, reason, verdict = outcome.status, outcome.reason, None
        # A pruned trial is judged too, on its probe's updates: a layout bug of a slow config must not go unseen.
        if status in ("ok", "pruned") and outcome.result is not None:
            try:
                if kind == "canonical":
                    # runs[1:]: its self-check decompositions (ParityGate.self_checks), all needed to certify it
                    unrun = next((r for r in runs[1:] if r.status != "ok" or r.result is None), None)
                    if unrun is not None:
                        return Judgement("failed" if unrun.status == "ok" else unrun.status,
                                         f"its self-check run (one rank, microbatches of one sequence) did not run: "
                                         f"{unrun.status}: {unrun.reason}", None)
                    verdict = gate.judge_canonical(outcome.result, [r.result for r in runs[1:]])
                elif kind == "baseline":
                    repeats = [r.result for r in runs[1:] if r.status == "ok" and r.result is not None]
                    verdict = gate.judge_baseline(outcome.result, repeats)
                else:
                    verdict = gate.judge(outcome.result)
            except trust.TrustError as e:
                status, reason, verdict = "infeasible", f"parity: {e}", e.verdict
            if verdict is not None and not verdict["passed"] and status == "ok":
                status, reason = "infeasible", f"parity: {parity.describe_failure(verdict)} (vs the reference)"
            elif verdict is not None and not verdict["passed"] and status == "pruned":  # parity-failed, not just slow
                status, reason = "infeasible", (f"parity: {parity.describe_failure(verdict)} (vs the reference, on "
                                                f"the probe's {verdict['steps']} updates); also {reason}")
        if kind != "canonical":  # a reference run: no budget applies to it
            peak = outcome.result.summary.peak_memory_bytes if outcome.result is not None else None
            status, reason = within_budget(status, reason, peak, self.cfg.resources.memory_budget_gb)
        return Judgement(status, reason, verdict)

    def resume(self, baseline: Any) -> None:
        pass  # the parity reference is the loop's trust chain (ParityGate.resume)

    def guided_sampler(self, base: Any, records: Callable[[], Sequence[Any]]) -> Any:
        from orchestrator.calibration import guided

        return guided.sampler_for(self, base, records)

    def ledger_fields(self, kind: str, config: Any, outcome: RunOutcome, status: str,
                      runs: Sequence[RunOutcome]) -> dict[str, Any]:
        fields: dict[str, Any] = {
            "overhead_s": sum(r.wall_s for r in runs) - sum(r.work_s for r in runs) if runs else None}
        if outcome.placement:  # where each rank ran: host, ip, Ray node id, GPU ids (rank order)
            fields["placement"] = outcome.placement
        # A probe ran fewer updates than the config asks for: the trial's first run, when it was pruned (or
        # failed parity on it) or went on to its full measurement.
        probe = runs[0] if kind == "trial" and runs and runs[0].result is not None \
            and len(runs[0].result.steps) < config.run.steps else None
        if probe is not None:
            n = len(probe.result.steps)
            fields["probe"] = Probe(steps=n, step_time_s=probe.result.summary.step_time_s, wall_s=probe.wall_s,
                                    skipped_steps=config.run.steps - n if outcome is probe else 0)
        return fields


def prefilter_from_settings(settings: Mapping[str, Any] | None, base_dir: str | Path = ".",
                            default_budget_gb: float | None = None) -> MemoryPrefilter | None:
    """A sweep file's ``prefilter:`` mapping -> a MemoryPrefilter, or None when absent or not enabled.

    ``cluster`` and ``calibration`` paths are relative to ``base_dir`` (the sweep file's folder) unless
    absolute or found from the working directory. ``memory_budget_gb`` is in GiB (2**30 bytes), the unit of
    the sweep's ``resources.memory_budget_gb``, which is the default because both judge the same number;
    without either the cluster's ``hbm_gb`` is the budget. Errors name ``prefilter.<field>``.
    """
    if not settings:
        return None
    if not isinstance(settings, Mapping):
        raise ValueError("prefilter: expected a mapping (enabled, cluster, calibration, memory_budget_gb, margin)")
    unknown = sorted(set(settings) - set(SETTINGS))
    if unknown:
        raise ValueError(f"prefilter.{unknown[0]}: unknown field; known: {', '.join(SETTINGS)}")
    enabled = settings.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"prefilter.enabled: expected true or false, got {enabled!r}")
    if not enabled:
        return None
    if not settings.get("cluster"):
        raise ValueError("prefilter.cluster: required (e.g. search_spaces/clusters/cpu-local.yaml)")
    try:
        cluster, efficiency = load_cluster(resolve_path(settings["cluster"], Path(base_dir)))
    except ValueError as e:
        raise ValueError(f"prefilter.cluster: {e}") from None
    if settings.get("calibration"):
        try:
            efficiency = load_calibration(resolve_path(settings["calibration"], Path(base_dir)))
        except ValueError as e:
            raise ValueError(f"prefilter.calibration: {e}") from None
    budget_gb = settings.get("memory_budget_gb", default_budget_gb)
    if budget_gb is not None and (isinstance(budget_gb, bool) or not isinstance(budget_gb, (int, float))
                                  or budget_gb <= 0):
        raise ValueError(f"prefilter.memory_budget_gb: expected a number > 0 (GiB), got {budget_gb!r}")
    margin = settings.get("margin", 0.0)
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin < 0:
        raise ValueError(f"prefilter.margin: expected a number >= 0, got {margin!r}")
    return MemoryPrefilter(cluster, efficiency, budget_bytes=budget_gb * 2**30 if budget_gb else None,
                           margin=float(margin))

