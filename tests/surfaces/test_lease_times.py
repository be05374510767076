"""Lease and heartbeat times are exact on every store the machine can run: SQLite,
PostgreSQL and MariaDB (MySQL). A 4-byte ``FLOAT`` (what MySQL made of the old columns)
keeps an epoch instant only to 128 s: a lease renewed "until now + 2 min" could be stored a
minute short and taken over while its holder works. Tables made that way are widened to
``DOUBLE`` when the store opens. The trigger's memory writes and reads back the same on each.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from icegate_dagster.maintenance.leases.store import LEASE_TABLE, TableLocks
from icegate_dagster.maintenance.sql_store import engine_for
from icegate_dagster.maintenance.trigger.records import OperationAttempt, PassRecord
from icegate_dagster.maintenance.trigger.store import TriggerMemory
from tests.surfaces.mysql_server import MySQLServer, available, mysql_server
from tests.surfaces.postgres_server import postgres_server

LEASE = timedelta(minutes=2)


@pytest.fixture(scope="module")
def mysql() -> Iterator[MySQLServer]:
    if not available():
        pytest.fail("MariaDB is not installed: run scripts/setup.sh --test")
    with mysql_server() as server:
        yield server


def _exact(store: TableLocks) -> None:
    """A lease taken now lasts exactly one lease, by the database's clock, and a heartbeat
    too: to the millisecond, not to the 128 s a 4-byte float keeps."""
    from sqlalchemy import select

    assert store.try_acquire("ns.t", "token-1", "host:1:run") is None
    store.beat("run-1", "beat-1", "host:1:run-1", "host|boot|pid:[1]|1|1")
    with store.engine.connect() as conn:
        acquired, expires, now = conn.execute(
            select(store.table.c.acquired_at, store.table.c.expires_at, store.now)
        ).one()
        beat_started, beat_expires = conn.execute(
            select(store.heartbeats.c.started_at, store.heartbeats.c.expires_at)
        ).one()
    assert abs(float(expires) - float(acquired) - LEASE.total_seconds()) < 1e-3
    assert abs(float(expires) - float(now) - LEASE.total_seconds()) < 5
    assert abs(float(beat_expires) - float(beat_started) - LEASE.total_seconds()) < 1e-3
    # Renewed, it moves on by the seconds that passed, not by a float's step.
    assert store.renew("ns.t", "token-1")
    holder = store.holder("ns.t")
    assert holder is not None and holder.owner == "host:1:run"
    # Nobody else can take it while it lasts.
    assert store.try_acquire("ns.t", "token-2", "other:2:run") is not None


def _memory_round_trip(engine: object) -> None:
    """The trigger's memory upserts and reads back on this database."""
    memory = TriggerMemory(engine)
    now = memory.now()
    assert memory.record_requests([("ns.t", ["optimize"])], "health", now) == {"ns.t": 1}
    assert memory.record_requests([("ns.t", ["optimize"])], "health", now + 1) == {"ns.t": 2}
    for _ in range(2):
        memory.record_pass(
            PassRecord("ns.t", "r", (OperationAttempt("optimize", "failed", error="boom"),)),
            now=now + 10,
            backoff=timedelta(minutes=1),
            backoff_max=timedelta(hours=1),
        )
    memory.show([("ns.t", "abc123", True)], now + 11)
    remembered = memory.tables_memory()["ns.t"]
    assert remembered.decisions == 2 and remembered.shown_state == "abc123"
    optimize = remembered.operations["optimize"]
    assert (optimize.failures, optimize.detail) == (2, "boom")
    assert optimize.not_before is not None
    assert abs(optimize.not_before - (now + 10 + 60)) < 1e-3


def test_sqlite(tmp_path: Path) -> None:
    engine = engine_for(f"sqlite:///{tmp_path / 'store.db'}")
    _exact(TableLocks(engine, LEASE))
    _memory_round_trip(engine)


def test_postgresql() -> None:
    with postgres_server(database="leases") as server:
        engine = engine_for(server.uri(server.password))
        _exact(TableLocks(engine, LEASE))
        _memory_round_trip(engine)
        engine.dispose()


def test_mysql_keeps_exact_times_and_widens_an_older_stores_floats(mysql: MySQLServer) -> None:
    # A store made before: its instants in 4-byte FLOAT columns.
    mysql.query(
        f"CREATE TABLE {LEASE_TABLE} (table_name VARCHAR(512) PRIMARY KEY, "
        "token VARCHAR(64) NOT NULL, holder VARCHAR(512) NOT NULL, "
        "acquired_at FLOAT NOT NULL, expires_at FLOAT NOT NULL)"
    )
    mysql.query(
        f"INSERT INTO {LEASE_TABLE} VALUES ('ns.old', 't', 'h', UNIX_TIMESTAMP(NOW(6)), "
        "UNIX_TIMESTAMP(NOW(6)) + 120)"
    )
    [(kept,)] = mysql.query(f"SELECT expires_at - acquired_at FROM {LEASE_TABLE}")
    assert abs(float(kept) - 120) > 1, "the control: a FLOAT loses the lease's length"
    mysql.query(f"DELETE FROM {LEASE_TABLE}")

    engine = engine_for(mysql.uri())
    store = TableLocks(engine, LEASE)

    types = dict(
        mysql.query(
            "SELECT column_name, data_type FROM information_schema.columns "
            f"WHERE table_schema = '{mysql.database}' AND table_name = '{LEASE_TABLE}'"
        )
    )
    assert types["acquired_at"] == types["expires_at"] == "double"
    _exact(store)
    _memory_round_trip(engine)
    engine.dispose()


def test_a_heartbeat_outlives_its_stores_failover_and_an_instance_that_cannot_answer() -> None:
    """The lease store's server goes away for longer than a lease and comes back; the run's
    instance cannot say whether the run is over for a while: the heartbeat thread keeps
    beating through both and renews the run's row once the store is back, and the healer on
    this host never calls the run dead meanwhile (its process lives)."""
    import dataclasses
    import time

    from sqlalchemy import select

    from icegate_dagster.sensors.healing import dead_run_reason
    from tests.surfaces.postgres_server import start, stop

    lease = timedelta(seconds=3)  # a beat every half second
    with postgres_server(database="leases") as server:
        engine = engine_for(server.uri(server.password))
        store = TableLocks(engine, lease)
        calls = {"n": 0}

        def running() -> bool:
            calls["n"] += 1
            if calls["n"] <= 4:
                raise ConnectionError("the Dagster instance cannot be reached")
            return True

        thread = store.start_heartbeat("run-1", "host:1:run-1", running)

        def beat_until() -> float:
            with engine.connect() as conn:
                return float(conn.execute(select(store.heartbeats.c.expires_at)).scalar_one())

        time.sleep(1.5)
        before = beat_until()
        stop(server)
        time.sleep(2 * lease.total_seconds())  # silent for two leases
        assert thread.is_alive()
        start(server)
        time.sleep(1.5)
        after = beat_until()
        assert thread.is_alive()
        assert after > before + 2 * lease.total_seconds()
        # What the healer saw when the store came back: a stale beat, a live process.
        [liveness] = store.run_liveness(["run-1"]).values()
        assert liveness.process is not None
        stale = dataclasses.replace(liveness, now=liveness.now + 10 * lease)
        assert dead_run_reason(stale.now - lease * 20, stale, lease, stale.now) is None
        engine.dispose()
