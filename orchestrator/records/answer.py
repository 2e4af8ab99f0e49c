"""The answer: one pure function (``decide``) turns a ledger into the decision everything else renders.

The stop line, the summary, the table's rank 1 and ``*``, ``report``, ``export``'s default, MLflow's parent
tags and description, each child's ``meets_target`` tag and the pictures' winner all read one ``Answer``; none
of them decides anything of its own. What the next settling round runs is not decided here: that is the race
(orchestrator.sweep.race), which reads the answer.

How it decides (docs/search.md#one-answer):

- **Runs.** A config's runs are its ok, parity-checked lines (baseline or trial, and the re-runs the sweep made
  of it). Its absolute figure is the median of its runs.
- **Rounds and paired figures.** After the search the sweep settles the answer in rounds: each round runs some
  configs once each, in a random order, on the same workers, so the runs of one round share the machine's state.
  The rounds' runs are read through one additive model of log step times, log t = config effect + round level
  + noise (a two-way layout with rounds as blocks, fitted by least squares; configs need not all run in every
  round): drift between rounds (a neighbour starting, a GPU throttling) is the round level and cancels. A
  config's figure is its effect over the baseline's, exp(effect), its time over the baseline's in the same
  rounds (with every config in every round: the geometric mean of its per-round ratios). One never run in a
  round: its median over the baseline's median (unpaired, said so).
- **Intervals.** Student-t intervals from the model's pooled residual spread (``winner.confidence``): with the
  3-4 rounds a sweep affords, a bootstrap of a handful of ratios spans too little and claims too much. A
  config measured once (or before the model has a residual) is widened by the assumed spread.
- **The baseline** a relative target scales is the median of all its runs, not one run.
- **Tie set.** The leader (lowest figure) and every config it cannot be told apart from: for two configs with
  ``MIN_COMMON_ROUNDS`` rounds in common, the interval of their ratio in the model; they differ when its lower
  end is above ``1 + threshold``. Fewer common rounds: their intervals (min/max of their runs, or a single run
  widened by the assumed spread) overlap within the threshold. ``band``: every member's upper end over the
  lowest member's lower end, the most a tie member can be slower than the fastest of them.
- **Winner.** Of the tie set's configs whose figure is within ``threshold`` of the leader's (practically equal
  by the point estimate, not merely not told apart by a noisy interval), by the tie-break the summary states:
  the fewest params changed from the baseline, then the lowest peak memory, then the lowest figure, then the
  lowest trial number.
- **Target verdict.** ``met`` when the winner's whole interval is at or under the target, ``not met`` when all
  of it is above, else ``undecided`` with an estimate of the rounds that would decide it. A predicted winner's
  interval is the one its prediction carries (``predicted_interval``: the fit's uncertainty or the corpus
  band), so a model-backend answer is judged by the same rule; no number of rounds decides a prediction.

Deterministic: the model is a function of the set of runs, and the bootstrap (absolute targets) uses a fixed
seed on sorted values, so the answer does not depend on ledger order.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from orchestrator.records.record import Kind, Status, TrialRecord
from orchestrator.records.rounds import RoundModel, round_model
from orchestrator.records.selection import selected_low

MET, NOT_MET, UNDECIDED, NO_TARGET = "met", "not met", "undecided", "no target"

TIE_BREAK = ("of the tied configs within winner.threshold of the lowest figure: the fewest params changed from the "
             "baseline, then the lowest peak memory, then the lowest figure, then the trial number")
"""How a tie set's winner is picked; the summary states it."""


