"""The MLflow mirror's worker: tracking calls run in order on one background thread at the lowest CPU priority.

Mirroring a ledger line costs the driver ~0.3 s on a 2-core machine (a timeline picture, a child run's
writes to the store); done between runs, the training ranks wait for it: ~40 lines are ~15% of the default
sweep's wall time. On this thread the driver submits the next run at once. The thread lowers its own priority
to nice 19 (Linux schedules threads as tasks), so while ranks are measured it takes only the CPU they leave
idle (CFS gives a nice-19 task about 1.5% of a core against a nice-0 one): the step times stay the ranks' own.

The ledger stays the source of truth: a call that fails is logged and skipped, and lines a killed driver never
mirrored are reconciled on resume (orchestrator.review.tracking.Tracker.reconcile).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable

log = logging.getLogger(__name__)

NICE = 19
"""The worker thread's niceness: the lowest priority, so measured ranks keep their cores."""


class Mirror:
    """Runs ``call(what, *args)`` for each ``submit`` in submission order; in the caller's thread when not
    ``background``."""

    def __init__(self, call: Callable[..., Any], background: bool = True):
        self.call, self.background = call, background
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self.busy_s = 0.0
        """Seconds the mirror spent on calls (in either mode): its work, whether or not the driver waited."""

    def submit(self, what: str, *args: Any) -> None:
        if not self.background:
            self._run(what, args)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="steptune-mlflow-mirror", daemon=True)
            self._thread.start()
        self._queue.put((what, args))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every submitted call has run; False if ``timeout_s`` passed first."""
        if self._thread is None:
            return True
        done = threading.Event()
        self._queue.put(("__flush__", (done,)))
        if done.wait(timeout_s):
            return True
        log.warning("MLflow mirror: %d call(s) still queued after %.0f s; the ledger has them and the next run of "
                    "this sweep reconciles MLflow", self._queue.qsize(), timeout_s or 0)
        return False

    def _work(self) -> None:
        try:  # a thread's own niceness on Linux; elsewhere it keeps the process's priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), NICE)
        except (AttributeError, OSError):
            pass
        while True:
            what, args = self._queue.get()
            if what == "__flush__":
                args[0].set()
                continue
            self._run(what, args)

    def _run(self, what: str, args: tuple) -> None:
        t0 = time.perf_counter()
        try:
            self.call(what, *args)
        except Exception as e:  # tracking mirrors the ledger; the sweep does not depend on it
            log.warning("MLflow %s failed (%s: %s); the ledger has it", what, type(e).__name__, e)
        finally:
            self.busy_s += time.perf_counter() - t0
