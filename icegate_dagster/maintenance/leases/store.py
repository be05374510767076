"""One maintainer per table, across the whole deployment: a lease row in a shared SQL database.

Every process that maintains a table (CLI runs, Dagster runs, on any host)
uses the same lease store: ``maintain.locks.uri`` when set, else the catalog's
own SQL database (SQLite, PostgreSQL), else a SQLite file beside the
configuration (one host only: REST catalogs on several hosts must set
``maintain.locks.uri``, e.g. the Dagster instance's PostgreSQL).

A lease is a row ``(table, token, holder, acquired_at, expires_at)``. Every
acquisition gets a fresh random token, so two threads of one process, or two
containers that share a hostname and PID namespace, are never mistaken for one
another. Times are the **database's** clock (``now()`` evaluated in SQL), so a
host whose clock runs fast cannot take a live lease. The holder renews its
lease in the background; a holder that dies simply stops renewing and its
lease runs out. A holder that cannot renew stops itself: it considers the
lease lost two thirds into the lease (measured on its own monotonic clock),
before anyone else may take it over, and cancels its running Spark jobs.
A holder that has held its lease for ``stuck_after`` is taken for stuck (its
renewal thread would otherwise keep a hung operation's table, and its run,
forever): it stops renewing and considers the lease lost the same way, and the
lease runs out one lease later. Before every commit and every delete the
operation re-checks, in the database, that the lease is still its own
(:func:`check_lease`).

The same store keeps a **heartbeat per Dagster run** (table ``icegate_run_heartbeats``):
a run renews its row for as long as its process lives, whether or not it holds a table
just then, through store errors too; the row names the process (:mod:`.process`), so a
healer on the same host can ask whether it still runs (:meth:`TableLocks.run_liveness`).
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import copy
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from icegate_dagster.config import format_duration
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.leases.process import process_identity
from icegate_dagster.maintenance.sql_store import create_tables, db_now, engine_for, epoch_type

LEASE_TABLE = "icegate_table_leases"
HEARTBEAT_TABLE = "icegate_run_heartbeats"
#: Heartbeat rows that ran out this long ago are deleted (by the next heartbeat to start).
HEARTBEAT_KEPT = timedelta(days=1)
#: A holder renews its lease every third of this; a dead holder's lease frees after it.
DEFAULT_LEASE = timedelta(minutes=2)
#: A holder that has held a table this long is reported as stuck instead of waited for.
DEFAULT_STUCK_AFTER = timedelta(hours=6)
#: A run's first heartbeat is retried this long before the run's set-up fails.
FIRST_BEAT_WITHIN = timedelta(seconds=30)


class LeaseLostError(IcegateError):
    """The table's lease is no longer ours: the operation stops before it commits."""


