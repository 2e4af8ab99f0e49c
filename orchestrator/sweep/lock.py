"""One driver per Optuna study, whatever its results directory: a driver record in the study, kept alive by a heartbeat.

The ledger lock (orchestrator.records.ledger) guards one results directory; two drivers with different results dirs
but the same ``storage.optuna_url`` would still share the study, and the second would take the first one's
RUNNING trial for a dead driver's (FAIL it, queue a second baseline). So the study itself is claimed at open:

- A claim is a study system attr ``steptune.driver.<generation>`` holding a :class:`DriverRecord` (host,
  pid, start time, results dir, a random token). The newest generation is the holder.
- The holder's heartbeat thread rewrites its record's ``heartbeat_at`` (the database's clock, so hosts'
  clocks need not agree) every ``heartbeat_interval_s``, and records Optuna's own trial heartbeat for
  every RUNNING trial, so Optuna's ``fail_stale_trials`` (run by each ``ask()`` on a heartbeat storage)
  fails only the trials of a driver that stopped beating; those are queued again by
  :func:`requeue_stale`.
- A new driver is refused while the newest record is live (not released, heartbeat within
  ``grace_period_s``), with a message naming the holder; a stale record (its driver was killed) is taken
  over with a note. A record of this same process, or of a process of this host that no longer exists
  (a killed driver resumed on its own machine), is taken over at once.
- Two drivers claiming the same generation at once: Optuna's attr write is an upsert, so each writes, waits
  ``SETTLE_S`` and reads its generation back; only the one whose token is there goes on.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import optuna
import sqlalchemy
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)

KEY = "steptune.driver."
SETTLE_S = 0.5
"""Between writing a claim and reading it back: longer than another driver's check-to-write step."""


class StudyBusy(RuntimeError):
    """Another live driver holds this Optuna study."""


@dataclass
class DriverRecord:
    host: str
    pid: int
    started_at: str
    """UTC, ISO 8601 (this host's clock: for people)."""
    results_dir: str
    token: str
    heartbeat_at: str
    """The database's clock at the last heartbeat (ISO 8601): what staleness is judged by."""
    released: bool = False
    """Set by a driver that ended normally: its study is free at once."""

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (results dir {self.results_dir}, started {self.started_at})"


SQLITE_BUSY_TIMEOUT_S = 60
"""How long a write to a sqlite study waits for another process's lock before it fails."""


def heartbeat_storage(url: str, interval_s: int, grace_s: int) -> RDBStorage:
    """Optuna's RDB storage with its trial heartbeat on; a trial failed as stale is queued again."""
    # Optuna warns on every ask() that its heartbeat is meant for optimize(); here this module beats for it.
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        # sqlite: several processes write one file (this driver, its heartbeat thread, a second driver being
        # refused); a writer waits for the lock instead of failing after sqlite's default 5 s on a busy machine.
        engine = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}} if url.startswith("sqlite") else None
        storage = RDBStorage(url, engine_kwargs=engine, heartbeat_interval=interval_s, grace_period=grace_s,
                             heartbeat_stale_trial_callback=requeue_stale)
    if url.startswith("sqlite"):
        _write_ahead(storage.engine)
    return storage


def _write_ahead(engine: Any) -> None:
    """sqlite in write-ahead-log mode, synced at checkpoints rather than at every commit: Optuna commits some
    twenty times per trial (ask, params, user attrs, constraints, tell, heartbeats), each an fsync that the ranks
    wait through between two runs. A commit lost to a power cut is told again from the ledger, which stays
    fsynced per line (orchestrator.sweep.study's resume)."""
    def pragmas(conn: Any, _record: Any) -> None:
        cur = conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.close()

    sqlalchemy.event.listen(engine, "connect", pragmas)
    engine.dispose()  # connections opened while Optuna created its tables reconnect with the pragmas


def requeue_stale(study: optuna.Study, trial: FrozenTrial) -> None:
    """A trial whose driver stopped beating (Optuna just failed it): its params are queued again."""
    study.enqueue_trial(trial.params, user_attrs={"kind": trial.user_attrs.get("kind", "trial"),
                                                  "requeued_from": trial.number})


