"""The settling rule as it stood before racing (orchestrator/records/answer.py at 340a605), frozen for the replay.

``bench/replay.py --rule before`` settles each replayed sweep with this rule (every round the baseline and every
contender, contenders from ``_settling``; ties and intervals by the bootstrap of paired ratios) so that its rounds
and the calibration of its claims can be measured beside today's rule (docs/search.md, "The answer in the replay").
Nothing in orchestrator/ imports it. Below: the module as it was, unchanged but for this docstring.
"""
from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator.records.record import Kind, Status, TrialRecord

MET, NOT_MET, UNDECIDED, NO_TARGET = "met", "not met", "undecided", "no target"

TIE_BREAK = ("of the tied configs within winner.threshold of the lowest figure: the fewest params changed from the "
             "baseline, then the lowest peak memory, then the lowest figure, then the trial number")
"""How a tie set's winner is picked; the summary states it."""


@dataclass(frozen=True)
class SettleRule:
    """How the sweep settles its answer after the search (``winner:`` in a sweep file)."""

    top_k: int = 3
    """Configs (the lowest figures, baseline aside) that enter the settling rounds; later rounds keep only those
    that cannot yet be told apart from the leader, and the leader while the target verdict is undecided."""
    min_rounds: int = 3
    """Paired runs the leader and every config still tied with it get before the tie set and the target verdict
    are trusted (with 3, a bootstrap interval of a median spans the middle of its three ratios); a contender
    that its runs already tell apart from the leader leaves the rounds earlier."""
    max_rounds: int = 4
    """Most settling rounds after the search (and in a target check during it); 0: no settling, the answer is
    the search's own runs and the summary says it is unsettled."""
    threshold: float = 0.01
    """Practical threshold: configs whose step times are within this fraction (0.01 = 1%) are a tie."""
    confidence: float = 0.9
    """Confidence level of the bootstrap intervals (0.9: the 5th to 95th percentile of the resampled medians)."""
    resamples: int = 2000
    """Bootstrap resamples per interval."""
    single_run_spread: float = 0.15
    """Relative spread ((max - min) / median) assumed for a config measured once, until three configs have
    several runs (then their median spread is used). 0.15: a 2-rank CPU trial re-measured went 41.6 -> 47.5 ms."""

    def __post_init__(self) -> None:
        for name, low in (("top_k", 1), ("min_rounds", 1), ("max_rounds", 0), ("resamples", 100)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise ValueError(f"winner.{name}={v!r}: a whole number >= {low}")
        for name, low, high in (("threshold", 0.0, 0.5), ("confidence", 0.5, 0.999),
                                ("single_run_spread", 0.0, 2.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not low < v < high:
                raise ValueError(f"winner.{name}={v!r}: a number in ({low}, {high})")


RULE = SettleRule()

MEASURED_SPREAD_CONFIGS = 3
"""Configs with several runs needed before their median spread replaces ``single_run_spread``."""
MIN_COMMON_ROUNDS = 2
"""Rounds two configs need in common before their paired ratio (not their intervals) decides whether they differ."""


def key_of(params: Mapping[str, Any]) -> str:
    """What groups a config's runs: its params as sorted JSON."""
    return json.dumps(dict(params), sort_keys=True)


def counts(r: TrialRecord) -> bool:
    """Whether a record is a run a config is ranked by: an ok baseline, trial, confirm or repeat line whose step
    time is a number. A canonical reference run shares the baseline's trial number but not its config, a reused
    measurement (``duplicate_of``) is not a run, and a measured run without a parity verdict was never checked
    against the baseline (``export`` refuses it), so it cannot be the answer either."""
    t = r.metrics.step_time_s
    checked = r.parity.passed if r.parity is not None else (r.kind is Kind.BASELINE or not r.measured)
    return (r.kind is not Kind.CANONICAL and r.status is Status.OK and r.duplicate_of is None and checked
            and isinstance(t, (int, float)) and math.isfinite(t) and t > 0)


def ci_ratio(values: Sequence[float], confidence: float, resamples: int) -> tuple[float, float]:
    """Percentile bootstrap interval of the geometric mean of positive ratios (or times), as Criterion.rs
    bootstraps its estimates; fixed seed on sorted input, so the order of the values does not matter. The
    geometric mean, not the median: with the 3-4 rounds a sweep affords, a bootstrap of the median spans the
    whole [min, max] and would call nearly everything a tie."""
    v = np.log(np.sort(np.asarray(values, dtype=float)))
    if len(v) == 1:
        return float(np.exp(v[0])), float(np.exp(v[0]))
    rng = np.random.default_rng(0)
    means = v[rng.integers(0, len(v), size=(resamples, len(v)))].mean(axis=1)
    a = (1 - confidence) / 2
    return float(np.exp(np.quantile(means, a))), float(np.exp(np.quantile(means, 1 - a)))


@dataclass(frozen=True, eq=False)
class ConfigFigure:
    """One config as the answer sees it: its runs, their paired figures, and where it stands."""

    record: TrialRecord
    """The config's first ok baseline or trial line: the trial number, params and config that name it."""
    key: str
    runs: tuple[float, ...]
    """Every run's step time (s), ledger order."""
    by_round: Mapping[int, float]
    """Settling round -> this config's step time in it."""
    paired: tuple[float, ...]
    """Per round it ran in: its step time over the baseline's in that round (the baseline's own: 1.0)."""
    ratio: float
    """What it is ranked by: median of ``paired``; without any, median of runs / the baseline's median (or,
    with no baseline, the median of runs)."""
    interval: tuple[float, float]
    """Interval of ``ratio`` (same units): bootstrap of the paired figures, else min/max of the runs, else one run
    widened by the assumed spread; a prediction's is the point."""
    peak_memory_bytes: float | None
    changed: int
    """Params that differ from the baseline's (the tie-break's first key)."""
    is_baseline: bool

    @property
    def trial(self) -> int:
        return self.record.trial

    @property
    def params(self) -> dict[str, Any]:
        return self.record.params

    @property
    def step_time_s(self) -> float:
        """The absolute figure: the median of its runs."""
        return statistics.median(self.runs)

    @property
    def predicted(self) -> bool:
        return self.record.predicted

    def describe(self) -> str:
        """``median of 4 runs 40.7 ms``, ``single run 45.3 ms``, ``predicted ~9.18 s``."""
        t = self.step_time_s
        value = f"{t * 1e3:.1f} ms" if t < 1 else f"{t:.3f} s"
        if self.predicted:
            return f"predicted ~{value}"
        return f"median of {len(self.runs)} runs {value}" if len(self.runs) > 1 else f"single run {value}"


@dataclass(frozen=True)
class TargetVerdict:
    state: str
    """met, not met, undecided, or no target."""
    target_s: float | None
    """The target in seconds (a relative one: times the baseline's median)."""
    interval_s: tuple[float, float] | None
    """The winner's interval in seconds (paired interval times the baseline's median for a relative target)."""
    more_rounds: int | None
    """Undecided: about how many more rounds would decide it (the interval shrinking as 1/sqrt(n)); None when
    no number of rounds can (the figure sits on the target) or when decided."""
    paired: bool
    """Judged on the paired figure (relative target, settled winner) rather than absolute times."""


@dataclass(frozen=True)
class Noise:
    """What the sweep's measurements say about the machine's noise."""

    baseline_runs: int
    baseline_spread: float | None
    """(max - min) / median of the baseline's runs; None with one run."""
    remeasured_spread: float | None
    """Median over re-measured configs (baseline aside) of (max - min) / median of their runs."""
    paired_spread: float | None
    """Median over settled configs of (max - min) / median of their paired figures: the noise left after pairing."""
    load_median: float | None
    """Median 1-minute load average sampled as each run finished (None: not sampled, older ledgers)."""
    load_max: float | None


@dataclass(frozen=True)
class Answer:
    """The decision. ``ranked`` starts with the winner (then by figure); ``ties`` holds the winner and every
    config it cannot be told apart from."""

    ranked: tuple[ConfigFigure, ...]
    winner: ConfigFigure | None
    leader: ConfigFigure | None
    """The lowest figure (the winner unless the tie-break picked another member of the tie set)."""
    ties: tuple[ConfigFigure, ...]
    baseline: ConfigFigure | None
    baseline_s: float | None
    """Median of the baseline's runs."""
    target: TargetVerdict
    noise: Noise
    rounds: int
    """Settling rounds in the ledger."""
    contenders: tuple[str, ...]
    """Keys (baseline aside) the next round would run beside the baseline; () when settled (or a round of the
    baseline alone)."""
    settled: bool
    """Nothing left for another round to decide."""
    why_unsettled: str | None
    rule: SettleRule = field(repr=False, default=RULE)

    @property
    def tie(self) -> bool:
        return len(self.ties) > 1

    def figure_of(self, key: str) -> ConfigFigure | None:
        return next((c for c in self.ranked if c.key == key), None)

    def meets(self, params: Mapping[str, Any]) -> bool:
        """A config's own point figure at or under the target (what each MLflow child's tag says)."""
        c = self.figure_of(key_of(params))
        return c is not None and self.target.target_s is not None and self._seconds(c) <= self.target.target_s

    def _seconds(self, c: ConfigFigure) -> float:
        return c.ratio * self.baseline_s if self.target.paired and self.baseline_s else c.step_time_s

    def seconds_of(self, c: ConfigFigure) -> float:
        """A config's figure in seconds as the verdict judges it (the paired ratio times the baseline's median
        for a relative target once settled; else its median run)."""
        return self._seconds(c)


def decide(records: Sequence[TrialRecord], target: Any, rule: SettleRule = RULE) -> Answer:
    """The answer of a ledger. ``target``: an ``orchestrator.search.target.Target`` (anything with
    ``kind``, ``seconds(baseline_s)`` and ``relative_to_baseline``)."""
    params_of = {r.trial: r.params for r in records if r.kind in (Kind.BASELINE, Kind.TRIAL)}
    base_rec = next((r for r in reversed(records) if r.kind is Kind.BASELINE and r.status is Status.OK), None)
    base_key = key_of(base_rec.params) if base_rec is not None else None
    runs: dict[str, list[float]] = {}
    rounds: dict[str, dict[int, float]] = {}
    named: dict[str, TrialRecord] = {}
    memory: dict[str, float] = {}
    for r in records:
        if not counts(r):
            continue
        key = key_of(params_of.get(r.trial, r.params))
        t = float(r.metrics.step_time_s)
        runs.setdefault(key, []).append(t)
        if r.round is not None:
            rounds.setdefault(key, {}).setdefault(r.round, t)
        if r.metrics.peak_memory_bytes is not None:
            memory[key] = max(memory.get(key, 0.0), float(r.metrics.peak_memory_bytes))
        if r.kind in (Kind.BASELINE, Kind.TRIAL) and (key not in named or r.trial < named[key].trial):
            named[key] = r
    keys = [k for k in runs if k in named]
    base_runs = runs.get(base_key, []) if base_key else []
    baseline_s = statistics.median(base_runs) if base_runs else None
    base_rounds = rounds.get(base_key, {}) if base_key else {}
    spread = _assumed_spread(runs, rule)
    base_params = base_rec.params if base_rec is not None else {}

    figures = []
    for k in keys:
        rec = named[k]
        mine = rounds.get(k, {})
        paired = tuple(mine[n] / base_rounds[n] for n in sorted(mine) if n in base_rounds)
        if k == base_key:
            paired = tuple(1.0 for _ in paired)
        scale = baseline_s or 1.0
        if k == base_key and baseline_s:
            ratio, interval = 1.0, _runs_interval([t / baseline_s for t in runs[k]], spread, rec.predicted)
        elif paired:
            ratio = statistics.median(paired)
            interval = ci_ratio(paired, rule.confidence, rule.resamples) if len(paired) > 1 else \
                _runs_interval(paired, spread, rec.predicted)
        else:
            ratio = statistics.median(runs[k]) / scale
            interval = _runs_interval([t / scale for t in runs[k]], spread, rec.predicted)
        changed = sum(1 for p in set(rec.params) | set(base_params) if rec.params.get(p) != base_params.get(p))
        figures.append(ConfigFigure(rec, k, tuple(runs[k]), dict(mine), paired, ratio, interval,
                                    memory.get(k), changed, k == base_key))
    by_figure = sorted(figures, key=lambda c: (c.ratio, c.trial))
    n_rounds = len(base_rounds)
    noise = _noise(records, figures, base_runs)
    if not by_figure:
        verdict = TargetVerdict(NO_TARGET if target.kind == "none" else UNDECIDED, target.seconds(baseline_s),
                                None, None, False)
        return Answer((), None, None, (), None, baseline_s, verdict, noise, n_rounds, (), True,
                      "no config ran ok and passed parity", rule)
    leader = by_figure[0]
    ties = [leader] + [c for c in by_figure[1:] if not _differs(c, leader, rule)]
    # A wide interval (few rounds, a noisy machine) can tie a config whose figure is far worse: the tie-break
    # only chooses among those practically equal to the leader by their figure.
    band = [c for c in ties if c.ratio <= leader.ratio * (1 + rule.threshold)]
    win = min(band, key=lambda c: (c.changed, c.peak_memory_bytes if c.peak_memory_bytes is not None else math.inf,
                                   c.ratio, c.trial))
    ranked = (win, *[c for c in by_figure if c is not win])
    ties_t = (win, *[c for c in ties if c is not win])
    verdict = _verdict(win, target, baseline_s, rule)
    contenders, settled, why = _settling(by_figure, ties_t, win, verdict, rule)
    baseline = next((c for c in figures if c.is_baseline), None)
    return Answer(ranked, win, leader, ties_t, baseline, baseline_s, verdict, noise, n_rounds, contenders, settled,
                  why, rule)


def _assumed_spread(runs: Mapping[str, Sequence[float]], rule: SettleRule) -> float:
    spreads = [(max(v) - min(v)) / statistics.median(v) for v in runs.values() if len(v) > 1]
    # One or two configs' runs say little about the spread: the declared one holds until a few have several.
    return statistics.median(spreads) if len(spreads) >= MEASURED_SPREAD_CONFIGS else rule.single_run_spread


def _runs_interval(values: Sequence[float], spread: float, predicted: bool) -> tuple[float, float]:
    if predicted:
        return values[0], values[0]
    if len(values) > 1:
        return min(values), max(values)
    return values[0] * (1 - spread / 2), values[0] * (1 + spread / 2)


def _differs(c: ConfigFigure, leader: ConfigFigure, rule: SettleRule) -> bool:
    """Whether ``c`` is told apart from (slower than) the leader by more than the practical threshold."""
    if c.predicted and leader.predicted:
        return c.ratio > leader.ratio  # a prediction repeats exactly: only an equal one ties
    common = sorted(set(c.by_round) & set(leader.by_round))
    if len(common) >= MIN_COMMON_ROUNDS:
        lo, _ = ci_ratio([c.by_round[n] / leader.by_round[n] for n in common], rule.confidence, rule.resamples)
        return lo > 1 + rule.threshold
    return c.interval[0] > leader.interval[1] * (1 + rule.threshold)


def _verdict(win: ConfigFigure, target: Any, baseline_s: float | None, rule: SettleRule) -> TargetVerdict:
    target_s = target.seconds(baseline_s)
    if target.kind == "none" or target_s is None:
        return TargetVerdict(NO_TARGET if target.kind == "none" else UNDECIDED, target_s, None, None, False)
    paired = target.kind == "relative" and bool(win.paired) and baseline_s is not None
    if paired:
        lo, hi = (x * baseline_s for x in win.interval)
        point, n = win.ratio * baseline_s, len(win.paired)
    elif win.predicted:
        lo = hi = point = win.step_time_s
        n = 1
    else:
        vals = list(win.runs)
        lo, hi = ci_ratio(vals, rule.confidence, rule.resamples) if len(vals) > 1 else \
            _runs_interval(vals, rule.single_run_spread, False)
        point, n = statistics.median(vals), len(vals)
    if hi <= target_s:
        return TargetVerdict(MET, target_s, (lo, hi), None, paired)
    if lo > target_s:
        return TargetVerdict(NOT_MET, target_s, (lo, hi), None, paired)
    gap, half = abs(point - target_s), (hi - lo) / 2
    more = None if gap <= 0 or win.predicted else max(1, math.ceil(n * (half / gap) ** 2) - n)
    return TargetVerdict(UNDECIDED, target_s, (lo, hi), more, paired)


def _settling(by_figure: Sequence[ConfigFigure], ties: Sequence[ConfigFigure], win: ConfigFigure,
              verdict: TargetVerdict, rule: SettleRule) -> tuple[tuple[str, ...], bool, str | None]:
    """(the keys, baseline aside, that the next round runs beside the baseline; settled; why not settled).

    Until every candidate (the tie set's first ``top_k`` and the leader) has ``min_rounds`` paired runs, they all
    run in each round, so every pair of them shares rounds; after that only a tie set (to separate it) and an
    undecided winner (to decide the target) go on. A round may hold the baseline alone: when it is the winner
    and its own verdict is undecided."""
    if win.predicted:
        return (), True, None
    undecided = verdict.state == UNDECIDED
    # A config that entered the rounds stays until it has min_rounds paired runs: one or two noisy rounds must not
    # drop the truly best config on the strength of an assumed spread.
    started = [c for c in by_figure if 0 < len(c.paired) < rule.min_rounds]
    cands = [c for c in [*ties[:rule.top_k], by_figure[0], *started] if not c.is_baseline]
    cands = [c for i, c in enumerate(cands) if c not in cands[:i]]
    short = [c for c in cands if len(c.paired) < rule.min_rounds]
    if short:
        todo = cands
    else:
        todo = [c for c in ties if not c.is_baseline] if len(ties) > 1 else []
        if undecided and not win.is_baseline and win not in todo:
            todo.append(win)
    alone = undecided and win.is_baseline and not todo
    if not todo and not alone:
        return (), True, None
    what = []
    if short:
        what.append(f"trials {', '.join(str(c.trial) for c in short)} have fewer than winner.min_rounds="
                    f"{rule.min_rounds} paired runs")
    if len(ties) > 1:
        what.append(f"trials {', '.join(str(c.trial) for c in ties)} cannot be told apart")
    if undecided:
        what.append("the target verdict is undecided")
    return tuple(c.key for c in todo), False, "; ".join(what) or None


def _noise(records: Sequence[TrialRecord], figures: Sequence[ConfigFigure], base_runs: Sequence[float]) -> Noise:
    def spread(v: Sequence[float]) -> float | None:
        return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else None

    again = [s for c in figures if not c.is_baseline and (s := spread(c.runs)) is not None]
    paired = [s for c in figures if not c.is_baseline and (s := spread(c.paired)) is not None]
    loads = [r.load_1m for r in records if r.load_1m is not None]
    return Noise(len(base_runs), spread(base_runs), statistics.median(again) if again else None,
                 statistics.median(paired) if paired else None,
                 statistics.median(loads) if loads else None, max(loads) if loads else None)
