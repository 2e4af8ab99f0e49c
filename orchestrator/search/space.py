"""Search space: a YAML mapping -> parameter specs -> Optuna define-by-run suggestions. Pure.

A space is ``{params: {dotted.name: spec}}``. Spec types: ``categorical`` (choices), ``int`` and ``float``
(low, high, optional step, log) and ``layer_split`` (first/last stage layer-count ranges; the middle
stages are balanced). Any spec may carry ``when: {other.name: value | [values]}``: it is suggested only
when every listed name has one of those values (looked up among the params already suggested, then in the
fixed base config), and otherwise takes its ``default:`` if it has one, or leaves the base value alone.

``suggest`` returns two mappings: ``params`` (what Optuna recorded, flat dotted) and ``overrides`` (what to
apply to the base config: params plus the defaults of inactive params and the split's ``kind``).
Optuna cannot change a categorical's choices between trials, so everything context-dependent (the split,
whose feasible values depend on layers and stages) is expressed as int ranges, which it can.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import optuna

from trainer.layout import split_counts

TYPES = ("categorical", "int", "float", "layer_split")
_KEYS = {
    "categorical": {"choices", "when", "default"},
    "int": {"low", "high", "step", "log", "when", "default"},
    "float": {"low", "high", "step", "log", "when", "default"},
    "layer_split": {"first", "last", "when"},
}
_UNSET = object()
_SCALARS = (type(None), bool, int, float, str)

# (n_layers, n_stages) for the config being built; the backend knows where those live.
SplitContext = Callable[[Mapping[str, Any]], "tuple[int, int]"]


@dataclass(frozen=True)
class Param:
    name: str
    type: str
    choices: tuple = ()
    low: Any = None
    high: Any = None
    step: Any = None
    log: bool = False
    when: tuple = ()
    """((name, (allowed values...)), ...): all must hold for the param to be suggested."""
    default: Any = _UNSET
    first: tuple = ()
    last: tuple = ()

    def distribution(self) -> optuna.distributions.BaseDistribution:
        """The Optuna distribution of a categorical, int or float param; a split's depends on the layout."""
        if self.type == "categorical":
            return optuna.distributions.CategoricalDistribution(list(self.choices))
        if self.type == "int":
            return optuna.distributions.IntDistribution(self.low, self.high, step=self.step or 1, log=self.log)
        if self.type == "float":
            return optuna.distributions.FloatDistribution(self.low, self.high, step=self.step, log=self.log)
        raise ValueError(f"{self.name}: a layer_split has no fixed distribution; its ranges follow the layout")

    @property
    def optuna_names(self) -> list[str]:
        return [f"{self.name}.first", f"{self.name}.last"] if self.type == "layer_split" else [self.name]

    @property
    def override_keys(self) -> list[str]:
        return [f"{self.name}.kind", *self.optuna_names] if self.type == "layer_split" else [self.name]


@dataclass(frozen=True)
class Space:
    params: tuple[Param, ...]
    """In suggestion order: every param after the params its ``when`` names."""
    allow_numerics_change: tuple[str, ...] = ()
    """Params the file opts in to searching although they change the arithmetic, not only its order
    (``space.allow_numerics_change``; which knobs need it: orchestrator.parity.verdict.NUMERICS_CHANGING_KNOBS)."""

    @property
    def names(self) -> list[str]:
        return [n for p in self.params for n in p.optuna_names]

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        """Name -> Optuna distribution of every param whose range does not depend on the layout."""
        return {p.name: p.distribution() for p in self.params if p.type != "layer_split"}

    @property
    def override_keys(self) -> list[str]:
        return [k for p in self.params for k in p.override_keys]

    def get(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)


