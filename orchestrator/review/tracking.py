"""MLflow tracking for a sweep: one parent run per sweep, one child run per trial.

Everything goes through ``MlflowClient`` with explicit run ids and batched writes, never the global
active-run stack (``mlflow.start_run``): the parent stays open while children are written, and the
process-wide "active run" would leak between sweeps, tests and threads. Resume is by tags, not by memory: the parent is the run
tagged ``steptune.sweep=<name>, steptune.role=parent``; a ledger line is the child tagged with its trial number,
kind and (settling re-runs) repeat and round, so logging a line twice is a no-op and a resume logs only what is missing
(``reconcile``). The ledger stays the source of truth; this module only mirrors it for review in the UI.
"""

from __future__ import annotations

import json
import shlex
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterable

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from orchestrator import commands
from orchestrator.records import answer as A
from orchestrator.search.target import Target
from orchestrator.review import plots as sweep_plots
from orchestrator.records.record import Kind, Status, TrialRecord
from orchestrator.review.tracking_lines import (MAX_TAG, PROGRESS, description, epoch_ms, flag, line_key,
                                                params_of, plot_point, progress_points, run_key, run_name,
                                                summary_md, to_yaml, trial_metrics, trial_params, trial_tags,
                                                write_trial_artifacts)
from orchestrator.review.tracking_store import open_with_recovery
from trainer.config import flatten

# MLflow's per-request limits (mlflow.utils.validation): 100 params+tags, 1000 entities in all.
_MAX_PARAMS_TAGS, _MAX_ENTITIES = 100, 1000
_SHORT_PARAM = 250  # sweep-config values longer than this live only in the YAML artifact
_DONE = {"FINISHED", "FAILED", "KILLED"}
# Trial status -> MLflow run status: only a finished measurement is FINISHED, so the UI's status
# column already separates usable trials from the rest.
_RUN_STATUS = {"ok": "FINISHED", "pruned": "KILLED", "skipped": "KILLED"}
# The UI's experiment kind (mlflow/server/js: ExperimentKind.CUSTOM_MODEL_DEVELOPMENT): a model-development
# experiment, shown with runs, charts and params, not as GenAI "evaluation runs" and traces.
_EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# MLflow 3.x picks its sidebar's GenAI / "Model training" view from this URL query before any tag.
UI_VIEW_QUERY = "workflowType=machine_learning"


def tracking_uri_for(results_dir: Path) -> str:
    """The default store: a sqlite database under the results directory (absolute, so any cwd works)."""
    return f"sqlite:///{Path(results_dir).resolve() / 'mlflow.db'}"


