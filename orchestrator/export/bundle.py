"""Export a sweep's winner (or a chosen trial) for production training.

Reads the ledger (``results/<sweep>/trials.jsonl``, the source of truth) and writes three files:

- ``trainer.yaml``: the trial's resolved TrainConfig; ``python -m trainer --config trainer.yaml`` runs it
  as is, with exactly the trial's settings;
- ``megatron_args.txt``: the same settings as Megatron-LM flags (orchestrator/frameworks/megatron_flags.py);
- ``summary.md``: measured numbers vs the baseline, the parity verdict, the MLflow run id, and every
  knob Megatron cannot take, by name.

A trial that did not finish or failed parity is refused with the reason unless forced: shipping a
config that changes what the model learns is the one mistake this tool exists to prevent.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import yaml

from orchestrator.commands import steptune
from orchestrator.records import query as Q
from orchestrator.records import answer as A
from orchestrator.review.report import secs
from orchestrator.sweep.config import load_saved_sweep
from orchestrator.calibration.verdict import verdict as plan_verdict, verdict_lines
from orchestrator.frameworks.megatron_flags import format_args, megatron_args, megatron_args_for_plan
from orchestrator.records.ledger import read_records
from orchestrator.records.record import Kind, ParityVerdict, Status, TrialRecord
from trainer.config import TrainConfig, flatten


def find_ledger(results_dir: Path, sweep: str | None = None) -> Path:
    """``<results_dir>/<sweep>/trials.jsonl``; without a sweep name, the most recently written ledger."""
    results_dir = Path(results_dir)
    if sweep:
        path = results_dir / sweep / "trials.jsonl"
        if not path.is_file():
            known = sorted(p.parent.name for p in results_dir.glob("*/trials.jsonl"))
            raise ValueError(f"no ledger for sweep {sweep!r} at {path}; sweeps with a ledger: {known or 'none'}")
        return path
    ledgers = sorted(results_dir.glob("*/trials.jsonl"), key=lambda p: p.stat().st_mtime)
    if not ledgers:
        raise ValueError(f"no sweep ledger under {results_dir}/ (run `{steptune()} sweep` first)")
    return ledgers[-1]


def read_ledger(path: Path) -> list[TrialRecord]:
    """The ledger's records (a torn last line is skipped, a corrupt one raises), baseline/trial/confirm only:
    a canonical reference run is no candidate for export."""
    if not Path(path).is_file():
        raise ValueError(f"no ledger at {path}")
    return [r for r in read_records(path) if r.kind is not Kind.CANONICAL]


def refusal(record: TrialRecord) -> str | None:
    """Why this record must not be exported unforced; None when it may be."""
    name = f"trial {record.trial} ({record.kind.value})"
    parity = record.parity
    # Parity first: the sweep marks a parity failure as status infeasible, and this is the reason to give.
    if parity is not None and not parity.passed:
        return f"{name} failed parity: {_parity_failure(parity)}: it does not learn what the baseline learns"
    status, reason = record.status, record.reason
    if status is not Status.OK:
        what = "is infeasible" if status is Status.INFEASIBLE else f"did not finish: status {status.value}"
        return f"{name} {what}" + (f": {reason}" if reason else "")
    if parity is None and record.kind is not Kind.BASELINE and not record.predicted:
        # (The baseline is the parity reference itself; a cost-model prediction has no run to compare.)
        return f"{name} has no parity verdict: it was not checked against the baseline"
    return None


_METRIC = {"loss": ("loss", "max_loss_rel_diff", "loss_rel"),
           "grad_norm": ("grad norm", "max_grad_norm_rel_diff", "grad_norm_rel"),
           "parameters": ("final parameters", "max_fingerprint_rel_diff", "param_rel"),
           "replicas": ("data-parallel replicas", "replica_max_abs_diff", "replica_abs")}
"""first_fail_metric -> (what to call it, the verdict's worst difference of it, its tolerance's field)."""


def _parity_failure(parity: ParityVerdict) -> str:
    """The metric that failed, its step, its difference and that metric's own tolerance (not the loss's)."""
    metric = str(parity.first_fail_metric)
    label, worst, tol_key = _METRIC.get(metric.split(" (")[0], (metric, None, None))
    if metric.startswith("parameters ("):
        label += metric[len("parameters"):]
    # Ledger lines from before first_fail_diff existed: the worst difference of the failing metric.
    diff = parity.first_fail_diff if parity.first_fail_diff is not None else (
        getattr(parity, worst) if worst else None)
    allowed = parity.first_fail_tolerance if parity.first_fail_tolerance is not None else (
        getattr(parity.tolerance, tol_key) if tol_key and parity.tolerance is not None else None)
    numbers = f" (difference {_g(diff)}, tolerance {_g(allowed)})" if diff is not None and allowed is not None else ""
    return f"{label} differs at step {parity.first_fail_step}{numbers}"


def step_time(record: TrialRecord) -> float | None:
    return record.metrics.step_time_s


def pick(records: list[TrialRecord], trial: int | None, force: bool,
         answer: A.Answer | None = None) -> tuple[TrialRecord, str | None]:
    """(record, forced-despite reason). Without ``trial``: the answer's winner (orchestrator.records.answer, the
    one decision the sweep's summary, table and MLflow name), whose runs all passed parity."""
    if trial is None:
        best = (answer or A.decide(records, _saved_target(None))).winner
        if best is None:
            raise ValueError("no trial in the ledger finished with parity passed; pick one with --trial N "
                             "(and --force to export it anyway)")
        return pick(records, best.trial, force)
    mine = [r for r in records if r.trial == trial]
    if not mine:
        have = sorted({r.trial for r in records})
        raise ValueError(f"trial {trial} is not in the ledger (trials: {have})")
    # The trial's own line (baseline or trial): the config the ranking names. A confirm or re-measurement line is
    # one more run of it (its figure counts them all, below); the latest line before an older one.
    ranked = sorted(reversed(mine), key=lambda r: (refusal(r) is None, r.kind in (Kind.BASELINE, Kind.TRIAL)),
                    reverse=True)
    why = refusal(ranked[0])
    if why and not force:
        raise ValueError(f"refusing to export: {why}. Use --force to export it anyway")
    return ranked[0], why


