"""``TrialRecord``: one ledger line as a typed, versioned record, with its one writer and its one loader.

``TrialRecord.to_line()`` is the only thing that turns a record into a ledger line and
``TrialRecord.from_line()`` the only thing that turns a line back; every reader (report, export, tracking,
calibration, resume) works on records, never on the line's string keys.

What a line stores, and why (schema 1):

- ``config`` once: the record's config is the one the trial was asked to run. The result's own copy is
  left out when it is the same, and only its changed values are kept when it is not (a pruned trial's
  result is its probe's, whose ``run.steps`` is shorter).
- ``metrics`` once, and ``result.summary`` keeps only what metrics do not carry (FLOPs per step, the
  peak bases, ...). Metrics are the stored side because every line has them, a result only a measured
  run: a prediction, a skipped duplicate (which repeats an earlier trial's metrics) and a failed run
  have metrics and no result. They are also what every reader and ``jq`` looks at first, and they keep
  the line readable should ``result`` (the bulk of a line) ever move to a file of its own. The summary is
  rebuilt from both on load, so ``record.result.summary`` is complete.

Lines written before the schema existed (no ``schema`` key: version 0) load too: their second config and
their summary-copied metrics are simply redundant. Keys a line carries that this version does not know
(another helper's, a newer writer's) are kept in ``extra`` and written back, never dropped.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping

from orchestrator.records.jsonl import JsonLines
from orchestrator.parity.verdict import Tolerance, describe_failure
from trainer.mapping import flatten
from trainer.result import Result, Summary

SCHEMA_VERSION = 1
"""The version ``to_line`` writes. 0: lines from before the schema (config twice, metrics = summary copy)."""


class Kind(enum.StrEnum):
    """What a line measured. A str, so ``record.kind == "trial"`` holds and JSON writes the plain name."""

    BASELINE = "baseline"
    TRIAL = "trial"
    CONFIRM = "confirm"
    CANONICAL = "canonical"
    """The reference run of the baseline's maths in the simplest layout (orchestrator.parity.trust); no candidate."""
    REPEAT = "repeat"
    """A re-measurement the noise-aware winner rule asked for (orchestrator.records.winner): the trial's config again,
    after the search; it adds a run to the config's median and is no candidate of its own."""


class Status(enum.StrEnum):
    """How a trial ended, after judgement (parity and the memory budget can turn ``ok`` into ``infeasible``)."""

    OK = "ok"
    FAILED = "failed"
    OOM = "oom"
    TIMEOUT = "timeout"
    NAN = "nan"
    INFEASIBLE = "infeasible"
    PRUNED = "pruned"
    SKIPPED = "skipped"


def _enum(cls: type[enum.Enum], value: Any, where: str) -> Any:
    try:
        return cls(value)
    except ValueError:
        raise ValueError(f"{where}={value!r}: must be one of {[m.value for m in cls]}") from None


def _split(cls: type, d: Mapping[str, Any] | None, where: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the keys ``cls`` has a field for, the rest): unknown keys go to ``extra`` instead of being dropped."""
    if d is None:
        return {}, {}
    if not isinstance(d, Mapping):
        raise ValueError(f"{where}: expected a mapping, got {type(d).__name__}")
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return {k: v for k, v in d.items() if k in names}, {k: v for k, v in d.items() if k not in names}


def _dict(obj: Any, drop_none: bool = False) -> dict[str, Any]:
    """A part's dict form: its fields, then its extra keys (the order a v0 line had them in, roughly)."""
    out = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name != "extra"}
    if drop_none:
        out = {k: v for k, v in out.items() if v is not None}
    return {**out, **obj.extra}


