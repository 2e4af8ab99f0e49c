"""A declared framework: the team's own training script, described in the sweep file (``command.framework: custom``).

The ``command.custom`` section says how each knob becomes the script's arguments and environment (a template per
knob, or a map from each value to its arguments) and how the script's figures are read (``log``: a regular
expression per metric, from rank 0's stdout or a file the script writes into its trial folder). Everything is
checked when the sweep file is loaded: a knob that is not a steptune knob, a placeholder nothing fills, a pattern
that is not a regular expression or lacks its named group, a unit nobody knows; a knob of the space that the
declaration does not cover is refused with the knob named (``refuse``), and a value a map does not list is refused
for the configs that would carry it (``render``, run on every config of the space at load).

Pure: the declaration's types, rendering a trial config as argv and environment, and (``custom_log``) reading its
text into a ``ParsedLog``. Nothing here starts a process.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterable, Mapping, Optional, Sequence, Union

NAME = "custom"
WHERE = "command.custom"
DERIVED = {
    "value": "the knob's value in this trial",
    "n_microbatches": "microbatches per data-parallel replica per update (gradient accumulation steps): "
                      "batch.global_batch / (batch.micro_batch_size x parallel.dp)",
    "world_size": "ranks of the trial (resources.world_size)",
    "tokens_per_microbatch": "batch.micro_batch_size x model.seq_len",
    "trial_dir": "the trial's own folder on each node (left for the runner to fill)",
}
"""Placeholders a template may use besides any trial config field (``{batch.global_batch}``, ``{model.seq_len}``)."""
TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}
MEMORY_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KiB": 2**10, "MiB": 2**20,
                "GiB": 2**30, "TiB": 2**40}
KEYWORDS = ("kind", "args", "env", "values")


def fmt_value(v: Any) -> str:
    """A knob value as a script's argument: ``true``/``false``, ``25`` for 25.0, the shortest exact text otherwise."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else repr(v)
    return str(v)


