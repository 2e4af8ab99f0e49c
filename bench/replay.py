"""Samplers replayed against a measured landscape (bench/landscape.py): trials to reach the true best.

    PYTHONPATH=. .venv/bin/python bench/replay.py [--landscape bench/results/landscape_default.json]
        [--seeds 50] [--cap 60] [--random-cap 200] [--budget 20] [--out bench/results/replay_default.md]

Each "trial" of a replayed sweep asks the sampler for params exactly as a sweep does (``space.suggest`` on
an Optuna trial, the baseline enqueued as trial 0), snaps a float param to the nearest measured value, and
draws one of that config's stored step-time samples (``random.Random(seed)``): the replay sees the real
noise, not the median. A proposal with the same params as an earlier trial costs no run (the sweep reuses
the measurement); a config that failed parity or did not run is told as the sweep tells it (constraints).
A config a partial landscape has no run of is skipped like a pre-filtered one: a trial, but no run.

Per strategy and seed: the runs until a config whose truth is within 2% (5%) of the true best was measured, up to
a cap; and, for a sweep of ``--budget`` trials, whether
the declared winner is truly within 2%, with and without settling (``declare``: interleaved rounds of the
baseline and the contenders, judged by the sweep's own decision, orchestrator.records.answer.decide); a
declared tie counts as right only when every member of it is truly within 2%.

The truth. A config's truth is its time over the baseline's: for a config the landscape refined
(``bench/landscape.py --refine-top``), the geometric mean of its paired ratios over the refinement's rounds; for the
others, its median over the baseline's median. A refined landscape also gives the settling rounds their
pairing: each replayed round draws one refinement round, and every config in it takes its run of that round, so
what a round shares (the machine's state while it ran) reaches the decision as it does in a sweep; a config
without a run in that round draws one of its stored runs. Without a refinement, the truth is the 3-run medians,
a few percent off each on a shared machine: too coarse to judge "within 2%" by.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import statistics
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Sequence

import numpy as np
import optuna

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from orchestrator import backends  # noqa: E402
from orchestrator.calibration import guided
from orchestrator.records import answer as A
from orchestrator.records.record import Metrics, ParityVerdict, TrialRecord  # noqa: E402
from orchestrator.search.target import Target  # noqa: E402
from orchestrator.sweep import race  # noqa: E402
from orchestrator.sweep.config import SweepConfig, load_sweep  # noqa: E402
from orchestrator.search.space import suggest  # noqa: E402

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
STRATEGIES = ("random", "tpe", "gp", "tpe_warm", "guided", "guided_profile")
"""guided_profile: guided, its planner started from a profile (``sampler.calibration``: bench/slice_proof.py's
slice calibration, with its measured cluster file) instead of the cpu-local priors."""


@dataclasses.dataclass
class Landscape:
    doc: dict
    cfg: SweepConfig
    configs: Any
    rows: dict[str, dict]
    """key -> the landscape's row for that config."""
    floats: dict[str, list[float]]
    truth: dict[str, float] = dataclasses.field(default_factory=dict)
    """key -> the figure "truly within" judges (usable configs only): its time over the baseline's."""
    refined: dict[str, dict[int, float]] = dataclasses.field(default_factory=dict)
    """key -> refinement round -> its run in that round (s)."""
    refined_rounds: int = 0

    def __post_init__(self) -> None:
        if not self.truth:  # no baseline to scale by: each config's median stands for itself
            self.truth = {k: r["median_s"] for k, r in self.rows.items() if self.usable(r)}

    @classmethod
    def load(cls, path: str | Path, overrides: Sequence[str] = ()) -> "Landscape":
        return cls.from_doc(json.loads(Path(path).read_text()), overrides)

    @classmethod
    def from_doc(cls, doc: dict, overrides: Sequence[str] = ()) -> "Landscape":
        """``overrides``: sweep-file settings as a dotlist (e.g. ``sampler.guided_every=2``, ``winner.min_rounds=4``);
        the space itself is the landscape's."""
        cfg = load_sweep(ROOT / doc["source"], list(overrides), check=False)
        rows = {r["key"]: r for r in doc["configs"]}
        refined = {k: {int(n): t for n, t in v.items()} for k, v in (doc.get("refined") or {}).get("runs", {}).items()}
        return cls(doc, cfg, backends.build(cfg).configs, rows, doc.get("discretised", {}), truth_of(doc), refined,
                   len({n for v in refined.values() for n in v}))

    @property
    def best_s(self) -> float:
        """The fastest median (s) of the landscape's own runs (bench/slice_proof.py's reference)."""
        return min(r["median_s"] for r in self.rows.values() if self.usable(r))

    @property
    def best(self) -> float:
        """The true best's figure (``truth``'s units)."""
        return min(self.truth.values())

    @property
    def best_key(self) -> str:
        return min(self.truth, key=self.truth.get)

    def settling_sample(self, key: str, rnd: int | None, rng: random.Random) -> float:
        """A config's run in a replayed settling round ``rnd`` (None: no refinement, one of its stored runs). The
        refinement ran in another machine state than the landscape (the best config at 47.6 ms there, 38.0 ms in
        the landscape), and a replayed sweep's search phase draws the landscape's runs: so a refined config's run
        of the round is brought to the landscape's level (times the baseline's stored median over its refined
        median), and a config without a run in that round takes one of its stored runs times the round's drift
        (the baseline's run of the round over its refined median). Unscaled, either would look 20% off beside
        the other."""
        runs = self.rows[key]["step_time_samples_s"]
        stored = runs[rng.randrange(len(runs))]
        base = self.doc.get("baseline_key")
        if rnd is None or not self.refined.get(base):
            return stored
        level = statistics.median(self.refined[base].values())
        mine = self.refined.get(key, {})
        if rnd in mine:
            return mine[rnd] * self.rows[base]["median_s"] / level
        if mine and rnd in self.refined[base]:
            return self._refined_elsewhere(key, rnd, rng) * self.rows[base]["median_s"] / level
        return stored * self.refined[base].get(rnd, level) / level

    def _refined_elsewhere(self, key: str, rnd: int, rng: random.Random) -> float:
        """A run of a config refined in other rounds (the 24-round configs in a round past their 24th): its truth
        times the round's level (what every config refined in that round shares) times one of its own residuals
        (its run over truth x level in one of its rounds). Its paired ratio to the baseline of another round times
        this round's baseline would carry that baseline's own deviation into every such config of the round at
        once, and a stored run times the drift would pair with the baseline exactly."""
        levels = self._round_levels()
        mine = sorted(n for n in self.refined[key] if n in levels)
        m = mine[rng.randrange(len(mine))]
        return self.truth[key] * levels[rnd] * self.refined[key][m] / (self.truth[key] * levels[m])

    def _round_levels(self) -> dict[int, float]:
        """Refinement round -> the geometric mean over the configs refined in it of run / truth (seconds at the
        baseline's scale): the machine's state in that round."""
        if not hasattr(self, "_levels"):
            per: dict[int, list[float]] = {}
            for k, runs in self.refined.items():
                for n, t in runs.items():
                    if k in self.truth:
                        per.setdefault(n, []).append(t / self.truth[k])
            self._levels = {n: statistics.geometric_mean(v) for n, v in per.items()}
        return self._levels

    @staticmethod
    def usable(row: dict) -> bool:
        return row["status"] == "ok" and bool(row["step_time_samples_s"])

    def within(self, key: str, frac: float) -> bool:
        return key in self.truth and self.truth[key] <= self.best * (1 + frac)

    def key(self, params: dict) -> str:
        out = dict(params)
        for name, values in self.floats.items():
            if name in out:
                out[name] = min(values, key=lambda v: abs(math.log(v) - math.log(out[name])))
        return guided.key_of(out)


