"""What one ledger line becomes in MLflow: its child run's key, name, tags, params, metrics and artifacts;
the parent's per-trial history points; the parent's Markdown summary. Pure functions of the line (no store).
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from orchestrator import report
from orchestrator.timeline import render_timeline
from trainer.config import TrainConfig, flatten

MAX_TAG = 5000
# The parent's per-trial history: a trial's own step time and the best so far, step = trial number. With
# target_step_time_s these are the parent's only metrics, so its chart view is the sweep converging (every
# metric is a chart there; the baseline's and the best trial's other numbers are on their own child runs).
PROGRESS = ("step_time_s", "best_step_time_s")


def line_key(record: dict[str, Any]) -> tuple[str, str, str]:
    """What identifies a ledger line's child run: trial, kind and (confirm lines only) the repeat number."""
    kind = str(record.get("kind", "trial"))
    return str(record.get("trial")), kind, str(record.get("repeat") or 1) if kind == "confirm" else ""


def run_key(run) -> tuple[str, str, str]:
    t = run.data.tags
    kind = t.get("steptune.kind", "trial")
    # A confirm logged before repeats were tagged was the first (later repeats collided with it).
    return t.get("steptune.trial", ""), kind, t.get("steptune.repeat", "1") if kind == "confirm" else ""


def progress_points(record: dict[str, Any], best: float) -> list[tuple[str, int, float]]:
    """The parent's history points for one baseline/trial line, given the best step time before it."""
    trial, own = record.get("trial"), (record.get("metrics") or {}).get("step_time_s")
    if not isinstance(trial, int):
        return []
    points = []
    if record.get("status") == "ok" and isinstance(own, (int, float)):  # usable lines only, as L.best_of
        points.append((PROGRESS[0], trial, float(own)))
        best = min(best, float(own))
    return points + ([(PROGRESS[1], trial, best)] if best < math.inf else [])


_NAME = {"parallel.pp": "pp", "parallel.dp": "dp", "batch.micro_batch_size": "mbs", "pipeline.schedule": "",
         "pipeline.virtual_stages": "v", "recompute.kind": "rc=", "recompute.num_layers": "rcl",
         "recompute.method": "rcm=", "data_parallel.kind": "", "data_parallel.overlap_grad_reduce": "overlap",
         "optimizer.overlap_param_gather": "pgather", "data_parallel.bucket_mb": "bkt",
         "pipeline.split.first": "first", "pipeline.split.last": "last", "pipeline.split.kind": "split="}
"""Short run-name labels: ``pp`` + 2 reads "pp2", ``rc=`` + selective reads "rc=sel", "" shows the value only."""
_ABBREV = {"selective": "sel", "interleaved_1f1b": "i1f1b", "none": "none", "full": "full"}


def run_name(record: dict[str, Any]) -> str:
    """A child run's name from its params, short enough for the UI's run column: "t7 pp2 1f1b mbs4 rc=sel"."""
    kind, trial = record.get("kind", "trial"), record.get("trial")
    head = {"baseline": f"t{trial} baseline", "confirm": f"t{trial} confirm{record.get('repeat') or 1}"}.get(
        kind, f"t{trial}")
    words = []
    for key, value in (record.get("params") or {}).items():
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


def trial_tags(record: dict[str, Any]) -> dict[str, str]:
    parity = record.get("parity")
    verdict = "not_checked" if not parity else ("passed" if parity.get("passed") else "failed")
    backend = str(record.get("backend", "ray"))
    tags = {
        "steptune.role": "trial", "steptune.sweep": str(record.get("sweep", "")),
        "steptune.trial": str(record.get("trial")), "steptune.kind": str(record.get("kind", "trial")),
        "steptune.status": str(record.get("status", "failed")),
        "steptune.failure_reason": str(record.get("reason") or "")[:MAX_TAG],
        "steptune.optuna_trial": str(record.get("optuna_trial", record.get("trial"))),
        "steptune.meets_target": flag(record.get("meets_target")), "steptune.parity": verdict,
        "steptune.backend": backend,
        # A cost-model prediction must never be mistaken for a measurement in the UI or a query.
        "steptune.measurement": "prediction" if backend == "model" else "measured",
    }
    if tags["steptune.kind"] == "confirm":
        tags["steptune.repeat"] = line_key(record)[2]
    if parity and not parity.get("passed"):
        tags["steptune.parity_first_fail"] = (f"step {parity.get('first_fail_step')}: "
                                              f"{parity.get('first_fail_metric')}")
    return tags


