"""Calibrate the planner to a real sweep: fit its efficiency parameters to the trials in a ledger; the calibration
file's one writer and reader.

``calibrate_from_ledger`` reads ``results/<sweep>/trials.jsonl``, maps each measured trial's trainer config
onto the planner (``orchestrator.calibration.prefilter.plan_for_trial``), and hands the pairs to
``orchestrator.planner.calibrate``; ``format_calibration`` prints the error per metric before and after;
``write_calibration`` / ``load_calibration`` store the fitted efficiency as YAML a sweep's ``prefilter:``
section points to; ``load_uncertainty`` reads a file's ``uncertainty:`` section (how sure the fit is: its
bootstrap replicates and residuals), which ``plan`` and the model backend turn into each prediction's interval.
``calibrate_main`` is the command line (``python -m orchestrator calibrate``).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import yaml

from orchestrator.commands import steptune
from orchestrator.planner import Calibration, ClusterSpec, Efficiency, calibrate
from orchestrator.planner.calibrate import BOUNDS, TRAINER_PHASES, trainer_phase_metrics
from orchestrator.planner.uncertainty import Uncertainty
from orchestrator.records.ledger import read_records
from orchestrator.records.record import TrialRecord
from trainer.knobs import FsdpDP
from trainer.measure.result import Result

METRICS = ("step_time_s", "peak_memory_bytes") + tuple(TRAINER_PHASES.values())
CPU_FIT = ("matmul_eff", "attention_eff", "op_overhead_us", "pp_bw_eff", "dp_bw_eff",
           "optimizer_bw_eff", "mem_activation_factor")
"""Fitted by default: what trials on one host can tell apart. Tensor parallelism is never used by the
trainer (tp_bw_eff stays as given), and the CPU memory measurement has no runtime overhead to
fit (mem_reserved_gb). gemm_tokens_half trades off against matmul_eff unless the sweep varied the
microbatch size widely; add it with ``fit=``."""


FSDP_NOT_FITTED = ("data_parallel.kind=fsdp at dp > 1: the trainer times FSDP's all-gathers and reduce-scatters "
                   "inside its forward and backward phases, which the planner prices apart (dp_exposed_s); not fitted")
"""Why a measured FSDP trial is left out of a calibration."""


@dataclass(frozen=True)
class LedgerCalibration(Calibration):
    """A planner ``Calibration`` plus where its records came from and which lines were left out."""

    ledger: str = ""
    used_trials: tuple[int, ...] = ()
    skipped: tuple[tuple[int, str], ...] = ()
    """(trial, why) for measured lines that could not be used (a config the planner cannot represent)."""


def ledger_records(lines: Sequence[TrialRecord], cluster: ClusterSpec, efficiency: Efficiency | None = None,
                   statuses: Sequence[str] = ("ok",), metrics: Sequence[str] = METRICS,
                   to_plan: Any = None) -> tuple[list[dict[str, Any]], list[int], list[tuple[int, str]]]:
    """Calibration records from a ledger's trial records: the measured ones (a real run's result) of the given
    statuses; predictions and reused measurements are left out by what they are, not by backend name.
    ``to_plan(trial config, cluster, efficiency)``: how a trial's config maps onto the planner (default the trainer's
    own, ``prefilter.plan_for_trial``; a command sweep's declared model, ``command_planner``).

    Returns (records, their trial numbers, (trial, why) for records that were measured but not usable).
    """
    from orchestrator.calibration.prefilter import plan_for_trial
    from trainer.config import TrainConfig

    plan_for_trial = to_plan or plan_for_trial

    records, used, skipped = [], [], []
    for line in lines:
        if not line.measured or line.status.value not in statuses:
            continue
        trial = line.trial
        try:
            train_cfg = TrainConfig.from_dict(line.config)
            plan = plan_for_trial(train_cfg, cluster, efficiency)
        except ValueError as e:
            skipped.append((trial, str(e)))
            continue
        if isinstance(train_cfg.data_parallel, FsdpDP) and train_cfg.parallel.dp > 1:
            skipped.append((trial, FSDP_NOT_FITTED))
            continue
        measured = {k: v for k, v in measured_metrics(line.result, train_cfg.tensor_parallel.size > 1).items()
                    if k in metrics}
        # With nothing to reduce or no pipeline the planner predicts exactly 0 for these, while the trainer
        # times the empty call: fitting that is fitting noise.
        if plan.parallel.dp == 1:
            measured.pop("dp_exposed_s", None)
        if plan.parallel.pp == 1:
            measured.pop("pp_idle_s", None)
        if measured:
            records.append({"config": plan, "measured": measured})
            used.append(trial)
    return records, used, skipped


def measured_metrics(result: Result, tensor_parallel: bool) -> dict[str, float]:
    """A trainer result as the planner's metric names; ``tensor_parallel``: the run had tp > 1 (its compute
    phases hold TP communication, so they are left out: planner.calibrate.NESTED_IN_TP)."""
    out = {k: float(getattr(result.summary, k)) for k in ("step_time_s", "peak_memory_bytes")
           if getattr(result.summary, k)}
    return {**out, **trainer_phase_metrics(result.phases, tensor_parallel)}


def calibrate_from_ledger(ledger_path: str | Path, cluster: ClusterSpec, efficiency: Efficiency | None = None,
                          fit: Sequence[str] | None = None, statuses: Sequence[str] = ("ok",),
                          metrics: Sequence[str] = METRICS, prior_weight: float | None = None) -> LedgerCalibration:
    """Fit ``fit`` (default ``CPU_FIT``) to a sweep's measured trials, starting from ``efficiency``.

    Only measured records (a real run's result) with a status in ``statuses`` are used; add "infeasible" (measured,
    then rejected by parity or the memory budget) and "pruned" (a probe's few updates) for more points:
    their timings and memory are real measurements too. ValueError if nothing usable is left.
    """
    path = Path(ledger_path)
    if not path.is_file():
        raise ValueError(f"{path}: no ledger here (run the sweep first, or check --sweep / --results-dir)")
    records, used, skipped = ledger_records(read_records(path), cluster, efficiency, statuses, metrics)
    if not records:
        why = f"; {len(skipped)} could not be mapped, first: trial {skipped[0][0]}: {skipped[0][1]}" if skipped else ""
        raise ValueError(f"{path}: no measured trial with status {' or '.join(statuses)}{why}")
    base = dataclasses.replace(records[0]["config"], efficiency=efficiency or records[0]["config"].efficiency)
    kwargs = {} if prior_weight is None else {"prior_weight": prior_weight}
    cal = calibrate(records, base, fit=tuple(fit or CPU_FIT), **kwargs)
    return LedgerCalibration(**{f.name: getattr(cal, f.name) for f in dataclasses.fields(Calibration)},
                             ledger=str(path), used_trials=tuple(used), skipped=tuple(skipped))


def format_calibration(cal: Calibration) -> str:
    """The fit as a table: per metric, trials, mean and max |error| before and after, then the parameters."""
    rows = [("metric", "n", "mean |err| before", "mean |err| after", "max |err| after")]
    for name, after in cal.errors_after.items():
        before = cal.errors_before.get(name, {})
        rows.append((name, str(after["n"]), f"{before.get('mean_abs_pct', float('nan')):.1f}%",
                     f"{after['mean_abs_pct']:.1f}%", f"{after['max_abs_pct']:.1f}%"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]]
    lines.append("")
    lines.append(f"fitted ({cal.n_records} trials, {cal.solver}): "
                 + ", ".join(f"{k} = {v:.4g}" for k, v in cal.fitted.items()))
    for trial, why in getattr(cal, "skipped", ()):
        lines.append(f"not used: trial {trial}: {why}")
    return "\n".join(lines)


def write_calibration(cal: Calibration, path: str | Path, cluster_file: str | None = None,
                      provenance: Mapping[str, Any] | None = None, header: str | None = None,
                      uncertainty: Any = None) -> Path:
    """The calibrated efficiency as YAML (``efficiency:`` is what ``load_calibration`` reads back, ``uncertainty:``
    what ``load_uncertainty`` does).

    ``provenance`` (``steptune profile``: basis, hardware, shapes) is for people, like a cluster file's;
    ``uncertainty`` (a ``planner.uncertainty.Uncertainty``: the fit's bootstrap replicates and residuals) gives every
    prediction made with the file its interval."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "efficiency": dataclasses.asdict(cal.efficiency),
        "calibration": {
            "ledger": getattr(cal, "ledger", None), "cluster": cluster_file, "n_records": cal.n_records,
            "trials": list(getattr(cal, "used_trials", ())), "solver": cal.solver, "fitted": cal.fitted,
            "mean_abs_error_pct": {k: {"before": cal.errors_before.get(k, {}).get("mean_abs_pct"),
                                       "after": v["mean_abs_pct"], "max_after": v["max_abs_pct"], "n": v["n"]}
                                   for k, v in cal.errors_after.items()},
            "not_used": [{"trial": t, "why": w} for t, w in getattr(cal, "skipped", ())],
        },
    }
    if uncertainty is not None:
        doc["uncertainty"] = uncertainty.to_dict()
    if provenance is not None:
        doc["provenance"] = dict(provenance)
    header = header or ("# Planner efficiency fitted by `python -m orchestrator calibrate` to a sweep's measured "
                        "trials.\n# Point a sweep's prefilter.calibration here; only the efficiency: section is "
                        "read back.\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return path


def load_calibration(path: str | Path) -> Efficiency:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such calibration file (write one with {steptune()} calibrate)")
    data = yaml.safe_load(path.read_text()) or {}
    eff = data.get("efficiency") if isinstance(data, Mapping) else None
    if not isinstance(eff, Mapping):
        raise ValueError(f"{path}: expected an efficiency: mapping")
    names = {f.name for f in dataclasses.fields(Efficiency)}
    unknown = sorted(set(eff) - names)
    if unknown:
        raise ValueError(f"{path}: efficiency.{unknown[0]}: unknown field; known: {', '.join(sorted(names))}")
    try:
        return Efficiency(**eff)
    except ValueError as e:
        raise ValueError(f"{path}: efficiency.{e}") from None


def load_uncertainty(path: str | Path) -> Uncertainty | None:
    """A calibration file's ``uncertainty:`` section (``Uncertainty.to_dict()``: level, basis, samples,
    residuals), or None when the file has none. Every replicate must make a valid efficiency set with the file's
    ``efficiency:``; a ValueError names the file and the field otherwise."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such calibration file (write one with {steptune()} calibrate)")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, Mapping):
        raise ValueError(f"{path}: expected a mapping")
    if data.get("uncertainty") is None:
        return None
    u = Uncertainty.from_dict(data["uncertainty"], f"{path}: uncertainty")
    point = load_calibration(path)
    for i, s in enumerate(u.samples):
        for name, value in s.items():
            try:
                dataclasses.replace(point, **{name: value})
            except ValueError as e:
                raise ValueError(f"{path}: uncertainty.samples[{i}].{name}: {e}") from None
    return u


# ---- command line ------------------------------------------------------------------------------

DEFAULT_CLUSTER = "search_spaces/clusters/cpu-local.yaml"


def add_calibrate_arguments(p: argparse.ArgumentParser) -> None:
    """calibrate's own flags (``steptune calibrate`` adds the shared --sweep and --results-dir)."""
    p.add_argument("--cluster", default=DEFAULT_CLUSTER, metavar="FILE",
                   help=f"cluster file (default: {DEFAULT_CLUSTER})")
    p.add_argument("--out", metavar="FILE",
                   help="write the calibrated efficiency here (default: RESULTS_DIR/NAME/calibration.yaml)")
    p.add_argument("--fit", metavar="FIELDS",
                   help=f"comma-separated efficiency fields to fit (default: {','.join(CPU_FIT)})")
    p.add_argument("--include", default="ok", metavar="STATUSES",
                   help="comma-separated ledger statuses to use (default: ok; e.g. ok,infeasible,pruned)")


def run_calibrate(args: argparse.Namespace) -> int:
    """Fit, print and write; a ValueError names the flag or file that is wrong."""
    from orchestrator.calibration.prefilter import load_cluster

    fit = [f.strip() for f in args.fit.split(",") if f.strip()] if args.fit else None
    for name in fit or ():
        if name not in BOUNDS:
            raise ValueError(f"--fit: {name!r} is not fittable; choose from {', '.join(BOUNDS)}")
    cluster, prior = load_cluster(args.cluster)
    ledger = Path(args.results_dir) / args.sweep / "trials.jsonl"
    cal = calibrate_from_ledger(ledger, cluster, prior, fit=fit,
                                statuses=tuple(s.strip() for s in args.include.split(",") if s.strip()))
    print(f"calibrated the planner on {cal.n_records} measured trials of {ledger} ({args.cluster})")
    print()
    print(format_calibration(cal))
    out = Path(args.out) if args.out else Path(args.results_dir) / args.sweep / "calibration.yaml"
    write_calibration(cal, out, cluster_file=args.cluster)
    print()
    print(f"wrote {out}; use it in a sweep file:")
    print(f"  prefilter: {{enabled: true, cluster: {args.cluster}, calibration: {out}, memory_budget_gb: <GiB>}}")
    return 0


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """``calibrate --sweep NAME [--results-dir results] [--cluster FILE] [--out FILE.yaml] [...]``."""
    p = argparse.ArgumentParser(prog="steptune calibrate",
                                description="fit the planner's efficiency parameters to a sweep's measured trials")
    p.add_argument("--sweep", default="default", help="sweep name (default: default)")
    p.add_argument("--results-dir", "--results", dest="results_dir", default="results",
                   help="results directory (default: results)")
    add_calibrate_arguments(p)
    try:
        return run_calibrate(p.parse_args(argv))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

if __name__ == "__main__":
    raise SystemExit(calibrate_main())
