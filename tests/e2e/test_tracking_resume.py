"""MLflow review and recovery against real sqlite stores: the experiment's view, the parent's per-trial history,
child names, the Markdown summary, ledger -> MLflow reconciliation, the parent ended on a stop, and a store
that a killed driver left half-created."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.sweep.config import REPO_ROOT, load_sweep
from orchestrator.records.ledger import Ledger
from orchestrator.records.record import TrialRecord
from orchestrator.sweep.loop import SweepError, run_sweep
from orchestrator.review.tracking import Tracker, tracking_uri_for

sys.path.insert(0, str(Path(__file__).parent))
from test_tracking import log_ledger, make_record  # noqa: E402  (the same synthetic ledger lines as the store test)

pytestmark = pytest.mark.e2e
ROOT = REPO_ROOT  # the checkout under test, for the driver subprocesses


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    results = tmp_path_factory.mktemp("review") / "results"
    return results, Tracker(tracking_uri_for(results), "steptune-review")


def _children(client: MlflowClient, parent: str) -> list:
    exp = client.get_run(parent).info.experiment_id
    return client.search_runs([exp], f"tags.\"mlflow.parentRunId\" = '{parent}'", max_results=1000)


def _keys(runs) -> list[tuple]:
    return sorted((r.data.tags["steptune.trial"], r.data.tags["steptune.kind"], r.data.tags.get("steptune.repeat", ""))
                  for r in runs)


def _ledger(sweep: str) -> list[TrialRecord]:
    """A sweep's lines in finishing order: baseline, trials (one failed, one slower), a met target confirmed twice."""
    return [make_record(0, "baseline", 0.10, sweep=sweep),
            make_record(1, "trial", 0.07, sweep=sweep, parallel__pp=2, pipeline__schedule="1f1b",
                        batch__micro_batch_size=4, recompute__kind="selective"),
            make_record(2, "trial", status="oom", sweep=sweep, batch__micro_batch_size=8),
            make_record(3, "trial", 0.08, sweep=sweep, data_parallel__overlap_grad_reduce=False,
                        data_parallel__bucket_mb=0.3125),
            make_record(4, "trial", 0.05, sweep=sweep, batch__micro_batch_size=2),
            make_record(4, "confirm", 0.051, sweep=sweep, batch__micro_batch_size=2),
            dataclasses.replace(make_record(4, "confirm", 0.052, sweep=sweep, batch__micro_batch_size=2), repeat=2)]


def test_experiment_opens_as_model_development(store, tmp_path):
    results, tracker = store
    client = MlflowClient(tracking_uri_for(results))
    assert client.get_experiment(tracker.experiment_id).tags["mlflow.experimentKind"] == "custom_model_development"
    # An experiment made before (no kind) gets it; a kind the user chose in the UI stays.
    old = client.create_experiment("made-before", artifact_location=(tmp_path / "a").as_uri())
    Tracker(tracking_uri_for(results), "made-before")
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "custom_model_development"
    client.set_experiment_tag(old, "mlflow.experimentKind", "genai_development")
    Tracker(tracking_uri_for(results), "made-before")
    assert client.get_experiment(old).tags["mlflow.experimentKind"] == "genai_development"