def trial_params(record: dict[str, Any]) -> dict[str, str]:
    config = record.get("config") or {}
    params = params_of(flatten(config))
    for k, v in params_of(record.get("params") or {}).items():
        params.setdefault(k, v)  # a search param outside the config is kept; the config's value wins
    result = record.get("result") or {}
    derived = {k: result[k] for k in ("world_size", "n_microbatches") if k in result}
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


def trial_metrics(record: dict[str, Any]) -> tuple[dict[str, float], list[tuple[str, int, float]]]:
    result = record.get("result") or {}
    out: dict[str, float] = {}
    out.update(numbers(result.get("summary") or {}))
    for phase, mm in (result.get("phases") or {}).items():
        # Exposed time is what the slowest rank waits: the max over ranks is the headline.
        out[f"phase.{phase}_s"] = num(mm.get("max"))
        out[f"phase.{phase}_min_s"] = num(mm.get("min"))
    out.update({f"memory.{k}": num(v.get("max")) for k, v in (result.get("memory") or {}).items()})
    for k in ("reduce_start_after_backward_s", "replica_max_abs_diff"):
        if isinstance(result.get(k), (int, float)):
            out[k] = num(result[k])
    out.update(numbers(record.get("metrics") or {}))  # the sweep's own numbers win on a name clash
    out.update({f"parity.{k}": v for k, v in numbers(record.get("parity") or {}).items()})
    out.update({f"prediction.{k}": v for k, v in numbers(record.get("prediction") or {}).items()})
    for k in ("wall_s", "overhead_s"):
        if isinstance(record.get(k), (int, float)):
            out[f"trial.{k}"] = num(record[k])
    steps = []
    for s in result.get("steps") or []:
        for key, name in (("loss", "step/loss"), ("time_s", "step/time_s"), ("grad_norm", "step/grad_norm")):
            if isinstance(s.get(key), (int, float)):
                steps.append((name, int(s["step"]), num(s[key])))
    return {k: v for k, v in out.items() if v is not None}, steps


def write_trial_artifacts(out: Path, record: dict[str, Any]) -> None:
    if record.get("config"):
        # A model-backend line holds the planner's production-scale plan, not something the trainer runs.
        name = "plan.yaml" if record.get("backend") == "model" else "trainer_config.yaml"
        (out / name).write_text(to_yaml(record["config"]))
    (out / "ledger_record.json").write_text(json.dumps(record, indent=1, default=str))
    result = record.get("result")
    if not result:
        return
    (out / "result.json").write_text(json.dumps(result, indent=1, default=str))
    if any(r.get("spans") for r in result.get("ranks") or []):
        try:
            render_timeline(result, out / "timeline.png")
        except Exception as exc:  # a picture must never cost the trial its run; say why it is missing
            (out / "timeline_error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    for extra in record.get("artifacts") or []:  # the run.profile_step traces the trial's ranks wrote
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
    out += ["", "## Trials", "", "Ranked by step time; every trial is a child run of this one.", "",
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



def epoch_ms(t: Any) -> int | None:
    """started_at/finished_at as epoch milliseconds: epoch seconds, epoch ms or ISO-8601 accepted."""
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        return int(t if t > 1e11 else t * 1000)
    if isinstance(t, str):
        try:
            return int(datetime.fromisoformat(t).timestamp() * 1000)
        except ValueError:
            return None
    return None
