"""Slices -> the planner's efficiency: one joint fit of the compute, data-parallel and pipeline slices, of only what
the slices pin down, each fitted parameter with its bootstrap interval over the rounds.

* **Measurements per role** (``ROLE_METRICS``). Every slice's step time (the slowest rank's median update: what a
  trial's figure is); a compute slice's forward, backward (recompute included), optimizer and data-parallel
  phases and its peak memory; a data-parallel slice's wait for its buckets. A pipeline slice gives its step time
  alone: its ranks' other phases hold the waits for each other that the planner counts as the fill and drain.
  At tp > 1 the measured TP collectives are swapped for the cluster file's price (netcal measures the network;
  the compute efficiencies must not soak it up), and the compute phases, which hold them, are left out.
* **Identified first** (``planner.identify``): of ``CANDIDATES`` (in priority order), those the slices cannot see
  or cannot tell from a higher-priority one stay at the prior, each named with the reason. The identification is
  made at a first, lightly regularised fit of every candidate, where the model's slopes are the data's, not the
  prior's (a prior of no per-bucket latency would make every latency look invisible).
* **Fitted** on each slice's median run (a real run: its phases and memory belong together).
* **Bootstrap over the rounds** (``stability.round_resamples``): the rounds are resampled with replacement, the
  same draw for every slice (what a round shares stays together), each slice's median run of the drawn rounds
  refitted; the replicates and the fit's residuals are the ``Uncertainty`` every prediction inherits.
* **Pinned or not** (``stability.unpinned``): a fitted parameter whose 90% interval is wider than ``PIN`` of its
  value names the slice that weighs on it most and the rounds that would pin it.

Pure: the runs are handed in (``orchestrator.calibration.profile`` and ``bench/slice_proof.py`` run them).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from orchestrator.calibration.slices import Slice
from orchestrator.calibration.stability import Unpinned, median_run, round_resamples, unpinned
from orchestrator.planner import Calibration, ClusterSpec, Efficiency, calibrate
from orchestrator.planner.identify import Identified, identify
from orchestrator.planner.uncertainty import Uncertainty

CANDIDATES = ("matmul_eff", "op_overhead_us", "pass_overhead_us", "optimizer_tensor_us", "step_overhead_us",
              "optimizer_bw_eff", "dp_latency_us", "dp_bw_eff", "dp_overlap_eff", "pp_latency_us",
              "gemm_tokens_half", "flash_attention_eff", "elementwise_bw_eff", "mem_activation_factor")
"""What slices may fit, in priority order: the GEMM efficiency and the fixed costs per layer, per pass, per tensor
and per update first, then the communication terms, then refinements (the GEMM half-size, attention, elementwise)
that a single layer shape can rarely tell from the GEMM efficiency. The network's bandwidth efficiencies of TP
and pipeline sends are the cluster file's (``steptune netcal``); the data-parallel ones are fitted because the
trainer's buckets pay a hook, a dispatch and a rendezvous besides the link."""
ROLE_METRICS = {
    "compute": ("step_time_s", "forward_s", "backward_incl_recompute_s", "optimizer_s", "dp_exposed_s",
                "peak_memory_bytes"),
    "dp": ("step_time_s", "dp_exposed_s"),
    "pp": ("step_time_s",),
}
"""The planner's figures each role of slice is fitted on (module docstring)."""
PRIOR_WEIGHT = 0.01
"""The pull towards the prior in the final fit (calibrate's default): the identified parameters need none."""
FIRST_PASS_WEIGHT = 0.1
"""The pull in the first fit of every candidate, made only to find where the model's slopes are."""


@dataclass(frozen=True)
class SliceRow:
    """One slice as fitted: its median run's step time and the fitted planner's."""

    name: str
    role: str
    runs: int
    measured_step_s: float
    fitted_step_s: float
    low_s: float = 0.0
    high_s: float = 0.0
    """The fitted step time's 90% interval for a measurement of the slice's rounds (``uncertainty.intervals``)."""

    @property
    def error_pct(self) -> float:
        return 100.0 * (self.fitted_step_s / self.measured_step_s - 1.0)


