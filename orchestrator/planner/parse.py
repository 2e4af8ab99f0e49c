"""Mappings <-> PlanConfig, and flat dotted knobs applied to a plan.

``plan_config_from_dict`` reads a preset's ``planner:`` section (errors name ``planner.<field>``);
``apply_params`` applies a trial's flat knobs (errors name the knob). Both return validated configs.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from .checks import prefixed
from .cluster import ClusterSpec, Efficiency, JobSpec, ModelSpec
from .config import (BalancedSplit, BatchConfig, DataParallelConfig, FirstLastSplit, FullRecompute,
                     NoRecompute, ParallelConfig, PipelineConfig, PlanConfig, SelectiveRecompute)

_SECTIONS = {
    "cluster": ClusterSpec, "model": ModelSpec, "job": JobSpec, "efficiency": Efficiency,
    "parallel": ParallelConfig, "batch": BatchConfig, "pipeline": PipelineConfig,
    "recompute": None, "data_parallel": DataParallelConfig,
}
_SPLITS = {c.kind: c for c in (BalancedSplit, FirstLastSplit)}
_RECOMPUTES = {c.kind: c for c in (NoRecompute, SelectiveRecompute, FullRecompute)}

KNOBS: dict[str, str] = {
    "batch.micro_batch_size": "sequences per microbatch (microbatch count = global_batch / (this * dp))",
    "pipeline.schedule": "gpipe | 1f1b | interleaved_1f1b",
    "pipeline.virtual_stages": "model chunks per rank (interleaved_1f1b only)",
    "pipeline.split.kind": "balanced | first_last",
    "pipeline.split.first": "layers on the first pipeline stage (first_last)",
    "pipeline.split.last": "layers on the last pipeline stage (first_last)",
    "recompute.kind": "none | selective | full",
    "recompute.method": "uniform | block (full)",
    "recompute.num_layers": "group size (uniform) or recomputed layers per chunk (block) (full)",
    "recompute.modules": "list of core_attn | mlp | norm (selective)",
    "data_parallel.overlap_grad_reduce": "bool",
    "data_parallel.overlap_param_gather": "bool (needs distributed_optimizer)",
    "data_parallel.bucket_mb": "float, MB of bf16 gradients per bucket",
    "data_parallel.distributed_optimizer": "bool",
    "data_parallel.grad_reduce_dtype": "fp32 | bf16",
    "parallel.tp": "planner-only: tensor-parallel size",
    "parallel.pp": "planner-only: pipeline-parallel size",
    "parallel.dp": "planner-only: data-parallel size",
    "parallel.sequence_parallel": "planner-only: bool",
}


def _build(cls: type, data: Any, path: str, skip: tuple[str, ...] = ()) -> Any:
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping, got {type(data).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names - {"kind"})
    if unknown:
        raise ValueError(f"{path}.{unknown[0]}: unknown field; known: {', '.join(sorted(names))}")
    with prefixed(path):
        return cls(**{k: v for k, v in data.items() if k != "kind" and k not in skip})


def _union(options: dict[str, type], data: Any, path: str) -> Any:
    if isinstance(data, str):  # shorthand ``recompute: none``
        data = {"kind": data}
    if not isinstance(data, Mapping) or "kind" not in data:
        raise ValueError(f"{path}.kind: give a mapping with kind: one of {', '.join(options)}")
    kind = data["kind"]
    if kind not in options:
        raise ValueError(f"{path}.kind: must be one of {', '.join(options)}; got {kind!r}")
    return _build(options[kind], data, path)


def plan_config_from_dict(d: Mapping[str, Any], where: str = "planner") -> PlanConfig:
    """A preset's ``planner:`` mapping -> validated PlanConfig. Missing sections take their defaults."""
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected a mapping of sections {', '.join(_SECTIONS)}")
    unknown = sorted(set(d) - set(_SECTIONS))
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown section; known: {', '.join(_SECTIONS)}")
    parts: dict[str, Any] = {}
    for name, cls in _SECTIONS.items():
        if name not in d:
            continue
        path = f"{where}.{name}"
        if name == "recompute":
            parts[name] = _union(_RECOMPUTES, d[name], path)
        elif name == "pipeline":
            data = d[name]
            split = _union(_SPLITS, data.get("split", "balanced"), f"{path}.split") \
                if isinstance(data, Mapping) else None
            parts[name] = dataclasses.replace(_build(cls, data, path, skip=("split",)), split=split)
        else:
            parts[name] = _build(cls, d[name], path)
    with prefixed(where):
        return PlanConfig(**parts)


