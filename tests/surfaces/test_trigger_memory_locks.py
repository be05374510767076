"""A tick's trigger memory waits for another writer's lock within the tick's deadline, on
every store the machine can run (SQLite, PostgreSQL, MariaDB): the write gives up with
:class:`MemoryBusy` (naming ``maintain.locks.uri``) instead of waiting out SQLite's 30 s,
MySQL's 50 s or PostgreSQL's forever, and the connection's own setting is put back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.maintenance.sql_store import engine_for
from icegate_dagster.maintenance.trigger.store import MemoryBusy, TriggerMemory
from tests.surfaces.mysql_server import MySQLServer, available, mysql_server
from tests.surfaces.postgres_server import postgres_server

#: A generous liveness bound: the bounded wait is 1 s; the databases' own are 30 s and more.
LIVENESS_S = 20.0


@pytest.fixture(scope="module")
def mysql() -> Iterator[MySQLServer]:
    if not available():
        pytest.fail("MariaDB is not installed: run scripts/setup.sh --test")
    with mysql_server(database="memory_locks") as server:
        yield server


def _setting(engine: Any) -> int:
    """The lock wait a fresh statement of the engine's pool would get."""
    with engine.connect() as conn:
        if engine.dialect.name == "sqlite":
            return int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar())
        return int(conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar())


def _gives_up_within_the_deadline(engine: Any) -> None:
    from sqlalchemy import text

    memory = TriggerMemory(engine)
    now = memory.now()
    assert memory.record_requests([("ns.t", ["optimize"])], "health", now) == {"ns.t": 1}
    before = _setting(engine) if engine.dialect.name != "postgresql" else None
    with engine.connect() as holder, holder.begin():
        # Another maintainer's transaction holds the table's row.
        holder.execute(
            text("UPDATE icegate_trigger_tables SET decisions = 5 WHERE table_name = 'ns.t'")
        )
        started = time.monotonic()
        with pytest.raises(MemoryBusy, match=r"maintain\.locks\.uri\) is locked"):
            memory.within(started + 1.0).record_requests([("ns.t", ["optimize"])], "health", now)
        assert time.monotonic() - started < LIVENESS_S
        holder.rollback()
    if before is not None:
        assert _setting(engine) == before
    # The lock gone, the same write goes through, numbered after the one that was kept.
    bounded = memory.within(time.monotonic() + 10)
    assert bounded.record_requests([("ns.t", ["optimize"])], "health", now + 1) == {"ns.t": 2}


def test_sqlite(tmp_path: Path) -> None:
    _gives_up_within_the_deadline(engine_for(f"sqlite:///{tmp_path / 'store.db'}"))


def test_postgresql() -> None:
    with postgres_server(database="memory_locks") as server:
        engine = engine_for(server.uri(server.password))
        _gives_up_within_the_deadline(engine)
        engine.dispose()


def test_mysql(mysql: MySQLServer) -> None:
    engine = engine_for(mysql.uri())
    _gives_up_within_the_deadline(engine)
    engine.dispose()