def truth_of(doc: dict) -> dict[str, float]:
    """key -> a usable config's time over the baseline's: its refined paired ratio (geometric mean over the
    refinement's rounds) where the landscape was refined, else its median over the baseline's median (each config's median alone without a baseline)."""
    rows = {r["key"]: r for r in doc["configs"]}
    base = rows.get(doc.get("baseline_key", ""))
    scale = base["median_s"] if base is not None and Landscape.usable(base) else 1.0
    ratios = (doc.get("refined") or {}).get("ratio", {})
    return {k: ratios.get(k, r["median_s"] / scale) for k, r in rows.items() if Landscape.usable(r)}


@dataclasses.dataclass
class SeedResult:
    strategy: str
    seed: int
    reach: dict[float, int | None]
    """Within fraction -> runs (baseline included) until such a config was measured; None: not within the cap."""
    winner_best_sample: bool
    """Budgeted sweep, winner = the fastest single sample: truly within 2%?"""
    winner_noise_aware: bool
    """The same with ``declare``'s settling rounds: the winner, and every member of a declared tie, truly within
    2%?"""
    extra_runs: int
    """Runs ``declare``'s settling rounds added (baseline runs included)."""
    planner_err: list[float]
    """|error| % of the planner's prediction per run (guided strategies only)."""
    winner_noise_aware_5: bool = False
    """``declare``'s winner (and its tie set) truly within 5%?"""
    tie: bool = False
    """``declare`` declared a tie."""
    answer_winner: bool = False
    """``declare``'s winner alone (the tie set's first, by its stated tie-break) truly within 2%?"""