def _fields(template: str, where: str) -> list[str]:
    try:
        return [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise ValueError(f"{where}: {template!r} is not a template ({e}); write a literal brace as {{{{ or }}}}") \
            from None


def _check_template(template: Any, where: str, config_fields: Sequence[str]) -> None:
    if not isinstance(template, str):
        raise ValueError(f"{where}: expected a string, got {template!r}")
    for f in _fields(template, where):
        if f not in DERIVED and f not in config_fields:
            raise ValueError(f"{where}: {{{f}}} is not a placeholder; use {{value}}, a trial config field such as "
                             f"{{batch.global_batch}}, or one of {', '.join('{' + k + '}' for k in DERIVED)}")


def fill(template: str, context: Mapping[str, Any]) -> str:
    """``template`` with its placeholders filled from ``context`` (``{trial_dir}`` stays for the runner)."""
    out = []
    for literal, name, spec, conv in string.Formatter().parse(template):
        out.append(literal)
        if name is None:
            continue
        if name == "trial_dir":
            out.append("{trial_dir}")
            continue
        v = context[name]
        out.append(format(v, spec) if spec else fmt_value(v))
    return "".join(out)


# ---- knobs -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KnobTemplate:
    """A knob whose value is written into its arguments: ``batch.micro_batch_size: ["--micro-batch-size",
    "{value}"]`` (the list alone is this form)."""

    kind: ClassVar[str] = "template"
    args: tuple[str, ...] = ()
    """Arguments appended to the command for this knob; ``{value}`` is its value, and any trial config field
    (``{batch.global_batch}``) or ``{n_microbatches}``, ``{world_size}``, ``{tokens_per_microbatch}``,
    ``{trial_dir}`` may appear."""
    env: dict = field(default_factory=dict)
    """Environment variables for every rank, NAME: template (the same placeholders)."""


@dataclass(frozen=True)
class KnobValues:
    """A knob whose each value has its own arguments: ``recompute.kind: {none: [], full: ["--ckpt", "all"]}`` (a
    mapping without ``kind``/``args``/``env``/``values`` keys is this form). A value it does not list is refused at
    load for every config of the space that would carry it."""

    kind: ClassVar[str] = "values"
    values: dict = field(default_factory=dict)
    """Each value (as the space writes it: ``none``, ``2``, ``true``) -> its arguments (a list; ``[]`` for none);
    the same placeholders as a template."""
    env: dict = field(default_factory=dict)
    """Each value -> environment variables for it ({NAME: template}); a value not listed sets none."""


KnobRule = Union[KnobTemplate, KnobValues]


def _rule(knob: str, spec: Any) -> KnobRule:
    """A knob's entry of ``command.custom.knobs`` in either its short or its explicit form."""
    from trainer.mapping import build

    where = f"{WHERE}.knobs.{knob}"
    if isinstance(spec, (list, tuple)):
        spec = {"kind": "template", "args": list(spec)}
    elif isinstance(spec, dict) and not (set(spec) & set(KEYWORDS)):
        spec = {"kind": "values", "values": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"{where}: expected a list of arguments (a template), a mapping of value -> arguments, or "
                         f"{{kind: template|values, ...}}; got {spec!r}")
    kind = spec.get("kind", "values" if "values" in spec else "template")
    cls = {KnobTemplate.kind: KnobTemplate, KnobValues.kind: KnobValues}.get(kind)
    if cls is None:
        raise ValueError(f"{where}.kind: {kind!r} must be template or values")
    return build(cls, {k: v for k, v in spec.items() if k != "kind"}, where)


def _check_rule(knob: str, rule: KnobRule, config_fields: Sequence[str]) -> None:
    where = f"{WHERE}.knobs.{knob}"
    if isinstance(rule, KnobTemplate):
        for i, a in enumerate(rule.args):
            _check_template(a, f"{where}.args[{i}]", config_fields)
        envs = {"": rule.env}
    else:
        if not rule.values:
            raise ValueError(f"{where}.values: list at least one value and its arguments")
        for value, args in rule.values.items():
            if not isinstance(args, (list, tuple)):
                raise ValueError(f"{where}.values.{fmt_value(value)}: expected a list of arguments ([] for none), "
                                 f"got {args!r}")
            for i, a in enumerate(args):
                _check_template(a, f"{where}.values.{fmt_value(value)}[{i}]", config_fields)
        if not isinstance(rule.env, dict):
            raise ValueError(f"{where}.env: expected a mapping of value -> {{NAME: value}}")
        unknown = sorted(fmt_value(v) for v in rule.env if fmt_value(v) not in {fmt_value(k) for k in rule.values})
        if unknown:
            raise ValueError(f"{where}.env.{unknown[0]}: not one of the values listed under values")
        envs = {fmt_value(k): v for k, v in rule.env.items()}
    for value, env in envs.items():
        at = f"{where}.env" + (f".{value}" if value else "")
        if not isinstance(env, dict):
            raise ValueError(f"{at}: expected a mapping of NAME: value")
        for name, v in env.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(name)):
                raise ValueError(f"{at}.{name}: not an environment variable name")
            _check_template(str(v), f"{at}.{name}", config_fields)


# ---- the log ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StdoutSource:
    """Rank 0's standard output: the first node's stdout, where torchrun starts rank 0 (print from rank 0 only, as
    most scripts do; lines of the same iteration printed again by other ranks are read once)."""

    kind: ClassVar[str] = "stdout"


@dataclass(frozen=True)
class FileSource:
    """A file the script writes into its trial folder on the first node (put ``{trial_dir}/<path>`` in its
    arguments), read once the run has ended."""

    kind: ClassVar[str] = "file"
    path: str = ""
    """The file's name inside the trial folder (e.g. ``train.log``): a relative path without ``..``."""

    def __post_init__(self) -> None:
        p = self.path
        if not p or p.startswith("/") or ".." in p.split("/") or "{" in p:
            raise ValueError(f"{WHERE}.log.source.path={p!r}: the file's name inside the trial folder, e.g. "
                             f"train.log (the script writes {{trial_dir}}/train.log)")


