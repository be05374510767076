"""One maintainer per table, across the whole deployment: a lease row in the catalog database.

Every process that maintains a table (CLI runs, Dagster runs, on any host)
opens the same catalog, so a row in the catalog's own SQL database is a lock
they all see. A lock is a lease: its holder renews it in the background while
it works. A holder that died (crash, SIGKILL) loses it at once to a process of
the same host, which sees that its pid is gone, and otherwise when the lease
runs out, so a dead process never blocks a table for long. Catalogs without a SQL
database (REST, Glue, ...) get no lock here; Dagster's pool limit still keeps
maintenance steps apart there.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

LOCK_TABLE = "icegate_maintenance_locks"
#: A holder renews its lease every third of this; a dead holder's lock frees after it.
DEFAULT_LEASE = timedelta(minutes=2)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a table, and until when unless they renew."""

    owner: str
    expires_at: datetime

    def describe(self) -> str:
        """For messages: ``host:pid:run (lease until 12:00:00 UTC)``."""
        return f"{self.owner} (lease until {self.expires_at:%Y-%m-%d %H:%M:%S} UTC)"


def lock_owner(run_id: str) -> str:
    """This process's identity as a lock holder."""
    return f"{socket.gethostname()}:{os.getpid()}:{run_id}"


def holder_is_dead(owner: str) -> bool:
    """Whether ``owner`` (``host:pid:run``) was a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, someone else's
        return False
    return False


class TableLocks:
    """Leases on tables, stored in a SQL database (the catalog's, normally)."""

    def __init__(self, engine: Any, lease: timedelta = DEFAULT_LEASE) -> None:
        from sqlalchemy import Column, Float, MetaData, String, Table

        self.engine = engine
        self.lease = lease
        metadata = MetaData()
        self.table = Table(
            LOCK_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("owner", String(512), nullable=False),
            Column("expires_at", Float, nullable=False),
        )
        try:
            metadata.create_all(engine, checkfirst=True)
        except Exception:
            # Another process created it between the check and the create: fine if it exists.
            from sqlalchemy import inspect

            if not inspect(engine).has_table(LOCK_TABLE):
                raise

    @classmethod
    def for_catalog(cls, catalog: Catalog, lease: timedelta = DEFAULT_LEASE) -> TableLocks | None:
        """The catalog's lock table, or None for a catalog without a SQL database."""
        engine = getattr(catalog, "engine", None)
        if engine is None or type(engine).__name__ != "Engine":
            return None
        return cls(engine, lease)

    def try_acquire(self, table: str, owner: str) -> LockHolder | None:
        """Take ``table`` (or a lease that ran out); None on success, else the holder."""
        from sqlalchemy import insert, select, update
        from sqlalchemy.exc import IntegrityError

        now = time.time()
        expires = now + self.lease.total_seconds()
        locks = self.table
        try:
            with self.engine.begin() as conn:
                conn.execute(
                    insert(locks).values(table_name=table, owner=owner, expires_at=expires)
                )
            return None
        except IntegrityError:
            pass
        with self.engine.begin() as conn:
            # Take over only a lease that ran out (or our own): one statement, so one winner.
            taken = conn.execute(
                update(locks)
                .where(locks.c.table_name == table)
                .where((locks.c.expires_at < now) | (locks.c.owner == owner))
                .values(owner=owner, expires_at=expires)
            )
            if taken.rowcount == 1:
                return None
            row = conn.execute(
                select(locks.c.owner, locks.c.expires_at).where(locks.c.table_name == table)
            ).first()
        if row is None:  # released in between: try once more
            return self.try_acquire(table, owner)
        holder = str(row[0])
        if holder_is_dead(holder):
            # A process of this host that died holding the lease: no need to wait it out.
            with self.engine.begin() as conn:
                taken = conn.execute(
                    update(locks)
                    .where(locks.c.table_name == table)
                    .where(locks.c.owner == holder)
                    .values(owner=owner, expires_at=expires)
                )
            if taken.rowcount == 1:
                return None
            return self.try_acquire(table, owner)
        return LockHolder(holder, datetime.fromtimestamp(float(row[1]), UTC))

    def renew(self, table: str, owner: str) -> bool:
        """Extend our lease; False if it is no longer ours."""
        from sqlalchemy import update

        with self.engine.begin() as conn:
            result = conn.execute(
                update(self.table)
                .where(self.table.c.table_name == table)
                .where(self.table.c.owner == owner)
                .values(expires_at=time.time() + self.lease.total_seconds())
            )
        return bool(result.rowcount == 1)

    def release(self, table: str, owner: str) -> None:
        """Give ``table`` back (only if we hold it)."""
        from sqlalchemy import delete

        with self.engine.begin() as conn:
            conn.execute(
                delete(self.table)
                .where(self.table.c.table_name == table)
                .where(self.table.c.owner == owner)
            )

    def holder(self, table: str) -> LockHolder | None:
        """Who holds ``table`` now, if anyone (an expired lease counts as free)."""
        from sqlalchemy import select

        with self.engine.connect() as conn:
            row = conn.execute(
                select(self.table.c.owner, self.table.c.expires_at).where(
                    self.table.c.table_name == table
                )
            ).first()
        if row is None or float(row[1]) < time.time():
            return None
        return LockHolder(str(row[0]), datetime.fromtimestamp(float(row[1]), UTC))

    @contextlib.contextmanager
    def hold(self, table: str, owner: str, wait: timedelta) -> Iterator[LockHolder | None]:
        """Hold ``table`` for the block, renewing the lease; yields None, or the other holder
        when it could not be had within ``wait`` (the block then must not touch the table)."""
        deadline = time.monotonic() + wait.total_seconds()
        while True:
            other = self.try_acquire(table, owner)
            if other is None or time.monotonic() >= deadline:
                break
            time.sleep(min(1.0, max(0.05, deadline - time.monotonic())))
        if other is not None:
            yield other
            return
        stop = threading.Event()
        interval = self.lease.total_seconds() / 3

        def keep_alive() -> None:
            while not stop.wait(interval):
                with contextlib.suppress(Exception):  # a missed renewal is retried next time
                    self.renew(table, owner)

        renewer = threading.Thread(target=keep_alive, name=f"lease {table}", daemon=True)
        renewer.start()
        try:
            yield None
        finally:
            stop.set()
            renewer.join(timeout=5)
            with contextlib.suppress(Exception):  # the lease frees it anyway
                self.release(table, owner)