def parse_space(data: Any, where: str = "space") -> Space:
    if not isinstance(data, Mapping) or "params" not in data or set(data) - {"params", "allow_numerics_change"}:
        raise ValueError(f"{where}: expected a mapping with params (and optionally allow_numerics_change) "
                         f"(got {_keys(data)})")
    params = data.get("params")
    if not isinstance(params, Mapping) or not params:
        raise ValueError(f"{where}.params: expected a non-empty mapping of dotted.name: spec")
    parsed = [_parse_param(str(name), spec, f"{where}.params.{name}") for name, spec in params.items()]
    allowed = data.get("allow_numerics_change", [])
    if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
        raise ValueError(f"{where}.allow_numerics_change: expected a list of space param names")
    unknown = [a for a in allowed if a not in params]
    if unknown:
        raise ValueError(f"{where}.allow_numerics_change: {', '.join(unknown)} not in {where}.params; list only "
                         f"params the space searches")
    return Space(tuple(_dependency_order(parsed, where)), tuple(allowed))


def _keys(data: Any) -> Any:
    return sorted(data) if isinstance(data, Mapping) else type(data).__name__


def _parse_param(name: str, spec: Any, where: str) -> Param:
    if not isinstance(spec, Mapping):
        raise ValueError(f"{where}: expected a mapping with type: one of {list(TYPES)}")
    kind = spec.get("type")
    if kind not in TYPES:
        raise ValueError(f"{where}.type={kind!r} must be one of {list(TYPES)}")
    unknown = sorted(set(spec) - _KEYS[kind] - {"type"})
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} for type {kind}; allowed: {sorted(_KEYS[kind])}")
    when = _parse_when(name, spec.get("when", {}), f"{where}.when")
    default = spec.get("default", _UNSET)
    if default is not _UNSET and not when:
        raise ValueError(f"{where}.default only applies with when: (it is the value used while inactive)")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ValueError(f"{where}.choices: expected a non-empty list")
        if not all(isinstance(c, _SCALARS) for c in choices):
            raise ValueError(f"{where}.choices: only null, bool, int, float and str choices are allowed")
        if len({repr(c) for c in choices}) != len(choices):
            raise ValueError(f"{where}.choices has duplicates: {choices}")
        return Param(name, kind, choices=tuple(choices), when=when, default=default)
    if kind == "layer_split":
        return Param(name, kind, first=_range(spec.get("first"), f"{where}.first"),
                     last=_range(spec.get("last"), f"{where}.last"), when=when)
    return _parse_numeric(name, kind, spec, where, when, default)


def _parse_numeric(name: str, kind: str, spec: Mapping, where: str, when: tuple, default: Any) -> Param:
    ok = (lambda v: isinstance(v, int) and not isinstance(v, bool)) if kind == "int" else \
        (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))
    for key in ("low", "high"):
        if not ok(spec.get(key)):
            raise ValueError(f"{where}.{key}: expected {'an integer' if kind == 'int' else 'a number'}, "
                             f"got {spec.get(key)!r}")
    low, high, step, log = spec["low"], spec["high"], spec.get("step"), spec.get("log", False)
    if low > high:
        raise ValueError(f"{where}: low={low} is above high={high}")
    if not isinstance(log, bool):
        raise ValueError(f"{where}.log: expected true or false, got {log!r}")
    if step is not None and (not ok(step) or step <= 0):
        raise ValueError(f"{where}.step: expected a positive {'integer' if kind == 'int' else 'number'}")
    if log and step not in (None, 1):
        raise ValueError(f"{where}: step and log cannot be combined (Optuna's rule)")
    if log and low <= 0:
        raise ValueError(f"{where}: log: true needs low > 0, got {low}")
    if kind == "float":
        low, high = float(low), float(high)
    param = Param(name, kind, low=low, high=high, step=step, log=log, when=when, default=default)
    try:
        param.distribution()
    except ValueError as e:  # anything else Optuna refuses
        raise ValueError(f"{where}: {e}") from None
    return param


def _range(value: Any, where: str) -> tuple[int, int]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ValueError(f"{where}: expected [min, max] layer counts, got {value!r}")
    if not 1 <= value[0] <= value[1]:
        raise ValueError(f"{where}={value}: need 1 <= min <= max")
    return value[0], value[1]