@dataclass
class Metrics:
    """The numbers the sweep judges and ranks by: measured (from ``result.summary``) or predicted (the planner).

    Every field is optional: a failed run has none, a prediction has no spread or step count.
    """

    step_time_s: float | None = None
    """Median seconds per update over the measured updates (slowest rank); predicted for the model backend."""
    step_time_min_s: float | None = None
    """Fastest measured update (what pruning compares)."""
    step_time_max_s: float | None = None
    """Slowest measured update."""
    n_measured_steps: int | None = None
    """Updates after warm-up that the median is over."""
    tokens_per_s: float | None = None
    """Global-batch tokens per second at ``step_time_s``."""
    mfu: float | None = None
    """Model FLOPs utilisation; its peak basis is ``result.summary.peak_basis``. None where no peak is known."""
    hfu: float | None = None
    """Hardware FLOPs utilisation (recompute counted), same basis as ``mfu``."""
    peak_memory_bytes: int | float | None = None
    """Largest over ranks; what it counts is ``result.summary.peak_memory_basis``."""
    speedup_vs_baseline: float | None = None
    """Baseline step time / this step time; set by the sweep, absent on lines with no step time."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Metric names this version does not know; kept and written back."""

    def __post_init__(self) -> None:
        for name in ("step_time_s", "step_time_min_s", "step_time_max_s"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"Metrics.{name}={v!r}: must be >= 0 seconds (or None when not measured)")

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> "Metrics":
        known, extra = _split(cls, d, "metrics")
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """Without the Nones: a v0 line had only the keys its source gave (a prediction has 5, a failure 0)."""
        return _dict(self, drop_none=True)

    @classmethod
    def of_summary(cls, s: Summary) -> "Metrics":
        """A measured run's metrics: the fields of its result's summary that carry these names."""
        return cls(**{f.name: getattr(s, f.name) for f in dataclasses.fields(cls) if hasattr(s, f.name)})

    @classmethod
    def of_prediction(cls, prediction: Mapping[str, Any]) -> "Metrics":
        """A planner prediction's metrics (the planner predicts no spread and counts no steps)."""
        keys = ("step_time_s", "tokens_per_s", "mfu", "hfu", "peak_memory_bytes")
        return cls(**{k: prediction.get(k) for k in keys})


@dataclass
class ParityVerdict:
    """A trial's losses, gradient norms and final parameters against the baseline's (orchestrator.parity.verdict)."""

    passed: bool
    """Every step and the final parameters within tolerance, and the same maths settings."""
    first_fail_step: int | None = None
    """The first step that differed beyond tolerance; None when passed."""
    first_fail_metric: str | None = None
    """What differed there: loss, grad_norm, parameters, replicas, steps, maths settings."""
    first_fail_diff: float | None = None
    """The failing metric's difference at that step (absent on lines older than it)."""
    first_fail_tolerance: float | None = None
    """That metric's own tolerance (absent on lines older than it)."""
    max_loss_rel_diff: float | None = None
    """Largest per-step loss difference, relative to the baseline's."""
    max_grad_norm_rel_diff: float | None = None
    """Largest per-step gradient-norm difference, relative."""
    max_fingerprint_rel_diff: float | None = None
    """Largest final-parameter difference (per tensor), relative."""
    replica_max_abs_diff: float | None = None
    """Largest element difference between this trial's own data-parallel replicas."""
    tolerance: Tolerance | None = None
    """The tolerance the verdict was given under."""
    steps: int | None = None
    """Updates compared: all of the run's, or a pruned trial's probe's (the same global steps, so the same data,
    as the reference's first ones; its final parameters are then not compared). None on older lines."""
    shared_with_canonical: list[str] | None = None
    """Baseline and canonical lines: the layout families the canonical run could not set canonical (its
    microbatch, when the whole batch does not fit the device) that the baseline has active too. A bug there is
    in both runs and no verdict can see it. None or empty: nothing shared."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Verdict keys this version does not know; kept and written back."""

    def __post_init__(self) -> None:
        if not isinstance(self.passed, bool):
            raise ValueError(f"parity.passed={self.passed!r}: must be true or false")
        if isinstance(self.tolerance, Mapping):
            self.tolerance = Tolerance(**self.tolerance)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ParityVerdict":
        known, extra = _split(cls, d, "parity")
        if "passed" not in known:
            raise ValueError("parity: a verdict without 'passed'; the line was not written by the sweep")
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        d = _dict(self)
        d["tolerance"] = dataclasses.asdict(self.tolerance) if self.tolerance is not None else None
        return d

    def describe_failure(self) -> str:
        """One line: the metric that failed, at which step, by how much against which tolerance."""
        return describe_failure(self.to_dict())