def test_parent_history_names_and_markdown_summary(store):
    _, tracker = store
    parent = tracker.start_sweep("live", {"search": {"n_trials": 5}}, 0.06)
    lines = _ledger("live")
    ids = log_ledger(tracker, parent, lines)
    tracker.finish_sweep(parent, {"n_trials": 5, "stopped_because": "trial 4 met the target"}, None,
                         "rank  trial  step time\n1     4      50.0 ms\n")
    client = tracker.client
    hist = {k: [(m.step, m.value) for m in sorted(client.get_metric_history(parent, k), key=lambda m: m.step)]
            for k in ("step_time_s", "best_step_time_s")}
    # Step = trial number; only usable measurements have a step time, every trial a best-so-far point.
    assert hist["step_time_s"] == [(0, 0.10), (1, 0.07), (3, 0.08), (4, 0.05)]
    assert hist["best_step_time_s"] == [(0, 0.10), (1, 0.07), (2, 0.07), (3, 0.07), (4, 0.05)]
    names = {r.info.run_id: r.info.run_name for r in _children(client, parent)}
    assert [names[i] for i in ids] == ["t0 baseline", "t1 pp2 1f1b mbs4 rc=sel", "t2 mbs8",
                                       "t3 no-overlap bkt0.312", "t4 mbs2", "t4 confirm1 mbs2", "t4 confirm2 mbs2"]
    assert len(set(ids)) == 7  # the second confirm repeat is its own run, not the first one again
    md = Path(client.download_artifacts(parent, "summary.md")).read_text()
    assert md.startswith("# steptune sweep `live`") and "**trial 4 met the target**" in md
    assert "```text\nrank  trial  step time\n1     4      50.0 ms\n```" in md
    assert "summary_table.txt" not in {a.path for a in client.list_artifacts(parent)}


def test_reconcile_logs_what_a_killed_driver_missed_once(store):
    _, tracker = store
    lines = _ledger("killed")
    parent = tracker.start_sweep("killed", {}, 0.06)
    # The driver died right after writing trial 3's line and the second confirm's to the ledger (before MLflow),
    # and once between creating trial 4's child run and ending it.
    log_ledger(tracker, parent, lines[:3])
    tracker.log_trial(parent, lines[5])
    half = tracker.client.create_run(tracker.experiment_id, tags={
        "mlflow.parentRunId": parent, "steptune.trial": "4", "steptune.kind": "trial"}).info.run_id

    again = Tracker(tracker.tracking_uri, "steptune-review")
    assert again.start_sweep("killed", {}, 0.06) == parent
    assert again.reconcile(parent, lines) == 3  # trials 3 and 4, confirm 2
    runs = _children(again.client, parent)
    assert _keys(runs) == sorted([("0", "baseline", ""), ("1", "trial", ""), ("2", "trial", ""),
                                  ("3", "trial", ""), ("4", "trial", ""), ("4", "confirm", "1"),
                                  ("4", "confirm", "2")])
    assert again.client.get_run(half).info.lifecycle_stage == "deleted"  # half-logged: logged again, whole
    hist = sorted((m.step, m.value) for m in again.client.get_metric_history(parent, "best_step_time_s"))
    assert hist == [(0, 0.10), (1, 0.07), (2, 0.07), (3, 0.07), (4, 0.05)]
    steps = sorted(m.step for m in again.client.get_metric_history(parent, "step_time_s"))
    assert steps == [0, 1, 3, 4]
    assert again.client.get_run(parent).data.tags["steptune.best_trial"] == "4"
    # Idempotent: a second resume logs nothing and duplicates nothing.
    assert Tracker(tracker.tracking_uri, "steptune-review").reconcile(parent, lines) == 0
    assert len(_children(again.client, parent)) == 7
    assert len(again.client.get_metric_history(parent, "best_step_time_s")) == 5


def test_every_settling_run_is_its_own_child_and_a_resume_reconciles_them(store):
    """Issue 26 item 4: repeats of one trial (settling rounds) were all logged as its first repeat."""
    _, tracker = store
    lines = [make_record(0, "baseline", 0.10), make_record(1, "trial", 0.05, parallel__dp=2)]
    for k in (1, 2, 3):
        base = dataclasses.replace(make_record(0, "repeat", 0.10 + 0.001 * k), repeat=k, round=k)
        mine = dataclasses.replace(make_record(1, "repeat", 0.05 + 0.001 * k, parallel__dp=2), repeat=k, round=k)
        lines += [base, mine]
    parent = tracker.start_sweep("rounds", {}, 0.06)
    log_ledger(tracker, parent, lines[:4])  # ... the driver dies after round 1
    again = Tracker(tracker.tracking_uri, "steptune-review")
    assert again.start_sweep("rounds", {}, 0.06) == parent
    assert again.reconcile(parent, lines) == len(lines) - 4
    runs = _children(again.client, parent)
    assert len(runs) == len(lines)  # one child per ledger line
    rounds = sorted((r.data.tags["steptune.trial"], r.data.tags["steptune.round"]) for r in runs
                    if r.data.tags["steptune.kind"] == "repeat")
    assert rounds == [(t, str(k)) for t in ("0", "1") for k in (1, 2, 3)]
    names = {r.info.run_name.split(" ")[0] + " " + r.info.run_name.split(" ")[1] for r in runs
             if r.data.tags["steptune.kind"] == "repeat"}
    assert names == {f"t{t} r{k}" for t in (0, 1) for k in (1, 2, 3)}
    assert Tracker(tracker.tracking_uri, "steptune-review").reconcile(parent, lines) == 0


