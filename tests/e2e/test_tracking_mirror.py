"""The MLflow mirror process (orchestrator.review.mirror): a real sqlite store, a real child process."""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from orchestrator.review import mirror as M
from orchestrator.review.tracking import Tracker, tracking_uri_for
from orchestrator.review.tracking_lines import PROGRESS

sys.path.insert(0, str(Path(__file__).parent))
from test_tracking import make_record  # noqa: E402  (the same synthetic ledger lines as the store test)

pytestmark = pytest.mark.e2e


def _open(tmp_path, name="mirror"):
    tracker = Tracker(tracking_uri_for(tmp_path / "results"), "steptune-mirror")
    return tracker, tracker.start_sweep(name, {}, None)


def _children(tracker, parent) -> list:
    client = MlflowClient(tracker.tracking_uri)
    return client.search_runs([tracker.experiment_id], f"tags.\"mlflow.parentRunId\" = '{parent}'",
                              max_results=1000, order_by=["attributes.start_time ASC"])


def _lines(n: int) -> list:
    """A baseline and n - 1 trials, each started 10 ms after the one before: a child run's start time is its
    record's, so lines made within one millisecond would list in any order."""
    lines = [make_record(0, "baseline", step_time=0.1)] + [make_record(t, "trial", step_time=0.05 + 0.001 * t)
                                                          for t in range(1, n)]
    return [dataclasses.replace(r, started_at=lines[0].started_at + timedelta(milliseconds=10 * i))
            for i, r in enumerate(lines)]


def test_every_line_is_logged_by_the_child_process_in_order_and_the_driver_does_none(tmp_path):
    tracker, parent = _open(tmp_path)
    records = _lines(6)
    took_over = []
    mirror = M.Mirror(tracker, parent, lambda: took_over.append(True))
    for r in records:
        mirror.submit("log_trial", r, 0.05)
    mirror.submit("log_best", records[3])
    child_pid = mirror._proc.pid
    assert child_pid != os.getpid()
    # (no give-up clock: the child's start and its nice-19 share on a busy test machine take what they take)
    assert mirror.flush(patience_s=600, stall_s=None) is True and not took_over and mirror.inline_s == 0.0
    assert os.getpriority(os.PRIO_PROCESS, child_pid) == M.NICE  # the child's own, set before it did any work
    runs = _children(tracker, parent)
    assert [r.data.tags["steptune.trial"] for r in runs] == [str(r.trial) for r in records]
    assert {r.info.status for r in runs} == {"FINISHED"}
    # In order: the parent's history points carry the time each call logged them, trial by trial.
    history = MlflowClient(tracker.tracking_uri).get_metric_history(parent, PROGRESS[0])
    logged = [m.timestamp for m in sorted(history, key=lambda m: m.step)]
    assert len(logged) == len(records) and logged == sorted(logged)
    assert MlflowClient(tracker.tracking_uri).get_run(parent).data.tags["steptune.best_trial"] == "3"
    mirror.close()


def test_a_failing_call_is_skipped_and_the_calls_after_it_still_run(tmp_path, capfd):
    tracker, parent = _open(tmp_path)
    records = _lines(3)
    mirror = M.Mirror(tracker, parent, lambda: None)
    mirror.submit("log_trial", records[0], None)
    mirror.submit("no_such_call")
    mirror.submit("log_trial", records[1], None)
    assert mirror.flush(patience_s=600, stall_s=None) is True
    mirror.close()
    assert [r.data.tags["steptune.trial"] for r in _children(tracker, parent)] == ["0", "1"]
    assert "MLflow no_such_call failed (AttributeError" in capfd.readouterr().err


def test_a_mirror_that_does_not_finish_in_time_is_stopped_and_the_driver_reconciles(tmp_path, caplog):
    tracker, parent = _open(tmp_path)
    records = _lines(4)
    mirror = M.Mirror(tracker, parent, lambda: tracker.reconcile(parent, records))
    for r in records:
        mirror.submit("log_trial", r, None)
    os.kill(mirror._proc.pid, 19)  # SIGSTOP: a mirror that gets no CPU at all
    with caplog.at_level(logging.WARNING):
        assert mirror.flush(patience_s=600, stall_s=0.5) is False
    assert "(no call finished in 0.5 s); the driver logs what the store misses itself" in caplog.text
    assert mirror._proc is None and mirror.inline_s > 0
    runs = _children(tracker, parent)
    assert sorted(r.data.tags["steptune.trial"] for r in runs) == ["0", "1", "2", "3"]
    assert {r.info.status for r in runs} == {"FINISHED"}  # nothing half-logged, nothing twice


def test_a_mirror_too_far_behind_hands_the_rest_of_the_sweep_to_the_driver(tmp_path, monkeypatch):
    monkeypatch.setattr(M, "MAX_BEHIND", 2)
    tracker, parent = _open(tmp_path)
    records = _lines(6)
    mirror = M.Mirror(tracker, parent, lambda: tracker.reconcile(parent, records[:len(seen)]))
    seen = []
    mirror.submit("log_trial", records[0], None)
    seen.append(records[0])
    os.kill(mirror._proc.pid, 19)
    for r in records[1:]:
        seen.append(r)
        mirror.submit("log_trial", r, None)
    assert mirror.background is False and mirror._proc is None
    assert sorted(int(r.data.tags["steptune.trial"]) for r in _children(tracker, parent)) == list(range(6))


def test_inline_mode_logs_before_submit_returns(tmp_path):
    tracker, parent = _open(tmp_path)
    (record,) = _lines(1)
    mirror = M.Mirror(tracker, parent, lambda: None, background=False)
    t0 = time.perf_counter()
    mirror.submit("log_trial", record, None)
    assert mirror._proc is None and len(_children(tracker, parent)) == 1
    assert mirror.inline_s == pytest.approx(time.perf_counter() - t0, abs=0.5)