class Tracker:
    def __init__(self, tracking_uri: str, experiment: str, artifact_root: Path | None = None) -> None:
        self.tracking_uri, self.experiment_name = tracking_uri, experiment
        # Resolved once: a relative sqlite path means the cwd of *now*, whatever cwd ui_command runs in.
        self._db = db = _sqlite_path(tracking_uri)
        if db is not None:
            db.parent.mkdir(parents=True, exist_ok=True)
            # Without an explicit location MLflow would put artifacts under ./mlruns of whatever the
            # current directory is; keep them next to the database, under results/.
            artifact_root = artifact_root or db.parent / "mlartifacts"
        self.artifact_root = Path(artifact_root).resolve() if artifact_root else None

        def open_store() -> tuple[MlflowClient, str]:
            self.client = MlflowClient(tracking_uri=tracking_uri)
            return self.client, self._experiment(experiment)  # the first call that touches the store

        self.client, self.experiment_id = open_with_recovery(db, open_store)
        self._sweep_names: dict[str, str] = {}  # parent run id -> sweep name (the summary's title)

    def _experiment(self, name: str) -> str:
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                return self.client.create_experiment(
                    name, artifact_location=self.artifact_root.as_uri() if self.artifact_root else None,
                    tags=dict([_EXPERIMENT_KIND]))
            except MlflowException:  # created concurrently by another process: use theirs
                exp = self.client.get_experiment_by_name(name)
                if exp is None:
                    raise
        if exp.lifecycle_stage == "deleted":
            self.client.restore_experiment(exp.experiment_id)
        if _EXPERIMENT_KIND[0] not in exp.tags:  # a kind the user picked in the UI stays theirs
            self.client.set_experiment_tag(exp.experiment_id, *_EXPERIMENT_KIND)
        return exp.experiment_id

    # ---- sweep (parent run) ------------------------------------------------------------------

    def start_sweep(self, sweep_name: str, sweep_config: dict[str, Any], target_s: float | None) -> str:
        """The sweep's parent run id: created, or found again when the sweep resumes."""
        found = self._search(f"tags.\"steptune.sweep\" = {_q(sweep_name)} and tags.\"steptune.role\" = 'parent'")
        if found:
            run = found[0]
            run_id = run.info.run_id
            if run.info.status != "RUNNING":
                self.client.update_run(run_id, status="RUNNING")
            for stale in ("steptune.stop_reason", "steptune.stopped_by"):  # from the previous, stopped driver
                if stale in run.data.tags:
                    self.client.delete_tag(run_id, stale)
            old = run.data.params
        else:
            run_id = self.client.create_run(self.experiment_id, run_name=sweep_name, tags={
                "steptune.sweep": sweep_name, "steptune.role": "parent",
                "mlflow.note.content": f"steptune sweep `{sweep_name}`: one child run per ledger line (canonical, "
                                      f"baseline, trials, settling rounds). The sweep's ledger (trials.jsonl) is the "
                                      f"source of truth; this is its mirror for review.",
            }).info.run_id
            old = {}
        params = {k: v for k, v in params_of(flatten(sweep_config)).items() if len(v) <= _SHORT_PARAM}
        changed = sorted(k for k in params if k in old and old[k] != params[k])
        tags = {"steptune.target_s": "none" if target_s is None else repr(float(target_s))}
        if changed:  # params are immutable in MLflow: say so instead of failing the resumed sweep
            tags["steptune.config_changed_on_resume"] = ",".join(changed)[:MAX_TAG]
        metrics = {} if target_s is None else {"target_step_time_s": float(target_s)}
        self._log(run_id, metrics, {k: v for k, v in params.items() if k not in old}, tags)
        self.client.log_text(run_id, to_yaml(sweep_config), "sweep_config.yaml")
        self._sweep_names[run_id] = sweep_name
        return run_id

    def log_trial(self, parent_run_id: str, record: TrialRecord, best_s: float | None = None) -> str:
        """One child run for one trial record; an already-logged (trial, kind, repeat) returns the existing run.

        Given ``best_s`` (the answer's figure with this record counted, orchestrator.records.answer),
        a new baseline or trial record also extends the parent's per-trial history (``PROGRESS``); ``reconcile``
        writes that history itself, in ledger order."""
        trial, kind = record.trial, record.kind.value
        for run in self._children(parent_run_id, f"tags.\"steptune.trial\" = {_q(str(trial))} "
                                                 f"and tags.\"steptune.kind\" = {_q(kind)}"):
            if run_key(run) != line_key(record):
                continue  # another re-run (repeat, round) of the same trial
            if run.info.status in _DONE:
                return run.info.run_id
            self.client.delete_run(run.info.run_id)  # half-logged before a crash: log it again, whole
        run_id = self._create_child(parent_run_id, record)
        if best_s is not None and record.kind in (Kind.BASELINE, Kind.TRIAL):
            self._log(parent_run_id, {}, {}, {}, progress_points(record, best_s))
        return run_id

    def reconcile(self, parent_run_id: str, records: list[TrialRecord]) -> int:
        """Make the store hold every ledger line once (on resume); returns how many child runs were logged.

        The ledger is written before MLflow, so a driver killed in between leaves lines that Optuna is told
        about on resume but MLflow never saw. Children are matched by their tags (trial, kind, repeat), the
        parent's history by step: running it twice logs nothing the second time."""
        done = {run_key(r) for r in self._children(parent_run_id, "") if r.info.status in _DONE}
        missing = [r for r in records if line_key(r) not in done]
        for r in missing:
            self.log_trial(parent_run_id, r)
        have = {k: {m.step for m in self.client.get_metric_history(parent_run_id, k)} for k in PROGRESS}
        points = []
        for i, r in enumerate(records):  # ledger order is finishing order: the best as it was when each line landed
            if r.kind not in (Kind.BASELINE, Kind.TRIAL):
                continue
            best = A.decide(records[:i + 1], Target()).leader
            points += [p for p in progress_points(r, best.step_time_s if best else None) if p[1] not in have[p[0]]]
        if points:
            self._log(parent_run_id, {}, {}, {}, points)
        top = A.decide(records, Target()).winner
        if top is not None and self.client.get_run(parent_run_id).data.tags.get("steptune.best_trial") != str(
                top.trial):
            self.log_best(parent_run_id, top.record)
        return len(missing)

    def end_sweep(self, parent_run_id: str, error: BaseException) -> None:
        """A sweep that stopped on an error: the parent is ended FAILED (KILLED for Ctrl-C), the reason tagged."""
        status = "KILLED" if isinstance(error, KeyboardInterrupt) else "FAILED"
        reason = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
        self._log(parent_run_id, {}, {}, {"steptune.stop_reason": reason[:MAX_TAG],
                                          "steptune.stopped_by": type(error).__name__})
        self.client.set_terminated(parent_run_id, status)

    def _create_child(self, parent_run_id: str, record: TrialRecord) -> str:
        tags = {"mlflow.parentRunId": parent_run_id, **trial_tags(record)}
        run_id = self.client.create_run(self.experiment_id, start_time=epoch_ms(record.started_at),
                                        tags=tags, run_name=run_name(record)).info.run_id
        metrics, steps = trial_metrics(record)
        self._log(run_id, metrics, trial_params(record), {}, steps)
        with tempfile.TemporaryDirectory(prefix="steptune-mlflow-") as tmp:
            write_trial_artifacts(Path(tmp), record)
            self.client.log_artifacts(run_id, tmp)
        self.client.set_terminated(run_id, _RUN_STATUS.get(record.status.value, "FAILED"), epoch_ms(record.finished_at))
        if record.kind is Kind.BASELINE and record.status is Status.OK:
            self._log(parent_run_id, {}, {}, {"steptune.baseline_run_id": run_id})
        return run_id

    def log_best(self, parent_run_id: str, record: TrialRecord) -> None:
        """The answer's winner's trial line (orchestrator.records.answer), as tags on the parent (its figure is
        the ``best_step_time_s`` history). ``best_meets_target`` is the line's own run until ``finish_sweep``
        judges the final answer's figure."""
        # The ledger is written before MLflow, so a record never carries its run id: find the child by its tags.
        run_id = next((r.info.run_id for r in self._children(
            parent_run_id, f"tags.\"steptune.trial\" = {_q(str(record.trial))} "
                           f"and tags.\"steptune.kind\" = {_q(record.kind.value)}")), "")
        tags = {"steptune.best_trial": str(record.trial), "steptune.best_kind": record.kind.value,
                "steptune.best_run_id": run_id, "steptune.best_meets_target": flag(record.meets_target)}
        self._log(parent_run_id, {}, {}, tags)

    def finish_sweep(self, parent_run_id: str, summary: dict[str, Any], study: Any, table_text: str,
                     by_trial: dict[str, tuple[bool, int | None]] | None = None) -> None:
        """Final pictures, table and summary on the parent, which is then marked FINISHED. The parent's tags and
        description and each child's ``steptune.meets_target`` and ``steptune.answer_rank`` render the final
        answer (``summary['answer']``; ``by_trial``: trial number -> (its config's figure meets the target, its
        config's rank in the answer, 1 = the winner; None: not ranked))."""
        numeric = {}  # the final numbers are in summary.md / summary.json: a metric each would be a chart each
        # A relative target is only known once the baseline is measured: prefer the summary's.
        target = summary.get("target_s")
        if not isinstance(target, (int, float)):
            tag = self.client.get_run(parent_run_id).data.tags.get("steptune.target_s", "none")
            target = None if tag == "none" else float(tag)
        else:
            numeric["target_step_time_s"] = float(target)
        # The answer's figure after the re-measurements, as the latest best_step_time_s point (MLflow shows the
        # point with the highest step, then the latest time): what the summary and `export` name.
        best = summary.get("best") or {}
        final = [] if best.get("step_time_s") is None else [(PROGRESS[1], max(
            (m.step for m in self.client.get_metric_history(parent_run_id, PROGRESS[1])), default=best["trial"]),
            float(best["step_time_s"]))]
        points = [plot_point(r) for r in self._children(parent_run_id, "")]
        with tempfile.TemporaryDirectory(prefix="steptune-mlflow-") as tmp:
            out = Path(tmp)
            (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
            notes = sweep_plots.write_all(out / "plots", study, points, target, summary.get("answer"))
            if notes:
                (out / "plots" / "NOTES.txt").write_text("\n".join(notes) + "\n")
            pictures = sorted(p.name for p in (out / "plots").glob("*.png"))
            name = self._sweep_names.get(parent_run_id) or self.client.get_run(parent_run_id).data.tags.get(
                "steptune.sweep", "")
            (out / "summary.md").write_text(summary_md(name, summary, table_text, pictures, notes))
            self.client.log_artifacts(parent_run_id, tmp)
        tags = {} if target is None else {"steptune.target_s": repr(float(target))}
        answer = summary.get("answer") or {}
        if best.get("step_time_s") is not None:  # judged on the answer's figure, as the summary judges it
            tags["steptune.best_meets_target"] = flag(bool(summary.get("target_met")))
            tags["steptune.best_trial"] = str(best["trial"])
            tags["steptune.target_verdict"] = str(summary.get("target_verdict"))
            tags["steptune.tie_trials"] = ",".join(str(t["trial"]) for t in answer.get("ties") or [])
            tags["steptune.settling_rounds"] = str(answer.get("rounds", 0))
            tags["steptune.best_ratio_vs_baseline"] = f"{best['ratio']:.4f}" if best.get("ratio") else "none"
        # Tags, not metrics: every parent metric is a chart, and its chart view is the sweep converging.
        noise = answer.get("noise") or {}
        for k in ("baseline_spread", "remeasured_spread", "paired_spread", "load_median"):
            if isinstance(noise.get(k), (int, float)):
                tags[f"steptune.noise.{k}"] = f"{noise[k]:.4f}"
        if isinstance(summary.get("duty_cycle"), (int, float)):
            tags["steptune.duty_cycle"] = f"{summary['duty_cycle']:.3f}"
        tags["mlflow.note.content"] = description(name, summary)
        self._log(parent_run_id, numeric, {}, tags, final)
        for run in self._children(parent_run_id, "") if by_trial is not None else []:
            canonical = run.data.tags.get("steptune.kind") == "canonical"
            meets, rank = (False, None) if canonical else by_trial.get(run.data.tags.get("steptune.trial", ""),
                                                                      (False, None))
            want = {"steptune.meets_target": flag(meets), "steptune.answer_rank": rank_tag(rank)}
            # The answer's verdict and rank, not the run's own: a link sorted by the rank shows the winner first.
            self._log(run.info.run_id, {}, {}, {k: v for k, v in want.items() if run.data.tags.get(k) != v})
        self.client.set_terminated(parent_run_id, "FINISHED")

    def ui_command(self) -> str:
        """The exact command that opens this store in the MLflow UI."""
        uri = self.tracking_uri
        if uri.startswith(("http://", "https://")):
            return f"open {uri} in a browser (the tracking server serves the UI)"
        cmd = ["ui", "--backend-store-uri", f"sqlite:///{self._db}" if self._db is not None else uri]
        if self.artifact_root is not None:
            cmd += ["--default-artifact-root", self.artifact_root.as_uri()]
        return f"{commands.mlflow()} {shlex.join(cmd)}"

    def view_url(self, base: str = "http://127.0.0.1:5000", sweep: str | None = None) -> str:
        """The experiment's page in the UI's "Model training" view (MLflow 3.x otherwise opens its GenAI view).
        With ``sweep``: its runs table filtered to the sweep's ledger lines and sorted by the answer's rank
        (``steptune.answer_rank``), so the winner's lines are the first rows (the UI keeps the filter and the
        order in the URL; the columns shown are the UI's own choice)."""
        if self.tracking_uri.startswith(("http://", "https://")):
            base = self.tracking_uri
        page, query = "", UI_VIEW_QUERY
        if sweep is not None:  # the runs page reads these from its URL (the experiment page would drop them)
            page = "/runs"
            query += "&" + urllib.parse.urlencode({
                "searchFilter": f"tags.`steptune.sweep` = {_q(sweep)} and tags.`steptune.role` = 'trial'",
                "orderByKey": "tags.`steptune.answer_rank`", "orderByAsc": "true"}, quote_via=urllib.parse.quote)
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id}{page}?{query}"

    def open_hint(self, sweep: str | None = None) -> str:
        """What the sweep prints: the command that serves the store, then the page to open."""
        if self.tracking_uri.startswith(("http://", "https://")):
            return f"open {self.view_url(sweep=sweep)}"
        return f"{self.ui_command()}  then open {self.view_url(sweep=sweep)}"

    # ---- plumbing --------------------------------------------------------------------------------

    def _search(self, filter_string: str) -> list:
        runs, token = [], None
        while True:
            page = self.client.search_runs([self.experiment_id], filter_string, max_results=1000,
                                           page_token=token, order_by=["attributes.start_time ASC"])
            runs.extend(page)
            token = page.token
            if not token:
                return runs

    def _children(self, parent_run_id: str, extra: str) -> list:
        where = f"tags.\"mlflow.parentRunId\" = {_q(parent_run_id)}"
        return self._search(f"{where} and {extra}" if extra else where)

    def _log(self, run_id: str, metrics: dict[str, float], params: dict[str, str], tags: dict[str, str],
             steps: Iterable[tuple[str, int, float]] = ()) -> None:
        ts = int(time.time() * 1000)
        ms = [Metric(k, v, ts, 0) for k, v in metrics.items()] + [Metric(k, v, ts, s) for k, s, v in steps]
        pt = [Param(k, v) for k, v in params.items()] + [RunTag(k, v) for k, v in tags.items()]
        # Chunk to MLflow's batch limits; params and tags share one budget.
        while ms or pt:
            head_pt, pt = pt[:_MAX_PARAMS_TAGS], pt[_MAX_PARAMS_TAGS:]
            head_ms, ms = ms[:_MAX_ENTITIES - len(head_pt)], ms[_MAX_ENTITIES - len(head_pt):]
            self.client.log_batch(run_id, metrics=head_ms, params=[p for p in head_pt if isinstance(p, Param)],
                                  tags=[t for t in head_pt if isinstance(t, RunTag)])


