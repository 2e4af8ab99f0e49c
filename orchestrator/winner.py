"""The noise-aware winner: configs compared by the median of their runs, with [min, max] as the interval.

One rule, used by the replay (bench/replay.py, which re-measures as it says) and by the sweep summary
(which reports it): the winner is the config with the lowest median; while any of the ``TOP_K`` lowest
medians has an interval overlapping the leader's, each of those configs and the leader with fewer than
``MIN_RUNS`` runs needs one more run. A config's interval is [min, max] of its runs; with one run, the run
widened by the typical spread ((max - min) / median) of the configs with several, or ``DEFAULT_SPREAD``.
"""

from __future__ import annotations

import json
import statistics
from typing import Any, Mapping, Sequence

from orchestrator.record import Kind, Status, TrialRecord

TOP_K = 3
MIN_RUNS = 3
DEFAULT_SPREAD = 0.15
"""Relative spread assumed before any config has two runs (a 2-rank CPU trial re-measured: 41.6 -> 47.5 ms)."""


def to_remeasure(runs: Mapping[str, Sequence[float]], top_k: int = TOP_K, min_runs: int = MIN_RUNS) -> list[str]:
    """Keys (best median first) that need one more run before a winner can be declared; [] when none."""
    top = sorted(runs, key=lambda k: statistics.median(runs[k]))[:top_k]
    if not top:
        return []
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in runs.values() if len(v) > 1]
    spread = statistics.median(spreads) if spreads else DEFAULT_SPREAD

    def interval(k: str) -> tuple[float, float]:
        v = runs[k]
        return (min(v), max(v)) if len(v) > 1 else (v[0] * (1 - spread / 2), v[0] * (1 + spread / 2))

    lead = top[0]
    overlap = [k for k in top[1:] if interval(k)[0] <= interval(lead)[1]]
    return [k for k in ([lead] + overlap if overlap else []) if len(runs[k]) < min_runs]


def leader(runs: Mapping[str, Sequence[float]]) -> str:
    return min(runs, key=lambda k: statistics.median(runs[k]))


def ledger_runs(records: Sequence[TrialRecord]) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Step times per config (params as sorted JSON) from ok trial, baseline and confirm records, and the
    first trial number of each config. The canonical reference run shares the baseline's trial number but not
    its config, and a reused measurement is not a run: neither counts."""
    runs: dict[str, list[float]] = {}
    first: dict[str, int] = {}
    params_of = {r.trial: r.params for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)}
    for r in records:
        t = r.metrics.step_time_s
        if r.kind is Kind.CANONICAL or r.status is not Status.OK or not t or r.duplicate_of is not None:
            continue
        key = json.dumps(params_of.get(r.trial, r.params), sort_keys=True)
        runs.setdefault(key, []).append(t)
        first.setdefault(key, r.trial)
    return runs, first


def summary(records: Sequence[TrialRecord]) -> dict[str, Any] | None:
    """The noise-aware winner of a ledger as measured: its trial, median and interval, and the trials the
    rule would run again before declaring it (the sweep does not run them; the replay does)."""
    runs, first = ledger_runs(records)
    if not runs:
        return None
    lead = leader(runs)
    return {"trial": first[lead], "median_s": statistics.median(runs[lead]), "runs": len(runs[lead]),
            "interval_s": [min(runs[lead]), max(runs[lead])],
            "remeasure_trials": [first[k] for k in to_remeasure(runs)]}


def summary_text(w: Mapping[str, Any]) -> str:
    line = (f"noise-aware winner: trial {w['trial']}, median {w['median_s'] * 1e3:.1f} ms of {w['runs']} run(s) "
            f"[{w['interval_s'][0] * 1e3:.1f}, {w['interval_s'][1] * 1e3:.1f}]")
    if w["remeasure_trials"]:
        line += (f"; not settled: trials {', '.join(map(str, w['remeasure_trials']))} overlap it and need more runs "
                 f"({MIN_RUNS} each) to tell them apart")
    return line