def make_sampler(strategy: str, land: Landscape, seed: int, lines: Callable[[], list],
                 ranking: guided.PlannerRanking | None) -> optuna.samplers.BaseSampler:
    from orchestrator.sweep.study import _sampler

    cfg = dataclasses.replace(land.cfg, sampler=dataclasses.replace(land.cfg.sampler, kind="tpe", seed=seed))
    tpe = _sampler(cfg)  # TPE exactly as the sweep file configures it
    if strategy == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if strategy == "tpe":
        return tpe
    if strategy == "gp":
        return optuna.samplers.GPSampler(seed=seed, n_startup_trials=cfg.sampler.n_startup_trials,
                                         warn_independent_sampling=False)
    assert ranking is not None
    fresh = ranking.fresh()
    s = cfg.sampler
    if strategy == "tpe_warm":
        return guided.GuidedSampler(fresh, tpe, lines, n_first=s.guided_first, every=0, refit=False)
    return guided.GuidedSampler(fresh, tpe, lines, n_first=s.guided_first, every=s.guided_every)


def replay(strategy: str, land: Landscape, seed: int, cap: int, budget: int,
           ranking: guided.PlannerRanking | None = None, fracs: tuple[float, ...] = (0.02, 0.05)) -> SeedResult:
    """One replayed sweep: runs until a config within max(fracs) and the budget are both done, or ``cap``."""
    reach, first, errs, rng, base = search(strategy, land, seed, cap, budget, ranking, fracs)
    best_single = min(first, key=lambda k: min(first[k]))
    ties, extra = declare(first, land, rng, base=base)
    return SeedResult(strategy, seed, reach, land.within(best_single, 0.02),
                      all(land.within(k, 0.02) for k in ties), extra, errs,
                      all(land.within(k, 0.05) for k in ties), len(ties) > 1, land.within(ties[0], 0.02))


def search(strategy: str, land: Landscape, seed: int, cap: int, budget: int,
           ranking: guided.PlannerRanking | None = None, fracs: tuple[float, ...] = (0.02, 0.05)
           ) -> tuple[dict[float, int | None], dict[str, list[float]], list[float], random.Random, str]:
    """The search of one replayed sweep: (runs until a config within each of ``fracs``, the samples per config of
    its first ``budget`` runs, the planner's |error| per run, the generator it drew with, the baseline's key)."""
    rng = random.Random(seed)
    lines: list[dict] = []
    sampler = make_sampler(strategy, land, seed, lambda: lines, ranking)
    study = optuna.create_study(direction="minimize", sampler=sampler)
    cfg, configs = land.cfg, land.configs
    base_params = configs.baseline_params(cfg.space)
    study.enqueue_trial(base_params)
    base_row = land.rows[land.key(base_params)]
    base_s = base_row["median_s"]  # what a failed or skipped config is told as (10 x)
    samples: dict[str, list[float]] = {}  # what this sweep measured, per config
    history: list[str] = []  # config key per run
    reach: dict[float, int | None] = {f: None for f in fracs}
    seen: dict[str, float] = {}
    errs: list[float] = []
    n_trials = 0
    while n_trials < cap and (n_trials < budget or any(v is None for v in reach.values())):
        trial = study.ask()
        n_trials += 1
        params, _ = suggest(trial, cfg.space, configs.fixed, configs.split_context)
        exact = guided.key_of(params)
        key = land.key(params)
        row = land.rows.get(key)
        if exact in seen:  # the sweep reuses a repeated proposal's measurement: no run
            _tell(study, trial, seen[exact], row)
            continue
        if row is None or row["status"] == "missing":
            # Not in the landscape (a partial one): skipped like a pre-filtered config, a trial but no run.
            seen[exact] = 10.0 * base_s
            _tell(study, trial, seen[exact], None)
            continue
        if not row["step_time_samples_s"]:  # measured, failed: a run told as the sweep tells a crash
            value = 10.0 * base_s
        else:
            i = rng.randrange(len(row["step_time_samples_s"]))
            value = row["step_time_samples_s"][i]
            if isinstance(sampler, guided.GuidedSampler):
                pred = guided.planner_fields(sampler, params, {"step_time_s": value}, trial.number)["planner"]
                if pred.get("error_pct") is not None:
                    errs.append(abs(pred["error_pct"]))
            lines.append(_line(land, trial.number, params, row, i))
            if Landscape.usable(row):
                samples.setdefault(key, []).append(value)
        seen[exact] = value
        history.append(key)
        _tell(study, trial, value, row)
        for f in fracs:
            if reach[f] is None and land.within(key, f):
                reach[f] = len(history)
        if len(history) == budget:
            first = {k: list(v) for k, v in samples.items()}
    if len(history) < budget:
        first = samples
    return reach, first, errs, rng, land.key(base_params)