def test_a_stopped_sweep_ends_its_parent_with_the_reason(store):
    _, tracker = store
    parent = tracker.start_sweep("stopped", {}, None)
    tracker.end_sweep(parent, SweepError("the baseline (trial 0) did not run: oom"))
    run = tracker.client.get_run(parent)
    assert run.info.status == "FAILED" and run.data.tags["steptune.stopped_by"] == "SweepError"
    assert run.data.tags["steptune.stop_reason"] == "SweepError: the baseline (trial 0) did not run: oom"
    assert tracker.start_sweep("stopped", {}, None) == parent  # resumed: running again, the old reason gone
    run = tracker.client.get_run(parent)
    assert run.info.status == "RUNNING" and "steptune.stop_reason" not in run.data.tags
    tracker.end_sweep(parent, KeyboardInterrupt())
    run = tracker.client.get_run(parent)
    assert run.info.status == "KILLED" and run.data.tags["steptune.stop_reason"] == "KeyboardInterrupt"


def test_run_name_is_short_and_readable():
    from orchestrator.review.tracking import run_name

    r = make_record(7, "trial", parallel__pp=2, pipeline__schedule="interleaved_1f1b", pipeline__virtual_stages=2)
    assert run_name(r) == "t7 pp2 i1f1b v2"
    assert run_name(dataclasses.replace(r, params={"x.y": 3, "z": "abc"})) == "t7 y=3 z=abc"


# ---- a store left half-created by a killed process ---------------------------------------------------------

_KILL_DURING_SETUP = textwrap.dedent("""
    import os, signal, sys
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "after_cursor_execute")
    def die(conn, cursor, statement, *args):
        if statement.lstrip().startswith("CREATE TABLE " + sys.argv[2] + " "):
            os.kill(os.getpid(), signal.SIGKILL)  # as a driver killed during MLflow's first setup

    from orchestrator.review.tracking import Tracker
    Tracker("sqlite:///" + sys.argv[1], "steptune")
""")


def _kill_during_setup(db: Path, table: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _KILL_DURING_SETUP, str(db), table], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]


@pytest.mark.timeout(600)
def test_a_store_half_created_by_a_killed_driver_is_made_again(tmp_path, caplog):
    db = tmp_path / "results" / "mlflow.db"
    _kill_during_setup(db, "datasets")
    # What MLflow itself does with it: every later open fails, so tracking was off for good.
    with pytest.raises(Exception, match="table datasets already exists"):
        MlflowClient(f"sqlite:///{db}").search_experiments()
    tracker = Tracker(tracking_uri_for(db.parent), "steptune")  # same process: MLflow's engine cache is warm
    parent = tracker.start_sweep("after-kill", {}, None)
    tracker.log_trial(parent, make_record(0, "baseline", 0.1, sweep="after-kill"))
    assert len(_children(MlflowClient(f"sqlite:///{db}"), parent)) == 1
    aside = [p.name for p in db.parent.iterdir() if p.name.startswith("mlflow.db.broken-")]
    assert len(aside) == 1 and "half-created" in caplog.text and aside[0] in caplog.text