class StudyLock:
    def __init__(self, storage: RDBStorage, study_name: str, results_dir: str):
        self.storage, self.results_dir = storage, str(results_dir)
        self.study_id = storage.get_study_id_from_name(study_name)
        self.study_name = study_name
        self.grace_s = storage.grace_period or 2 * storage.heartbeat_interval
        self.interval_s = storage.heartbeat_interval
        self.key: str | None = None
        self.record: DriverRecord | None = None
        self.lost = threading.Event()
        """Set when another driver took the study over (this one's heartbeat had stopped for too long)."""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _now(self) -> datetime:
        with self.storage.engine.connect() as conn:
            now = conn.execute(sqlalchemy.select(sqlalchemy.func.now())).scalar()
        if isinstance(now, str):  # sqlite's CURRENT_TIMESTAMP, UTC
            now = datetime.fromisoformat(now)
        return now.replace(tzinfo=None)

    def _newest(self) -> tuple[int, DriverRecord | None]:
        attrs = self.storage.get_study_system_attrs(self.study_id)
        gens = {int(k[len(KEY):]): k for k in attrs if k.startswith(KEY) and k[len(KEY):].isdigit()}
        if not gens:
            return 0, None
        gen = max(gens)
        return gen, DriverRecord(**attrs[gens[gen]])

    def acquire(self) -> "StudyLock":
        gen, holder = self._newest()
        note = None
        if holder is not None and not holder.released:
            age = (self._now() - datetime.fromisoformat(holder.heartbeat_at)).total_seconds()
            here = holder.host == socket.gethostname()
            mine = here and holder.pid == os.getpid()
            gone = here and not _alive(holder.pid)  # on this host a dead driver is known at once
            if age <= self.grace_s and not (mine or gone):
                raise StudyBusy(self._busy(holder, age))
            if not mine:
                why = "its process is gone" if gone else \
                    f"last heartbeat {age:.0f} s ago > storage.grace_period_s={self.grace_s}"
                note = (f"note: took over study {self.study_name!r} from a driver that stopped ({holder.describe()}; "
                        f"{why}); its running trials are queued again" + ("" if holder.results_dir == self.results_dir else
                                                      f"; its ledger stays in {holder.results_dir}"))
        self.key = f"{KEY}{gen + 1:06d}"
        self.record = DriverRecord(host=socket.gethostname(), pid=os.getpid(),
                                   started_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                                   results_dir=self.results_dir, token=secrets.token_hex(8),
                                   heartbeat_at=self._now().isoformat())
        self._write()
        time.sleep(SETTLE_S)
        back = DriverRecord(**self.storage.get_study_system_attrs(self.study_id)[self.key])  # the upsert's winner
        if back.token != self.record.token or self._newest()[0] != gen + 1:
            raise StudyBusy(self._busy(back if back.token != self.record.token else self._newest()[1], 0.0))
        if note:
            log.info(note)
        self._thread = threading.Thread(target=self._beat, name="steptune-study-heartbeat", daemon=True)
        self._thread.start()
        return self

    def _busy(self, holder: DriverRecord | None, age: float) -> str:
        who = holder.describe() if holder else "another driver"
        return (f"study {self.study_name!r} is being run by another driver: {who}; its last heartbeat was "
                f"{age:.0f} s ago. Wait for it to finish, stop it, or use another name=...; a killed driver's "
                f"study is free storage.grace_period_s={self.grace_s} s after its last heartbeat")

    def _write(self) -> None:
        self.storage.set_study_system_attr(self.study_id, self.key, dataclasses.asdict(self.record))

    def beat(self) -> None:
        """One heartbeat: this driver's record, and Optuna's heartbeat of each RUNNING trial (all are ours)."""
        if self._newest()[0] != int(self.key[len(KEY):]):
            self.lost.set()
            return
        self.record.heartbeat_at = self._now().isoformat()
        self._write()
        for t in self.storage.get_all_trials(self.study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            self.storage.record_heartbeat(t._trial_id)

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s) and not self.lost.is_set():
            try:
                self.beat()
            except Exception as e:  # a store hiccup: the next beat tries again; the grace period allows several
                log.warning("study heartbeat failed (%s: %s)", type(e).__name__, e)

    def release(self) -> None:
        """Stop beating and mark the record released (the study is free at once)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.record is not None and not self.lost.is_set() and self._newest()[0] == int(self.key[len(KEY):]):
            self.record.released = True
            self._write()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def open_locked(url: str, study_name: str, results_dir: Any, interval_s: int, grace_s: int,
                **create: Any) -> tuple[optuna.Study, StudyLock]:
    """Create or load the study on a heartbeat storage and claim it for this driver (StudyBusy if held)."""
    storage = heartbeat_storage(url, interval_s, grace_s)
    study = optuna.create_study(study_name=study_name, storage=storage, load_if_exists=True, **create)
    return study, StudyLock(storage, study_name, str(results_dir)).acquire()