_T0 = __import__("datetime").datetime(2026, 1, 1, tzinfo=__import__("datetime").timezone.utc)


def _record(number: int, params: dict, t: float, base: bool, rnd: int | None) -> TrialRecord:
    """A drawn sample as a ledger record, for the sweep's own decision (parity passed, as in the landscape)."""
    kind = ("baseline" if base else "trial") if rnd is None else "repeat"
    return TrialRecord(sweep="replay", trial=number, kind=kind, backend="ray", params=params, config={},
                       status="ok", reason=None, metrics=Metrics(step_time_s=t), meets_target=False, wall_s=t,
                       overhead_s=0.0, started_at=_T0, finished_at=_T0,
                       parity=None if base and rnd is None else ParityVerdict(passed=True),
                       repeat=None if rnd is None else rnd, round=rnd)


def declare(samples: dict[str, list[float]], land: Landscape, rng: random.Random, base: str | None = None,
            rule: A.SettleRule | None = None) -> tuple[list[str], int]:
    """The answer as the sweep settles it (``Sweep._next_round``, the sweep file's ``winner:``): rounds of the
    baseline and the contenders ``answer.decide`` names, one drawn sample each, until it is settled or
    ``max_rounds`` are spent. Returns (the winner's key and its tie set's, winner first; runs added)."""
    rule = rule or getattr(getattr(land, "cfg", None), "winner", None) or A.RULE
    base = base if base in samples else next(iter(samples))
    keys = [base] + [k for k in samples if k != base]
    params = {k: (land.rows.get(k) or {}).get("params") or {"key": k} for k in keys}
    land_key = {A.key_of(params[k]): k for k in keys}
    records = [_record(i, params[k], t, k == base, None) for i, k in enumerate(keys) for t in samples[k]]
    extra, number = 0, 0
    while number < rule.max_rounds:
        answer = A.decide(records, Target(), rule)
        plan = None if answer.settled else race.next_round(answer, rule, rule.max_rounds - number)
        if plan is None:
            break
        number += 1
        rnd = rng.randrange(land.refined_rounds) if land.refined_rounds else None
        for k in ([base] if plan.baseline else []) + [land_key[c] for c in plan.configs]:
            records.append(_record(keys.index(k), params[k], land.settling_sample(k, rnd, rng), k == base, number))
            extra += 1
    answer = A.decide(records, Target(), rule)
    return [land_key[c.key] for c in answer.ties], extra


def resolution(land: Landscape, frac: float, runs: int = 3, draws: int = 2000, seed: int = 0) -> float:
    """How often a fresh measurement of EVERY config (``runs`` runs each, drawn from its stored runs) names a
    best config truly within ``frac`` of the landscape's best: the ceiling any sampler or winner rule meets
    on this landscape, set by its own noise, not by the search."""
    rng = random.Random(seed)
    rows = [r for r in land.rows.values() if Landscape.usable(r)]
    hits = 0
    for _ in range(draws):
        meds = {r["key"]: statistics.median(rng.choice(r["step_time_samples_s"]) for _ in range(runs)) for r in rows}
        hits += land.within(min(meds, key=meds.get), frac)
    return hits / draws


