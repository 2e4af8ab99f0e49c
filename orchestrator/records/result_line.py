"""A measured result as a ledger line stores it: without what the line holds already, and without its detail.

``pack`` leaves out the record's config (or keeps only the values that differ: a probe's shorter
``run.steps``), the summary values the line's metrics carry, and the keys its detail file holds
(orchestrator.records.detail); ``unpack`` puts back the first two, and ``join`` the detail once it is read.
Only values equal to the record's are left out, so packing loses nothing by construction.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from trainer.mapping import flatten
from trainer.measure.result import Summary

EMPTY_DETAIL = {"steps": [], "fingerprint": {}, "ranks": []}
"""What a result holds where its detail file has not been read (or could not be)."""


def pack(result: dict[str, Any], config: dict[str, Any], metrics: dict[str, Any],
         apart: tuple[str, ...] = ()) -> dict[str, Any]:
    """``result`` (``Result.to_dict()``) without the record's config, its metrics' values and the ``apart`` keys."""
    out = {k: v for k, v in result.items() if k not in apart}
    rc = out.pop("config")
    if rc != config:
        changes = _changes(config, rc)
        if changes is not None:
            out["config_changes"] = changes
        else:  # a different shape, not just other values: keep it whole
            out["config"] = rc
    out["summary"] = {k: v for k, v in out["summary"].items()
                      if k not in metrics or metrics[k] != v or type(metrics[k]) is not type(v)}
    return out


def unpack(packed: dict[str, Any], config: dict[str, Any], metrics: dict[str, Any],
           apart: tuple[str, ...] = ()) -> dict[str, Any]:
    """The ``Result.to_dict()`` a packed result came from, the ``apart`` keys empty until its detail is joined."""
    out = {**{k: copy.deepcopy(EMPTY_DETAIL[k]) for k in apart}, **packed}
    if "config" not in out:
        rc = copy.deepcopy(config)
        for key, value in (out.pop("config_changes", None) or {}).items():
            _set(rc, key, value)
        out["config"] = rc
    names = {f.name for f in dataclasses.fields(Summary)}
    out["summary"] = {**{k: metrics[k] for k in names if k in metrics}, **out["summary"]}
    return out


def detail_of(result: dict[str, Any], apart: tuple[str, ...]) -> dict[str, Any]:
    """The ``apart`` keys of ``result``: what its detail file holds."""
    return {k: result[k] for k in apart}


def join(result: dict[str, Any], detail: dict[str, Any], apart: tuple[str, ...]) -> dict[str, Any]:
    """``result`` with its detail file's keys put back; ``ValueError`` when the file lacks one of them."""
    missing = [k for k in apart if k not in detail]
    if missing:
        raise ValueError(f"the detail file lacks {missing}")
    return {**result, **{k: detail[k] for k in apart}}


def _changes(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any] | None:
    """``other`` as dotted-key value changes to ``base``; None when it is not ``base`` with other leaf values."""
    fb, fo = flatten(base), flatten(other)
    if fb.keys() != fo.keys():
        return None
    changes = {k: v for k, v in fo.items() if fb[k] != v or type(fb[k]) is not type(v)}
    rebuilt = copy.deepcopy(base)
    for k, v in changes.items():
        _set(rebuilt, k, v)
    return changes if rebuilt == other else None


def _set(d: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    for p in parents:
        d = d[p]
    d[leaf] = value
