"""The one answer: configs ranked by the median of their runs (one run: that run); the rule that settles it.

A config is ranked by one figure, the median of its runs (its single run until it is re-measured; a
prediction is one "run"): ``standings`` is that ranking and ``best`` its first, the answer. The table, the
summary, the target verdict, the sweep's target stop (``confirmed``), ``export`` and the MLflow parent all
read them, so they name the same config. The single fastest run is shown only as such.

The noise-aware part, used by the sweep (which runs the re-measurements it asks for once its search is over)
and the replay (bench/replay.py): while any of the ``top_k`` lowest figures has an interval overlapping the
leader's, each of those configs and the leader with fewer than ``min_runs`` runs needs one more run, up to
``max_repeats`` extra runs in all. A config's interval is [min, max] of its runs; with one run, the run
widened by the typical spread ((max - min) / median) of the configs with several, or by
``single_run_spread`` until three have several.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from orchestrator.records.record import Kind, Status, TrialRecord

@dataclass(frozen=True)
class WinnerRule:
    """How the sweep settles its winner among configs whose measurements overlap (``winner:`` in a sweep file)."""

    top_k: int = 3
    """The fastest configs (by median) whose intervals are compared with the leader's."""
    min_runs: int = 4
    """Runs each config of an overlapping top needs before the rule is satisfied with its median (4: the
    replay of the default space's landscape declared a winner truly within 2% in 98% of seeds; 3: 94%)."""
    max_repeats: int = 10
    """Most re-measurements a sweep runs after its search (a ``repeat`` line each); 0: none, and the summary
    names the trials left unsettled. The model backend never re-measures: a prediction repeats exactly."""
    single_run_spread: float = 0.15
    """Relative spread ((max - min) / median) assumed for a config measured once, until three configs have
    several runs (then their median spread is used). 0.15: a 2-rank CPU trial re-measured went 41.6 -> 47.5 ms; a quiet
    GPU cluster's runs differ by a few percent."""

    def __post_init__(self) -> None:
        for name, low in (("top_k", 1), ("min_runs", 1), ("max_repeats", 0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"winner.{name}={v!r}: a whole number >= {low}")
        if isinstance(self.single_run_spread, bool) or not isinstance(self.single_run_spread, (int, float)) \
                or not self.single_run_spread > 0:
            raise ValueError(f"winner.single_run_spread={self.single_run_spread!r}: a fraction > 0 (0.15 = 15%)")


RULE = WinnerRule()

MEASURED_SPREAD_CONFIGS = 3
"""Configs with several runs needed before their median spread replaces ``single_run_spread``."""


def figure(runs: Sequence[float]) -> float:
    """What a config is ranked by: the median of its runs; a config run once, that run."""
    return statistics.median(runs)


def to_remeasure(runs: Mapping[str, Sequence[float]], rule: WinnerRule = RULE) -> list[str]:
    """Keys (best median first) that need one more run before a winner can be declared; [] when none."""
    top = sorted(runs, key=lambda k: figure(runs[k]))[:rule.top_k]
    if not top:
        return []
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in runs.values() if len(v) > 1]
    # One or two configs' runs say little about the spread (a real default sweep's leader ran 45.3 and 45.4 ms,
    # which would have narrowed every single run to +-0.1% and settled a 1% race at once): the declared
    # spread holds until MEASURED_SPREAD_CONFIGS configs have several runs.
    spread = statistics.median(spreads) if len(spreads) >= MEASURED_SPREAD_CONFIGS else rule.single_run_spread

    def interval(k: str) -> tuple[float, float]:
        v = runs[k]
        return (min(v), max(v)) if len(v) > 1 else (v[0] * (1 - spread / 2), v[0] * (1 + spread / 2))

    lead = top[0]
    overlap = [k for k in top[1:] if interval(k)[0] <= interval(lead)[1]]
    return [k for k in ([lead] + overlap if overlap else []) if len(runs[k]) < rule.min_runs]


def next_to_run(runs: Mapping[str, Sequence[float]], rule: WinnerRule = RULE) -> str | None:
    """The one config to run again now: of those the rule asks for, the one with the fewest runs (best first)."""
    todo = to_remeasure(runs, rule)
    return min(todo, key=lambda k: len(runs[k])) if todo else None


def leader(runs: Mapping[str, Sequence[float]]) -> str:
    return min(runs, key=lambda k: figure(runs[k]))


def key_of(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True)


def counts(r: TrialRecord) -> bool:
    """Whether a record is a run the rule ranks its config by: an ok baseline, trial, confirm or repeat line
    whose step time is a number. A canonical reference run shares the baseline's trial number but not its
    config, and a reused measurement (``duplicate_of``) is not a run; a measured run without a parity verdict
    was never checked against the baseline (``export`` refuses it), so it cannot be the answer either."""
    t = r.metrics.step_time_s
    checked = r.parity.passed if r.parity is not None else (r.kind is Kind.BASELINE or not r.measured)
    return (r.kind is not Kind.CANONICAL and r.status is Status.OK and r.duplicate_of is None and checked
            and isinstance(t, (int, float)) and math.isfinite(t) and t > 0)