@dataclass(frozen=True)
class SettleRule:
    """How the sweep settles its answer after the search (``winner:`` in a sweep file)."""

    top_k: int = 3
    """Most rivals of the leader a settling round runs once every config of the tie set has its two paired runs:
    the nearest (by figure) that more rounds could still tell apart within the round budget (orchestrator.sweep.race);
    a config that joins the tie runs in every round until it has its two."""
    min_rounds: int = 3
    """Paired runs the leader (and a winner whose verdict is met) gets before the answer calls itself settled; every
    other config of the tie set gets two, then races on only while more rounds could still tell it apart."""
    max_rounds: int = 4
    """Most settling rounds after the search (and in a target check during it); fewer run when no round can
    change the decision any more. 0: no settling, the answer is the search's own runs and the summary says it is
    unsettled."""
    threshold: float = 0.01
    """Practical threshold: configs whose step times are within this fraction (0.01 = 1%) are a tie."""
    confidence: float = 0.9
    """Confidence level of the intervals (0.9: from the 5th to the 95th percentile; a config is told apart from
    the leader when the lower end of their ratio's interval is above 1 + threshold)."""
    resamples: int = 2000
    """Bootstrap resamples per interval of absolute runs (an absolute target's verdict)."""
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
SAME_FIGURE_DIGITS = 12
"""Figures that agree to this many significant digits rank as equal, the lower trial number first: a fitted figure's
last bits differ between machines (BLAS builds), and the ranking must not."""


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
    """Percentile bootstrap interval of the geometric mean of positive values, as Criterion.rs bootstraps its
    estimates; fixed seed on sorted input, so the order of the values does not matter. What an absolute target
    judges the winner's runs by (their rounds are not paired with anything)."""
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
    """Per round it ran in beside the baseline: its step time over the baseline's in that round (the baseline's
    own: 1.0)."""
    ratio: float
    """What it is ranked by: its time over the baseline's in the rounds' model (exp of its effect); without
    rounds, median of runs / the baseline's median (or, with no baseline, the median of runs)."""
    interval: tuple[float, float]
    """Interval of ``ratio`` (same units): the model's t interval, else min/max of the runs, else one run widened
    by the assumed spread; a prediction's is the point."""
    peak_memory_bytes: float | None
    changed: int
    """Params that differ from the baseline's (the tie-break's first key)."""
    is_baseline: bool
    rounds: int = 0
    """Settling rounds it ran in beside another config (its paired runs)."""
    unpaired: float = math.nan
    """The median of its runs over the baseline's median (its figure as if no round had run): what a config that
    never ran in a round is compared by."""

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
class Gap:
    """A config against the leader: its time over the leader's."""

    ratio: float
    interval: tuple[float, float]
    rounds: int
    """Settling rounds the two ran in together; below ``MIN_COMMON_ROUNDS`` the intervals of their own figures
    judge them (unpaired)."""
    apart: bool
    """Told apart: ``low`` is above 1 + threshold (it is out of the tie set)."""
    more_rounds: int | None
    """Still tied: about how many more common rounds would tell it apart if its ratio held (the reach below the
    ratio down to ``low`` shrinking as 1/sqrt(n), which errs high: the pick's share of it fades faster as rounds
    add up); None when none can (its ratio is within the threshold, or it never ran in a round
    beside the leader and has no paired ratio yet). Apart: 0."""
    low: float | None = None
    """The lower end that decides ``apart``: ``interval``'s, read given that the leader was picked as the lowest
    figure by the same runs (orchestrator.records.selection). ``interval`` is what a pair fixed in advance would
    have; it states the tie's band. None for two predictions (their ratio is exact)."""


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
    level: float | None = None
    """The coverage a predicted winner's interval states (0.9 for a fit's uncertainty, 0.8 for the corpus band);
    None: the settle rule's confidence (measured runs)."""
    relative: bool = False
    """The target scales with the baseline: a round that would decide it runs the baseline beside the winner."""


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
    round_spread: float | None = None
    """The rounds' model's residual spread of a log step time (sd; None before it has a residual)."""


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
    settled: bool
    """Nothing left for another round to decide: one winner, every config with its paired runs, the target
    verdict decided."""
    why_unsettled: str | None
    rule: SettleRule = field(repr=False, default=RULE)
    gaps: Mapping[str, Gap] = field(repr=False, default_factory=dict)
    """Config key -> its ratio to the leader (every ranked config but the leader)."""
    band: float | None = None
    """A tie: every member is at most this fraction slower than the fastest of them (the largest upper end of a
    member's interval against the leader over the smallest lower end, the leader's own being 1); None without a
    tie."""

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
    model = round_model({k: rounds[k] for k in keys if k in rounds}, base_key if base_key in named else None,
                        rule.single_run_spread / 2)

    figures = []
    for k in keys:
        rec = named[k]
        mine = rounds.get(k, {})
        paired = tuple(mine[n] / base_rounds[n] for n in sorted(mine) if n in base_rounds)
        if k == base_key:
            paired = tuple(1.0 for _ in paired)
        scale = baseline_s or 1.0
        fitted = model is not None and k in model.effect and k != base_key
        if k == base_key and baseline_s:
            ratio, interval = 1.0, _runs_interval([t / baseline_s for t in runs[k]], spread, rec.predicted)
        elif fitted:
            ratio = math.exp(model.effect[k])
            interval = _around(model.effect[k], model.half_width(model.se(k), rule.confidence))
        else:
            ratio = statistics.median(runs[k]) / scale
            interval = _runs_interval([t / scale for t in runs[k]], spread, rec.predicted)
        changed = sum(1 for p in set(rec.params) | set(base_params) if rec.params.get(p) != base_params.get(p))
        n_rounds = len(model.rounds[k]) if model is not None and k in model.rounds else 0
        unpaired = statistics.median(runs[k]) / scale
        figures.append(ConfigFigure(rec, k, tuple(runs[k]), dict(mine), paired, ratio, interval,
                                    memory.get(k), changed, k == base_key, n_rounds, unpaired))
    by_figure = sorted(figures, key=lambda c: (_rank_figure(c), c.trial))
    n_rounds = len({n for v in rounds.values() for n in v})
    noise = _noise(records, figures, base_runs, model)
    if not by_figure:
        verdict = TargetVerdict(NO_TARGET if target.kind == "none" else UNDECIDED, target.seconds(baseline_s),
                                None, None, False, relative=target.kind == "relative")
        return Answer((), None, None, (), None, baseline_s, verdict, noise, n_rounds, True,
                      "no config ran ok and passed parity", rule)
    leader = by_figure[0]
    gaps = {c.key: _gap(c, leader, model, rule, spread / 2) for c in by_figure[1:]}
    ties = [leader] + [c for c in by_figure[1:] if not gaps[c.key].apart]
    # A wide interval (few rounds, a noisy machine) can tie a config whose figure is far worse: the tie-break
    # only chooses among those practically equal to the leader by their figure.
    equal = [c for c in ties if c.ratio <= leader.ratio * (1 + rule.threshold)]
    win = min(equal, key=lambda c: (c.changed, c.peak_memory_bytes if c.peak_memory_bytes is not None else math.inf,
                                   _rank_figure(c), c.trial))
    ranked = (win, *[c for c in by_figure if c is not win])
    ties_t = (win, *[c for c in ties if c is not win])
    verdict = _verdict(win, target, baseline_s, rule)
    settled, why = _settled(ties_t, win, verdict, rule)
    baseline = next((c for c in figures if c.is_baseline), None)
    spread_of_tie = None
    if len(ties) > 1:
        his = [1.0] + [gaps[c.key].interval[1] for c in ties[1:]]
        los = [1.0] + [gaps[c.key].interval[0] for c in ties[1:]]
        spread_of_tie = max(his) / min(los) - 1
    return Answer(ranked, win, leader, ties_t, baseline, baseline_s, verdict, noise, n_rounds, settled, why,
                  rule, gaps, spread_of_tie)


