"""What one trial record becomes in MLflow: its child run's key, name, tags, params, metrics and artifacts;
the parent's per-trial history points; the parent's Markdown summary. Pure functions of the record (no store).
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from orchestrator.review import report
from orchestrator.records.record import Kind, Status, TrialRecord
from orchestrator.review.timeline import render_timeline
from trainer.config import TrainConfig, flatten

MAX_TAG = 5000
# The parent's per-trial history: a trial's own step time and the best config's figure after it (the answer's
# winner, orchestrator.records.answer), step = trial number; the sweep's end adds the answer's final
# figure, after its re-measurements, as the latest point. With target_step_time_s these are the parent's only
# metrics, so its chart view is the sweep converging (every metric is a chart there; the baseline's and the
# best trial's other numbers are on their own child runs).
PROGRESS = ("step_time_s", "best_step_time_s")


def line_key(record: TrialRecord) -> tuple[str, str, str]:
    """What identifies a record's child run: trial, kind and (confirm and repeat records) the repeat number, so
    every ledger line is its own child run."""
    again = record.kind in (Kind.CONFIRM, Kind.REPEAT)
    return str(record.trial), record.kind.value, str(record.repeat or 1) if again else ""


def run_key(run) -> tuple[str, str, str]:
    t = run.data.tags
    kind = t.get("steptune.kind", "trial")
    # A confirm or repeat logged before repeats were tagged was the first (later repeats collided with it).
    return t.get("steptune.trial", ""), kind, t.get("steptune.repeat", "1") if kind in ("confirm", "repeat") else ""


def progress_points(record: TrialRecord, best_s: float | None) -> list[tuple[str, int, float]]:
    """The parent's history points for one baseline/trial record, given the best config's figure after it."""
    trial, own = record.trial, record.metrics.step_time_s
    points = [(PROGRESS[0], trial, float(own))] if record.status is Status.OK and own is not None else []
    return points + ([(PROGRESS[1], trial, float(best_s))] if best_s is not None else [])


_NAME = {"parallel.pp": "pp", "parallel.dp": "dp", "batch.micro_batch_size": "mbs", "pipeline.schedule": "",
         "pipeline.virtual_stages": "v", "recompute.kind": "rc=", "recompute.num_layers": "rcl",
         "recompute.matmul_period": "mmp",
         "recompute.method": "rcm=", "data_parallel.kind": "", "data_parallel.overlap_grad_reduce": "overlap",
         "optimizer.overlap_param_gather": "pgather", "data_parallel.bucket_mb": "bkt",
         "pipeline.split.first": "first", "pipeline.split.last": "last", "pipeline.split.kind": "split=",
         "tensor_parallel.size": "tp", "tensor_parallel.sequence_parallel": "sp", "tensor_parallel.comm_overlap": "tpov"}
"""Short run-name labels: ``pp`` + 2 reads "pp2", ``rc=`` + selective reads "rc=sel", "" shows the value only."""
_ABBREV = {"selective": "sel", "interleaved_1f1b": "i1f1b", "none": "none", "full": "full"}


def run_name(record: TrialRecord) -> str:
    """A child run's name from its params, short enough for the UI's run column: "t7 pp2 1f1b mbs4 rc=sel"."""
    trial = record.trial
    again = f" r{record.round}" if record.round is not None else f" repeat{record.repeat or 1}"
    head = {Kind.BASELINE: f"t{trial} baseline", Kind.CONFIRM: f"t{trial} confirm{record.repeat or 1}",
            Kind.REPEAT: f"t{trial}{again}", Kind.CANONICAL: f"t{trial} canonical"}.get(record.kind, f"t{trial}")
    words = []
    for key, value in record.params.items():
        label = _NAME.get(key, key.rsplit(".", 1)[-1] + "=")
        if isinstance(value, bool):
            words.append(label.rstrip("=") if value else f"no-{label.rstrip('=')}")
        elif isinstance(value, float):
            words.append(f"{label}{value:.3g}")
        elif isinstance(value, str):
            words.append(f"{label}{_ABBREV.get(value, value)}")
        elif not isinstance(value, (dict, list)):
            words.append(f"{label}{value}")
    return " ".join([head, *words])[:200]


def trial_tags(record: TrialRecord) -> dict[str, str]:
    parity = record.parity
    verdict = "not_checked" if parity is None else ("passed" if parity.passed else "failed")
    tags = {
        "steptune.role": "trial", "steptune.sweep": record.sweep,
        "steptune.trial": str(record.trial), "steptune.kind": record.kind.value,
        "steptune.status": record.status.value,
        "steptune.failure_reason": (record.reason or "")[:MAX_TAG],
        "steptune.optuna_trial": str(record.trial),  # a confirm record carries the number of the trial it repeats
        "steptune.meets_target": flag(record.meets_target), "steptune.parity": verdict,
        "steptune.backend": record.backend,
        # A cost-model prediction must never be mistaken for a measurement in the UI or a query.
        "steptune.measurement": "prediction" if record.predicted else "measured",
    }
    if record.kind in (Kind.CONFIRM, Kind.REPEAT):
        tags["steptune.repeat"] = line_key(record)[2]
    if record.round is not None:
        tags["steptune.round"] = str(record.round)
    if parity is not None and not parity.passed:
        tags["steptune.parity_first_fail"] = f"step {parity.first_fail_step}: {parity.first_fail_metric}"
    return tags


def trial_params(record: TrialRecord) -> dict[str, str]:
    config = record.config or {}
    params = params_of(flatten(config))
    for k, v in params_of(record.params).items():
        params.setdefault(k, v)  # a search param outside the config is kept; the config's value wins
    result = record.result
    derived = {"world_size": result.world_size, "n_microbatches": result.n_microbatches} if result else {}
    try:
        if config:  # an empty mapping would validate as the default config: derive nothing from it
            cfg = TrainConfig.from_dict(config)
            derived = {"world_size": cfg.world_size, "dp": cfg.parallel.dp, "pp": cfg.parallel.pp,
                       "n_microbatches": cfg.n_microbatches,
                       "stage_layers": ",".join(str(len(s)) for s in cfg.stage_layers())}
    except (ValueError, TypeError):  # a planner config (model backend): its own parallel layout
        from orchestrator.planner.parse import upgrade_plan_dict

        plan = upgrade_plan_dict(config)
        par, batch = {**(plan.get("parallel") or {}), "tp": (plan.get("tensor_parallel") or {}).get("size", 1)}, \
            plan.get("batch") or {}
        mbs, gbs = batch.get("micro_batch_size"), batch.get("global_batch")
        if all(isinstance(par.get(k), int) for k in ("tp", "pp", "dp")):
            derived = {"world_size": par["tp"] * par["pp"] * par["dp"], "tp": par["tp"], "pp": par["pp"],
                       "dp": par["dp"]}
            if isinstance(gbs, int) and isinstance(mbs, int):
                derived["n_microbatches"] = gbs // (mbs * par["dp"])
    params.update(params_of({f"derived.{k}": v for k, v in derived.items()}))
    return params


def trial_metrics(record: TrialRecord) -> tuple[dict[str, float], list[tuple[str, int, float]]]:
    result = record.result
    out: dict[str, float] = {}
    steps = []
    if result is not None:
        out.update(numbers(dataclasses.asdict(result.summary)))
        for phase, mm in result.phases.items():
            # Exposed time is what the slowest rank waits: the max over ranks is the headline.
            out[f"phase.{phase}_s"] = num(mm.get("max"))
            out[f"phase.{phase}_min_s"] = num(mm.get("min"))
        out.update({f"memory.{k}": num(v.get("max")) for k, v in result.memory.items()})
        for k in ("reduce_start_after_backward_s", "replica_max_abs_diff"):
            if isinstance(getattr(result, k), (int, float)):
                out[k] = num(getattr(result, k))
        for s in result.steps:
            steps += [("step/loss", s.step, num(s.loss)), ("step/time_s", s.step, num(s.time_s)),
                      ("step/grad_norm", s.step, num(s.grad_norm))]
    out.update(numbers(record.metrics.to_dict()))  # the sweep's own numbers win on a name clash
    if record.parity is not None:
        out.update({f"parity.{k}": v for k, v in numbers(record.parity.to_dict()).items()})
    out.update({f"prediction.{k}": v for k, v in numbers(record.prediction or {}).items()})
    for k in ("wall_s", "overhead_s"):
        if isinstance(getattr(record, k), (int, float)):
            out[f"trial.{k}"] = num(getattr(record, k))
    return {k: v for k, v in out.items() if v is not None}, [p for p in steps if p[2] is not None]


def write_trial_artifacts(out: Path, record: TrialRecord) -> None:
    if record.config:
        # A prediction's config is the planner's production-scale plan, not something the trainer runs.
        name = "plan.yaml" if record.predicted else "trainer_config.yaml"
        (out / name).write_text(to_yaml(record.config))
    (out / "ledger_record.json").write_text(json.dumps(record.to_line(), indent=1, default=str))  # as stored
    if record.result is None:
        return
    if record.detail_error is not None:  # a lost detail file costs the pictures only: one line where they are missed
        (out / "timeline_error.txt").write_text(f"timeline skipped: {record.detail_error}\n")
    result = record.result.to_dict()  # whole: its config, summary and detail back in
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    # A settling re-run's timeline is its config's again (the trial's own child run has it); drawing one per round
    # costs the driver a matplotlib render between runs, time the sweep's duty cycle pays.
    if record.kind is not Kind.REPEAT and any(r.spans for r in record.result.ranks):
        try:
            render_timeline(result, out / "timeline.png")
        except Exception as exc:  # a picture must never cost the trial its run; say why it is missing
            (out / "timeline_error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    for extra in record.artifacts:  # the run.profile_step traces the trial's ranks wrote
        p = Path(extra)
        if p.is_file():
            (out / "traces").mkdir(exist_ok=True)
            (out / "traces" / p.name).write_bytes(p.read_bytes())


def summary_md(name: str, summary: dict[str, Any], table_text: str, pictures: list[str], notes: list[str]) -> str:
    """The parent's summary as Markdown (the UI renders .md artifacts): the headline, the table, the pictures."""
    try:
        lines = report.summary_text(summary).splitlines()
    except (KeyError, TypeError, AttributeError):  # a partial summary: its plain values as they are
        lines = [f"{k}: {v}" for k, v in summary.items() if isinstance(v, (str, int, float)) or v is None]
    out = [f"# steptune sweep `{name}`", "", f"Stopped because: **{summary.get('stopped_because', '-')}**", ""]
    out += [("  " if line.startswith("  ") else "") + f"- {line.strip()}" for line in lines if line.strip()]
    # Fenced: the table's columns are aligned with spaces, and params hold characters Markdown would eat.
    out += ["", "## Trials", "", "Rank 1 is the answer; then configs by their figure paired with the baseline's "
            "run of the same settling round (orchestrator.records.answer); every ledger line is a child run of "
            "this one.", "",
            "```text", table_text.rstrip(), "```", "", "## Pictures", ""]
    out += [f"- `plots/{p}`" for p in pictures] + [f"- skipped: {n}" for n in notes]
    out += ["", "The chart view of this run plots `best_step_time_s` and each trial's `step_time_s` "
                "against the trial number.", ""]
    return "\n".join(out)


