"""Planner-guided search: the planner ranks the space, is recalibrated after every measured trial, and takes
turns with TPE in proposing trials (``sampler.kind: guided``).

* Before the first trial, every config of the space (a float param at ``FLOAT_POINTS`` log-spaced values)
  is mapped onto the planner (``prefilter.plan_for_trial``) and ranked by predicted step time.
* The first ``n_first`` non-enqueued trials are the planner's top picks, spread over the knob families
  (``FAMILIES``): each pick differs from every earlier one in at least two families where such a config is
  ranked high enough, so the calibration sees varied configs.
* Then every ``every``-th trial is the recalibrated planner's best config not yet measured: before it the
  planner's efficiency parameters are refitted to every measured trial of the ledger so far with the
  calibration code (``ledger_fit.ledger_records`` -> ``planner.calibrate``), warm-started from the last fit.
  The other trials are the base sampler's (TPE), which learns from all trials, the planner's included.
* ``sampler.calibration`` (``start_efficiency``): a calibration file, e.g. ``steptune profile``'s fit to short
  slices of the model, replaces the cluster file's prior efficiency before the first ranking, so the first
  picks are already the measured planner's; the online refits start from it.
* ``planner_fields`` gives the ledger, per trial, what the planner predicted for it and the error.

What the planner cannot model (``plan_for_trial`` raises: unequal model chunks on one rank from an
interleaved layer split, FSDP with dp > 1) is never a planner pick: those configs are left to TPE, and
their trials are recorded with ``planner.not_modelled``. A space with nothing the planner can model, or a
sweep on the model backend, gets the base sampler alone (``sampler_for`` says why).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import optuna
from optuna.samplers import BaseSampler

from orchestrator.records.answer import key_of

FLOAT_POINTS = 3
"""Values a float param takes among the planner's candidates: its ends and geometric (or plain) middle."""
FAMILIES = {"parallel.": "pipeline", "pipeline.": "pipeline", "data_parallel.": "overlap",
            "recompute.": "recompute", "batch.": "microbatch"}
"""Knob families by param prefix: what a spread of first picks varies."""
FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "pp_bw_eff", "dp_bw_eff", "optimizer_bw_eff",
       "collective_latency_us", "dp_overlap_eff")
"""Efficiency fields refitted online: ``calibration.CPU_FIT`` minus memory (the ranking is by step time), plus
the per-message collective cost and the DP overlap share: the trials' measured DP waits at different bucket
sizes and overlap settings price the buckets (without them every refit kept picking the smallest bucket)."""
REFIT_TOL = 1e-8
"""scipy's xtol/ftol for the online refits (orchestrator.planner.calibrate.SOLVER_TOL is 1e-12): a refit only ranks
the candidates. On a default sweep's first 13 ledger lines, 1e-8 leaves every candidate of the space in the same
place as 1e-12; 1e-4 reorders them (with REFIT_METHOD; 1e-5 did with "lm"; tests/unit/test_guided.py)."""
REFIT_MAX_EVALS = 200
"""scipy's max_nfev for the online refits (calibrate's MAX_EVALS is 4000): a bound on a refit's driver time. With
REFIT_METHOD the refits of a default sweep stop at their tolerance after 20-50 evaluations, well under it. (With
"lm", the first refit of a default sweep from the priors on 15 ledger lines ran to 4000 evaluations, 8-11 s between
two runs; stopped at 200 it still took 1.7 s and left candidates out of place.)"""
REFIT_METHOD = "trf"
"""scipy's least_squares method for the online refits ("lm", MINPACK's Levenberg-Marquardt, for a kept
calibration). The refit's problem is flat along some directions (matmul_eff 0.84 or 0.91 fit a 15-line ledger
almost alike): "lm" crawled along it, 180 finite-difference Jacobians (1,660 residual evaluations) to the cap of
200 and still short of the full solve, with candidates out of place (the 3rd at the second refit of a default
sweep). The trust-region method stops at the same tolerance after 20-40 Jacobians, with every candidate where a
full solve puts it (tests/unit/test_guided.py: the full "lm" solve on one real ledger, "trf" to calibrate's
tolerances on the other)."""
TIME_METRICS = ("step_time_s", "forward_s", "backward_incl_recompute_s", "optimizer_s", "dp_exposed_s", "pp_idle_s")