@dataclass(frozen=True)
class SliceFit:
    efficiency: Efficiency
    """The prior with the identified parameters fitted."""
    calibration: Calibration
    """The final fit (errors before and after, per metric)."""
    identified: Identified
    """What was fitted, and why the rest was held."""
    uncertainty: Uncertainty
    """Bootstrap replicates over the rounds and the fit's residuals: every prediction's interval."""
    rows: tuple[SliceRow, ...]
    unpinned: tuple[Unpinned, ...]
    """Fitted parameters whose interval is too wide, each with the slice to measure more and the rounds needed."""
    tp_comm: tuple[tuple[str, float, float], ...] = ()
    """(slice, measured TP communication, the planner's from the cluster file) at tp > 1."""

    @property
    def fitted(self) -> dict[str, float]:
        return dict(self.calibration.fitted)

    def interval(self, name: str) -> tuple[float, float]:
        iv = self.uncertainty.field_interval(name, self.fitted[name])
        return iv.low, iv.high


def slice_records(slices: Sequence[Slice], results: Sequence[Any], cluster: ClusterSpec, prior: Efficiency
                  ) -> tuple[list[dict[str, Any]], list[str], list[tuple[str, float, float]]]:
    """(calibrate's records, a label per residual in calibrate's order, the TP rows) of the slices' results."""
    from orchestrator.calibration.ledger_fit import measured_metrics
    from orchestrator.calibration.prefilter import plan_for_trial
    from orchestrator.planner.calibrate import _evaluate
    from orchestrator.planner.knobs import encode

    records, labels, tp_rows = [], [], []
    for s, result in zip(slices, results):
        plan = plan_for_trial(s.config, cluster, prior)
        tp = s.config.tensor_parallel.size > 1
        got = measured_metrics(result, tp)
        measured = {k: got[k] for k in ROLE_METRICS[s.role] if k in got}
        if tp:
            # The measured TP collectives are this node's links, priced by the cluster file (netcal): swap them
            # for the planner's own figure so the compute efficiencies cannot soak them up.
            tp_meas, tp_pred = got.get("tp_comm_s", 0.0), _evaluate(plan, encode([plan]), prior)["tp_comm_s"]
            measured["step_time_s"] = measured["step_time_s"] + tp_pred - tp_meas
            tp_rows.append((s.name, tp_meas, tp_pred))
        records.append({"config": plan, "measured": measured})
        labels += [f"{s.name}: {k}" for k in measured]
    return records, labels, tp_rows


def _start(prior: Efficiency) -> Efficiency:
    """The prior with a number wherever the fit needs one to start from (None reads as 'priced from the link')."""
    fixes = {}
    if prior.flash_attention_eff is None:
        fixes["flash_attention_eff"] = prior.attention_eff
    for name in ("dp_latency_us", "pp_latency_us"):
        if getattr(prior, name) is None:
            fixes[name] = 0.0
    return dataclasses.replace(prior, **fixes)


