"""One `mlflow ui` server for the tests that read a store over HTTP (REST and the browser).

It is the command the sweep prints, run for real on loopback; each test writes its own sweep (its own
``steptune.sweep`` tag) into the served store, so one server start (~6-9 s on 2 cores) serves them all.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.request

import pytest


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_ui(tmp_path_factory):
    """(base URL, the Tracker of the served store): the printed `mlflow ui` command, one worker."""
    from orchestrator.review.tracking import Tracker, tracking_uri_for

    tracker = Tracker(tracking_uri_for(tmp_path_factory.mktemp("served") / "results"), "steptune")
    cmd = shlex.split(tracker.ui_command())  # run as printed, whatever PATH holds (orchestrator/commands.py)
    assert cmd[:2] == ["mlflow", "ui"] or cmd[1:4] == ["-m", "mlflow", "ui"], cmd
    # One worker: the default four take ~20 s to start on a 2-core machine.
    proc = subprocess.Popen(cmd + ["--host", "127.0.0.1", "--port", str(port := _free_port()), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120  # ~6 s on an idle 2-core machine; generous under load
        while True:
            try:
                urllib.request.urlopen(base + "/health", timeout=1).read()
                break
            except OSError:
                assert proc.poll() is None, f"mlflow ui exited with {proc.returncode}"
                assert time.time() < deadline, "mlflow ui did not answer within 120 s"
                time.sleep(0.25)
        yield base, tracker
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the server's own process group: it and its workers
        try:
            proc.wait(3)  # a graceful stop waits for the browser's kept-alive connections: not worth 10 s
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