def _rank_figure(c: ConfigFigure) -> float:
    """The figure as the ranking compares it: to ``SAME_FIGURE_DIGITS`` significant digits."""
    return float(f"{c.ratio:.{SAME_FIGURE_DIGITS}g}")


def _around(log_value: float, half: float) -> tuple[float, float]:
    return math.exp(log_value - half), math.exp(log_value + half)


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


def _more(n: int, log_gap: float, half: float) -> int | None:
    """More rounds (beyond ``n``) until an interval of half-width ``half`` at ``n`` rounds, shrinking as
    1/sqrt(n), clears a gap of ``log_gap``; None when no number can (no gap)."""
    if log_gap <= 0:
        return None
    return max(1, math.ceil(n * (half / log_gap) ** 2) - n)


def _gap(c: ConfigFigure, leader: ConfigFigure, model: RoundModel | None, rule: SettleRule, run_sd: float) -> Gap:
    """``c`` against the leader: paired, in the rounds' model, when both ran in rounds (told apart only after
    ``MIN_COMMON_ROUNDS`` rounds in common); else unpaired, by the medians of their runs, each run off by the
    assumed spread. Either way told apart by the lower end read given the leader's pick (``selected_low``)."""
    limit = math.log1p(rule.threshold)
    if c.predicted and leader.predicted:
        r = c.ratio / leader.ratio  # a prediction repeats exactly: only an equal one ties
        return Gap(r, (r, r), 0, c.ratio > leader.ratio, 0 if c.ratio > leader.ratio else None)
    both = model is not None and c.key in model.rounds and leader.key in model.rounds
    common = model.common(c.key, leader.key) if both else 0
    if common:
        # Paired over the rounds both ran in, as F-race compares candidates over the instances both have seen: a
        # round the leader ran in alone moves its own figure, not this comparison. Told apart only over
        # MIN_COMMON_ROUNDS rounds at least (irace's first test comes after its first instances).
        d, se = model.paired(c.key, leader.key)
        half = model.half_width(se, rule.confidence)
        # The Student-t half-width as a normal scale, so that far from the pick the bound is the t interval's.
        low = selected_low(d, half / _Z(rule.confidence), rule.confidence)
        apart = low > limit and common >= MIN_COMMON_ROUNDS
        return Gap(math.exp(d), _around(d, half), common, apart,
                   0 if apart else _more(common, d - limit, d - low), math.exp(low))
    # Not both in the rounds: their runs alone, unpaired, each run off by the assumed spread (``run_sd``, log units)
    # whatever round it ran in; a config measured once leaves the tie only when even that cannot bridge the gap.
    d = math.log(c.unpaired / leader.unpaired)
    se = run_sd * math.sqrt(1 / len(c.runs) + 1 / len(leader.runs))
    low = selected_low(d, se, rule.confidence)
    apart = c.unpaired * math.exp(low - d) > leader.unpaired * (1 + rule.threshold)
    return Gap(math.exp(d), _around(d, _Z(rule.confidence) * se), common, apart, 0 if apart else None,
               math.exp(low))