@dataclass(frozen=True)
class Standing:
    """One config as the rule ranks it: its runs (ledger order) and the figure they give."""

    record: TrialRecord
    """The config's first ok baseline or trial line: the trial number, params and config that name it."""
    runs: tuple[float, ...]
    key: str
    """``key_of`` its params: what groups a trial's confirm and repeat lines with it."""

    @property
    def trial(self) -> int:
        return self.record.trial

    @property
    def step_time_s(self) -> float:
        return figure(self.runs)

    @property
    def interval_s(self) -> tuple[float, float]:
        return min(self.runs), max(self.runs)

    @property
    def predicted(self) -> bool:
        return self.record.predicted

    def meets(self, target_s: float | None) -> bool:
        """At or under the target by the figure the config is ranked by."""
        return target_s is not None and self.step_time_s <= target_s

    def describe(self) -> str:
        """How the figure was reached: ``median of 4 runs 40.7 ms``, ``single run 45.3 ms``, ``predicted ~9.18 s``."""
        t = self.step_time_s
        value = f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.3f} s"
        if self.predicted:
            return f"predicted ~{value}"
        return f"median of {len(self.runs)} runs {value}" if len(self.runs) > 1 else f"single run {value}"


def standings(records: Sequence[TrialRecord]) -> list[Standing]:
    """Every config with a run that ``counts``, best first: by ``figure``, then by trial number. THE ranking:
    the table, the summary, the target verdict, the sweep's target stop, ``export`` and MLflow all read it."""
    runs: dict[str, list[float]] = {}
    named: dict[str, TrialRecord] = {}
    params_of = {r.trial: r.params for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)}
    for r in records:
        if not counts(r):
            continue
        key = key_of(params_of.get(r.trial, r.params))
        runs.setdefault(key, []).append(r.metrics.step_time_s)
        if r.kind in (Kind.BASELINE, Kind.TRIAL) and (key not in named or r.trial < named[key].trial):
            named[key] = r
    out = [Standing(named[k], tuple(v), k) for k, v in runs.items() if k in named]
    return sorted(out, key=lambda s: (s.step_time_s, s.trial))


def best(records: Sequence[TrialRecord]) -> Standing | None:
    """The answer: the config with the lowest figure (the noise-aware winner once re-measured)."""
    ranked = standings(records)
    return ranked[0] if ranked else None


def runs_by_key(ranked: Sequence[Standing]) -> dict[str, list[float]]:
    """The runs ``to_remeasure`` and ``next_to_run`` take, in the ranking's order (so ties resolve alike)."""
    return {s.key: list(s.runs) for s in ranked}


def confirmed(records: Sequence[TrialRecord], target_s: float | None, repeats: int) -> Standing | None:
    """The best config, when it meets the target by a measured figure that counts ``repeats`` re-measurements
    beyond its first run (``confirm.repeats``): what stops a sweep for its target. None for a prediction:
    it repeats exactly, so the model backend searches its whole budget instead."""
    top = best(records)
    if top is None or top.predicted or not top.meets(target_s) or len(top.runs) < 1 + repeats:
        return None
    return top


def summary(records: Sequence[TrialRecord], rule: WinnerRule = RULE) -> dict[str, Any] | None:
    """The answer of a ledger as a JSON-able dict (the sweep summary's ``best``): its trial, figure, runs and
    interval, the re-measurements the sweep ran, and the trials the rule would still run again (the
    ``max_repeats`` budget was spent, or the sweep stopped for its wall time)."""
    ranked = standings(records)
    if not ranked:
        return None
    top = ranked[0]
    unsettled = [] if top.predicted else to_remeasure(runs_by_key(ranked), rule)
    return {"trial": top.trial, "kind": top.record.kind.value, "params": top.record.params,
            "step_time_s": top.step_time_s, "runs": len(top.runs), "interval_s": list(top.interval_s),
            "predicted": top.predicted, "describe": top.describe(),
            "repeats_run": sum(r.kind is Kind.REPEAT for r in records),
            "remeasure_trials": [s.trial for s in ranked if s.key in unsettled],
            "min_runs": rule.min_runs}


def settling_text(w: Mapping[str, Any]) -> str | None:
    """Whether the rule is satisfied with the answer: the re-measurements run, and the trials still unsettled."""
    parts = [f"settled with {w['repeats_run']} re-measurement(s)"] if w.get("repeats_run") else []
    if w["remeasure_trials"]:
        parts.append(f"not settled: trials {', '.join(map(str, w['remeasure_trials']))} overlap it and need more "
                     f"runs ({w.get('min_runs', RULE.min_runs)} each) to tell them apart (winner.max_repeats)")
    return "; ".join(parts) or None