def _saved_target(saved: Any) -> Any:
    from orchestrator.search.target import parse_target

    return saved.target if saved is not None else parse_target(None)


def ledger_answer(ledger_path: Path, records: list[TrialRecord]) -> A.Answer:
    """The answer the sweep rendered, from its ledger and the target and settling rule it ran with."""
    saved = load_saved_sweep(Path(ledger_path).parent)
    return A.decide(records, _saved_target(saved), saved.winner if saved is not None else A.RULE)


def export_trial(ledger_path: Path, trial: int | None, out_dir: Path, force: bool = False) -> list[Path]:
    records = read_ledger(ledger_path)
    answer = ledger_answer(ledger_path, records)
    record, forced = pick(records, trial, force, answer)
    head = f"# steptune export: sweep {record.sweep}, trial {record.trial} ({record.kind.value})\n"
    if record.predicted:
        # A cost-model record: its config is the planner's production-scale plan, not a trainer config.
        config = record.config or {}
        args, notes = megatron_args_for_plan(config)
        name, text = "plan.yaml", head + "# the cost model's plan this prediction is for (not a trainer config)\n"
        from orchestrator.planner.parse import upgrade_plan_dict

        par = upgrade_plan_dict(config).get("parallel") or {}
        tp = (upgrade_plan_dict(config).get("tensor_parallel") or {}).get("size", 1)
        world = f"tp {tp} x pp {par.get('pp', 1)} x dp {par.get('dp', 1)}"
        nprocs = int(tp) * int(par.get("pp", 1)) * int(par.get("dp", 1))
        run = [f"- Megatron-LM: {nprocs} GPUs ({world}); for example `torchrun --nnodes N --nproc-per-node "
               f"<GPUs per node> pretrain_gpt.py $(cat megatron_args.txt)` plus your tokenizer, data, optimizer "
               f"and schedule flags"]
    else:
        try:
            cfg = TrainConfig.from_dict(record.config)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"trial {record.trial}: its config is not a trainer config ({exc})") from exc
        config = cfg.to_dict()
        args, notes = megatron_args(cfg)
        name = "trainer.yaml"
        text = head + f"# run as is: python -m trainer --config {name}\n"
        run = ["- steptune: `python -m trainer --config trainer.yaml`",
               f"- Megatron-LM: `torchrun --nproc-per-node {cfg.world_size} pretrain_gpt.py $(cat megatron_args.txt)` "
               f"(world size = pp {cfg.parallel.pp} x dp {cfg.parallel.dp}; Megatron derives the data-parallel "
               f"size from it), plus your data and tokenizer flags"]
    command = record.extra.get("command") if isinstance(record.extra.get("command"), dict) else None
    if command is not None:  # a command-backend trial: first of all, the command exactly as it ran
        run = [f"- the command as it ran ({command.get('framework') or 'command'}): `sh command.sh` (its environment, "
               f"working directory and per-node torchrun lines)"] + run
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = Q.baseline_of(records)
    baseline = baseline if baseline is not None and baseline.status is Status.OK else None
    config_file = out_dir / name
    config_file.write_text(text + yaml.safe_dump(config, sort_keys=False))
    args_file = out_dir / "megatron_args.txt"
    args_file.write_text(format_args(args))
    summary = out_dir / "summary.md"
    run_id = mlflow_run_of(ledger_path, record)
    ranked = answer.ranked
    place = next(((i, len(ranked), s) for i, s in enumerate(ranked) if s.trial == record.trial), None)
    summary.write_text(summary_markdown(record, baseline, config, run, notes, forced, ledger_path, run_id, place,
                                        answer))
    written = [config_file, args_file, summary]
    if command is not None:  # a command-backend trial: what actually ran
        from orchestrator.frameworks.adapters import what_ran

        for fname, body in what_ran(command, record.extra.get("framework_log")).items():
            (out_dir / fname).write_text(body)
            written.append(out_dir / fname)
    return written