def fit(slices: Sequence[Slice], runs: Mapping[str, Mapping[int, Any]], cluster: ClusterSpec, prior: Efficiency,
        candidates: Sequence[str] = CANDIDATES, n_boot: int = 40, seed: int = 0) -> SliceFit:
    """Identify, fit and bootstrap (module docstring). ``runs``: slice name -> round -> its trainer Result (a slice
    may miss rounds). ValueError when no slice ran or nothing is identifiable."""
    ran = [s for s in slices if runs.get(s.name)]
    if not ran:
        raise ValueError("no slice ran to the end: nothing to fit")
    medians = [median_run(list(runs[s.name].values())) for s in ran]
    start = _start(prior)
    records, labels, tp_rows = slice_records(ran, medians, cluster, start)
    base = dataclasses.replace(records[0]["config"], efficiency=start)
    first = calibrate(records, base, fit=tuple(candidates), prior_weight=FIRST_PASS_WEIGHT).efficiency
    ident = identify(records, dataclasses.replace(base, efficiency=first), candidates, labels)
    if not ident.fit:
        raise ValueError("the slices pin down none of the planner's parameters: " + "; ".join(
            f"{k}: {v}" for k, v in ident.held.items()))
    cal = calibrate(records, base, fit=ident.fit, prior_weight=PRIOR_WEIGHT)
    eff = cal.efficiency
    samples = []
    for drawn in round_resamples(runs, n_boot, seed):
        picked = [median_run(drawn[s.name]) for s in ran]
        recs, _, _ = slice_records(ran, picked, cluster, start)
        samples.append(calibrate(recs, dataclasses.replace(base, efficiency=eff), fit=ident.fit, tol=1e-8,
                                 prior_weight=PRIOR_WEIGHT).fitted)
    residuals = _residuals(records, eff)
    u = Uncertainty(tuple(samples), residuals, basis=f"bootstrap over the rounds of {len(ran)} slices "
                    f"({max(len(v) for v in runs.values())} rounds), {n_boot} refits; the fit's residuals",
                    run_sd=run_sd(runs))
    from orchestrator.planner.uncertainty import intervals

    rows = tuple(SliceRow(s.name, s.role, len(runs[s.name]), float(r["measured"]["step_time_s"]), iv.point, iv.low,
                          iv.high)
                 for s, r in zip(ran, records)
                 for iv in [intervals([r["config"]], eff, u, runs=len(runs[s.name]))[0]["step_time_s"]])
    loose = unpinned(cal.fitted, u, ident, {s.name: len(runs[s.name]) for s in ran})
    return SliceFit(eff, cal, ident, u, rows, loose, tuple(tp_rows))


def run_sd(runs: Mapping[str, Mapping[int, Any]]) -> float:
    """The standard deviation of log(step time) of one run around its slice's level: per slice over its rounds, the
    median over slices (of those with 3 or more runs; 0 when none has)."""
    sds = [statistics.stdev(math.log(float(r.summary.step_time_s)) for r in v.values())
           for v in runs.values() if len(v) >= 3]
    return statistics.median(sds) if sds else 0.0


def _residuals(records: Sequence[Mapping[str, Any]], eff: Efficiency) -> dict[str, tuple[float, ...]]:
    """log(measured / predicted) per metric of the point fit (times only: memory has its own factor)."""
    from orchestrator.planner.calibrate import _evaluate
    from orchestrator.planner.knobs import encode

    out: dict[str, list[float]] = {}
    for r in records:
        p = _evaluate(r["config"], encode([r["config"]]), eff)
        for k, v in r["measured"].items():
            if k.endswith("_s") and v > 0 and p.get(k, 0) > 0 and v > 0.02 * r["measured"]["step_time_s"]:
                out.setdefault(_metric_name(k), []).append(math.log(v / p[k]))
    return {k: tuple(v) for k, v in out.items()}


def _metric_name(k: str) -> str:
    """A fitted metric as an ``uncertainty.PHASES`` name (the backward with its recompute is the backward's)."""
    return "backward_s" if k == "backward_incl_recompute_s" else k


def format_fit(f: SliceFit) -> str:
    """The fit in a few lines: the slices, what was fitted with its interval, what was held and why."""
    w = max(len(r.name) for r in f.rows)
    lines = [f"{'slice':<{w}}  {'role':<7}  {'runs':>4}  {'measured ms':>11}  {'fitted ms':>9}  {'90% interval':>15}  "
             f"{'error':>6}"]
    lines += [f"{r.name:<{w}}  {r.role:<7}  {r.runs:4d}  {1e3 * r.measured_step_s:11.2f}  {1e3 * r.fitted_step_s:9.2f}"
              f"  {f'{1e3 * r.low_s:.1f}-{1e3 * r.high_s:.1f}':>15}  {r.error_pct:+5.1f}%" for r in f.rows]
    lines.append("fitted (90% interval over the rounds): " + ", ".join(
        f"{k} = {v:.4g} ({f.interval(k)[0]:.4g}-{f.interval(k)[1]:.4g})" for k, v in f.fitted.items()))
    lines += [f"held at the prior: {k} = {getattr(f.efficiency, k)}: {why}" for k, why in f.identified.held.items()]
    lines += [f"not pinned down: {u.text()}" for u in f.unpinned]
    return "\n".join(lines)


def median_abs_error_pct(rows: Sequence[SliceRow]) -> float:
    return statistics.median(abs(r.error_pct) for r in rows)
