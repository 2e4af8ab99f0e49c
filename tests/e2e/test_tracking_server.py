"""The printed `mlflow ui` command, run for real on loopback against a sweep's store, read back over REST."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tracking import make_record  # noqa: E402  (same synthetic ledger lines as the store test)

pytestmark = pytest.mark.e2e


def _call(base: str, path: str, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


@pytest.fixture
def server(mlflow_ui):
    """The served store (tests/e2e/conftest.py) with one sweep, "served": a parent and two children."""
    base, tracker = mlflow_ui
    parent = tracker.start_sweep("served", {"search": {"n_trials": 2}}, 0.06)
    children = [tracker.log_trial(parent, make_record(0, "baseline", 0.1, sweep="served")),
                tracker.log_trial(parent, make_record(1, "trial", 0.05, sweep="served", parallel__dp=2))]
    tracker.finish_sweep(parent, {"n_trials": 2}, None, "table")
    return base, tracker.experiment_id, parent, children


def test_runs_read_back_through_rest(server):
    base, experiment_id, parent, children = server
    found = _call(base, "/api/2.0/mlflow/runs/search", {
        "experiment_ids": [experiment_id], "filter": "tags.\"steptune.sweep\" = 'served'"})["runs"]
    runs = {r["info"]["run_id"]: r for r in found}
    assert set(runs) == {parent, *children}

    def tags(run):
        return {t["key"]: t["value"] for t in run["data"].get("tags", [])}

    assert tags(runs[parent])["steptune.role"] == "parent" and runs[parent]["info"]["status"] == "FINISHED"
    for child in children:
        assert tags(runs[child])["mlflow.parentRunId"] == parent
        assert runs[child]["info"]["status"] == "FINISHED"
    trial = runs[children[1]]
    params = {p["key"]: p["value"] for p in trial["data"]["params"]}
    metrics = {m["key"]: m["value"] for m in trial["data"]["metrics"]}
    assert params["parallel.dp"] == "2" and params["derived.dp"] == "2"
    assert metrics["step_time_s"] == 0.05 and "phase.dp_comm_wait_s" in metrics
    history = _call(base, f"/api/2.0/mlflow/metrics/get-history?run_id={children[1]}&metric_key=step/loss")
    assert [m["step"] for m in history["metrics"]] == [0, 1, 2, 3]
    files = {f["path"] for f in _call(base, f"/api/2.0/mlflow/artifacts/list?run_id={children[1]}")["files"]}
    assert {"timeline.png", "result.json", "trainer_config.yaml"} <= files
