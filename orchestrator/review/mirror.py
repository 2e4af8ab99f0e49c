"""The MLflow mirror's worker: tracking calls run in order in one child process at the lowest CPU priority.

Mirroring a ledger line costs up to ~0.2 s on a 2-core machine (a timeline picture, a child run's writes to the
store; bench/mirror_cost.py); done between runs, the training ranks wait for it: ~8% of the default sweep's wall.
Handed to this process, the driver submits the next run at once. The process runs at nice 19, so while ranks
are measured it takes only the CPU they leave idle (Linux's scheduler gives a nice-19 task about 1.5% of a core
against a nice-0 one): step times stay the ranks' own. A process, not a thread: a low-priority thread holding
the driver's GIL while the scheduler keeps it off the CPU would stall the driver itself whenever neighbours
keep the cores busy.

Under such neighbours the mirror may fall far behind. ``flush`` therefore waits only as long as the same calls
would have taken in the driver (``patience_s``); then it stops the process and the driver logs what is missing
itself, at its own priority, by reconciling the store with the ledger (Tracker.reconcile: matched by tags, a
half-logged child run is logged again whole). The ledger stays the source of truth throughout: a failed call
is logged and skipped, and lines a killed driver never mirrored are reconciled on resume.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import time
from pathlib import Path
from typing import Any, Callable

log = logging.getLogger(__name__)

NICE = 19
"""The mirror process's niceness: the lowest priority, so measured ranks keep their cores."""
MAX_BEHIND = 12
"""A mirror this many calls behind is not finding idle CPU (neighbours keep the cores busy): the driver catches up
and mirrors the rest of the sweep itself, so falling behind never costs more than mirroring inline would."""
STALL_S = 3.0
"""``flush`` stops waiting when no call finished for this long: the child is getting no CPU, and the driver is
faster doing the rest itself."""
PATIENCE_PER_CALL_S = 1.0
"""How long ``flush`` waits per call still queued (a call costs up to ~0.2 s on an idle 2-core machine) before the
driver takes the rest over."""


def _serve(uri: str, experiment: str, artifact_root: str | None, parent: str, inbox: Any, done: Any) -> None:
    os.nice(NICE)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's: it decides how long to wait for us
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from orchestrator.review.tracking import Tracker

    tracker = Tracker(uri, experiment, Path(artifact_root) if artifact_root else None)
    driver = mp.parent_process()
    while True:
        try:
            item = inbox.get(timeout=1.0)
        except queue.Empty:
            if driver is not None and not driver.is_alive():  # a killed driver: its resume reconciles the rest
                return
            continue
        if item is None:
            return
        what, args = item
        try:
            getattr(tracker, what)(parent, *args)
        except Exception as e:  # tracking mirrors the ledger; the sweep does not depend on it
            log.warning("MLflow %s failed (%s: %s); the ledger has it", what, type(e).__name__, e)
        with done.get_lock():
            done.value += 1


class Mirror:
    """Runs ``Tracker.<what>(parent, *args)`` for each ``submit``, in submission order: in a child process at
    nice 19 (``background``), or at once in the caller. ``take_over()`` is the driver's fallback when the child
    is stopped before it is done: it must leave the store holding every ledger line (a reconcile)."""

    def __init__(self, tracker: Any, parent: str, take_over: Callable[[], None], background: bool = True):
        self.tracker, self.parent, self.take_over, self.background = tracker, parent, take_over, background
        self._proc: Any = None
        self._inbox: Any = None
        self._done: Any = None
        self.submitted = 0
        self.inline_s = 0.0
        """Seconds the driver itself spent on tracking calls (inline mode, or taking over)."""

    def submit(self, what: str, *args: Any) -> None:
        if not self.background:
            self._inline(lambda: getattr(self.tracker, what)(self.parent, *args), what)
            return
        if self._proc is None:
            ctx = mp.get_context("spawn")  # not fork: the driver holds Ray's threads
            self._inbox, self._done = ctx.Queue(), ctx.Value("i", 0)
            # At exit the driver must not wait to push calls into the pipe of a child that was stopped or killed:
            # what a flush did not see done is the ledger's to reconcile.
            self._inbox.cancel_join_thread()
            root = str(self.tracker.artifact_root) if self.tracker.artifact_root else None
            self._proc = ctx.Process(target=_serve, name="steptune-mlflow-mirror", daemon=True, args=(
                self.tracker.tracking_uri, self.tracker.experiment_name, root, self.parent, self._inbox, self._done))
            self._proc.start()
        self._inbox.put((what, args))
        self.submitted += 1
        if self.behind > MAX_BEHIND:
            # Neighbours leave it no idle CPU: catch up now, at the driver's priority, and mirror inline from here on
            log.warning("MLflow mirror: %d calls behind (the machine has no idle CPU for it); the driver catches up "
                        "and logs the rest of this sweep itself", self.behind)
            self.flush(patience_s=0.0)
            self.background = False

    @property
    def behind(self) -> int:
        """Calls submitted that the child has not finished."""
        return self.submitted - self._done.value if self._proc is not None else 0

    def flush(self, patience_s: float | None = None, stall_s: float | None = STALL_S) -> bool:
        """Wait for every submitted call; True when the child did them all. Gives up after ``patience_s`` in all
        (default: PATIENCE_PER_CALL_S per call queued, at least 10 s) or ``stall_s`` without a call finishing
        (the machine leaves the child no CPU), then stops the child and runs ``take_over``; False then."""
        if self._proc is None:
            return True
        wait = patience_s if patience_s is not None else max(10.0, PATIENCE_PER_CALL_S * self.behind)
        now = time.monotonic()
        deadline, done, moved = now + wait, self._done.value, now
        while self.behind > 0 and self._proc.is_alive() and now < deadline:
            if self._done.value != done:
                done, moved = self._done.value, now
            elif stall_s is not None and now - moved > stall_s:
                break
            time.sleep(0.02)
            now = time.monotonic()
        if self.behind == 0:
            return True
        why = ("its process ended" if not self._proc.is_alive() else
               f"no call finished in {stall_s:g} s" if now < deadline else f"not within {wait:.0f} s")
        log.warning("MLflow mirror: %d call(s) not done (%s); the driver logs what the store misses itself",
                    self.behind, why)
        self.close()
        self._inline(self.take_over, "reconcile")
        return False

    def last(self, what: str, *args: Any, patience_s: float | None = None) -> None:
        """The sweep's last call (``finish_sweep``, ``end_sweep``), in the driver once the mirror is done and
        stopped: its arguments (the Optuna study) stay in this process, and the parent's end is never left to a
        process that may die."""
        self.flush(patience_s)
        self.close()
        self._inline(lambda: getattr(self.tracker, what)(self.parent, *args), what)

    def close(self) -> None:
        """Stop the child (after a flush: it is idle); later calls start a new one."""
        if self._proc is None:
            return
        if self._proc.is_alive():
            if self.behind == 0:
                self._inbox.put(None)
                self._proc.join(5)
            if self._proc.is_alive():  # SIGKILL: a stopped or starved process must not hold the driver's exit
                self._proc.kill()
                self._proc.join(5)
        self._inbox.close()
        self._proc = self._inbox = None
        self.submitted = 0

    def _inline(self, call: Callable[[], Any], what: str) -> None:
        t0 = time.perf_counter()
        try:
            call()
        except Exception as e:
            log.warning("MLflow %s failed (%s: %s); the ledger has it", what, type(e).__name__, e)
        finally:
            self.inline_s += time.perf_counter() - t0