log = logging.getLogger(__name__)


def family_of(name: str) -> str:
    return next((f for prefix, f in FAMILIES.items() if name.startswith(prefix)), name)


def float_values(p: Any, n: int = FLOAT_POINTS) -> list[float]:
    if n == 1 or p.high == p.low:
        return [p.low]
    values = np.geomspace(p.low, p.high, n) if p.log else np.linspace(p.low, p.high, n)
    return [float(f"{v:.6g}") for v in values]  # 0.5, not 0.49999999999999994


def candidates(space: Any, fixed: Mapping[str, Any], split_context: Any, n_float: int = FLOAT_POINTS
               ) -> list[dict[str, Any]]:
    """Every params set of ``space`` (``space.enumerate_space``), each float param at ``float_values``."""
    from orchestrator.search.space import enumerate_space

    floats = {p.name: p for p in space.params if p.type == "float"}
    out, seen = [], set()
    for params, _ in enumerate_space(space, fixed, split_context):
        variants = [params]
        for name, p in floats.items():
            if name in params:
                if params[name] != p.low:
                    variants = []  # the enumeration gives each float's ends; the low end stands for all values
                    break
                variants = [{**v, name: x} for v in variants for x in float_values(p, n_float)]
        for v in variants:
            if key_of(v) not in seen:
                seen.add(key_of(v))
                out.append(v)
    return out


def snap(params: Mapping[str, Any], space: Any, n_float: int = FLOAT_POINTS) -> dict[str, Any]:
    """``params`` with each float replaced by the nearest of its ``float_values`` (log distance if log)."""
    out = dict(params)
    for p in space.params:
        if p.type == "float" and p.name in out:
            dist = (lambda a, b: abs(math.log(a) - math.log(b))) if p.log else (lambda a, b: abs(a - b))
            out[p.name] = min(float_values(p, n_float), key=lambda v: dist(v, out[p.name]))
    return out