def mlflow_run_of(ledger_path: Path, record: TrialRecord) -> str | None:
    """The trial's MLflow run id, from the store the sweep logged to (the sweep config saved beside the ledger)."""
    sweep = load_saved_sweep(Path(ledger_path).parent)
    if sweep is not None and not sweep.tracking.enabled:
        return None
    from orchestrator.review.tracking import find_trial_run, tracking_uri_for

    # The ledger lies in <results_dir>/<sweep>/: that is where the default store is, whatever the cwd was.
    uri = (sweep.storage.mlflow_uri if sweep else None) or tracking_uri_for(Path(ledger_path).parent.parent)
    # A tracking server that is down would otherwise be retried for minutes; one quick try is enough here.
    quick = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
    saved = {k: os.environ.get(k) for k in quick}
    os.environ.update(quick)
    try:
        return find_trial_run(uri, sweep.tracking.experiment if sweep else "steptune", record)
    except Exception:  # no store to ask must not cost the export; the summary says how to find the run
        return None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# (label, how to read it from a record, unit scale, format)
_ROWS = (
    ("step time (s)", lambda r: step_time(r), 1, "{:.4g}"),
    ("tokens/s", lambda r: _metric(r, "tokens_per_s"), 1, "{:,.0f}"),
    ("MFU", lambda r: _metric(r, "mfu"), 1, "{:.1%}"),
    ("HFU", lambda r: _metric(r, "hfu"), 1, "{:.1%}"),
    ("peak memory (MiB, largest rank)", lambda r: _metric(r, "peak_memory_bytes"), 2 ** -20, "{:,.1f}"),
    ("exposed dp communication (s, max rank)", lambda r: _phase(r, "dp_comm_wait"), 1, "{:.4g}"),
    ("pipeline idle (s, max rank)", lambda r: _phase(r, "pipeline_idle"), 1, "{:.4g}"),
    ("tensor-parallel communication (s, max rank)", lambda r: _phase(r, "tp_comm"), 1, "{:.4g}"),
)