def refined_resolution(land: Landscape, frac: float, rounds: int, draws: int = 2000, seed: int = 0) -> float | None:
    """The same ceiling for the refined configs at a given number of rounds: draw ``rounds`` refinement rounds
    (with replacement), rank every refined config (baseline aside) by its geometric mean over them (the truth's
    statistic: over common rounds, the same order as its paired ratio's), and ask whether the lowest is truly
    within ``frac``. An answer that runs no more rounds than that cannot be expected to name
    a config within ``frac`` more often, let alone a tie set of such configs. None without a refinement."""
    if not land.refined_rounds:
        return None
    rng = random.Random(seed)
    base = land.doc.get("baseline_key")
    keys = [k for k in land.refined if k != base and k in land.truth]
    hits = 0
    for _ in range(draws):
        picked = [rng.randrange(land.refined_rounds) for _ in range(rounds)]
        meds = {k: statistics.geometric_mean([land.refined[k][n] for n in picked if n in land.refined[k]])
                for k in keys if any(n in land.refined[k] for n in picked)}
        hits += land.within(min(meds, key=meds.get), frac)
    return hits / draws


def _tell(study: optuna.Study, trial: optuna.Trial, value: float, row: dict | None) -> None:
    ok = row is not None and row["status"] in ("ok", "infeasible")
    trial.set_constraint("crash", 0.0 if ok else 1.0)
    trial.set_constraint("parity", 1.0 if row is not None and row["status"] == "infeasible" else 0.0)
    trial.set_constraint("memory", 0.0)
    study.tell(trial, value)


_CONFIGS: dict[str, dict] = {}


def _line(land: Landscape, number: int, params: dict, row: dict, i: int) -> SimpleNamespace:
    """One drawn sample as the guided sampler's refit reads a ledger record (``ledger_fit.ledger_records``:
    measured, status, trial, config, result.summary, result.phases); a replayed sample has nothing else."""
    if row["key"] not in _CONFIGS:
        _CONFIGS[row["key"]] = land.configs.build(land.configs.overrides_for(land.cfg.space, row["params"])).to_dict()
    phases = row.get("phases_samples_s") or [{}] * len(row["step_time_samples_s"])
    result = SimpleNamespace(summary=SimpleNamespace(step_time_s=row["step_time_samples_s"][i], peak_memory_bytes=None),
                             phases={p: {"max": v} for p, v in phases[i].items()})
    return SimpleNamespace(measured=True, status=SimpleNamespace(value="ok" if row["status"] == "ok" else row["status"]),
                           trial=number, config=_CONFIGS[row["key"]], result=result)


def synthetic(efficiency: Any, source: str = "search_spaces/default.yaml", noise_rel: float = 0.03,
              repeats: int = 3, seed: int = 0) -> dict:
    """A landscape document drawn from the planner itself with ``efficiency`` as the truth: each config's runs
    are its prediction times lognormal noise (``noise_rel``); phases from the prediction's breakdown. Configs the
    planner cannot model get 1.5 x the median prediction. For tests: the parameters behind it are known."""
    from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER
    from orchestrator.planner import predict
    from orchestrator.calibration.prefilter import load_cluster

    cfg = load_sweep(ROOT / source, check=False)
    configs = backends.build(cfg).configs
    cluster, _ = load_cluster(ROOT / DEFAULT_CLUSTER)
    ranking = guided.PlannerRanking(cfg.space, configs, cluster, efficiency)
    pred = ranking.predictions()
    fallback = 1.5 * statistics.median(pred.values())
    rng = np.random.default_rng(seed)
    rows = []
    for params in ranking.candidates:
        k = guided.key_of(params)
        plan = ranking.plans.get(k)
        if plan is not None:
            p = predict(dataclasses.replace(plan, efficiency=efficiency))
            phases = {"forward": p.forward_s, "backward": p.backward_s + p.recompute_s, "optimizer": p.optimizer_s,
                      "dp_comm_wait": p.dp_exposed_s, "pipeline_idle": p.pp_bubble_s + p.pp_p2p_s}
        else:
            phases = {}
        noise = np.exp(rng.normal(0.0, noise_rel, repeats))
        times = [float(pred.get(k, fallback) * n) for n in noise]
        rows.append({"key": k, "params": params, "status": "ok", "step_time_samples_s": times,
                     "phases_samples_s": [{ph: v * n for ph, v in phases.items()} for n in noise],
                     "median_s": statistics.median(times), "spread_rel": (max(times) - min(times)) / min(times)})
    return {"space": cfg.name, "source": source, "repeats": repeats, "started_at": "synthetic",
            "discretised": {p.name: guided.float_values(p) for p in cfg.space.params if p.type == "float"},
            "machine": {"cpu": "synthetic (the planner)", "cpus": 0}, "configs": rows}