class PlannerRanking:
    """The planner's view of a space's candidates: predictions with the current efficiency, refits to a ledger."""

    def __init__(self, space: Any, configs: Any, cluster: Any, efficiency: Any, n_float: int = FLOAT_POINTS,
                 to_plan: Callable[..., Any] | None = None, uncertainty: Any = None):
        from orchestrator.calibration.prefilter import plan_for_trial

        # to_plan(trial config, cluster, efficiency) -> PlanConfig: the trainer's own mapping, or a command sweep's
        # declared model (orchestrator.calibration.command_planner), used for the ranking and the refits alike.
        plan_for_trial = self.to_plan = to_plan or plan_for_trial
        self.space, self.configs, self.cluster, self.n_float = space, configs, cluster, n_float
        # How sure the starting efficiency is (a profile's bootstrap replicates and residuals), or None.
        self.uncertainty = uncertainty
        self._rel: dict[str, tuple[float, float, float]] | None = None
        self.prior = self.efficiency = efficiency
        self.candidates = candidates(space, configs.fixed, configs.split_context, n_float)
        self.plans: dict[str, Any] = {}
        self.not_modelled: dict[str, str] = {}
        for params in self.candidates:
            try:
                cfg = configs.build(configs.overrides_for(space, params))
                self.plans[key_of(params)] = plan_for_trial(cfg, cluster, efficiency)
            except ValueError as e:
                self.not_modelled[key_of(params)] = str(e)
        self._records: list[dict] = []
        self._lines_seen = 0
        self.n_fits = 0
        self._pred: dict[str, float] | None = None

    def fresh(self) -> "PlannerRanking":
        """The same candidates and plans, back at the prior efficiency with no records (one per sweep)."""
        new = copy.copy(self)
        new.efficiency, new._records, new._lines_seen, new.n_fits, new._pred = self.prior, [], 0, 0, None
        return new

    @property
    def modelled(self) -> bool:
        return bool(self.plans)

    def predictions(self) -> dict[str, float]:
        """Candidate key -> predicted step time (s) with the current efficiency; modelled candidates only."""
        if self._pred is None:
            from orchestrator.planner.knobs import Consts, encode
            from orchestrator.planner.timing import step_times

            groups: dict[tuple, list[str]] = {}
            for k, plan in self.plans.items():  # the vectorised model wants one parallel layout per batch
                groups.setdefault((plan.parallel.pp, plan.parallel.dp, plan.tensor_parallel.size), []).append(k)
            self._pred = {}
            for keys in groups.values():
                plans = [self.plans[k] for k in keys]
                times = step_times(Consts.of(plans[0], self.efficiency), encode(plans))["step_time_s"]
                self._pred.update(zip(keys, (float(t) for t in times)))
        return self._pred

    def predict(self, params: Mapping[str, Any]) -> float | None:
        return self.predictions().get(key_of(snap(params, self.space, self.n_float)))

    def interval(self, params: Mapping[str, Any]) -> Any:
        """The predicted step time's 90% interval (``planner.uncertainty.Interval``), or None without an uncertainty
        or for a config the planner does not model. The profile's replicates give each candidate its interval
        relative to the starting prediction; after refits the same relative interval is kept around the refitted
        point (a refit moves the point; the trials it rests on are too few to bootstrap)."""
        from orchestrator.planner.uncertainty import Interval, intervals

        point = self.predict(params)
        if point is None or self.uncertainty is None:
            return None
        if self._rel is None:
            keys = list(self.plans)
            got = intervals([self.plans[k] for k in keys], self.prior, self.uncertainty)
            self._rel = {k: (g["step_time_s"].low / g["step_time_s"].point, g["step_time_s"].high / g["step_time_s"].point,
                             g["step_time_s"].level) for k, g in zip(keys, got)}
        lo, hi, level = self._rel[key_of(snap(params, self.space, self.n_float))]
        return Interval(point * lo, point, point * hi, level)

    def why_not(self, params: Mapping[str, Any]) -> str | None:
        k = key_of(snap(params, self.space, self.n_float))
        return self.not_modelled.get(k) or (None if k in self.plans else "not a candidate of the space")

    def refit(self, lines: Sequence[Mapping[str, Any]]) -> bool:
        """Refit to the ledger lines (only new ones are mapped); True when the efficiency changed."""
        from orchestrator.calibration.ledger_fit import ledger_records
        from orchestrator.planner import calibrate

        new = list(lines[self._lines_seen:])
        self._lines_seen = len(lines)
        if not new:
            return False
        records, _, _ = ledger_records(new, self.cluster, self.prior, metrics=TIME_METRICS, to_plan=self.to_plan)
        if not records:
            return False
        self._records.extend(records)
        # Warm start: the last fit is the starting point (and the weak prior), so a refit takes a few steps.
        base = dataclasses.replace(self._records[0]["config"], efficiency=self.efficiency)
        self.efficiency = calibrate(self._records, base, fit=FIT, tol=REFIT_TOL, max_evals=REFIT_MAX_EVALS,
                                   method=REFIT_METHOD).efficiency
        self.n_fits += 1
        self._pred = None
        return True


