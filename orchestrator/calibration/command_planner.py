"""The planner's view of a command-backend trial: the model the team's own command trains, declared in the sweep
file's ``planner:`` section, with each trial's knobs on it; and the guided sampler built from it.

A black box's config tells steptune only its knob values. What the planner also needs (the model's layers, width,
heads, vocabulary, the sequence length and precision, the cluster it runs on) comes from ``planner:``, in the model
backend's own format (``model:``, ``job:``, ``cluster_file:`` or ``cluster:``, optionally ``efficiency:`` /
``calibration_file:``, ``optimizer:``, ``pipeline_comm:``). The knob sections (batch, parallel, tensor_parallel,
pipeline, recompute, data_parallel) are each trial's own, from its config; ``planner.batch.global_batch``, where
given, must be the trial configs' (one global batch per sweep). The guided sampler is the ray backend's
(orchestrator.calibration.guided) with this mapping in place of ``prefilter.plan_for_trial``: its picks, its online refits to
the measured step times of the sweep's own command trials. Nothing falls back silently: a sweep that asks for
``sampler.kind: guided`` without a planner section, or whose space the planner cannot model at all, is refused at
load, and configs it cannot model are named in the log.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from orchestrator.planner import ClusterSpec, Efficiency, PlanConfig

log = logging.getLogger(__name__)
KNOB_SECTIONS = ("batch", "parallel", "tensor_parallel", "pipeline", "recompute", "data_parallel")


@dataclass(frozen=True)
class CommandPlanner:
    """The declared model and cluster, onto which each trial's knobs are put."""

    base: PlanConfig
    """The planner section as a plan (its knob sections the baseline's, replaced per trial)."""
    sources: Any
    """Where its figures come from (orchestrator.calibration.sources.Sources)."""

    @property
    def cluster(self) -> ClusterSpec:
        return self.base.cluster

    @property
    def efficiency(self) -> Efficiency:
        return self.base.efficiency

    def plan_for(self, train_cfg: Any, cluster: ClusterSpec | None = None, efficiency: Efficiency | None = None
                 ) -> PlanConfig:
        """A trial config's knobs on the declared model: ``prefilter.plan_for_trial``'s signature, so the guided
        sampler and its refits take it in that one's place. ValueError where the planner cannot represent it."""
        pipeline = train_cfg.pipeline
        if train_cfg.parallel.pp == 1:  # one stage: microbatches one at a time, whatever the schedule says
            pipeline = dataclasses.replace(pipeline, schedule="1f1b", virtual_stages=1)
        cluster = cluster or self.base.cluster
        return dataclasses.replace(
            self.base, cluster=dataclasses.replace(cluster, num_gpus=train_cfg.world_size),
            efficiency=efficiency or self.base.efficiency, parallel=train_cfg.parallel,
            tensor_parallel=train_cfg.tensor_parallel, batch=train_cfg.batch, pipeline=pipeline,
            recompute=train_cfg.recompute, data_parallel=train_cfg.data_parallel)


def load(planner: Mapping[str, Any], baseline: Any, base_dir: Path | None = None) -> CommandPlanner:
    """``planner:`` of a command sweep, checked against the baseline's trial config; ValueError naming the field."""
    from orchestrator.calibration import sources as S
    from orchestrator.planner import plan_config_from_dict

    if not isinstance(planner, Mapping):
        raise ValueError("planner: expected a mapping (model:, job:, cluster_file: ...)")
    for section in KNOB_SECTIONS:
        extra = set(planner.get(section) or {}) - ({"global_batch"} if section == "batch" else set())
        if extra:
            raise ValueError(f"planner.{section}.{sorted(extra)[0]}: the command backend takes every knob from the "
                             f"trial's own config (trainer:, baseline:, space:); remove it from planner:")
    given = (planner.get("batch") or {}).get("global_batch")
    if given is not None and given != baseline.batch.global_batch:
        raise ValueError(f"planner.batch.global_batch={given}: the trials' global batch is trainer.batch.global_batch="
                         f"{baseline.batch.global_batch}; one global batch per sweep (or leave it out of planner:)")
    if not planner.get("model"):
        raise ValueError("planner.model: required: the model your command trains (num_layers, hidden_size, "
                         "num_heads, vocab_size, ...), as for the model backend")
    if not (planner.get("cluster") or planner.get("cluster_file")):
        raise ValueError("planner.cluster_file: required (or planner.cluster): the machine the trials run on, e.g. "
                         "search_spaces/clusters/cpu-local.yaml or steptune netcal's measured file")
    data = {k: v for k, v in planner.items() if k not in KNOB_SECTIONS}
    cluster = dict(data.get("cluster") or {})
    cluster.setdefault("num_gpus", baseline.world_size)
    data["cluster"] = cluster
    resolved, sources = S.resolve(data, base_dir)
    resolved["cluster"]["num_gpus"] = baseline.world_size
    for section in KNOB_SECTIONS:  # the baseline's knobs, so the base plan is a valid plan
        resolved[section] = baseline.to_dict()[section]
    try:
        base = plan_config_from_dict(resolved)
    except ValueError as e:
        raise ValueError(f"planner: {e}") from None
    return CommandPlanner(base, sources)


def sampler_for(ranking: Any, cfg: Any, base: Any, records: Callable[[], Sequence[Any]]):
    """``sampler.kind: guided`` on a command sweep: the ray backend's guided sampler over ``base``, ranking with this
    planner's mapping (``ranking_for``, built when the sweep file was loaded)."""
    from orchestrator.calibration import guided

    s = cfg.sampler
    return guided.GuidedSampler(ranking, base, records, n_first=s.guided_first, every=s.guided_every)


def ranking_for(planner: CommandPlanner, cfg: Any, configs: Any, n_float: int | None = None):
    """The planner's ranking of a command sweep's space (its efficiency: ``sampler.calibration`` where given, else
    the planner section's); ValueError when it models none of the configs, a note naming those it cannot model."""
    from orchestrator.calibration import guided

    eff = guided.start_efficiency(cfg.sampler, cfg.source) or planner.efficiency
    kwargs = {} if n_float is None else {"n_float": n_float}
    ranking = guided.PlannerRanking(cfg.space, configs, planner.cluster, eff, to_plan=planner.plan_for,
                                    uncertainty=guided.start_uncertainty(cfg.sampler, cfg.source), **kwargs)
    if not ranking.modelled:
        raise ValueError(f"sampler.kind=guided: the planner models none of the space's configs ("
                         f"{next(iter(ranking.not_modelled.values()), '?')}); use sampler.kind=tpe, or describe the "
                         f"model under planner: so it can")
    if ranking.not_modelled:
        log.info("note: the planner does not model %d of %d configs (e.g. %s); TPE alone proposes those",
                 len(ranking.not_modelled), len(ranking.candidates), next(iter(ranking.not_modelled.values())))
    return ranking