def _parse_when(name: str, when: Any, where: str) -> tuple:
    if not isinstance(when, Mapping):
        raise ValueError(f"{where}: expected a mapping of other.param: value or [values]")
    out = []
    for key, allowed in when.items():
        if key == name:
            raise ValueError(f"{where}: a param cannot depend on itself")
        values = tuple(allowed) if isinstance(allowed, list) else (allowed,)
        if not values or not all(isinstance(v, _SCALARS) for v in values):
            raise ValueError(f"{where}.{key}: expected a scalar or a non-empty list of scalars")
        out.append((str(key), values))
    return tuple(out)


def _dependency_order(params: list[Param], where: str) -> list[Param]:
    by_name = {p.name: p for p in params}
    for p in params:
        for key, _ in p.when:
            if key in by_name and by_name[key].type == "layer_split":
                raise ValueError(f"{where}.params.{p.name}.when: cannot depend on the layer_split {key}")
    ordered: list[Param] = []
    placed: set[str] = set()
    while len(ordered) < len(params):
        ready = [p for p in params if p.name not in placed
                 and all(k in placed or k not in by_name for k, _ in p.when)]
        if not ready:
            stuck = sorted(p.name for p in params if p.name not in placed)
            raise ValueError(f"{where}.params: when: conditions form a cycle among {stuck}")
        # Keep YAML order among the ready ones; layer splits last, since their range depends on the layout.
        nxt = next((p for p in ready if p.type != "layer_split"), ready[0])
        ordered.append(nxt)
        placed.add(nxt.name)
    return ordered


# ---- suggestion ------------------------------------------------------------------------------