def plot_point(run) -> dict[str, Any]:
    m, t = run.data.metrics, run.data.tags
    return {"trial": t.get("steptune.trial"), "kind": t.get("steptune.kind"), "status": t.get("steptune.status"),
            "parity": t.get("steptune.parity"), "prediction": t.get("steptune.measurement") == "prediction",
            "step_time_s": m.get("step_time_s"), "peak_memory_bytes": m.get("peak_memory_bytes")}


def numbers(d: dict[str, Any]) -> dict[str, float]:
    """Numeric leaves of a nested mapping, dotted names; booleans as 0/1, non-finite as NaN."""
    return {k: num(v) for k, v in flatten(d).items() if isinstance(v, (int, float))}


def num(v: Any) -> float | None:
    if v is None:
        return None
    v = float(v)
    return v if math.isfinite(v) else math.nan  # MLflow stores NaN but turns inf into 1.8e308


def params_of(flat: dict[str, Any]) -> dict[str, str]:
    return {k[:250]: v if isinstance(v, str) else json.dumps(v, default=str) for k, v in flat.items()}


def flag(v: Any) -> str:
    return "unknown" if v is None else ("true" if v else "false")


def to_yaml(d: dict[str, Any]) -> str:
    return yaml.safe_dump(json.loads(json.dumps(d, default=str)), sort_keys=False)


def epoch_ms(t: datetime) -> int:
    """A record's started_at/finished_at as the epoch milliseconds MLflow takes."""
    return int(t.timestamp() * 1000)


def description(name: str, summary: dict[str, Any]) -> str:
    """The parent's description (``mlflow.note.content``, shown on its overview page): the answer, its tie set
    and the noise, as the summary states them."""
    try:
        lines = report.answer_lines(summary)
    except (KeyError, TypeError, AttributeError):
        lines = []
    head = [f"**steptune sweep `{name}`**: {summary.get('stopped_because', '-')}", ""]
    return "\n".join(head + [f"- {line.strip()}" for line in lines] +
                      ["", "Every ledger line (canonical, baseline, trials, settling rounds) is a child run; "
                           "`summary.md` has the whole table."])[:MAX_TAG]