def spread_picks(ranked: Sequence[dict[str, Any]], n: int, window: int | None = None) -> list[dict[str, Any]]:
    """Up to ``n`` of ``ranked`` (best first): each differs from every earlier pick in >= 2 knob families,
    looking ``window`` (default: a quarter of ``ranked``) places down the ranking; else the best remaining one."""
    window = window or max(12, len(ranked) // 4)
    picks: list[dict[str, Any]] = []
    rest = list(ranked)
    while rest and len(picks) < n:
        def families_apart(c: dict[str, Any]) -> int:
            return min((len({family_of(k) for k in set(c) | set(p) if c.get(k) != p.get(k)}) for p in picks),
                       default=99)
        choice = next((c for c in rest[:window] if families_apart(c) >= 2), rest[0])
        picks.append(choice)
        rest.remove(choice)
    return picks


class GuidedSampler(BaseSampler):
    """An Optuna sampler: planner picks (fixed params of a trial) in turn with ``base``'s proposals.

    ``lines()`` returns the ledger lines so far (measured trials with results) for the refits.
    ``every=0`` and ``refit=False`` make it "TPE warm-started by the planner": the first picks, then TPE.
    """

    def __init__(self, ranking: PlannerRanking, base: BaseSampler, lines: Callable[[], Sequence[Mapping]],
                 n_first: int = 3, every: int = 2, refit: bool = True):
        if n_first < 0 or every < 0:
            raise ValueError("sampler: n_first and every must be >= 0")
        self.ranking, self.base, self.lines = ranking, base, lines
        self.n_first, self.every, self.do_refit = n_first, every, refit
        if refit and every:
            from orchestrator.planner.calibrate import load_solver

            # Now, while the sweep sets up, not at the first refit: there the worker group (its devices) would
            # idle while scipy.optimize loads.
            load_solver()
        self._first = spread_picks(self.ranked(), n_first)
        self._picks: dict[int, dict[str, Any]] = {}
        self._free = 0
        """Trials this sampler proposed itself so far (enqueued ones excluded)."""

    def ranked(self, exclude: set[str] = frozenset()) -> list[dict[str, Any]]:
        pred = self.ranking.predictions()
        cands = [c for c in self.ranking.candidates if key_of(c) in pred and key_of(c) not in exclude]
        return sorted(cands, key=lambda c: pred[key_of(c)])

    def measured_keys(self, study: optuna.Study) -> set[str]:
        """Every config the study holds a trial of (any state), floats snapped to the candidates' values."""
        return {key_of(snap(t.params, self.ranking.space, self.ranking.n_float))
                for t in study.get_trials(deepcopy=False) if t.params} | \
               {key_of(p) for p in self._picks.values()}

    def before_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
        self.base.before_trial(study, trial)
        if "fixed_params" in trial.system_attrs:
            return  # enqueued (baseline, enqueue:, a requeued trial): runs as given
        i, self._free = self._free, self._free + 1
        pick = None
        done = self.measured_keys(study)
        if i < self.n_first:
            pick = next((p for p in self._first if key_of(p) not in done), None)
        elif self.every and (i - self.n_first) % self.every == 0:
            # Refitted here, to every ledger line so far: a fit costs a fraction of a ms per parallel layout
            # measured per solver step (calibrate evaluates a layout's records in one call), so it is done
            # when the ranking is used (the first picks use the prior's).
            if self.do_refit:
                self.ranking.refit(self.lines())
            pick = next(iter(self.ranked(exclude=done)), None)
        if pick is not None:
            self._picks[trial.number] = pick
            study._storage.set_trial_system_attr(trial._trial_id, "guided_pick", pick)

    def infer_relative_search_space(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> dict:
        if trial.number in self._picks:
            return {}
        return self.base.infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, search_space: dict) -> dict:
        if trial.number in self._picks:
            return {}
        return self.base.sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, name: str,
                           distribution: optuna.distributions.BaseDistribution) -> Any:
        pick = self._picks.get(trial.number)
        if pick is not None and name in pick:
            return pick[name]
        return self.base.sample_independent(study, trial, name, distribution)

    def after_trial(self, study: optuna.Study, trial: optuna.trial.FrozenTrial, state: Any, values: Any) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


