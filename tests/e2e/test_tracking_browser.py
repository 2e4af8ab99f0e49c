"""The MLflow UI on a real sweep's store, seen in a real headless Chromium (driven over the DevTools protocol).

Skips where no Chromium is installed (``apt-get install chromium``); the same facts are asserted over REST in
test_tracking_resume.py and test_tracking_server.py, which always run. Set STEPTUNE_SCREENSHOTS=<dir> to keep
the pictures (docs/img/ was made this way).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from test_tracking_resume import _ledger  # noqa: E402  (a baseline, trials, a failed one, two confirms)
from test_tracking import log_ledger  # noqa: E402

pytestmark = pytest.mark.e2e
CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
aiohttp = pytest.importorskip("aiohttp")  # the DevTools websocket client (a dependency of ray[default])


class Page:
    """One Chromium tab over the DevTools protocol: navigate, read the text, take a screenshot."""

    def __init__(self, ws) -> None:
        self.ws, self.n = ws, 0

    async def call(self, method: str, **params):
        self.n += 1
        await self.ws.send_json({"id": self.n, "method": method, "params": params})
        while True:
            msg = await self.ws.receive_json(timeout=60)
            if msg.get("id") == self.n:
                assert "error" not in msg, msg
                return msg["result"]

    async def text(self) -> str:
        r = await self.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                            returnByValue=True)
        return r["result"].get("value") or ""

    async def wait_for(self, *needles: str, timeout: float = 90) -> str:
        deadline = time.time() + timeout
        while True:
            text = await self.text()
            if all(n in text for n in needles) or time.time() > deadline:
                return text
            await asyncio.sleep(0.5)

    async def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode((await self.call("Page.captureScreenshot", format="png"))["data"]))


async def _browse(script) -> None:
    profile = tempfile.mkdtemp(prefix="steptune-chromium-")
    # --lang=en-US: without it the UI fails with "Invalid language tag: en-US@posix" under a POSIX locale.
    proc = subprocess.Popen([CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--lang=en-US",
                             "--window-size=1400,900", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.time() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None and time.time() < deadline, "chromium did not start"
            await asyncio.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        url = next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")
        async with aiohttp.ClientSession() as session, session.ws_connect(url, max_msg_size=0) as ws:
            page = Page(ws)
            await page.call("Page.enable")
            await script(page)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def ui(mlflow_ui):
    """The served store (tests/e2e/conftest.py) with the sweep "browsed": a baseline, trials, a failed one."""
    base, tracker = mlflow_ui
    parent = tracker.start_sweep("browsed", {"search": {"n_trials": 5}}, 0.06)
    log_ledger(tracker, parent, _ledger("browsed"))
    tracker.log_best(parent, _ledger("browsed")[4])
    tracker.finish_sweep(parent, {"n_trials": 5, "stopped_because": "trial 4 met the target"}, None, "table")
    return base, tracker, parent


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)")
@pytest.mark.timeout(600)
def test_the_printed_link_opens_model_training_with_the_sweep_curve(ui, tmp_path):
    base, tracker, parent = ui
    shots = Path(os.environ.get("STEPTUNE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}

    async def script(page: Page) -> None:
        url = tracker.view_url(base)
        assert "workflowType=machine_learning" in url
        await page.call("Page.navigate", url=url)
        seen["experiment"] = await page.wait_for("Model training", "browsed", "Run Name")
        await page.screenshot(shots / "mlflow_experiment.png")
        await page.call("Page.navigate", url=f"{base}/#/experiments/{tracker.experiment_id}/runs/{parent}"
                                             f"/model-metrics?workflowType=machine_learning")
        seen["charts"] = await page.wait_for("best_step_time_s", "step_time_s")
        await page.screenshot(shots / "mlflow_parent_charts.png")

    asyncio.run(_browse(script))
    # "Model training" lists runs (a run table with the sweep's parent), not GenAI's "Evaluation runs" / traces.
    assert "Run Name" in seen["experiment"] and "browsed" in seen["experiment"], seen["experiment"][:2000]
    assert "Evaluation runs" not in seen["experiment"]
    assert "best_step_time_s" in seen["charts"], seen["charts"][:2000]
    for name in ("mlflow_experiment.png", "mlflow_parent_charts.png"):
        assert (shots / name).stat().st_size > 10_000


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (apt-get install chromium)")
@pytest.mark.timeout(600)
def test_the_printed_link_lists_the_sweeps_runs_with_the_answer_first(mlflow_ui, tmp_path):
    """Issue 26 item 4: the link the sweep prints opens its runs table filtered to its ledger lines and sorted by
    the answer's rank, so the winner's runs are the first rows without a click; the parent's description (its
    overview page) states the answer."""
    from orchestrator.review import report
    from orchestrator.search.target import Target

    base, tracker = mlflow_ui
    lines = _ledger("ranked")
    parent = tracker.start_sweep("ranked", {"search": {"n_trials": 5}}, 0.06)
    log_ledger(tracker, parent, lines)
    summary = {**report.summarize(lines, Target(step_time_s=0.06)), "stopped_because": "the trial budget is spent"}
    answer = __import__("orchestrator.records.answer", fromlist=["decide"]).decide(lines, Target(step_time_s=0.06))
    tracker.finish_sweep(parent, summary, None, "table", report.by_trial(lines, answer))
    winner = next(r for r in lines if r.trial == answer.winner.trial and r.kind.value in ("trial", "baseline"))
    second = next(r for r in lines if r.trial == answer.ranked[1].trial and r.kind.value in ("trial", "baseline"))
    shots = Path(os.environ.get("STEPTUNE_SCREENSHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    seen: dict[str, str] = {}
    from orchestrator.review.tracking_lines import run_name

    async def script(page: Page) -> None:
        url = tracker.view_url(base, sweep="ranked")
        assert "orderByKey=" in url and "searchFilter=" in url
        await page.call("Page.navigate", url=url)
        seen["runs"] = await page.wait_for(run_name(winner), run_name(second))
        await page.screenshot(shots / "mlflow_answer_first.png")
        await page.call("Page.navigate", url=f"{base}/#/experiments/{tracker.experiment_id}/runs/{parent}"
                                             f"?workflowType=machine_learning")
        seen["overview"] = await page.wait_for(f"best (trial {answer.winner.trial})")

    asyncio.run(_browse(script))
    text = seen["runs"]
    assert run_name(winner) in text and run_name(second) in text, text[:3000]
    assert text.index(run_name(winner)) < text.index(run_name(second)), text[:3000]
    assert "browsed" not in text  # another sweep's runs are filtered out
    assert f"best (trial {answer.winner.trial})" in seen["overview"], seen["overview"][:3000]