def _metric(r: TrialRecord, key: str) -> float | None:
    return getattr(r.metrics, key)


# The cost model's names for the same waits (orchestrator/planner predictions).
_PREDICTED_PHASE = {"dp_comm_wait": "dp_exposed_s", "pipeline_idle": "pp_bubble_s", "tp_comm": "tp_comm_s"}


def _phase(r: TrialRecord, phase: str) -> float | None:
    if r.result is not None:
        v = (r.result.phases.get(phase) or {}).get("max")
    else:
        v = (r.prediction or {}).get(_PREDICTED_PHASE[phase])
    return v if isinstance(v, (int, float)) else None


def summary_markdown(record: TrialRecord, baseline: TrialRecord | None, config: dict[str, Any],
                     run: list[str], notes: list[str], forced: str | None, ledger_path: Path,
                     run_id: str | None = None, place: tuple[int, int, A.ConfigFigure] | None = None,
                     answer: A.Answer | None = None) -> str:
    """``place``: (index, configs ranked, its figure) in the answer's ranking (orchestrator.records.answer);
    with ``answer``, the target is judged as the sweep summary judges it."""
    standing = place[2] if place is not None else None
    target_s = answer.target.target_s if answer is not None else None
    meets = answer.meets(record.params) if answer is not None and target_s is not None else record.meets_target
    predicted = record.predicted
    what = "predicted" if predicted else "measured"
    lines = [f"# steptune export: sweep `{record.sweep}`, trial {record.trial} ({record.kind.value})", ""]
    if forced:
        lines += [f"> **Exported with --force despite:** {forced}", ""]
    if predicted:
        lines += ["> **Predicted, not measured**: these numbers come from the cost model (backend `model`); "
                  "measure the config before relying on them.", ""]
        lines += [f"- {line}" for line in verdict_lines(plan_verdict([record], None))] + [""]
    parity = record.parity
    if parity is None:
        verdict = "not applicable (the baseline is the reference)" if record.kind is Kind.BASELINE else (
            "not checked (a prediction)" if predicted else "not checked")
    elif parity.passed:
        tolerance = dataclasses.asdict(parity.tolerance) if parity.tolerance is not None else None
        verdict = (f"passed (max relative differences: loss {_g(parity.max_loss_rel_diff)}, grad norm "
                   f"{_g(parity.max_grad_norm_rel_diff)}, parameters {_g(parity.max_fingerprint_rel_diff)}; "
                   f"tolerance {tolerance})")
    else:
        verdict = f"**FAILED**: {_parity_failure(parity)}"
    lines += [
        f"- status: {record.status.value}; backend: {record.backend} ({what})",
        f"- loss parity vs baseline: {verdict}",
        f"- meets target: {_yes_no(meets)}" + (
            f" ({standing.describe()} {'<=' if meets else '>'} {secs(target_s)}"
            + (f"; the sweep's verdict on its answer: {answer.target.state})" if answer is not None else ")")
            if standing is not None and target_s is not None and not predicted else "")
        + (_interval_note(record, target_s) if predicted else ""),
        *([_place_line(*place, answer)] if place is not None else []),
        f"- MLflow run: `{run_id}`" if run_id else
        f"- MLflow run: not found in the sweep's store; in the UI filter on "
        f"`tags.\"steptune.trial\" = '{record.trial}'`",
        f"- ledger: `{ledger_path}`", "",
        f"| | baseline | this trial ({what}) | change |", "|---|---|---|---|",
    ]
    for label, get, scale, fmt in _ROWS:
        mine = get(record)
        base = get(baseline) if baseline else None
        change = f"{mine / base:.3g}x" if mine is not None and base else ""
        lines.append(f"| {label} | {_fmt(base, scale, fmt)} | {_fmt(mine, scale, fmt)} | {change} |")
    speedup = _metric(record, "speedup_vs_baseline")
    if speedup is None and baseline and step_time(baseline) and step_time(record):
        speedup = step_time(baseline) / step_time(record)
    lines += ["", f"Speedup vs baseline (baseline step time / this step time): "
                  f"{'n/a' if speedup is None else f'{speedup:.3f}x'}"
                  + ("" if baseline else " (no finished baseline line in the ledger)"), ""]
    lines += ["## Settings that differ from the baseline", ""]
    diff = _config_diff(baseline.config if baseline else None, config)
    lines += [f"- `{k}`: {_show(a)} -> **{_show(b)}**" for k, a, b in diff] or ["- none (this is the baseline's config)"]
    lines += ["", "## Run it", "", *run, "", "## Megatron-LM mapping notes", ""]
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def _place_line(i: int, n: int, standing: A.ConfigFigure, answer: A.Answer | None = None) -> str:
    lo, hi = min(standing.runs), max(standing.runs)
    tie = answer is not None and answer.tie and any(c.key == standing.key for c in answer.ties)
    paired = f", {standing.ratio:.3f} of the baseline paired over {standing.rounds} rounds" \
        if standing.rounds else ""
    return (f"- rank {i + 1} of {n} configs" + (" (the sweep's best)" if i == 0 else "") + f", by {standing.describe()}"
            + (f" [{lo * 1e3:.1f}, {hi * 1e3:.1f}] ms (the table below is this line's own run)"
               if len(standing.runs) > 1 else "") + paired
            + (f"; tied with {len(answer.ties) - 1} other config(s) that cannot be told apart (tie-break: "
               f"{A.TIE_BREAK})" if tie else ""))


