"""Mappings <-> frozen dataclasses, and flat dotted overrides: the edge between YAML and a config (the
trainer's ``TrainConfig``, the planner's ``PlanConfig``, the sweep file). Neutral: no torch, no orchestrator.

Generic over dataclasses: a field typed as a Union of dataclasses is chosen by the mapping's ``kind:`` key
(each member has a ``kind`` ClassVar); unknown fields and wrong types are ValueErrors naming the dotted path.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, Callable, Union


@dataclasses.dataclass(frozen=True)
class _How:
    suggest: Callable[[str], str] | None = None
    root: str = ""
    inactive: str = "error"


def build(cls: type, data: Any, path: str = "", *, suggest: Callable[[str], str] | None = None,
          skip: tuple[str, ...] = (), root: str = "", inactive: str = "error") -> Any:
    """``cls(**data)`` with every field coerced and checked; errors name the dotted path.

    ``suggest`` turns an unknown dotted key into a hint (" (did you mean x.y?)"); ``skip`` names fields the
    caller fills itself. Validation errors of the dataclasses name their field from the config's root
    (``recompute.method: ...``); ``root`` is put in front of them (a preset's ``planner``). With
    ``inactive="ignore"`` a field of another option of the same ``kind`` union (``recompute.num_layers`` on
    ``recompute.kind: none``) is an inactive sub-knob and dropped instead of refused.
    """
    if inactive not in ("error", "ignore"):
        raise ValueError(f"inactive={inactive!r} must be error or ignore")
    return _build(cls, data, path, _How(suggest, root, inactive), skip)


def _build(cls: type, data: Any, path: str, how: _How, skip: tuple[str, ...] = (),
           siblings: frozenset[str] = frozenset()) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path or 'config'}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.name not in skip]
    known = {f.name for f in fields}
    tagged = isinstance(getattr(cls, "kind", None), str) and "kind" not in known  # a kind-union member
    for key, value in data.items():
        if key in known or (tagged and key == "kind") or (how.inactive == "ignore" and key in siblings):
            continue
        dotted = f"{path}.{key}" if path else str(key)
        hint = ""
        if how.suggest is not None:
            children = [f"{dotted}.{k}" for k in value] if isinstance(value, dict) else []
            hint = next((h for h in map(how.suggest, [dotted, *children]) if h), "")
        if not hint:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.75)
            hint = f" (did you mean {path + '.' if path else ''}{close[0]}?)" if close else ""
        raise ValueError(f"unknown field {dotted}{hint}; allowed here: {sorted(known)}")
    values = {f.name: _coerce(hints[f.name], data[f.name], f"{path}.{f.name}" if path else f.name, how)
              for f in fields if f.name in data}
    try:
        return cls(**values)
    except ValueError as e:  # the dataclass names its field from the config's root
        raise ValueError(f"{how.root}.{e}" if how.root else str(e)) from None


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a mapping",
             list: "a list"}


def _coerce(tp: Any, value: Any, path: str, how: _How) -> Any:
    if typing.get_origin(tp) in (Union, types.UnionType):  # Optional[x] and x | None
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        members = [a for a in args if a is not type(None)]
        if len(members) > 1:
            return _pick_kind(members, value, path, how)
        tp = members[0]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path, how)
    if typing.get_origin(tp) is tuple:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp)[:1]
        return tuple(_coerce(item, v, f"{path}[{i}]", how) for i, v in enumerate(value))
    if tp not in _EXPECTED:
        raise TypeError(f"{path}: unsupported field type {tp}")
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, tp) or (tp in (int, float) and isinstance(value, bool)):
        raise ValueError(f"{path}: expected {_EXPECTED[tp]}, got {value!r}")
    return value


def _pick_kind(members: list[type], value: Any, path: str, how: _How) -> Any:
    """Mutually exclusive options: the member whose ``kind`` the mapping names (a bare string is the kind)."""
    by_kind = {m.kind: m for m in members}
    if isinstance(value, str):
        value = {"kind": value}
    if not isinstance(value, dict) or "kind" not in value:
        raise ValueError(f"{path}: give a mapping with kind: one of {sorted(by_kind)}")
    if value["kind"] not in by_kind:
        raise ValueError(f"{path}.kind: {value['kind']!r} must be one of {sorted(by_kind)}")
    chosen = by_kind[value["kind"]]
    siblings = frozenset(f.name for m in members for f in dataclasses.fields(m)) - {
        f.name for f in dataclasses.fields(chosen)}
    return _build(chosen, value, path, how, siblings=siblings)


def field_names(cls: Any, prefix: str = "") -> list[str]:
    """Every flat dotted field name a config class accepts; a ``kind`` union gives ``.kind`` and the fields
    of all its options."""
    if typing.get_origin(cls) is Union:
        members = [a for a in typing.get_args(cls) if a is not type(None)]
        if len(members) > 1:
            names = [f"{prefix}kind"]
            for m in members:
                names += [n for n in field_names(m, prefix) if n not in names]
            return names
        cls = members[0]
    if not dataclasses.is_dataclass(cls):
        return [prefix[:-1]]
    hints = typing.get_type_hints(cls)
    return [n for f in dataclasses.fields(cls) for n in field_names(hints[f.name], f"{prefix}{f.name}.")]


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
