"""The MLflow mirror's worker (orchestrator.review.mirror): order, failures, flush, priority."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time

import pytest

from orchestrator.review.mirror import NICE, Mirror


def test_calls_run_in_submission_order_on_another_thread_and_flush_waits_for_them():
    seen: list[tuple[str, int, int]] = []
    main = threading.get_ident()

    def call(what, n):
        time.sleep(0.01 if n % 2 else 0.0)  # uneven work: order must not depend on it
        seen.append((what, n, threading.get_ident()))

    mirror = Mirror(call)
    for n in range(20):
        mirror.submit("log_trial", n)
    assert mirror.flush(timeout_s=30)
    assert [n for _, n, _ in seen] == list(range(20))
    assert {tid for _, _, tid in seen} != {main}
    assert mirror.busy_s > 0.09


def test_a_failing_call_is_logged_and_the_next_ones_still_run(caplog):
    seen = []

    def call(what, n):
        if n == 1:
            raise RuntimeError("store is locked")
        seen.append(n)

    mirror = Mirror(call)
    with caplog.at_level(logging.WARNING):
        for n in range(3):
            mirror.submit("log_trial", n)
        assert mirror.flush(timeout_s=30)
    assert seen == [0, 2]
    assert "MLflow log_trial failed (RuntimeError: store is locked); the ledger has it" in caplog.text


def test_flush_gives_up_after_its_timeout_and_says_what_is_left(caplog):
    release = threading.Event()
    mirror = Mirror(lambda what, n: release.wait(30))
    mirror.submit("log_trial", 0)
    mirror.submit("log_trial", 1)
    with caplog.at_level(logging.WARNING):
        assert mirror.flush(timeout_s=0.2) is False
    assert "still queued" in caplog.text and "reconciles" in caplog.text
    release.set()
    assert mirror.flush(timeout_s=30)


def test_inline_mode_runs_each_call_in_the_callers_thread_before_submit_returns():
    seen = []
    mirror = Mirror(lambda what, n: seen.append((n, threading.get_ident())), background=False)
    mirror.submit("log_trial", 7)
    assert seen == [(7, threading.get_ident())]
    assert mirror.flush(timeout_s=0)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")
def test_the_worker_thread_runs_at_the_lowest_priority_and_the_caller_keeps_its_own():
    niceness = []
    mirror = Mirror(lambda what: niceness.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())))
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    mirror.submit("log_best")
    assert mirror.flush(timeout_s=30)
    assert niceness == [NICE]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before