@dataclass
class Probe:
    """The short run a trial made before its full measurement, to be pruned early if clearly slower."""

    steps: int
    """Updates the probe ran (warm-up included)."""
    step_time_s: float
    """The probe's median seconds per measured update."""
    wall_s: float
    """What the probe cost, end to end (measured)."""
    skipped_steps: int = 0
    """Updates a pruned trial did not run (0 when the trial went on to its full measurement)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Probe keys this version does not know; kept and written back."""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Probe":
        known, extra = _split(cls, d, "probe")
        return cls(**known, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        return _dict(self)


@dataclass
class TrialRecord:
    """One finished trial, baseline or confirm run: what was asked, what happened, what was measured."""

    sweep: str
    """The sweep's name (results/<sweep>/trials.jsonl)."""
    trial: int
    """The Optuna trial number; a confirm run carries the number of the trial it repeats."""
    kind: Kind
    """baseline (the reference every trial is measured against), trial, confirm (a repeat of a config that met the
    target), repeat (a re-measurement for the noise-aware winner) or canonical (the baseline's reference run)."""
    backend: str
    """Who produced the numbers: ``ray`` (measured) or ``model`` (the planner's prediction)."""
    params: dict[str, Any]
    """The sampled values, by dotted knob name."""
    config: dict[str, Any]
    """The full config the trial was asked to run (trainer config, or the planner's plan); {} when none was built."""
    status: Status
    """How the trial ended, after judgement."""
    reason: str | None
    """Why the status is not ``ok`` (or what a skip reused); None for ok."""
    metrics: Metrics
    """The numbers judged and ranked by; stored in the line (``result.summary`` is rebuilt from them)."""
    meets_target: bool
    """Status ok and step time at or under the target."""
    wall_s: float
    """Seconds of every run the trial made (probe included), as the driver saw them."""
    overhead_s: float | None
    """Wall minus the time inside updates (ray backend); None for predictions."""
    started_at: datetime
    """When the driver started the trial (UTC; written as ISO text to the millisecond)."""
    finished_at: datetime
    """When its record was made, after judgement."""
    result: Result | None = None
    """The measured run (trainer.result.Result): None for predictions, skips and runs that produced nothing."""
    prediction: dict[str, Any] | None = None
    """The planner's prediction (orchestrator.planner), for the model backend and the memory pre-filter."""
    parity: ParityVerdict | None = None
    """None where nothing was compared (no result, or no reference yet)."""
    probe: Probe | None = None
    """The trial's probe run, when it made one."""
    repeat: int | None = None
    """Confirm and repeat runs: which one of the trial's (1-based)."""
    duplicate_of: int | None = None
    """A repeated proposal that was not run again: the trial whose measurement it reuses."""
    artifacts: list[str] = field(default_factory=list)
    """Files the trial's ranks wrote (profiler traces), logged to the MLflow child run."""
    placement: list[dict[str, Any]] | None = None
    """Where each rank ran, in rank order: host, ip, Ray node id, GPU ids, pid (ray backend; None otherwise)."""
    planner: dict[str, Any] | None = None
    """A guided sweep's planner view of this trial (orchestrator.plan.guided.planner_fields): its prediction with
    the efficiency refitted to the trials before it, the error against the measurement, whether it picked it
    (or why the planner cannot model it). None for other samplers."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level keys this version does not know (another writer's, e.g. a placement); kept and written back."""

    def __post_init__(self) -> None:
        self.kind = _enum(Kind, self.kind, "TrialRecord.kind")
        self.status = _enum(Status, self.status, "TrialRecord.status")
        if isinstance(self.trial, bool) or not isinstance(self.trial, int) or self.trial < 0:
            raise ValueError(f"TrialRecord.trial={self.trial!r}: must be an Optuna trial number (int >= 0)")
        if not isinstance(self.meets_target, bool):
            raise ValueError(f"TrialRecord.meets_target={self.meets_target!r}: must be true or false")
        if self.meets_target and self.status is not Status.OK:
            raise ValueError(f"TrialRecord.meets_target=True with status={self.status.value!r}: only an ok "
                             f"trial can meet the target")
        if self.kind in (Kind.CONFIRM, Kind.REPEAT) and self.repeat is None:
            raise ValueError(f"TrialRecord.repeat: a {self.kind.value} record needs its repeat number (1-based)")
        for name in ("started_at", "finished_at"):
            v = getattr(self, name)
            if isinstance(v, (int, float)):
                setattr(self, name, datetime.fromtimestamp(v, timezone.utc))
            elif isinstance(v, str):
                setattr(self, name, datetime.fromisoformat(v))
            elif not isinstance(v, datetime):
                raise ValueError(f"TrialRecord.{name}={v!r}: must be a datetime, epoch seconds or ISO text")

    @property
    def measured(self) -> bool:
        """A real run produced these numbers (not a prediction, not a reused earlier measurement)."""
        return self.result is not None

    @property
    def predicted(self) -> bool:
        """The numbers are the planner's prediction (model backend), not a measurement."""
        return self.result is None and self.prediction is not None and self.status is not Status.SKIPPED

    # ---- the writer ---------------------------------------------------------------------------

    def to_line(self) -> dict[str, Any]:
        """The ledger line (JSON-able), schema ``SCHEMA_VERSION``; ``from_line`` reads it back equal."""
        line: dict[str, Any] = {
            "schema": SCHEMA_VERSION, "sweep": self.sweep, "trial": self.trial, "kind": self.kind.value,
            "backend": self.backend, "params": self.params, "config": self.config, "status": self.status.value,
            "reason": self.reason, "metrics": self.metrics.to_dict(), "meets_target": self.meets_target,
            "wall_s": self.wall_s, "overhead_s": self.overhead_s, "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "parity": self.parity.to_dict() if self.parity is not None else None,
            "prediction": self.prediction,
        }
        optional = {"probe": self.probe.to_dict() if self.probe else None, "repeat": self.repeat,
                    "duplicate_of": self.duplicate_of, "artifacts": self.artifacts or None,
                    "placement": self.placement, "planner": self.planner}
        line.update({k: v for k, v in optional.items() if v is not None})
        clash = set(self.extra) & (set(line) | {"result"})
        if clash:
            raise ValueError(f"TrialRecord.extra: {sorted(clash)} are record fields; set them, not extra")
        line.update(self.extra)
        # Last, so the small fields stay at the head of the line where `head`/`less` show them.
        line["result"] = _pack_result(self.result.to_dict(), self.config, self.metrics) if self.result else None
        return line

    # ---- the loader ---------------------------------------------------------------------------

    @classmethod
    def from_line(cls, d: Mapping[str, Any]) -> "TrialRecord":
        """A record from a ledger line of any known schema (0: no ``schema`` key)."""
        d = dict(d)
        version = d.pop("schema", 0)
        if version not in (0, 1):
            raise ValueError(f"schema={version!r}: this steptune reads ledger schemas 0 and {SCHEMA_VERSION}; "
                             f"the line was written by a newer one, upgrade to read it")
        missing = [k for k in LINE_KEYS if k not in d]
        if missing:
            raise ValueError(f"missing keys {missing}: every ledger line has them; was this one edited by hand?")
        known, extra = _split(cls, d, "ledger line")
        raw_result = known.pop("result", None)
        metrics = Metrics.from_dict(known.pop("metrics"))
        result = None
        if raw_result is not None:
            # Version 0 stored the whole result (its own config and summary); unpacking that is a no-op.
            result = Result.from_dict(_unpack_result(raw_result, known["config"], metrics))
        parity = known.pop("parity", None)
        probe = known.pop("probe", None)
        artifacts = list(known.pop("artifacts", None) or [])  # popped first: **known is unpacked before it
        return cls(**known, metrics=metrics, result=result,
                   parity=ParityVerdict.from_dict(parity) if parity is not None else None,
                   probe=Probe.from_dict(probe) if probe is not None else None, artifacts=artifacts, extra=extra)


LINE_KEYS = ("sweep", "trial", "kind", "backend", "params", "config", "status", "reason", "metrics",
             "meets_target", "wall_s", "overhead_s", "started_at", "finished_at")
"""Every ledger line has these keys, in every schema."""


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds")


def _pack_result(result: dict[str, Any], config: dict[str, Any], metrics: Metrics) -> dict[str, Any]:
    """The result without what the line already holds: the record's config, the metrics' numbers.

    Only values equal to the record's are left out, so packing loses nothing by construction; anything
    that differs stays (a probe's shorter ``run.steps`` as ``config_changes``).
    """
    out = dict(result)
    rc = out.pop("config")
    if rc != config:
        changes = _changes(config, rc)
        if changes is not None:
            out["config_changes"] = changes
        else:  # a different shape, not just other values: keep it whole
            out["config"] = rc
    m = metrics.to_dict()
    out["summary"] = {k: v for k, v in out["summary"].items() if k not in m or m[k] != v or type(m[k]) is not type(v)}
    return out


def _unpack_result(packed: dict[str, Any], config: dict[str, Any], metrics: Metrics) -> dict[str, Any]:
    out = dict(packed)
    if "config" not in out:
        rc = copy.deepcopy(config)
        for key, value in (out.pop("config_changes", None) or {}).items():
            _set(rc, key, value)
        out["config"] = rc
    m = metrics.to_dict()
    names = {f.name for f in dataclasses.fields(Summary)}
    out["summary"] = {**{k: m[k] for k in names if k in m}, **out["summary"]}
    return out


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


# ---- a ledger file as records -----------------------------------------------------------------

def load_records(lines: Iterable[Mapping[str, Any]]) -> list[TrialRecord]:
    """Records from ledger lines (``Ledger.lines()``); a line that does not load names its trial and why."""
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(TrialRecord.from_line(line))
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"ledger line {n} (trial {line.get('trial', '?')}): {e}") from None
    return out


def read_records(path: Path) -> list[TrialRecord]:
    """The records of ``results/<sweep>/trials.jsonl`` (a torn last line skipped); ``Ledger(path).read()``."""
    return load_records(JsonLines(Path(path)).lines())


def line_bytes(line: Mapping[str, Any]) -> int:
    """Bytes the line takes in the ledger (the way ``Ledger.append`` writes it)."""
    return len((json.dumps(line) + "\n").encode())