def plan_config_to_dict(cfg: PlanConfig) -> dict[str, Any]:
    """The nested mapping ``plan_config_from_dict`` reads back to an equal config."""
    return cfg.to_dict()


def knob_values(cfg: PlanConfig) -> dict[str, Any]:
    """The current value of every knob that applies to ``cfg`` (flat dotted names)."""
    flat = {
        "batch.micro_batch_size": cfg.batch.micro_batch_size,
        "pipeline.schedule": cfg.pipeline.schedule,
        "pipeline.virtual_stages": cfg.pipeline.virtual_stages,
        "pipeline.split.kind": cfg.pipeline.split.kind,
        "recompute.kind": cfg.recompute.kind,
    }
    if isinstance(cfg.pipeline.split, FirstLastSplit):
        flat.update({"pipeline.split.first": cfg.pipeline.split.first, "pipeline.split.last": cfg.pipeline.split.last})
    if isinstance(cfg.recompute, FullRecompute):
        flat.update({"recompute.method": cfg.recompute.method, "recompute.num_layers": cfg.recompute.num_layers})
    if isinstance(cfg.recompute, SelectiveRecompute):
        flat["recompute.modules"] = list(cfg.recompute.modules)
    for group in ("data_parallel", "parallel"):
        obj = getattr(cfg, group)
        flat.update({f"{group}.{f.name}": getattr(obj, f.name) for f in dataclasses.fields(obj)})
    return flat


def layer_split_context(base: PlanConfig) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    """For a space's ``layer_split`` param: (layers, pipeline stages) of the config a trial builds.

    first/last count layers per pipeline rank (Megatron's meaning), so the stage count is pp, not pp*v.
    """
    return lambda flat: (base.model.num_layers, int(flat.get("parallel.pp", base.parallel.pp)))


def apply_params(cfg: PlanConfig, params: Mapping[str, Any]) -> PlanConfig:
    """A new validated config with flat dotted knobs applied (see ``KNOBS``).

    Changing a ``kind`` switches the option type; sub-knobs of an option that is not selected
    (``recompute.num_layers`` with ``recompute.kind: none``, ``pipeline.virtual_stages`` without
    interleaving) are ignored, so a baseline merged with a trial's conditional params applies cleanly.
    A newly selected option takes its sub-knobs from ``params``, else from the current option if it is
    the same kind; a required one missing from both is an error.
    """
    for name in params:
        if name not in KNOBS:
            raise ValueError(f"{name}: unknown knob; known: {', '.join(KNOBS)}")
    p = dict(params)

    def group(name: str, obj: Any, skip: tuple[str, ...] = ()) -> Any:
        new = {k.split(".", 1)[1]: v for k, v in p.items()
               if k.startswith(name + ".") and k.count(".") == 1 and k.split(".", 1)[1] not in skip}
        with prefixed(name):
            return dataclasses.replace(obj, **new) if new else obj

    pipe = cfg.pipeline
    schedule = p.get("pipeline.schedule", pipe.schedule)
    vstages = p.get("pipeline.virtual_stages", pipe.virtual_stages) if schedule == "interleaved_1f1b" else 1
    split = _pick(_SPLITS, "pipeline.split", pipe.split, p, {"first_last": ("first", "last")})
    with prefixed("pipeline"):
        pipe = PipelineConfig(schedule=schedule, virtual_stages=vstages, split=split)
    recompute = _pick(_RECOMPUTES, "recompute", cfg.recompute, p,
                      {"full": ("method", "num_layers"), "selective": ("modules",)})
    return PlanConfig(
        cluster=cfg.cluster, model=cfg.model, job=cfg.job, efficiency=cfg.efficiency,
        parallel=group("parallel", cfg.parallel), batch=group("batch", cfg.batch), pipeline=pipe,
        recompute=recompute, data_parallel=group("data_parallel", cfg.data_parallel),
    )


def _pick(options: dict[str, type], path: str, current: Any, p: Mapping[str, Any],
          subs: dict[str, tuple[str, ...]]) -> Any:
    kind = p.get(f"{path}.kind", current.kind)
    if kind not in options:
        raise ValueError(f"{path}.kind: must be one of {', '.join(options)}; got {kind!r}")
    values = {}
    for sub in subs.get(kind, ()):
        key = f"{path}.{sub}"
        if key in p:
            values[sub] = p[key]
        elif current.kind == kind:
            values[sub] = getattr(current, sub)
        elif sub != "modules":
            raise ValueError(f"{key}: required when {path}.kind is {kind}")
    with prefixed(path):
        return options[kind](**values)