def _Z(confidence: float) -> float:
    """The normal quantile of a two-sided ``confidence`` interval's upper end."""
    return statistics.NormalDist().inv_cdf((1 + confidence) / 2)


def interval_state(low: float, high: float, target_s: float) -> str:
    """The target verdict of an interval: ``met`` when all of it is at or under the target, ``not met`` when all of
    it is above, else ``undecided``. The one rule: the sweep's answer and the planner's predictions (``plan``) use it."""
    if high <= target_s:
        return MET
    if low > target_s:
        return NOT_MET
    return UNDECIDED


def predicted_interval(record: TrialRecord) -> tuple[float, float, float] | None:
    """(low, high, level) of the step-time interval a prediction carries: its ``interval`` (what the model backend
    records: orchestrator/calibration/interval.py), else its band (ledgers written before intervals, level 0.8); None for
    a measured line or a prediction with neither."""
    pred = record.prediction or {}
    iv = pred.get("interval")
    if isinstance(iv, Mapping) and all(isinstance(iv.get(k), (int, float)) for k in ("low", "high", "level")):
        return float(iv["low"]), float(iv["high"]), float(iv["level"])
    lo, hi = pred.get("step_time_low_s"), pred.get("step_time_high_s")
    if isinstance(lo, (int, float)) and isinstance(hi, (int, float)):
        return float(lo), float(hi), BAND_LEVEL
    return None