@pytest.mark.timeout(600)
def test_a_store_with_runs_that_does_not_open_is_left_alone(tmp_path):
    import sqlite3

    db = tmp_path / "mlflow.db"
    tracker = Tracker(f"sqlite:///{db}", "steptune")
    tracker.start_sweep("kept", {}, None)
    con = sqlite3.connect(db)  # as a store made by an older MLflow: its schema revision is behind
    con.execute("update alembic_version set version_num = '451aebb31d03'")
    con.commit()
    con.close()
    later = subprocess.run([sys.executable, "-c", f"from orchestrator.review.tracking import Tracker; "
                                                  f"Tracker('sqlite:///{db}', 'steptune')"],
                           env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert later.returncode == 1 and "BrokenStore" in later.stderr, later.stderr[-2000:]
    assert "holds 1 run(s)" in later.stderr and f"mlflow db upgrade sqlite:///{db}" in later.stderr
    assert db.is_file() and not list(tmp_path.glob("mlflow.db.broken-*"))


# ---- the real loop (planner backend: no Ray needed) ----------------------------------------------------------

_KILL_AFTER_LEDGER = textwrap.dedent("""
    import os, signal, sys
    from orchestrator.records import ledger
    from orchestrator.sweep.config import load_sweep
    from orchestrator.sweep.loop import run_sweep

    append, n = ledger.Ledger.append, int(sys.argv[1])
    def append_then_die(self, line):
        append(self, line)
        if sum(1 for _ in open(self.path)) >= n:
            os.kill(os.getpid(), signal.SIGKILL)  # the line is on disk; Optuna and MLflow never hear of it
    ledger.Ledger.append = append_then_die
    run_sweep(load_sweep(sys.argv[2], sys.argv[3:]))
""")


@pytest.mark.timeout(600)
def test_a_driver_killed_after_a_ledger_line_is_reconciled_on_resume(tmp_path):
    preset = REPO_ROOT / "search_spaces" / "preset-500b.yaml"
    args = [f"storage.results_dir={tmp_path}", "search.n_trials=5", "tracking.enabled=true"]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", _KILL_AFTER_LEDGER, "3", str(preset), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    cfg = load_sweep(preset, args)
    assert len(Ledger(cfg.results_dir / "trials.jsonl").read()) == 3
    client = MlflowClient(cfg.mlflow_uri)
    exp = client.get_experiment_by_name("steptune").experiment_id
    (parent,) = client.search_runs([exp], "tags.\"steptune.role\" = 'parent'")
    # Line 3 never reached MLflow; lines 1-2 may not have either (the mirror runs behind the ledger, on its thread)
    assert parent.info.status == "RUNNING" and len(_children(client, parent.info.run_id)) <= 2

    summary, lines = run_sweep(cfg)  # resume
    runs = _children(client, parent.info.run_id)
    assert _keys(runs) == sorted((str(r.trial), r.kind.value, "") for r in lines) and len(lines) == 5
    assert client.get_run(parent.info.run_id).info.status == "FINISHED"
    steps = {m.step for m in client.get_metric_history(parent.info.run_id, "best_step_time_s")}
    assert steps == {r.trial for r in lines if r.trial >= min(x.trial for x in lines if x.status == "ok")}


@pytest.mark.timeout(600)
def test_a_sweep_stopped_by_its_baseline_ends_the_parent_failed(tmp_path):
    cfg = load_sweep(REPO_ROOT / "search_spaces" / "preset-500b.yaml",
                     [f"storage.results_dir={tmp_path}", "tracking.enabled=true", "resources.memory_budget_gb=1"])
    with pytest.raises(SweepError, match="baseline"):
        run_sweep(cfg)
    client = MlflowClient(cfg.mlflow_uri)
    (parent,) = client.search_runs([client.get_experiment_by_name("steptune").experiment_id],
                                   "tags.\"steptune.role\" = 'parent'")
    assert parent.info.status == "FAILED"
    assert parent.data.tags["steptune.stopped_by"] == "SweepError" and "baseline" in parent.data.tags[
        "steptune.stop_reason"]