def holder_description(run_id: str) -> str:
    """Who a lease holder is, for people: ``host:pid:run``."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


@dataclass(frozen=True)
class LockHolder:
    """Who holds a table, since when and until when unless they renew (database clock)."""

    owner: str
    expires_at: datetime
    acquired_at: datetime | None = None
    #: How long it has held the table, by the database's clock.
    held_for: timedelta = timedelta(0)

    def describe(self) -> str:
        """For messages: ``host:pid:run (since 10:00:00 UTC, lease until 12:00:00 UTC)``."""
        since = f"since {self.acquired_at:%Y-%m-%d %H:%M:%S} UTC, " if self.acquired_at else ""
        return f"{self.owner} ({since}lease until {self.expires_at:%Y-%m-%d %H:%M:%S} UTC)"


def _stamp(value: Any) -> datetime:
    return datetime.fromtimestamp(float(value), UTC)


class Lease:
    """A lease this process holds: renewed in the background, checked before commits."""

    def __init__(self, store: TableLocks, table: str, token: str, holder: str) -> None:
        self.store = store
        self.table = table
        self.token = token
        self.holder = holder
        self.lost = threading.Event()
        self.reason = ""
        self._acquired = self._renewed = time.monotonic()
        self._on_lost: list[Callable[[], None]] = []
        self._guard = threading.Lock()

    @property
    def _margin(self) -> float:
        # Consider the lease gone well before another process may take it over.
        return self.store.lease.total_seconds() * 2 / 3

    def on_lost(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (once) if the lease is lost while held."""
        with self._guard:
            self._on_lost.append(callback)
        if self.lost.is_set():
            callback()

    def _lose(self, reason: str) -> None:
        with self._guard:
            if self.lost.is_set():
                return
            self.reason = reason
            self.lost.set()
            callbacks = list(self._on_lost)
        for callback in callbacks:
            with contextlib.suppress(Exception):
                callback()

    def _held_too_long(self) -> bool:
        """Mark the lease lost once it has been held for ``stuck_after``: its operation is
        taken for stuck, so it is renewed no more and nothing of it commits."""
        held = time.monotonic() - self._acquired
        stuck_after = self.store.stuck_after
        if held < stuck_after.total_seconds():
            return False
        self._lose(
            f"it held its lease for {format_duration(timedelta(seconds=round(held)))}, past "
            f"maintain.locks.stuck_after ({format_duration(stuck_after)}): taken for stuck, "
            "its lease was given up"
        )
        return True

    def renew(self) -> None:
        """Extend the lease; a lease that is no longer ours, could not be renewed in time,
        or has been held for ``stuck_after``, is marked lost (and renewed no more)."""
        if self._held_too_long():
            return
        try:
            ours = self.store.renew(self.table, self.token)
        except Exception as exc:  # the store is unreachable: retried until the margin
            if time.monotonic() - self._renewed > self._margin:
                self._lose(f"its lease could not be renewed for {self._margin:.0f}s ({exc})")
            return
        if ours:
            self._renewed = time.monotonic()
        else:
            other = self.store.holder(self.table)
            self._lose(f"its lease was taken over by {other.describe() if other else 'nobody'}")

    def verify(self) -> None:
        """Raise :class:`LeaseLostError` unless the lease is ours, checked in the database."""
        if not self.lost.is_set() and time.monotonic() - self._renewed > self._margin:
            self._lose(f"its lease was not renewed for {self._margin:.0f}s")
        if not self.lost.is_set():
            self._held_too_long()
        if not self.lost.is_set():
            try:
                ours = self.store.owns(self.table, self.token)
            except Exception as exc:
                raise LeaseLostError(
                    f"{self.table}: cannot confirm its lease before committing ({exc}); "
                    "nothing committed"
                ) from None
            if not ours:
                other = self.store.holder(self.table)
                self._lose(f"its lease was taken over by {other.describe() if other else 'nobody'}")
        if self.lost.is_set():
            raise LeaseLostError(f"{self.table}: {self.reason}; stopped before committing")


#: The lease of the operation running in this thread (see :func:`check_lease`).
_current: contextvars.ContextVar[Callable[[], None] | None] = contextvars.ContextVar(
    "icegate_commit_guard", default=None
)


def check_lease() -> None:
    """Called right before every commit and every delete: raises when the running operation's
    lease is no longer ours (a no-op outside a leased operation, e.g. a dry run)."""
    guard = _current.get()
    if guard is not None:
        guard()


@contextlib.contextmanager
def commit_guard(guard: Callable[[], None]) -> Iterator[None]:
    """Make ``guard`` what :func:`check_lease` calls in this thread for the block."""
    token = _current.set(guard)
    try:
        yield
    finally:
        _current.reset(token)


