"""Mappings <-> frozen dataclasses, and flat dotted overrides: the edge between YAML and the trainer's config.

Generic over dataclasses: a field typed as a Union of dataclasses is chosen by the mapping's ``kind:`` key
(each member has a ``kind`` ClassVar); unknown fields and wrong types are ValueErrors naming the dotted path.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Union

def _union_members(tp: Any) -> tuple[type, ...] | None:
    if typing.get_origin(tp) is Union:
        members = tuple(a for a in typing.get_args(tp) if dataclasses.is_dataclass(a))
        return members or None
    return None


def build(cls: type, data: Any, path: str) -> Any:
    if not isinstance(data, dict):
        raise ValueError(f"{path or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known - {"kind"})
    if unknown:
        where = f"{path}." if path else ""
        raise ValueError(f"unknown field(s) {', '.join(where + u for u in unknown)}; allowed: {sorted(known)}")
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _coerce(hints[f.name], data[f.name], f"{path}.{f.name}" if path else f.name)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, path: str) -> Any:
    members = _union_members(tp)
    if members:
        if isinstance(value, str):
            value = {"kind": value}
        if not isinstance(value, dict) or "kind" not in value:
            kinds = [m.kind for m in members]
            raise ValueError(f"{path}: give a mapping with kind: one of {kinds}")
        by_kind = {m.kind: m for m in members}
        if value["kind"] not in by_kind:
            raise ValueError(f"{path}.kind={value['kind']!r} must be one of {sorted(by_kind)}")
        return build(by_kind[value["kind"]], value, path)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, path)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value))
    if tp is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{path}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{path}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{path}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ValueError(f"{path}: expected a string, got {value!r}")
        return value
    raise TypeError(f"{path}: unsupported field type {tp}")


def dump(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        out: dict[str, Any] = {}
        if isinstance(getattr(type(obj), "kind", None), str):
            out["kind"] = type(obj).kind
        for f in dataclasses.fields(obj):
            out[f.name] = dump(getattr(obj, f.name))
        return out
    if isinstance(obj, tuple):
        return [dump(v) for v in obj]
    return obj


def apply_overrides(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Apply flat dotted overrides (``{"recompute.kind": "full", "parallel.pp": 2}``) to a nested mapping.

    Changing a ``kind`` switches the option type, so the old option's other fields are dropped unless the
    overrides set them too: ``recompute.kind=none`` on a full-recompute base gives plain ``{kind: none}``.
    """
    out = _deepcopy(base)
    for key in sorted(overrides, key=lambda k: (not k.endswith(".kind"), k)):
        parts = key.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if isinstance(child, str):  # shorthand ``recompute: none``
                child = {"kind": child}
            if not isinstance(child, dict):
                child = {}
            node[part] = child
            node = child
        leaf = parts[-1]
        if leaf == "kind" and node.get("kind") != overrides[key]:
            node.clear()
        node[leaf] = overrides[key]
    return out


def _deepcopy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mapping -> flat dotted names (the form MLflow params and search spaces use)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        else:
            out[key] = v
    return out


def parse_dotlist(items: list[str]) -> dict[str, Any]:
    """``["run.steps=20", "recompute.modules=[mlp]"]`` -> overrides; values parsed as YAML scalars/lists."""
    import yaml

    out = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r} must look like key=value (e.g. parallel.pp=2)")
        out[key.strip()] = yaml.safe_load(raw) if raw != "" else ""
    return out
