"""Mappings <-> PlanConfig, and flat dotted knobs applied to a plan: the shared builder
(``trainer.mapping``) on the planner's config, nothing of its own.

``plan_config_from_dict`` reads a preset's ``planner:`` section (errors name ``planner.<field>``);
``apply_params`` applies a trial's flat knobs (errors name the knob). Both return validated configs.
"""

from __future__ import annotations

import difflib
from typing import Any, Callable, Mapping

from trainer.mapping import apply_overrides, build, field_names, flatten

from .config import PlanConfig

KNOB_SECTIONS = ("batch", "parallel", "tensor_parallel", "pipeline", "recompute", "data_parallel", "optimizer",
                 "pipeline_comm")
"""The sections of a PlanConfig a trial may change: the shared knobs plus tensor_parallel, optimizer and
pipeline_comm."""
KNOBS: tuple[str, ...] = tuple(n for n in field_names(PlanConfig) if n.split(".")[0] in KNOB_SECTIONS)
"""Every flat knob name (docs/knobs.md describes each)."""
MOVED = {"parallel.tp": "tensor_parallel.size", "parallel.sequence_parallel": "tensor_parallel.sequence_parallel",
         "job.global_batch": "batch.global_batch", "data_parallel.distributed_optimizer": "optimizer.distributed",
         "data_parallel.overlap_param_gather": "optimizer.overlap_param_gather",
         "data_parallel.grad_reduce_dtype": "optimizer.grad_reduce_dtype"}
"""Keys an older preset used, and where they live now (the hint an unknown key gets)."""


def _moved(where: str) -> Callable[[str], str]:
    def hint(dotted: str) -> str:
        key = dotted[len(where) + 1:] if where and dotted.startswith(where + ".") else dotted
        return f" (moved: use {where + '.' if where else ''}{MOVED[key]}; docs/knobs.md)" if key in MOVED else ""
    return hint


def upgrade_plan_dict(d: Mapping[str, Any]) -> dict[str, Any]:
    """A planner mapping written before the knobs were shared (a ledger line's ``config``) in today's
    keys and units: ``MOVED`` keys moved, and bucket_mb from MB of bf16 gradients to MB of gradients in
    their reduction dtype. A current mapping comes back unchanged."""
    flat = flatten(dict(d))
    if not any(k in MOVED for k in flat):
        return dict(d)
    dtype = flat.get("data_parallel.grad_reduce_dtype", "fp32")
    out: dict[str, Any] = {}
    for key, value in flat.items():
        if key == "data_parallel.bucket_mb":
            value = value * (4 if dtype == "fp32" else 2) / 2
        out[MOVED.get(key, key)] = value
    return apply_overrides({}, out)


UNCERTAINTY_KEY = "uncertainty"
"""A planner section's statement of how sure its efficiency set is (``uncertainty: {corpus: b200}``; read by
orchestrator/calibration/sources.py). No point prediction depends on it, so the config ignores it."""


def plan_config_from_dict(d: Mapping[str, Any], where: str = "planner") -> PlanConfig:
    """A preset's ``planner:`` mapping -> validated PlanConfig. Missing sections take their defaults; the
    ``uncertainty`` key (``UNCERTAINTY_KEY``) is left to the interval's reader."""
    if isinstance(d, Mapping):
        d = {k: v for k, v in d.items() if k != UNCERTAINTY_KEY}
    return build(PlanConfig, d, where, root=where, suggest=_moved(where))


def plan_config_to_dict(cfg: PlanConfig) -> dict[str, Any]:
    """The nested mapping ``plan_config_from_dict`` reads back to an equal config."""
    return cfg.to_dict()


def knob_values(cfg: PlanConfig) -> dict[str, Any]:
    """The current value of every knob that applies to ``cfg`` (flat dotted names)."""
    d = cfg.to_dict()
    return flatten({k: d[k] for k in KNOB_SECTIONS})


def layer_split_context(base: PlanConfig) -> Callable[[Mapping[str, Any]], tuple[int, int]]:
    """For a space's ``layer_split`` param: (layers, model chunks) of the config a trial builds.

    first/last count layers per model chunk (the trainer's meaning), so there are pp x virtual_stages.
    """
    def context(flat: Mapping[str, Any]) -> tuple[int, int]:
        pp = int(flat.get("parallel.pp", base.parallel.pp))
        return base.model.num_layers, pp * int(flat.get("pipeline.virtual_stages", 1))
    return context


def apply_params(cfg: PlanConfig, params: Mapping[str, Any]) -> PlanConfig:
    """A new validated config with flat dotted knobs applied (see ``KNOBS``).

    Changing a ``kind`` switches the option type; sub-knobs of an option that is not selected
    (``recompute.num_layers`` with ``recompute.kind: none``, ``pipeline.virtual_stages`` without
    interleaving) are ignored, so a baseline merged with a trial's conditional params applies cleanly.
    """
    for name in params:
        if name not in KNOBS:
            hint = _moved("")(name) or "".join(f" (did you mean {c}?)" for c in difflib.get_close_matches(
                name, KNOBS, n=1, cutoff=0.75))
            raise ValueError(f"{name}: unknown knob{hint}; known: {', '.join(KNOBS)}")
    p = dict(params)
    if p.get("pipeline.schedule", cfg.pipeline.schedule) != "interleaved_1f1b":
        p["pipeline.virtual_stages"] = 1  # a sub-knob of interleaving
    return build(PlanConfig, apply_overrides(cfg.to_dict(), p), "", inactive="ignore", suggest=_moved(""))