def planner_fields(sampler: Any, params: Mapping[str, Any], metrics: Mapping[str, Any], number: int | None = None
                   ) -> dict[str, Any]:
    """The ledger's ``planner`` entry for one trial: prediction (efficiency fitted to the trials before it),
    error against the measurement, whether the planner picked it. {} for other samplers."""
    if not isinstance(sampler, GuidedSampler):
        return {}
    r = sampler.ranking
    pred = r.predict(params)
    if pred is None:
        return {"planner": {"not_modelled": r.why_not(params), "picked": number in sampler._picks}}
    measured = metrics.get("step_time_s")
    out = {"predicted_step_time_s": pred, "picked": number in sampler._picks, "fits": r.n_fits,
           "error_pct": 100.0 * (pred - measured) / measured if measured else None}
    if (iv := r.interval(params)) is not None:
        out.update(predicted_low_s=iv.low, predicted_high_s=iv.high, interval_level=iv.level,
                   within_interval=iv.contains(measured) if measured else None)
    return {"planner": out}


def start_efficiency(sampler: Any, source: str | None) -> Any:
    """The efficiency ``sampler.calibration`` names (``SamplerConfig``; ``source``: the sweep file), or None.

    ValueError naming ``sampler.calibration`` for a file that is missing or not a calibration, or when the
    sampler is not guided (no other sampler has a planner to start)."""
    from pathlib import Path

    from orchestrator.calibration.ledger_fit import load_calibration
    from orchestrator.calibration.sources import resolve_path

    if sampler.calibration is None:
        return None
    if sampler.kind != "guided":
        raise ValueError(f"sampler.calibration: only sampler.kind=guided reads it (kind is {sampler.kind})")
    from orchestrator.calibration.hardware import file_mismatch, this_host

    path = resolve_path(sampler.calibration, Path(source).parent if source else None)
    if w := file_mismatch(path, host=this_host(), what="the guided search"):
        log.warning("sampler.calibration %s: %s", path, w)
    try:
        return load_calibration(path)
    except ValueError as e:
        raise ValueError(f"sampler.calibration: {e}") from None


def start_uncertainty(sampler: Any, source: str | None) -> Any:
    """The ``uncertainty:`` section of the file ``sampler.calibration`` names (a profile's), or None."""
    from pathlib import Path

    from orchestrator.calibration.ledger_fit import load_uncertainty
    from orchestrator.calibration.sources import resolve_path

    if sampler.calibration is None:
        return None
    try:
        return load_uncertainty(resolve_path(sampler.calibration, Path(source).parent if source else None))
    except ValueError as e:
        raise ValueError(f"sampler.calibration: {e}") from None


def sampler_for(backend: Any, base: BaseSampler, records: Callable[[], Sequence[Any]]) -> BaseSampler:
    """``sampler.kind: guided`` for a real-trials backend (``RayTrials``): GuidedSampler over ``base``, or ``base``
    alone when the planner cannot model the space (no cluster for this device, nothing mappable), saying why."""
    from orchestrator import REPO_ROOT
    from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER
    from orchestrator.calibration.prefilter import load_cluster

    cfg, configs = backend.cfg, backend.configs
    if backend.prefilter is not None:  # the sweep's own cluster file (and calibration) for this device
        cluster, eff = backend.prefilter.cluster, backend.prefilter.efficiency
    elif configs.device == "cpu":
        cluster, eff = load_cluster(REPO_ROOT / DEFAULT_CLUSTER)
    else:
        log.info("note: sampler.kind=guided needs a cluster file for a GPU sweep (an enabled prefilter: with its cluster); using TPE")
        return base
    # A profile measured before the sweep beats the cluster file's priors (and a prefilter calibration: that one
    # is for memory); the online refits then start from it.
    eff = start_efficiency(cfg.sampler, cfg.source) or eff
    ranking = PlannerRanking(cfg.space, configs, cluster, eff, uncertainty=start_uncertainty(cfg.sampler, cfg.source))
    if not ranking.modelled:
        log.info("note: sampler.kind=guided: the planner models none of the space's configs (%s); using TPE",
                 next(iter(ranking.not_modelled.values()), "?"))
        return base
    if ranking.not_modelled:
        log.info("note: the planner does not model %d of %d configs (e.g. %s); TPE alone proposes those",
                 len(ranking.not_modelled), len(ranking.candidates), next(iter(ranking.not_modelled.values())))
    s = cfg.sampler
    return GuidedSampler(ranking, base, records, n_first=s.guided_first, every=s.guided_every)
