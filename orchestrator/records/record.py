"""``TrialRecord``: one ledger line as a typed, versioned record, with its one writer and its one loader.

``TrialRecord.to_line()`` is the only thing that turns a record into a ledger line and
``TrialRecord.from_line()`` the only thing that turns a line back; every reader (report, export, tracking,
calibration, resume) works on records, never on the line's string keys.

What a line stores, and why (schema 2):

- ``config`` once: the record's config is the one the trial was asked to run. The result's own copy is
  left out when it is the same, and only its changed values are kept when it is not (a pruned trial's
  result is its probe's, whose ``run.steps`` is shorter).
- ``metrics`` once, and ``result.summary`` keeps only what metrics do not carry (FLOPs per step, the
  peak bases, ...). Metrics are the stored side because every line has them, a result only a measured
  run: a prediction, a skipped duplicate (which repeats an earlier trial's metrics) and a failed run
  have metrics and no result. They are also what every reader and ``jq`` looks at first, and they keep
  the line readable now that the bulk of ``result`` lives in a file of its own. The summary is rebuilt from
  both on load, so ``record.result.summary`` is complete.
- ``result`` without its detail: each rank's steps, spans, memory and fingerprint (and, for runs that are no
  parity reference, the per-step series and the parameter fingerprint) are read only by pictures, and were
  90-95 % of a line. They live in the detail file the line names (``detail``, orchestrator.records.detail),
  written before the line; ``read_records`` joins them back, so ``record.result`` is whole. A detail file that
  is gone or does not read leaves the result without them and says why in ``record.detail_error``: every
  figure a reader ranks, judges or reports by is in the line.

Lines written before the schema existed (no ``schema`` key: version 0) load too: their second config and
their summary-copied metrics are simply redundant. Version 1 lines (the whole result in the line) load as
they are. Keys a line carries that this version does not know
(another helper's, a newer writer's) are kept in ``extra`` and written back, never dropped.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from orchestrator.records import result_line
from orchestrator.records.detail import DetailMissing, detail_keys
from orchestrator.parity.verdict import Tolerance, describe_failure
from trainer.measure.result import Result, Summary

SCHEMA_VERSION = 2
"""The version ``to_line`` writes. 0: lines from before the schema (config twice, metrics = summary copy);
1: config and metrics once, the whole result in the line; 2: a line may name its detail file."""


class Kind(enum.StrEnum):
    """What a line measured. A str, so ``record.kind == "trial"`` holds and JSON writes the plain name."""

    BASELINE = "baseline"
    TRIAL = "trial"
    CONFIRM = "confirm"
    CANONICAL = "canonical"
    """The reference run of the baseline's maths in the simplest layout (orchestrator.parity.trust); no candidate."""
    REPEAT = "repeat"
    """A re-measurement in a settling round (orchestrator.records.answer): the trial's config (or the baseline's)
    again, paired with the baseline's run of the same round; it adds a run to the config and is no candidate of
    its own."""


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
    names = {f.name for f in dataclasses.fields(cls)} - {"extra", "detail_error"}
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
    """The measured run (trainer.measure.result.Result): None for predictions, skips and runs that produced nothing."""
    prediction: dict[str, Any] | None = None
    """The planner's prediction (orchestrator.planner), for the model backend and the memory pre-filter."""
    parity: ParityVerdict | None = None
    """None where nothing was compared (no result, or no reference yet)."""
    probe: Probe | None = None
    """The trial's probe run, when it made one."""
    repeat: int | None = None
    """Confirm and repeat runs: which one of the trial's (1-based)."""
    round: int | None = None
    """Settling round (1-based) of a repeat run: the baseline and every contender run once per round, so each run
    is paired with the baseline's run of the same round (orchestrator.records.answer). None outside rounds."""
    load_1m: float | None = None
    """The machine's 1-minute load average as the run finished (os.getloadavg; None where not sampled): the
    noise the summary reports beside the figures."""
    duplicate_of: int | None = None
    """A repeated proposal that was not run again: the trial whose measurement it reuses."""
    artifacts: list[str] = field(default_factory=list)
    """Files the trial's ranks wrote (profiler traces), logged to the MLflow child run."""
    placement: list[dict[str, Any]] | None = None
    """Where each rank ran, in rank order: host, ip, Ray node id, GPU ids, pid (ray backend; None otherwise)."""
    planner: dict[str, Any] | None = None
    """A guided sweep's planner view of this trial (orchestrator.calibration.guided.planner_fields): its prediction with
    the efficiency refitted to the trials before it, the error against the measurement, whether it picked it
    (or why the planner cannot model it). None for other samplers."""
    detail: str | None = None
    """The detail file holding what of ``result`` only pictures read, relative to the ledger's folder
    (``detail/<trial>-<kind>[-<repeat>].json.gz``); set by ``Ledger.append`` before the line is written."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Top-level keys this version does not know (another writer's, e.g. a placement); kept and written back."""
    detail_error: str | None = field(default=None, compare=False, repr=False)
    """Why ``result`` lacks its detail (the file is gone or does not read); None when whole. Not in the line:
    the timeline picture is skipped with this as its note."""

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
                    "duplicate_of": self.duplicate_of, "round": self.round,
                    "load_1m": self.load_1m, "artifacts": self.artifacts or None,
                    "placement": self.placement, "planner": self.planner, "detail": self.detail}
        line.update({k: v for k, v in optional.items() if v is not None})
        clash = set(self.extra) & (set(line) | {"result"})
        if clash:
            raise ValueError(f"TrialRecord.extra: {sorted(clash)} are record fields; set them, not extra")
        line.update(self.extra)
        # Last, so the small fields stay at the head of the line where `head`/`less` show them.
        line["result"] = result_line.pack(self.result.to_dict(), self.config, self.metrics.to_dict(),
                                          self._apart()) if self.result else None
        return line

    def detail_payload(self) -> dict[str, Any]:
        """What the detail file holds: the result's keys the line leaves out, and whose line it is."""
        if self.result is None:
            raise ValueError("TrialRecord.detail_payload: a record without a measured result has no detail")
        return {"schema": SCHEMA_VERSION, "sweep": self.sweep, "trial": self.trial, "kind": self.kind.value,
                "repeat": self.repeat,
                "result": result_line.detail_of(self.result.to_dict(), detail_keys(self.kind))}

    def join_detail(self, payload: Mapping[str, Any]) -> None:
        """Put the detail file's keys back into ``result``; ``DetailMissing`` when it is another line's."""
        own = {"sweep": self.sweep, "trial": self.trial, "kind": self.kind.value, "repeat": self.repeat}
        theirs = {k: payload.get(k) for k in own}
        if theirs != own:
            raise DetailMissing(f"{self.detail} belongs to {theirs}, not to this line ({own})")
        try:
            whole = result_line.join(self.result.to_dict(), payload.get("result") or {}, self._apart())
            self.result = Result.from_dict(whole)
        except (ValueError, TypeError, KeyError) as e:
            raise DetailMissing(f"{self.detail} does not hold this result's detail ({type(e).__name__}: {e})") from None
        self.detail_error = None

    def _apart(self) -> tuple[str, ...]:
        return detail_keys(self.kind) if self.detail is not None else ()

    # ---- the loader ---------------------------------------------------------------------------

    @classmethod
    def from_line(cls, d: Mapping[str, Any]) -> "TrialRecord":
        """A record from a ledger line of any known schema (0: no ``schema`` key)."""
        d = dict(d)
        version = d.pop("schema", 0)
        if version not in (0, 1, 2):
            raise ValueError(f"schema={version!r}: this steptune reads ledger schemas 0 to {SCHEMA_VERSION}; "
                             f"the line was written by a newer one, upgrade to read it")
        missing = [k for k in LINE_KEYS if k not in d]
        if missing:
            raise ValueError(f"missing keys {missing}: every ledger line has them; was this one edited by hand?")
        known, extra = _split(cls, d, "ledger line")
        raw_result = known.pop("result", None)
        metrics = Metrics.from_dict(known.pop("metrics"))
        apart = detail_keys(known["kind"]) if known.get("detail") is not None else ()
        result = None
        if raw_result is not None:
            # Version 0 stored the whole result (its own config and summary); unpacking that is a no-op.
            result = Result.from_dict(result_line.unpack(raw_result, known["config"], metrics.to_dict(), apart))
        parity = known.pop("parity", None)
        probe = known.pop("probe", None)
        artifacts = list(known.pop("artifacts", None) or [])  # popped first: **known is unpacked before it
        record = cls(**known, metrics=metrics, result=result,
                     parity=ParityVerdict.from_dict(parity) if parity is not None else None,
                     probe=Probe.from_dict(probe) if probe is not None else None, artifacts=artifacts, extra=extra)
        if result is not None and apart:
            record.detail_error = f"{record.detail} was not read (the line was loaded without its ledger's folder)"
        return record


LINE_KEYS = ("sweep", "trial", "kind", "backend", "params", "config", "status", "reason", "metrics",
             "meets_target", "wall_s", "overhead_s", "started_at", "finished_at")
"""Every ledger line has these keys, in every schema."""


def _iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).isoformat(timespec="milliseconds")


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


def line_bytes(line: Mapping[str, Any]) -> int:
    """Bytes the line takes in the ledger (the way ``Ledger.append`` writes it)."""
    return len((json.dumps(line) + "\n").encode())