def find_trial_run(tracking_uri: str, experiment: str, record: TrialRecord) -> str | None:
    """The id of the child run a trial record was logged as (read only: creates nothing); None if absent.

    The ledger is written before MLflow (it is the source of truth), so the line cannot carry its run id;
    the tags that ``log_trial`` sets identify the run instead. A repeated logging picks the newest.
    """
    if (db := _sqlite_path(tracking_uri)) is not None and not db.is_file():
        return None  # MlflowClient would create an empty store here
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return None
    tags = {"sweep": record.sweep, "trial": str(record.trial), "kind": record.kind.value}
    where = " and ".join(f"tags.\"steptune.{k}\" = {_q(v)}" for k, v in tags.items())
    runs = client.search_runs([exp.experiment_id], where, max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0].info.run_id if runs else None


def rank_tag(rank: int | None) -> str:
    """The answer's rank as a tag that sorts as text: ``001`` is the winner; ``~`` not ranked (sorts after every rank)."""
    return "~" if rank is None else f"{rank:03d}"


def _q(value: str) -> str:
    if "'" in value:
        raise ValueError(f"{value!r}: a name with a single quote cannot be used in an MLflow search")
    return f"'{value}'"


def _sqlite_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///") or ":memory:" in uri:
        return None
    return Path(uri[len("sqlite:///"):].split("?", 1)[0]).resolve()