@dataclass(frozen=True)
class LogFormat:
    """How the script's figures are read: one regular expression per figure (Python ``re`` syntax), each with a
    named group. A figure belongs to the latest iteration line at or before the line it is found on; what is not
    declared is not read, never guessed."""

    source: Union[StdoutSource, FileSource] = field(default_factory=StdoutSource)
    """Where the lines come from: ``stdout`` (rank 0's) or ``{kind: file, path: train.log}``."""
    iteration: str = ""
    """Required: the pattern of an iteration line, with ``(?P<step>\\d+)`` (the iteration number, counted from 1)
    and optionally ``(?P<total>\\d+)`` (the iterations asked for: a log that stops before is truncated)."""
    step_time: Optional[str] = None
    """Time per iteration: ``(?P<value>...)`` and either ``(?P<unit>...)`` or ``step_time_unit``."""
    step_time_unit: Optional[str] = None
    """The unit of step_time when the line does not print one: s, ms, us, ns or min."""
    loss: Optional[str] = None
    """The training loss at that iteration: ``(?P<value>...)``. The loss-curve parity gate compares it."""
    grad_norm: Optional[str] = None
    """The gradient norm: ``(?P<value>...)``; compared by the parity gate too where printed."""
    memory: Optional[str] = None
    """Peak memory per rank, wherever printed (the peak over the log is kept): ``(?P<value>...)`` and either
    ``(?P<unit>...)`` or ``memory_unit``."""
    memory_unit: Optional[str] = None
    """The unit of memory when the line does not print one: B, KB, MB, GB, KiB, MiB or GiB."""
    tokens_per_s: Optional[str] = None
    """Throughput: ``(?P<value>...)`` in tokens per second (thousands separators allowed)."""
    tokens_per_s_per_rank: bool = False
    """tokens_per_s is per rank as printed; false: the whole job's, divided by the world size."""

    def __post_init__(self) -> None:
        at = f"{WHERE}.log"
        if not self.iteration:
            raise ValueError(f"{at}.iteration: required, a pattern with (?P<step>\\d+), e.g. 'step (?P<step>\\d+)'")
        _pattern(self.iteration, f"{at}.iteration", ("step",), ("total",))
        for name, unit_field, units in (("step_time", "step_time_unit", TIME_UNITS),
                                        ("memory", "memory_unit", MEMORY_UNITS)):
            pat, unit = getattr(self, name), getattr(self, unit_field)
            if unit is not None and unit not in units:
                raise ValueError(f"{at}.{unit_field}={unit!r}: one of {', '.join(units)}")
            if pat is None:
                if unit is not None:
                    raise ValueError(f"{at}.{unit_field}: set without {at}.{name}")
                continue
            rx = _pattern(pat, f"{at}.{name}", ("value",), ("unit",))
            if "unit" not in rx.groupindex and unit is None:
                raise ValueError(f"{at}.{name}: the pattern has no (?P<unit>...) group: add one, or set {at}."
                                 f"{unit_field} ({', '.join(units)})")
        for name in ("loss", "grad_norm", "tokens_per_s"):
            if getattr(self, name) is not None:
                _pattern(getattr(self, name), f"{at}.{name}", ("value",))
        if not isinstance(self.tokens_per_s_per_rank, bool):
            raise ValueError(f"{at}.tokens_per_s_per_rank: true or false")

    def compiled(self) -> dict[str, re.Pattern]:
        return {name: re.compile(getattr(self, name)) for name in
                ("iteration", "step_time", "loss", "grad_norm", "memory", "tokens_per_s") if getattr(self, name)}


def _pattern(text: Any, where: str, required: Sequence[str], optional: Sequence[str] = ()) -> re.Pattern:
    if not isinstance(text, str) or not text:
        raise ValueError(f"{where}: expected a regular expression (a string), got {text!r}")
    try:
        rx = re.compile(text)
    except re.error as e:
        raise ValueError(f"{where}: {text!r} is not a regular expression: {e}") from None
    missing = [g for g in required if g not in rx.groupindex]
    if missing:
        raise ValueError(f"{where}: {text!r} has no named group (?P<{missing[0]}>...); put it around the number, "
                         f"e.g. (?P<{missing[0]}>[0-9.eE+-]+)")
    extra = sorted(set(rx.groupindex) - set(required) - set(optional))
    if extra:
        raise ValueError(f"{where}: named group (?P<{extra[0]}>...) is not read here; the groups read are "
                         f"{', '.join(list(required) + list(optional))} (use (?:...) for other groups)")
    return rx


