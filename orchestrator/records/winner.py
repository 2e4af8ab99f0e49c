"""The noise-aware winner: configs compared by the median of their runs, with [min, max] as the interval.

One rule, used by the sweep (which runs the re-measurements it asks for once its search is over), the
sweep summary, ``export`` and the replay (bench/replay.py): the winner is the config with the lowest median;
while any of the ``top_k`` lowest medians has an interval overlapping the leader's, each of those configs
and the leader with fewer than ``min_runs`` runs needs one more run, up to ``max_repeats`` extra runs in all.
A config's interval is [min, max] of its runs; with one run, the run widened by the typical spread
((max - min) / median) of the configs with several, or by ``single_run_spread`` until three have several.
"""

from __future__ import annotations

import json
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


def to_remeasure(runs: Mapping[str, Sequence[float]], rule: WinnerRule = RULE) -> list[str]:
    """Keys (best median first) that need one more run before a winner can be declared; [] when none."""
    top = sorted(runs, key=lambda k: statistics.median(runs[k]))[:rule.top_k]
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
    return min(runs, key=lambda k: statistics.median(runs[k]))


def key_of(params: Mapping[str, Any]) -> str:
    return json.dumps(dict(params), sort_keys=True)


def ledger_runs(records: Sequence[TrialRecord]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Step times per config (``key_of`` its params) from ok trial, baseline, confirm and repeat records, and
    the first trial number of each config. The canonical reference run shares the baseline's trial number but
    not its config, and a reused measurement is not a run: neither counts."""
    runs: dict[str, list[float]] = {}
    first: dict[str, int] = {}
    params_of = {r.trial: r.params for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)}
    for r in records:
        t = r.metrics.step_time_s
        if r.kind is Kind.CANONICAL or r.status is not Status.OK or not t or r.duplicate_of is not None:
            continue
        key = key_of(params_of.get(r.trial, r.params))
        runs.setdefault(key, []).append(t)
        first.setdefault(key, r.trial)
    return runs, first


def summary(records: Sequence[TrialRecord], rule: WinnerRule = RULE) -> dict[str, Any] | None:
    """The noise-aware winner of a ledger as measured: its trial, median and interval, the re-measurements the
    sweep ran, and the trials the rule would still run again (the ``max_repeats`` budget was spent, or the sweep
    stopped for its wall time)."""
    runs, first = ledger_runs(records)
    if not runs:
        return None
    lead = leader(runs)
    return {"trial": first[lead], "median_s": statistics.median(runs[lead]), "runs": len(runs[lead]),
            "interval_s": [min(runs[lead]), max(runs[lead])],
            "repeats_run": sum(r.kind is Kind.REPEAT for r in records),
            "remeasure_trials": [first[k] for k in to_remeasure(runs, rule)], "min_runs": rule.min_runs}


def summary_text(w: Mapping[str, Any]) -> str:
    line = (f"noise-aware winner: trial {w['trial']}, median {w['median_s'] * 1e3:.1f} ms of {w['runs']} run(s) "
            f"[{w['interval_s'][0] * 1e3:.1f}, {w['interval_s'][1] * 1e3:.1f}]")
    if w.get("repeats_run"):
        line += f"; settled with {w['repeats_run']} re-measurement(s)"
    if w["remeasure_trials"]:
        line += (f"; not settled: trials {', '.join(map(str, w['remeasure_trials']))} overlap it and need more runs "
                 f"({w.get('min_runs', RULE.min_runs)} each) to tell them apart (winner.max_repeats)")
    return line