def _config_diff(base: dict[str, Any] | None, mine: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    if not base:
        return []
    a, b = flatten(base), flatten(mine)
    missing = object()  # a field of an option the other config does not use (e.g. after a kind change)
    return [(k, a.get(k, missing), b.get(k, missing)) for k in sorted(set(a) | set(b))
            if a.get(k, missing) != b.get(k, missing)]


def _show(v: Any) -> str:
    if not isinstance(v, (str, int, float, bool, list, type(None))):
        return "(unset)"
    return v if isinstance(v, str) else json.dumps(v)


def _fmt(v: float | None, scale: float, fmt: str) -> str:
    return "n/a" if v is None else fmt.format(v * scale)


def _g(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else "n/a"


def _interval_note(record: TrialRecord, target_s: float | None) -> str:
    """What a predicted "meets target" rests on: the point estimate, beside the interval the prediction carries
    and that interval's verdict (the rule the sweep's answer uses: records.answer.interval_state)."""
    iv = A.predicted_interval(record)
    if iv is None:
        return ""
    low, high, level = iv
    against = f" against {target_s:.2f} s: {A.interval_state(low, high, target_s)}" if target_s is not None else ""
    return (f", at the point estimate (~{record.metrics.step_time_s:.2f} s); its {level:.0%} interval is "
            f"~{low:.2f}-{high:.2f} s{against}")


def _yes_no(v: Any) -> str:
    return "unknown" if v is None else ("yes" if v else "no")


def export_sweep(results_dir: Path, sweep: str | None = None, trial: int | None = None,
                 out_dir: Path | None = None, force: bool = False) -> list[Path]:
    """``python -m orchestrator export``: the sweep's ledger under ``results_dir``, written by default to
    ``<results_dir>/<sweep>/export/``."""
    ledger = find_ledger(results_dir, sweep)
    return export_trial(ledger, trial, Path(out_dir) if out_dir else ledger.parent / "export", force)