def ranking_for(land: Landscape, cluster_file: str | Path | None = None, calibration: str | Path | None = None
                ) -> guided.PlannerRanking | None:
    """The planner ranking a guided sweep of the landscape's space starts from: cpu-local.yaml's priors, or the
    given cluster file with a calibration file's efficiency (``sampler.calibration``)."""
    from orchestrator.calibration.ledger_fit import DEFAULT_CLUSTER, load_calibration
    from orchestrator.calibration.prefilter import load_cluster

    if land.cfg.backend == "command":  # a black box: the model its sweep file declares (planner:), its cluster file
        from orchestrator.calibration import command_planner

        planner = backends.build(land.cfg).planner
        if planner is None:
            raise SystemExit(f"{land.doc['source']}: a command landscape needs a planner: section to guide")
        return command_planner.ranking_for(planner, land.cfg, land.configs,
                                           n_float=len(next(iter(land.floats.values()), [0, 0, 0])))
    cluster, eff = load_cluster(cluster_file or ROOT / DEFAULT_CLUSTER)
    if calibration is not None:
        eff = load_calibration(calibration)
    n = len(next(iter(land.floats.values()), [0, 0, 0]))
    return guided.PlannerRanking(land.cfg.space, land.configs, cluster, eff, n_float=n)


def pct(values: list[int | None], q: float, cap: int) -> str:
    vals = [v if v is not None else cap + 1 for v in values]
    x = float(np.percentile(vals, q, method="inverted_cdf"))
    return f">{cap}" if x > cap else f"{x:.0f}"


def main(argv: list[str] | None = None) -> None:
    from results_file import write_and_print

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--landscape", default=str(ROOT / "bench/results/landscape_default.json"))
    ap.add_argument("--seeds", type=int, default=50)
    ap.add_argument("--cap", type=int, default=60, help="most runs per replayed sweep (random: --random-cap)")
    ap.add_argument("--random-cap", type=int, default=200)
    ap.add_argument("--gp-cap", type=int, default=40, help="GP: ~1 s per trial on 2 CPUs, so a lower cap")
    ap.add_argument("--gp-seeds", type=int, help="seeds for GP (default: --seeds)")
    ap.add_argument("--budget", type=int, default=20, help="trials of the sweep whose winner is judged")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                    help="sweep-file settings for the replayed sweeps (sampler.*, winner.*), as on the sweep command")
    ap.add_argument("--profile-cluster", default="bench/results/slice_proof_cluster.yaml",
                    help="guided_profile: the cluster file (bench/slice_proof.py: netcal on this host)")
    ap.add_argument("--profile-calibration", default="bench/results/slice_proof_default_calibration.yaml",
                    help="guided_profile: the calibration file the planner starts from (bench/slice_proof.py)")
    ap.add_argument("--out", help="default: bench/results/replay_default.md (--claims: replay_claims.md)")
    ap.add_argument("--claims", action="store_true",
                    help="how often the settled answer's claims are true, per settling rule (bench/claims.py)")
    ap.add_argument("--claims-rules", default=None, metavar="RULES",
                    help="--claims: the rules, e.g. race,race@8,before,before@16 (default: bench/claims.py's)")
    args = ap.parse_args(argv)
    land = Landscape.load(args.landscape, args.set)
    ranking = ranking_for(land)
    if args.claims:
        import claims

        args.out = args.out or str(ROOT / "bench/results/replay_claims.md")
        args.claims_rules = args.claims_rules or claims.DEFAULT_RULES
        return claims.main(args, land, ranking, sys.argv[1:] if argv is None else argv)
    args.out = args.out or str(ROOT / "bench/results/replay_default.md")
    profiled = (ranking_for(land, ROOT / args.profile_cluster, ROOT / args.profile_calibration)
                if "guided_profile" in args.strategies.split(",") else None)
    results: dict[str, list[SeedResult]] = {}
    t0 = time.perf_counter()
    cache = Path(args.out).with_suffix(".json")  # results per strategy: another run may add strategies
    for strategy in args.strategies.split(","):
        cap = _cap(strategy, args)
        t = time.perf_counter()
        seeds = args.gp_seeds if strategy == "gp" and args.gp_seeds else args.seeds
        label = f"{strategy} ({' '.join(args.set)})" if args.set else strategy
        rk = profiled if strategy == "guided_profile" else ranking
        results[label] = [replay(strategy, land, seed, cap, args.budget, rk) for seed in range(seeds)]
        print(f"{strategy}: {time.perf_counter() - t:.0f} s", flush=True)
    done = json.loads(cache.read_text()) if cache.exists() else {}
    ref = land.doc.get("refined") or {}
    stamp = f"{land.doc.get('last_run_at')}; refined {ref.get('started_at')} x {land.refined_rounds}" if ref \
        else land.doc.get("last_run_at")
    if done.get("landscape") != stamp:
        done = {}  # results of another landscape, or of another truth
    done.setdefault("strategies", {}).update(
        {k: {"args": vars(args), "seeds": [dataclasses.asdict(r) for r in v]} for k, v in results.items()})
    done["landscape"] = stamp
    cache.write_text(json.dumps(done, indent=1))
    every = {k: [SeedResult(**{**r, "reach": {float(f): n for f, n in r["reach"].items()}}) for r in v["seeds"]]
             for k, v in done["strategies"].items()}
    every = {k: every[k] for name in STRATEGIES for k in sorted(every) if k.split(" (")[0] == name}
    per_args = {k: argparse.Namespace(**done["strategies"][k]["args"]) for k in every}
    write_and_print(table(every, per_args, land, ranking, time.perf_counter() - t0, args), args.out)