class TableLocks:
    """Leases on tables, stored in a SQL database shared by every maintainer."""

    def __init__(
        self,
        engine: Any,
        lease: timedelta = DEFAULT_LEASE,
        stuck_after: timedelta = DEFAULT_STUCK_AFTER,
    ) -> None:
        from sqlalchemy import Column, MetaData, String, Table

        self.engine = engine
        self.lease = lease
        self.stuck_after = stuck_after
        self.now = db_now(engine.dialect.name)
        metadata = MetaData()
        self.table = Table(
            LEASE_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("token", String(64), nullable=False),
            Column("holder", String(512), nullable=False),
            Column("acquired_at", epoch_type(), nullable=False),
            Column("expires_at", epoch_type(), nullable=False),
        )
        self.heartbeats = Table(
            HEARTBEAT_TABLE,
            metadata,
            Column("token", String(64), primary_key=True),
            Column("run_id", String(128), nullable=False, index=True),
            Column("holder", String(512), nullable=False),
            Column("started_at", epoch_type(), nullable=False),
            Column("expires_at", epoch_type(), nullable=False),
            # Which process beats (see ``process.process_identity``): the healer asks the
            # host whether it still runs before it fails a run.
            Column("process", String(512), nullable=True),
        )
        create_tables(engine, metadata, (LEASE_TABLE, HEARTBEAT_TABLE))

    @classmethod
    def for_catalog(
        cls,
        catalog: Any,
        *,
        uri: str | None = None,
        fallback_uri: str | None = None,
        lease: timedelta = DEFAULT_LEASE,
        stuck_after: timedelta = DEFAULT_STUCK_AFTER,
    ) -> TableLocks | None:
        """The deployment's lease store: ``uri`` if given, else the catalog's own SQL
        database, else ``fallback_uri`` (a SQLite file beside the configuration)."""
        engine = None
        if uri is None:
            candidate = getattr(catalog, "engine", None)
            if candidate is not None and type(candidate).__name__ == "Engine":
                engine = candidate
            else:
                uri = fallback_uri
        if engine is None:
            if uri is None:
                return None
            engine = engine_for(uri)
        # Its tables are checked once per process and database (sensors open it each tick).
        key = (engine.url.render_as_string(hide_password=False), lease, stuck_after)
        with _stores_lock:
            store = _stores.get(key)
            if store is None:
                store = _stores[key] = cls(engine, lease, stuck_after)
            elif store.engine is not engine:
                store = copy.copy(store)
                store.engine = engine
            return store

    def _values(self, token: str, holder: str) -> dict[str, Any]:
        seconds = self.lease.total_seconds()
        return {
            "token": token,
            "holder": holder[:512],
            "acquired_at": self.now,
            "expires_at": self.now + seconds,
        }

    def try_acquire(self, table: str, token: str, holder: str) -> LockHolder | None:
        """Take ``table`` (or a lease that ran out, by the database's clock); None on
        success, else the current holder."""
        from sqlalchemy import insert, update
        from sqlalchemy.exc import IntegrityError

        locks = self.table
        try:
            with self.engine.begin() as conn:
                conn.execute(insert(locks).values(table_name=table, **self._values(token, holder)))
            return None
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            # Take over only a lease that ran out: one statement, so one winner.
            taken = conn.execute(
                update(locks)
                .where(locks.c.table_name == table)
                .where(locks.c.expires_at < self.now)
                .values(**self._values(token, holder))
            )
            if taken.rowcount == 1:
                return None
        other = self.holder(table)
        if other is None:  # released in between: try once more
            return self.try_acquire(table, token, holder)
        return other

    def renew(self, table: str, token: str) -> bool:
        """Extend our lease; False if it is no longer ours."""
        from sqlalchemy import update

        with self.engine.begin() as conn:
            result = conn.execute(
                update(self.table)
                .where(self.table.c.table_name == table)
                .where(self.table.c.token == token)
                .values(expires_at=self.now + self.lease.total_seconds())
            )
        return bool(result.rowcount == 1)

    def owns(self, table: str, token: str) -> bool:
        """Whether ``token`` holds a live lease on ``table`` now, by the database's clock."""
        from sqlalchemy import select

        with self.engine.connect() as conn:
            row = conn.execute(
                select(self.table.c.token)
                .where(self.table.c.table_name == table)
                .where(self.table.c.token == token)
                .where(self.table.c.expires_at >= self.now)
            ).first()
        return row is not None

    def release(self, table: str, token: str) -> None:
        """Give ``table`` back (only if we hold it)."""
        from sqlalchemy import delete

        with self.engine.begin() as conn:
            conn.execute(
                delete(self.table)
                .where(self.table.c.table_name == table)
                .where(self.table.c.token == token)
            )

    def holder(self, table: str) -> LockHolder | None:
        """Who holds ``table`` now, if anyone (a lease that ran out counts as free)."""
        from sqlalchemy import select

        locks = self.table
        with self.engine.connect() as conn:
            row = conn.execute(
                select(locks.c.holder, locks.c.expires_at, locks.c.acquired_at, self.now)
                .where(locks.c.table_name == table)
                .where(locks.c.expires_at >= self.now)
            ).first()
        if row is None:
            return None
        held = max(0.0, float(row[3]) - float(row[2]))
        return LockHolder(str(row[0]), _stamp(row[1]), _stamp(row[2]), timedelta(seconds=held))

    @contextlib.contextmanager
    def hold(self, table: str, holder: str, wait: timedelta) -> Iterator[Lease | LockHolder]:
        """Hold ``table`` for the block, renewing the lease: yields the :class:`Lease`, or the
        other :class:`LockHolder` when it could not be had within ``wait`` (the block then
        must not touch the table)."""
        token = uuid.uuid4().hex
        deadline = time.monotonic() + wait.total_seconds()
        while True:
            other = self.try_acquire(table, token, holder)
            if other is None or time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        if other is not None:
            yield other
            return
        lease = Lease(self, table, token, holder)
        stop = threading.Event()
        interval = self.lease.total_seconds() / 6

        def keep_alive() -> None:
            while not stop.wait(interval) and not lease.lost.is_set():
                lease.renew()

        renewer = threading.Thread(target=keep_alive, name=f"lease {table}", daemon=True)
        renewer.start()
        try:
            yield lease
        finally:
            stop.set()
            renewer.join(timeout=5)
            with contextlib.suppress(Exception):  # the lease frees it anyway
                self.release(table, token)

    # -- run heartbeats --------------------------------------------------------------------

    def beat(self, run_id: str, token: str, holder: str, process: str | None = None) -> None:
        """Start or renew the heartbeat ``token`` of run ``run_id``: alive for one more
        lease from now (the database's clock). ``process`` names the beating process."""
        from sqlalchemy import insert, update

        expires = self.now + self.lease.total_seconds()
        with self.engine.begin() as conn:
            renewed = conn.execute(
                update(self.heartbeats)
                .where(self.heartbeats.c.token == token)
                .values(expires_at=expires)
            )
            if renewed.rowcount == 0:
                conn.execute(
                    insert(self.heartbeats).values(
                        token=token,
                        run_id=run_id[:128],
                        holder=holder[:512],
                        started_at=self.now,
                        expires_at=expires,
                        process=(process or "")[:512] or None,
                    )
                )

    def forget_old_heartbeats(self) -> None:
        """Delete heartbeat rows that ran out more than :data:`HEARTBEAT_KEPT` ago."""
        from sqlalchemy import delete

        with self.engine.begin() as conn:
            conn.execute(
                delete(self.heartbeats).where(
                    self.heartbeats.c.expires_at < self.now - HEARTBEAT_KEPT.total_seconds()
                )
            )

    def live_leases(self) -> dict[str, str]:
        """Every table a live lease holds now, with its holder (``host:pid:run``)."""
        from sqlalchemy import select

        with self.engine.connect() as conn:
            rows = conn.execute(
                select(self.table.c.table_name, self.table.c.holder).where(
                    self.table.c.expires_at >= self.now
                )
            ).all()
        return {str(table): str(holder) for table, holder in rows}

    def run_liveness(self, run_ids: Sequence[str]) -> dict[str, RunLiveness]:
        """What the store says about each run: the latest its heartbeat lasts until and which
        process beat it, and the tables it holds a live lease on (its lease holders end in
        ``:<run id>``)."""
        from sqlalchemy import select

        wanted = set(run_ids)
        if not wanted:
            return {}
        beats: dict[str, tuple[float, str | None]] = {}
        with self.engine.connect() as conn:
            now = float(conn.execute(select(self.now)).scalar_one())
            rows = conn.execute(
                select(
                    self.heartbeats.c.run_id,
                    self.heartbeats.c.expires_at,
                    self.heartbeats.c.process,
                ).where(self.heartbeats.c.run_id.in_(sorted(wanted)))
            )
            for run_id, until, process in rows:
                latest = beats.get(str(run_id))
                if latest is None or float(until) > latest[0]:
                    beats[str(run_id)] = (float(until), process)
            held: dict[str, list[str]] = {}
            for table, holder in conn.execute(
                select(self.table.c.table_name, self.table.c.holder).where(
                    self.table.c.expires_at >= self.now
                )
            ):
                run_id = str(holder).rsplit(":", 1)[-1]
                if run_id in wanted:
                    held.setdefault(run_id, []).append(str(table))
        return {
            run_id: RunLiveness(
                run_id=run_id,
                now=_stamp(now),
                heartbeat_until=_stamp(beats[run_id][0]) if run_id in beats else None,
                tables_held=tuple(sorted(held.get(run_id, ()))),
                process=beats[run_id][1] if run_id in beats else None,
            )
            for run_id in sorted(wanted)
        }

    def start_heartbeat(
        self,
        run_id: str,
        holder: str,
        running: Callable[[], bool],
        *,
        first_beat_within: timedelta = FIRST_BEAT_WITHIN,
    ) -> threading.Thread:
        """Keep run ``run_id`` alive in the store: a row renewed every sixth of a lease by a
        daemon thread until the process ends or ``running()`` says the run is over. Its last
        renewal keeps the row alive one more lease, so a run whose steps are over but whose
        end is not recorded yet never looks dead.

        The first beat is retried for ``first_beat_within`` and then raises its error: a
        run that cannot reach its lease store must not run unseen. After it, nothing stops
        the beating but the run's end: a renewal that fails (a failover, a locked SQLite
        file) is retried at the next interval, and a ``running()`` that cannot tell (the
        instance unreachable) counts as still running.
        """
        token = uuid.uuid4().hex
        interval = self.lease.total_seconds() / 6
        process = process_identity()
        deadline = time.monotonic() + first_beat_within.total_seconds()
        while True:
            try:
                self.beat(run_id, token, holder, process)
                break
            except Exception:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(1.0, interval))
        with contextlib.suppress(Exception):
            self.forget_old_heartbeats()

        def keep_alive() -> None:
            while not _exiting.wait(interval):
                try:
                    if not running():
                        return
                except Exception:
                    pass  # cannot tell: keep beating, a live run must never look dead
                with contextlib.suppress(Exception):  # unreachable now: next interval
                    self.beat(run_id, token, holder, process)

        beater = threading.Thread(target=keep_alive, name=f"heartbeat {run_id}", daemon=True)
        beater.start()
        return beater


@dataclass(frozen=True)
class RunLiveness:
    """What the lease store knows of one run's process (times by the database's clock)."""

    run_id: str
    now: datetime
    #: Until when its latest heartbeat keeps it alive; None if it never had one.
    heartbeat_until: datetime | None
    #: Tables it holds a live lease on now.
    tables_held: tuple[str, ...] = ()
    #: The process that beat last (``process.process_identity``); None if unknown.
    process: str | None = None

    @property
    def alive(self) -> bool:
        """Whether something renewed this run's heartbeat or a lease of it within a lease."""
        beating = self.heartbeat_until is not None and self.heartbeat_until >= self.now
        return beating or bool(self.tables_held)


#: The lease stores this process opened (see ``TableLocks.for_catalog``).
_stores: dict[tuple[str, timedelta, timedelta], TableLocks] = {}
_stores_lock = threading.Lock()

#: Set when the interpreter exits: heartbeat threads stop before the modules they use go.
_exiting = threading.Event()
atexit.register(_exiting.set)