# ---- the declaration ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CustomFramework:
    """``command.framework: custom``: your own training script, declared: how each knob becomes its arguments and
    environment, and how its figures are read. docs/frameworks.md#your-own-trainer."""

    name: str = "custom"
    """What the progress lines, the ledger and parse-log call the script (letters, digits, '_', '-', '.')."""
    knobs: dict = field(default_factory=dict)
    """Knob (a steptune knob, e.g. batch.micro_batch_size) -> its arguments: a list (a template with ``{value}``),
    a mapping of each value to a list, or ``{kind: template, args, env}`` / ``{kind: values, values, env}``. A knob
    of the space that is not here is refused at load."""
    log: Optional[LogFormat] = None
    """Required: how the figures are read (at least ``log.iteration``)."""

    def __post_init__(self) -> None:
        from trainer.config import TrainConfig
        from trainer.mapping import field_names

        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", str(self.name)):
            raise ValueError(f"{WHERE}.name={self.name!r}: letters, digits, '_', '-', '.'")
        if self.log is None:
            raise ValueError(f"{WHERE}.log: required: at least log.iteration, the pattern of an iteration line")
        if not isinstance(self.knobs, dict):
            raise ValueError(f"{WHERE}.knobs: expected a mapping of knob -> arguments")
        known = field_names(TrainConfig)
        rules = {}
        for knob, spec in self.knobs.items():
            if knob not in known:
                import difflib

                close = difflib.get_close_matches(str(knob), known, n=1)
                raise ValueError(f"{WHERE}.knobs.{knob}: not a steptune knob" + (f" (did you mean {close[0]}?)"
                                                                                  if close else "")
                                 + "; knobs are trainer config fields, e.g. batch.micro_batch_size, recompute.kind")
            rules[knob] = _rule(knob, spec)
            _check_rule(knob, rules[knob], known)
        object.__setattr__(self, "rules", rules)  # the knobs' entries as typed rules (not a field of the file)

    def refuse(self, keys: Iterable[str]) -> None:
        """ValueError naming each knob of the space the declaration does not cover."""
        bad = sorted(set(keys) - set(self.rules))
        if bad:
            raise ValueError(f"space.params.{bad[0]}: framework custom ({self.name}) cannot express "
                             f"{', '.join(bad)}: declare its arguments under {WHERE}.knobs.{bad[0]} (knobs declared: "
                             f"{', '.join(self.rules) or 'none'})")

    def render(self, cfg: Any, keys: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """The arguments and environment of the space's knobs ``keys`` for trial config ``cfg``, in the declaration's
        order; ValueError for a value a map does not list (naming the knob, the value and the values it knows)."""
        from trainer.config import flatten

        flat = flatten(cfg.to_dict())
        context = {**flat, "n_microbatches": cfg.n_microbatches, "world_size": cfg.world_size,
                   "tokens_per_microbatch": cfg.batch.micro_batch_size * cfg.model.seq_len}
        args: list[str] = []
        env: dict[str, str] = {}
        for knob, rule in self.rules.items():
            if knob not in keys:
                continue
            value = flat.get(knob)
            ctx = {**context, "value": value}
            if isinstance(rule, KnobTemplate):
                args += [fill(a, ctx) for a in rule.args]
                env.update({k: fill(str(v), ctx) for k, v in rule.env.items()})
                continue
            by_text = {fmt_value(k): v for k, v in rule.values.items()}
            if fmt_value(value) not in by_text:
                raise ValueError(f"{knob}={fmt_value(value)}: framework custom ({self.name}) cannot express this "
                                 f"value ({WHERE}.knobs.{knob} lists {', '.join(by_text)})")
            args += [fill(a, ctx) for a in by_text[fmt_value(value)]]
            env.update({k: fill(str(v), ctx) for k, v in
                        {fmt_value(k): v for k, v in rule.env.items()}.get(fmt_value(value), {}).items()})
        return args, env