def _cap(strategy: str, args: Any) -> int:
    return {"random": args.random_cap, "gp": args.gp_cap}.get(strategy.split(" (")[0], args.cap)


def _command(a: Any) -> str:
    return (f"PYTHONPATH=. .venv/bin/python bench/replay.py --seeds {a.seeds} --cap {a.cap} --random-cap "
            f"{a.random_cap} --gp-cap {a.gp_cap} --budget {a.budget}" + (f" --gp-seeds {a.gp_seeds}" if a.gp_seeds
                                                                         else "") + f" --strategies {a.strategies}"
            + (f" --set {' '.join(a.set)}" if getattr(a, "set", None) else "")
            + (f" --profile-cluster {a.profile_cluster} --profile-calibration {a.profile_calibration}"
               if "guided_profile" in a.strategies.split(",") else "")
            + "".join(f" --{k} {_rel(getattr(a, k))}" for k in ("landscape", "out")
                      if getattr(a, k, None) and not getattr(a, k).endswith(("landscape_default.json",
                                                                             "replay_default.md"))))


def _rel(path: str) -> str:
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def table(results: dict[str, list[SeedResult]], per_args: dict[str, Any], land: Landscape, ranking: Any,
          wall: float, args: Any) -> str:
    usable = [r for r in land.rows.values() if Landscape.usable(r)]
    n2 = sum(land.within(r["key"], 0.02) for r in usable)
    n5 = sum(land.within(r["key"], 0.05) for r in usable)
    spreads = [r["spread_rel"] for r in usable if r.get("spread_rel") is not None]
    best = land.rows[land.best_key]
    ref = land.doc.get("refined") or {}
    n_runs = [len(r["step_time_samples_s"]) for r in usable]
    m = land.doc["machine"]
    lines = [
        "# Samplers replayed against the measured landscape", "",
        "Commands (each adds its strategies to the table; results per strategy in "
        f"`{Path(args.out).with_suffix('.json').name}`):", "",
        *sorted({f"    {_command(a)}" for a in per_args.values()}), "",
        f"(this invocation: {wall:.0f} s)", "",
        f"Landscape: `{Path(args.landscape).name}` ({land.doc['space']} space, {len(land.rows)} configs, "
        f"{len(usable)} of them measured and usable, {min(n_runs)}-{max(n_runs)} runs each (asked: "
        f"{land.doc['repeats']}), measured {str(land.doc.get('first_run_at') or land.doc['started_at'])[:16]} to "
        f"{str(land.doc.get('last_run_at') or '')[:16]} UTC on {m['cpu']}, {m['cpus']} CPUs, "
        f"shared with other jobs); {land.doc['discretised']} discretised. "
        + (f"Refined: the {len(ref['ratio']) - 1} fastest configs and the baseline re-measured in "
           f"{land.refined_rounds} interleaved rounds ({str(ref.get('started_at', ''))[:16]} UTC); a config's truth "
           f"is its paired ratio to the baseline there (geometric mean over the rounds), others' their median over the baseline's. "
           if ref else "Truth: each config's median (no refinement). ")
        + f"True best: `{best['key']}` (its median {best['median_s'] * 1e3:.1f} ms, truth {land.best:.4g}). "
        f"Configs within 2% of it: {n2}; within 5%: {n5} "
        f"(of {len(usable)} usable). " + (f"Median spread (max - min) / median of a config's runs: "
                                          f"{100 * statistics.median(spreads):.0f}%." if spreads else
                                          "No config has 2 runs: each replayed trial of a config draws the same "
                                          "value, so this replay carries no run-to-run noise."), "",
        "Runs count real runs, the baseline included; a repeated proposal, or a config the landscape lacks, costs "
        "none. Caps (trials) as in the commands; a seed that did not get there counts as cap + 1.", "",
        f"| strategy (seeds) | runs to 2%: median | p90 | runs to 5%: median | p90 | winner within 2% after "
        f"{args.budget} "
        f"trials: fastest sample | settled answer's winner | every member of its tie set | (every member: within "
        f"5%) | ties declared | its settling runs (mean) | planner abs error, first 5 runs -> last 5 (median %) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, rs in results.items():
        cap = _cap(name, per_args[name])
        r2, r5 = [r.reach[0.02] for r in rs], [r.reach[0.05] for r in rs]
        errs = [r.planner_err for r in rs if r.planner_err]
        trend = (f"{statistics.median(e for r in errs for e in r[:5]):.0f} -> "
                 f"{statistics.median(e for r in errs for e in r[-5:]):.0f}") if errs else "-"
        lines.append(f"| {name} ({len(rs)}) | {pct(r2, 50, cap)} | {pct(r2, 90, cap)} | {pct(r5, 50, cap)} | {pct(r5, 90, cap)} | "
                     f"{100 * np.mean([r.winner_best_sample for r in rs]):.0f}% | "
                     f"{100 * np.mean([r.answer_winner for r in rs]):.0f}% | "
                     f"{100 * np.mean([r.winner_noise_aware for r in rs]):.0f}% | "
                     f"{100 * np.mean([r.winner_noise_aware_5 for r in rs]):.0f}% | "
                     f"{100 * np.mean([r.tie for r in rs]):.0f}% | "
                     f"{np.mean([r.extra_runs for r in rs]):.1f} | {trend} |")
    ceiling = {f: resolution(land, f) for f in (0.02, 0.05)}
    lines += ["", f"**The landscape's own resolution.** Measuring every one of the {len(usable)} configs afresh, 3 runs "
              f"each drawn from its stored runs, and naming the best median finds a config truly within 2% of the "
              f"true best in {100 * ceiling[0.02]:.0f}% of 2000 draws, within 5% in {100 * ceiling[0.05]:.0f}% "
              f"(`resolution()`): no sampler or winner rule judged against this landscape's medians can be expected "
              f"to do much better with 3-run medians."]
    if land.refined_rounds:
        at = {n: refined_resolution(land, 0.02, n) for n in (4, 8, 16, 32)}
        lines += ["", f"**At the refined truth's resolution.** Ranking the {len(land.refined) - 1} refined configs by "
                  f"their geometric means over n rounds drawn from the refinement's {land.refined_rounds} (every config "
                  f"measured n times, no search) names one truly within 2% of the true best in "
                  + ", ".join(f"{100 * v:.0f}% at n = {n}" for n, v in at.items())
                  + f" (`refined_resolution()`): the ceiling of a settled answer that spends that many rounds; "
                  f"a declared tie is right only if all its members are within 2%, which is harder still."]
    missing = len(ranking.not_modelled)
    lines += ["", (f"The planner does not model {missing} of {len(ranking.candidates)} configs "
                   f"({next(iter(ranking.not_modelled.values()))}); guided search leaves those to TPE." if missing
                   else f"The planner models all {len(ranking.candidates)} configs (since it prices model chunks "
                        f"of unequal size; before, the 16 interleaved ones with unequal chunks per rank were left "
                        f"to TPE)."), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