BAND_LEVEL = 0.8
"""The stated coverage of the corpus band older ledger lines carry (orchestrator/planner/band.py's)."""


def _verdict(win: ConfigFigure, target: Any, baseline_s: float | None, rule: SettleRule) -> TargetVerdict:
    target_s = target.seconds(baseline_s)
    relative = target.kind == "relative"
    if target.kind == "none" or target_s is None:
        return TargetVerdict(NO_TARGET if target.kind == "none" else UNDECIDED, target_s, None, None, False,
                             relative=relative)
    # Paired: the winner's figure comes from the rounds (its model ratio, or the baseline's own rounds).
    paired = relative and baseline_s is not None and (win.rounds > 0 if not win.is_baseline else bool(win.paired))
    if paired:
        lo, hi = (x * baseline_s for x in win.interval)
        point = win.ratio * baseline_s
        n = win.rounds if not win.is_baseline else len(win.paired)
    elif win.predicted:
        point = win.step_time_s
        lo, hi, level = predicted_interval(win.record) or (point, point, None)
        return TargetVerdict(interval_state(lo, hi, target_s), target_s, (lo, hi), None, False, level, relative)
    else:
        vals = list(win.runs)
        lo, hi = ci_ratio(vals, rule.confidence, rule.resamples) if len(vals) > 1 else \
            _runs_interval(vals, rule.single_run_spread, False)
        point, n = statistics.median(vals), len(vals)
    state = interval_state(lo, hi, target_s)
    if state != UNDECIDED:
        return TargetVerdict(state, target_s, (lo, hi), None, paired, relative=relative)
    gap, half = abs(point - target_s), (hi - lo) / 2
    more = None if gap <= 0 or win.predicted else max(1, math.ceil(n * (half / gap) ** 2) - n)
    return TargetVerdict(UNDECIDED, target_s, (lo, hi), more, paired, relative=relative)


def _settled(ties: Sequence[ConfigFigure], win: ConfigFigure, verdict: TargetVerdict,
             rule: SettleRule) -> tuple[bool, str | None]:
    """(settled, why not): one winner, every config of the tie set (baseline aside) with ``min_rounds`` paired
    runs, and a decided target verdict."""
    if win.predicted:
        return True, None
    short = [c for c in ties if not c.is_baseline and c.rounds < rule.min_rounds]
    what = []
    if short:
        what.append(f"trials {', '.join(str(c.trial) for c in short)} have fewer than winner.min_rounds="
                    f"{rule.min_rounds} paired runs")
    if len(ties) > 1:
        what.append(f"trials {', '.join(str(c.trial) for c in ties)} cannot be told apart")
    if verdict.state == UNDECIDED:
        what.append("the target verdict is undecided")
    return not what, "; ".join(what) or None


def _noise(records: Sequence[TrialRecord], figures: Sequence[ConfigFigure], base_runs: Sequence[float],
           model: RoundModel | None) -> Noise:
    def spread(v: Sequence[float]) -> float | None:
        return (max(v) - min(v)) / statistics.median(v) if len(v) > 1 else None

    again = [s for c in figures if not c.is_baseline and (s := spread(c.runs)) is not None]
    paired = [s for c in figures if not c.is_baseline and (s := spread(c.paired)) is not None]
    loads = [r.load_1m for r in records if r.load_1m is not None]
    return Noise(len(base_runs), spread(base_runs), statistics.median(again) if again else None,
                 statistics.median(paired) if paired else None,
                 statistics.median(loads) if loads else None, max(loads) if loads else None,
                 model.sigma if model is not None else None)
