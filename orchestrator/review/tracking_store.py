"""Opening the sweep's MLflow store, including one that a killed driver left half-created.

MLflow builds a new sqlite store in two steps: ``create_all`` of its initial tables, then every alembic
migration (``mlflow.store.db.utils._initialize_tables``). On sqlite each ``CREATE TABLE`` commits on its
own, so a driver killed in between leaves some of the later tables in place while ``alembic_version``
still names an older revision. Every later open replays the migrations from that revision and fails
(``table datasets already exists``, ``table _alembic_tmp_latest_metrics already exists``, ...), which
turned tracking off for every later sweep on that results directory.

Such a store holds no run (the first run is written after the schema is complete), so nothing is lost by
setting it aside and creating it again; the sweep's ledger is the source of truth and a resumed sweep
logs every line of it again (``Tracker.reconcile``). A store that fails to open but does hold runs is
never touched: the error names the file and the fix.
"""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


class BrokenStore(RuntimeError):
    """An MLflow sqlite store that cannot be opened and holds runs, so it is not set aside automatically."""


def open_with_recovery(db: Path | None, open_store: Callable[[], T]) -> T:
    """``open_store()``; if it fails on a sqlite store with no runs in it, set the file aside and retry once."""
    try:
        return open_store()
    except Exception as exc:
        if db is None or not db.is_file():
            raise
        runs = _run_count(db)
        if runs:
            raise BrokenStore(
                f"the MLflow store {db} holds {runs} run(s) but does not open ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:300]}); run `mlflow db upgrade sqlite:///{db}`, or move the file "
                f"aside: the next sweep then logs its ledger into a new store") from exc
        aside = db.with_name(f"{db.name}.broken-{time.strftime('%Y%m%d-%H%M%S')}")
        _forget_engine(db)
        db.rename(aside)
        for suffix in ("-wal", "-shm", "-journal"):  # sqlite's side files belong to the old database
            side = db.with_name(db.name + suffix)
            if side.exists():
                side.rename(aside.with_name(aside.name + suffix))
        log.warning(f"MLflow store {db} was left half-created (a driver stopped during its first setup: "
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}); it held no runs, so it was moved to "
            f"{aside.name} and created again")
        return open_store()


def _run_count(db: Path) -> int:
    """Rows in the store's ``runs`` table (0 when the table is not there yet); read-only, no MLflow."""
    con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True)
    try:
        if not con.execute("select 1 from sqlite_master where type = 'table' and name = 'runs'").fetchone():
            return 0
        return int(con.execute("select count(*) from runs").fetchone()[0])
    finally:
        con.close()


def _forget_engine(db: Path) -> None:
    """Drop MLflow's process-wide cached engine for this file, so the retry opens the new file, not the old one."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    engines = getattr(SqlAlchemyStore, "_engine_map", {})  # MLflow's cache of one engine per database URI
    for uri in [u for u, e in engines.items() if e.url.database and Path(e.url.database).resolve() == db]:
        engines.pop(uri).dispose()