def suggest(trial: Any, space: Space, fixed: Mapping[str, Any],
            split_context: SplitContext | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ask ``trial`` (an Optuna trial, or anything with its three suggest methods) for one config.

    ``fixed`` is the flat base config, for ``when:`` names that are not params. Raises ValueError naming
    the param when the space cannot produce a value here (an unknown ``when:`` name, no feasible split).
    """
    params: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for p in space.params:
        if not _active(p, overrides, fixed):
            if p.type == "layer_split":
                overrides[f"{p.name}.kind"] = "balanced"
            elif p.default is not _UNSET:
                overrides[p.name] = p.default
            continue
        if p.type != "layer_split":
            params[p.name] = _ask(trial, p.name, p.distribution())
        else:
            if split_context is None:
                raise ValueError(f"{p.name}: layer_split needs the model's layer and stage counts")
            n_layers, n_stages = split_context({**fixed, **overrides})
            pairs = feasible_splits(p, n_layers, n_stages)
            first = _ask(trial, f"{p.name}.first", _progression(p, sorted({f for f, _ in pairs})))
            # An enqueued (fixed) first may lie outside the feasible set; its lasts then fall back to the range.
            lasts = sorted(last for f, last in pairs if f == first) or [p.last[0]]
            last = _ask(trial, f"{p.name}.last", _progression(p, lasts))
            params.update({f"{p.name}.first": first, f"{p.name}.last": last})
            overrides[f"{p.name}.kind"] = "first_last"
            continue
        overrides[p.name] = params[p.name]
    overrides.update(params)
    return params, overrides


def _active(p: Param, overrides: Mapping[str, Any], fixed: Mapping[str, Any]) -> bool:
    for key, allowed in p.when:
        if key in overrides:
            value = overrides[key]
        elif key in fixed:
            value = fixed[key]
        else:
            raise ValueError(f"{p.name}: when: names {key}, which is neither a space param nor in the base config")
        if value not in allowed:
            return False
    return True


def feasible_splits(p: Param, n_layers: int, n_stages: int) -> list[tuple[int, int]]:
    """(first, last) stage layer counts within the ranges whose middle stages split evenly (Megatron's rule)."""
    if n_stages < 2:
        raise ValueError(f"{p.name}: a layer split needs >= 2 pipeline stages; condition it with when: "
                         f"{{parallel.pp: [...]}} so it is only suggested with a pipeline")
    pairs = []
    n_mid = n_stages - 2
    for first in range(p.first[0], p.first[1] + 1):
        for last in range(p.last[0], p.last[1] + 1):
            try:
                split_counts(n_layers, n_stages, first=first, last=last)  # the one split rule
            except ValueError:
                continue
            pairs.append((first, last))
    if not pairs:
        raise ValueError(
            f"{p.name}: no first in {list(p.first)} and last in {list(p.last)} leaves the other {n_mid} of "
            f"{n_stages} stages an even share of {n_layers} layers; widen {p.name}.first/last"
        )
    return pairs


def _ask(trial: Any, name: str, dist: optuna.distributions.BaseDistribution) -> Any:
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return trial.suggest_categorical(name, list(dist.choices))
    if isinstance(dist, optuna.distributions.IntDistribution):
        return trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
    return trial.suggest_float(name, dist.low, dist.high, step=dist.step, log=dist.log)


def _progression(p: Param, values: list[int]) -> optuna.distributions.IntDistribution:
    """An int range covering exactly ``values``: Optuna ranges cannot have gaps (nor categoricals change choices)."""
    step = values[1] - values[0] if len(values) > 1 else 1
    if any(b - a != step for a, b in zip(values, values[1:])):
        raise ValueError(f"{p.name}: feasible layer counts {values} are unevenly spaced; narrow {p.name}.first/last")
    return optuna.distributions.IntDistribution(values[0], values[-1], step=step)


# ---- enumeration, for validating a space before anything launches -----------------------------

class _ScriptedTrial:
    """Stands in for an Optuna trial: takes the option at each position of ``path`` (depth-first) or at random."""

    def __init__(self, path: list[int], rng: random.Random | None = None):
        self.path, self.rng, self.sizes, self._i = path, rng, [], 0

    def _pick(self, options: list) -> Any:
        self.sizes.append(len(options))
        if self._i == len(self.path):
            self.path.append(self.rng.randrange(len(options)) if self.rng else 0)
        choice = options[self.path[self._i]]
        self._i += 1
        return choice

    def suggest_categorical(self, name: str, choices: list) -> Any:
        return self._pick(choices)

    def suggest_int(self, name: str, low: int, high: int, step: int = 1, log: bool = False) -> int:
        values = list(range(low, high + 1, step))
        if len(values) > 16:  # the ends and the middle say enough about a wide range
            values = sorted({values[0], values[len(values) // 2], values[-1]})
        return self._pick(values)

    def suggest_float(self, name: str, low: float, high: float, step: float | None = None, log: bool = False) -> float:
        return self._pick([low, high] if high > low else [low])


def enumerate_space(space: Space, fixed: Mapping[str, Any], split_context: SplitContext | None = None,
                    limit: int = 2000, samples: int = 300, seed: int = 0
                    ) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """Every (params, overrides) the space can produce (numeric ranges by their ends), depth-first.

    Past ``limit`` combinations it stops and yields ``samples`` random ones instead.
    """
    path: list[int] = []
    for _ in range(limit):
        trial = _ScriptedTrial(path)
        yield suggest(trial, space, fixed, split_context)
        sizes = trial.sizes
        del path[len(sizes):]
        while path and path[-1] + 1 >= sizes[len(path) - 1]:
            path.pop()
        if not path:
            return
        path[-1] += 1
    rng = random.Random(seed)
    for _ in range(samples):
        yield suggest(_ScriptedTrial([], rng), space, fixed, split_context)


def params_for(space: Space, config: Mapping[str, Any], split_counts: list[int] | None = None) -> dict[str, Any]:
    """The params that describe an existing flat ``config`` (the baseline) in this space's terms.

    A split is described by its first and last stage sizes (``split_counts``: layers per stage). Raises
    ValueError when a categorical value is not among the choices: Optuna could not be told about it.
    """
    params: dict[str, Any] = {}
    for p in space.params:
        if not _active(p, params, config):
            continue
        if p.type == "layer_split":
            if not split_counts or len(split_counts) < 2:
                continue
            params[f"{p.name}.first"], params[f"{p.name}.last"] = split_counts[0], split_counts[-1]
            continue
        if p.name not in config:
            raise ValueError(f"space param {p.name} is not a field of the base config")
        value = config[p.name]
        if p.type == "categorical" and value not in p.choices:
            raise ValueError(f"the baseline has {p.name}={value!r}, which is not among the space's choices "
                             f"{list(p.choices)}: add it, so the baseline can be told to Optuna as trial 0")
        params[p.name] = value
    return params
