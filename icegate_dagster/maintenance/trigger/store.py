"""The trigger's memory in the deployment's shared SQL database (the lease store's engine).

Four tables, each a row per table (and operation, or sensor):

- ``icegate_trigger_outcomes`` (table, operation): the last attempt, its outcome, the
  consecutive failures and ineffective attempts, when the next attempt may start, the
  last success and error (:class:`~.records.OperationMemory`). Written by every pass as
  each table finishes (Dagster runs and CLI passes alike), and by a sensor that finds a
  request its run never answered;
- ``icegate_trigger_tables`` (table): the sensors' decisions (a counter that numbers
  every run request), the last pass and the state it left, and what the table's partition
  page shows;
- ``icegate_trigger_requests`` (table, sensor): each sensor's last request of the table:
  when, which operations, and its run's key (so a request is counted lost only when its
  run provably ended without the table, and one sensor's request never hides another's);
- ``icegate_trigger_looks`` (table): the health trigger's last look at the table: its
  metadata file, its WAL, when a time-based operation may fall due, and its health
  summary or the error that kept it from being read. A steady tick re-reads only the
  tables whose look is out of date.

Times are epoch seconds by the database's clock (:meth:`TriggerMemory.now`), so hosts whose
clocks disagree share one time line. Every write is one short transaction; a table's rows
are written by one maintainer at a time (its lease) and by the sensors, each writing its
own columns. A sensor's tick uses the memory :meth:`~TriggerMemory.within` its deadline: a
database another writer keeps locked fails a statement with :class:`MemoryBusy` when the
deadline comes, instead of waiting out SQLite's 30 s (or a server's lock wait).
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.sql_store import create_tables, db_now, epoch_type, upsert
from icegate_dagster.maintenance.trigger.records import (
    OUTCOMES,
    OpenRequest,
    OperationMemory,
    PassRecord,
    TableMemory,
    lost,
    remember,
)

OUTCOMES_TABLE = "icegate_trigger_outcomes"
TABLES_TABLE = "icegate_trigger_tables"
LOOKS_TABLE = "icegate_trigger_looks"
REQUESTS_TABLE = "icegate_trigger_requests"
#: Table names per ``IN (...)`` of one query.
_CHUNK = 500
_OP_KEYS = ("table_name", "operation")


class MemoryBusy(IcegateError):
    """Another writer kept the trigger's memory locked past the tick's deadline."""


@dataclass(frozen=True)
class StoredLook:
    """The health trigger's last look at one table."""

    table: str
    #: The metadata file it read (None: the table could not be read).
    metadata_location: str | None
    #: The WAL it saw (``files/bytes/oldest``; None: no WAL configured or unreadable).
    wal: str | None
    looked_at: float
    #: Look again from this instant on even if nothing changed (a snapshot crosses its
    #: expiry's retention); None: only on a change.
    recheck_at: float | None
    health: HealthSummary | None
    error: str | None = None
    #: Since when its operations have been due without a break (None: nothing due).
    due_since: float | None = None
    #: The table's location, as its metadata file says (which never changes).
    location: str | None = None
    #: ``gc.enabled=false`` on the table (it may share files safely).
    gc_disabled: bool = False
    #: A digest of the table's settings the look was judged by: a configuration change
    #: (a threshold, ``min_interval``, an opt-out) makes it out of date.
    settings: str | None = None


def _chunks(names: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(names), _CHUNK):
        yield names[start : start + _CHUNK]


class TriggerMemory:
    """The trigger's memory on ``engine`` (see the module docstring)."""

    def __init__(self, engine: Any) -> None:
        from sqlalchemy import Boolean, Column, Integer, MetaData, String, Table, Text

        self.engine = engine
        self._now = db_now(engine.dialect.name)
        metadata = MetaData()
        self.outcomes = Table(
            OUTCOMES_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("operation", String(64), primary_key=True),
            Column("attempted_at", epoch_type(), nullable=False),
            Column("outcome", String(16), nullable=False),
            Column("failures", Integer, nullable=False, default=0),
            Column("ineffective", Integer, nullable=False, default=0),
            Column("not_before", epoch_type(), nullable=True),
            Column("succeeded_at", epoch_type(), nullable=True),
            Column("detail", String(1000), nullable=True),
            Column("run_id", String(128), nullable=True),
            Column("attempts", Integer, nullable=False, default=1),
        )
        self.tables = Table(
            TABLES_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("decisions", Integer, nullable=False, default=0),
            Column("recorded_at", epoch_type(), nullable=True),
            Column("settled_state", String(32), nullable=True),
            Column("shown_state", String(16), nullable=True),
            Column("shown_at", epoch_type(), nullable=True),
            Column("materialized", Boolean, nullable=False, default=False),
        )
        self.looks = Table(
            LOOKS_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("metadata_location", Text, nullable=True),
            Column("wal", String(256), nullable=True),
            Column("looked_at", epoch_type(), nullable=False),
            Column("recheck_at", epoch_type(), nullable=True),
            Column("health", Text, nullable=True),
            Column("error", Text, nullable=True),
            Column("due_since", epoch_type(), nullable=True),
            Column("location", Text, nullable=True),
            Column("gc_disabled", Boolean, nullable=True),
            Column("settings", String(64), nullable=True),
        )
        self.requests = Table(
            REQUESTS_TABLE,
            metadata,
            Column("table_name", String(512), primary_key=True),
            Column("requested_by", String(64), primary_key=True),
            Column("requested_at", epoch_type(), nullable=False),
            Column("requested_ops", String(512), nullable=False),
            Column("run_key", String(1024), nullable=True),
        )
        #: ``time.monotonic()`` after which a statement no longer waits for a lock.
        self.until: float | None = None
        create_tables(engine, metadata, (OUTCOMES_TABLE, TABLES_TABLE, LOOKS_TABLE, REQUESTS_TABLE))

    def on(self, engine: Any) -> TriggerMemory:
        """The same memory through another engine of the same database (no schema check)."""
        other = copy.copy(self)
        other.engine = engine
        return other

    def within(self, until: float) -> TriggerMemory:
        """The same memory for a tick that ends at ``until`` (``time.monotonic()``): a
        statement waits for another writer's lock until then at most, and then fails with
        :class:`MemoryBusy`."""
        other = copy.copy(self)
        other.until = until
        return other

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Any]:
        """One transaction, its lock waits bounded by :attr:`until` (when set)."""
        from sqlalchemy.exc import DBAPIError

        with self.engine.connect() as conn:
            restore = None
            try:
                with conn.begin():
                    if self.until is not None:
                        restore = _bound_lock_wait(conn, self.until - time.monotonic())
                    yield conn
            except DBAPIError as exc:
                if self.until is not None and _lock_timeout(exc):
                    raise MemoryBusy(
                        "the trigger's memory (maintain.locks.uri) is locked by another "
                        "writer: gave up waiting so that the tick ends within "
                        "maintain.trigger.tick_deadline; the next tick tries again"
                    ) from exc
                raise
            finally:
                if restore is not None:
                    with contextlib.suppress(DBAPIError):
                        restore()

    # -- reading -------------------------------------------------------------------------------

    def now(self) -> float:
        """The database's clock, in epoch seconds."""
        from sqlalchemy import select

        with self._transaction() as conn:
            return float(conn.execute(select(self._now)).scalar_one())

    def _select(self, table: Any, names: Collection[str] | None) -> list[Any]:
        from sqlalchemy import select

        with self._transaction() as conn:
            if names is None:
                return list(conn.execute(select(table)))
            rows: list[Any] = []
            for chunk in _chunks(sorted(set(names))):
                rows += conn.execute(select(table).where(table.c.table_name.in_(chunk)))
            return rows

    def operations(
        self, names: Collection[str] | None = None
    ) -> dict[str, dict[str, OperationMemory]]:
        """Per table (``names``, or all), each operation's memory: one query per 500."""
        found: dict[str, dict[str, OperationMemory]] = {}
        for row in self._select(self.outcomes, names):
            memory = _operation_memory(row)
            found.setdefault(memory.table, {})[memory.operation] = memory
        return found

    def tables_memory(
        self,
        names: Collection[str] | None = None,
        *,
        operations_of: Collection[str] | None = None,
    ) -> dict[str, TableMemory]:
        """Per table (``names``, or all): its decisions, last request and pass, what its page
        shows, and each operation's memory: of every table read, or with ``operations_of``
        of those tables only and of the tables whose operations fail or stay due (a steady
        tick needs no more, and a large lakehouse has several operations per table)."""
        if operations_of is None:
            operations = self.operations(names)
            read: Collection[str] | None = None
        else:
            operations = self.operations(operations_of)
            read = set(operations_of)
            for table, ops in self._troubled().items():
                operations.setdefault(table, {}).update(ops)
        requests: dict[str, dict[str, OpenRequest]] = {}
        for row in self._select(self.requests, read if read is not None else names):
            requests.setdefault(row.table_name, {})[row.requested_by] = OpenRequest(
                row.requested_by,
                float(row.requested_at),
                tuple(row.requested_ops.split(",")) if row.requested_ops else (),
                row.run_key,
            )
        found: dict[str, TableMemory] = {}
        no_operations: dict[str, OperationMemory] = {}
        no_requests: dict[str, OpenRequest] = {}
        # Rows as plain tuples: a steady tick reads every table's row.
        for (
            table,
            decisions,
            recorded_at,
            settled_state,
            shown_state,
            shown_at,
            materialized,
        ) in self._select(self.tables, names):
            found[table] = TableMemory(
                table,
                decisions or 0,
                requests.get(table, no_requests),
                recorded_at,
                settled_state,
                shown_state,
                shown_at,
                bool(materialized),
                operations.pop(table, no_operations),
                read is None or table in read,
            )
        for table, ops in operations.items():  # outcomes of a table with no row yet
            found[table] = TableMemory(
                table=table, operations=ops, operations_read=read is None or table in read
            )
        return found

    def _troubled(self) -> dict[str, dict[str, OperationMemory]]:
        """The operations that failed or stayed due at their last attempt (one query)."""
        from sqlalchemy import or_, select

        table = self.outcomes
        with self._transaction() as conn:
            rows = list(
                conn.execute(
                    select(table).where(or_(table.c.failures > 0, table.c.ineffective > 0))
                )
            )
        found: dict[str, dict[str, OperationMemory]] = {}
        for row in rows:
            memory = _operation_memory(row)
            found.setdefault(memory.table, {})[memory.operation] = memory
        return found

    def stored_looks(self, names: Collection[str] | None = None) -> dict[str, StoredLook]:
        """The last look at each table (``names``, or all)."""
        found = {}
        for row in self._select(self.looks, names):
            try:
                health = HealthSummary.from_json(row.table_name, row.health) if row.health else None
            except (ValueError, KeyError, TypeError):  # written by another version: look again
                continue
            found[row.table_name] = StoredLook(
                table=row.table_name,
                metadata_location=row.metadata_location,
                wal=row.wal,
                looked_at=float(row.looked_at),
                recheck_at=_float(row.recheck_at),
                health=health,
                error=row.error,
                due_since=_float(row.due_since),
                location=row.location,
                gc_disabled=bool(row.gc_disabled),
                settings=row.settings,
            )
        return found

    # -- writing -------------------------------------------------------------------------------

    def record_pass(
        self,
        record: PassRecord,
        *,
        now: float | None = None,
        backoff: timedelta,
        backoff_max: timedelta,
    ) -> list[OperationMemory]:
        """Remember one table's pass (see :func:`~.records.remember`), as it finishes;
        returns each operation's new memory."""
        return self.record_passes([record], now=now, backoff=backoff, backoff_max=backoff_max)[
            record.table
        ]

    def record_passes(
        self,
        records: Sequence[PassRecord],
        *,
        now: float | None = None,
        backoff: timedelta,
        backoff_max: timedelta,
    ) -> dict[str, list[OperationMemory]]:
        """Remember several tables' passes in one transaction (a pass over many tables
        writes them in batches); returns each table's operations' new memory."""
        if not records:
            return {}
        if now is None:
            now = self.now()
        previous = self.operations([r.table for r in records])
        memories: dict[str, list[OperationMemory]] = {}
        table_rows: list[dict[str, Any]] = []
        for record in records:
            before = previous.get(record.table, {})
            still_due = record.still_due or {}
            memories[record.table] = [
                remember(
                    before.get(attempt.operation),
                    attempt,
                    table=record.table,
                    run_id=record.run_id,
                    requested=attempt.operation in record.requested,
                    still_due=None
                    if record.still_due is None
                    else still_due.get(attempt.operation),
                    now=now,
                    backoff=backoff,
                    backoff_max=backoff_max,
                )
                for attempt in record.attempts
            ]
            row: dict[str, Any] = {"table_name": record.table, "recorded_at": now}
            if record.settled_state is not None or record.still_due is not None:
                # A state settles only where the pass did all it could about it: every
                # operation still due was attempted (a pass limited to others, such as a
                # WAL ingest, settles nothing), none failed, none was kept from the table
                # by another maintainer; those are tried again (after their back-off).
                attempted = {a.operation for a in record.attempts}
                done = set(still_due) <= attempted and all(
                    a.status != "failed" and not a.held_elsewhere for a in record.attempts
                )
                row["settled_state"] = record.settled_state if done else None
            if record.shown_state is not None:
                row.update(shown_state=record.shown_state, shown_at=now, materialized=True)
            table_rows.append(row)
        rows = [_operation_row(m) for ops in memories.values() for m in ops]
        with self._transaction() as conn:
            upsert(conn, self.outcomes, rows, _OP_KEYS)
            # Rows of one statement share their columns: grouped by the columns they set.
            by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
            for row in table_rows:
                by_columns.setdefault(tuple(row), []).append(row)
            for group in by_columns.values():
                upsert(conn, self.tables, group, ("table_name",))
        return memories

    def record_lost(
        self,
        table: str,
        operations: Iterable[str],
        why: str,
        *,
        now: float,
        backoff: timedelta,
        backoff_max: timedelta,
    ) -> list[OperationMemory]:
        """Count a requested attempt its run never answered as a failure of each operation;
        returns their new memory."""
        previous = self.operations([table]).get(table, {})
        memories = [
            lost(
                previous.get(op),
                table=table,
                operation=op,
                why=why,
                now=now,
                backoff=backoff,
                backoff_max=backoff_max,
            )
            for op in operations
        ]
        with self._transaction() as conn:
            upsert(conn, self.outcomes, [_operation_row(m) for m in memories], _OP_KEYS)
        return memories

    def record_requests(
        self,
        requests: Sequence[tuple[str, Sequence[str]]],
        by: str,
        now: float,
        *,
        run_keys: Mapping[str, str] | None = None,
    ) -> dict[str, int]:
        """Count each requested table's decisions up and remember the request as ``by``'s
        (``(table, operations)`` pairs, and the key of the run each is in): one transaction.
        Returns table -> its decision number."""
        if not requests:
            return {}
        from sqlalchemy import select

        names = [table for table, _ in requests]
        keys = run_keys or {}
        with self._transaction() as conn:
            current: dict[str, int] = {}
            for chunk in _chunks(sorted(set(names))):
                current.update(
                    (str(name), int(count or 0))
                    for name, count in conn.execute(
                        select(self.tables.c.table_name, self.tables.c.decisions).where(
                            self.tables.c.table_name.in_(chunk)
                        )
                    )
                )
            numbers = {table: current.get(table, 0) + 1 for table in names}
            upsert(
                conn,
                self.tables,
                [{"table_name": table, "decisions": numbers[table]} for table in names],
                ("table_name",),
            )
            upsert(
                conn,
                self.requests,
                [
                    {
                        "table_name": table,
                        "requested_by": by[:64],
                        "requested_at": now,
                        "requested_ops": ",".join(ops)[:512],
                        "run_key": keys.get(table),
                    }
                    for table, ops in requests
                ],
                ("table_name", "requested_by"),
            )
        return numbers

    def drop_requests(self, requests: Collection[tuple[str, str, str]]) -> None:
        """Forget requests that never reached Dagster: ``(table, sensor, run key)``; a newer
        request of the same sensor (another key) stays."""
        from sqlalchemy import and_, delete

        if not requests:
            return
        table = self.requests
        with self._transaction() as conn:
            for name, by, run_key in sorted(set(requests)):
                conn.execute(
                    delete(table).where(
                        and_(
                            table.c.table_name == name,
                            table.c.requested_by == by,
                            table.c.run_key == run_key,
                        )
                    )
                )

    def show(self, shown: Sequence[tuple[str, str, bool]], now: float) -> None:
        """Remember what partition pages show now: ``(table, state, materialized)``."""
        if not shown:
            return
        with self._transaction() as conn:
            upsert(
                conn,
                self.tables,
                [
                    {
                        "table_name": table,
                        "shown_state": state,
                        "shown_at": now,
                        "materialized": materialized,
                    }
                    for table, state, materialized in shown
                ],
                ("table_name",),
            )

    def save_looks(self, looks: Sequence[StoredLook]) -> None:
        """Store new looks (one statement)."""
        if not looks:
            return
        with self._transaction() as conn:
            upsert(
                conn,
                self.looks,
                [
                    {
                        "table_name": look.table,
                        "metadata_location": look.metadata_location,
                        "wal": look.wal,
                        "looked_at": look.looked_at,
                        "recheck_at": look.recheck_at,
                        "health": look.health.to_json() if look.health is not None else None,
                        "error": look.error,
                        "due_since": look.due_since,
                        "location": look.location,
                        "gc_disabled": look.gc_disabled,
                        "settings": look.settings,
                    }
                    for look in looks
                ],
                ("table_name",),
            )

    def known_locations(self) -> dict[str, str]:
        """Table locations by metadata file, as the looks read them (one query)."""
        from sqlalchemy import select

        looks = self.looks
        with self._transaction() as conn:
            rows = conn.execute(
                select(looks.c.metadata_location, looks.c.location).where(
                    looks.c.location.is_not(None), looks.c.metadata_location.is_not(None)
                )
            )
            return {str(metadata): str(location) for metadata, location in rows}

    def forget(self, names: Collection[str]) -> None:
        """Drop everything remembered of tables that are gone."""
        from sqlalchemy import delete

        with self._transaction() as conn:
            for chunk in _chunks(sorted(set(names))):
                for table in (self.outcomes, self.tables, self.looks, self.requests):
                    conn.execute(delete(table).where(table.c.table_name.in_(chunk)))


def _bound_lock_wait(conn: Any, seconds: float) -> Any:
    """Make the statements of ``conn``'s transaction wait for a lock ``seconds`` at most (at
    least what the database allows: 0 ms on SQLite, 1 ms on PostgreSQL, 1 s on MySQL).
    Returns what puts the connection's own setting back, or None (it ends with the
    transaction)."""
    dialect = conn.dialect.name
    millis = max(0, int(seconds * 1000))
    if dialect == "sqlite":
        before = int(conn.exec_driver_sql("PRAGMA busy_timeout").scalar() or 0)
        conn.exec_driver_sql(f"PRAGMA busy_timeout = {millis}")
        return lambda: conn.exec_driver_sql(f"PRAGMA busy_timeout = {before}")
    if dialect == "postgresql":
        conn.exec_driver_sql(f"SET LOCAL lock_timeout = {max(1, millis)}")
        return None
    if dialect in ("mysql", "mariadb"):
        before = int(conn.exec_driver_sql("SELECT @@SESSION.innodb_lock_wait_timeout").scalar())
        conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {max(1, -(-millis // 1000))}")
        return lambda: conn.exec_driver_sql(f"SET SESSION innodb_lock_wait_timeout = {before}")
    return None


def _lock_timeout(exc: Exception) -> bool:
    """Whether a database error says a lock was not granted in time (SQLite's "database is
    locked", PostgreSQL's ``lock_not_available``, MySQL's lock wait timeout)."""
    orig = getattr(exc, "orig", None)
    if getattr(orig, "pgcode", None) == "55P03":
        return True
    args = getattr(orig, "args", ())
    if args and args[0] == 1205:
        return True
    return "locked" in str(orig).lower()


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _operation_memory(row: Any) -> OperationMemory:
    return OperationMemory(
        table=row.table_name,
        operation=row.operation,
        attempted_at=float(row.attempted_at),
        outcome=row.outcome if row.outcome in OUTCOMES else "failed",
        failures=int(row.failures or 0),
        ineffective=int(row.ineffective or 0),
        not_before=_float(row.not_before),
        succeeded_at=_float(row.succeeded_at),
        detail=row.detail,
        run_id=row.run_id,
        attempts=int(row.attempts or 1),
    )


def _operation_row(memory: OperationMemory) -> dict[str, Any]:
    return {
        "table_name": memory.table,
        "operation": memory.operation,
        "attempted_at": memory.attempted_at,
        "outcome": memory.outcome,
        "failures": memory.failures,
        "ineffective": memory.ineffective,
        "not_before": memory.not_before,
        "succeeded_at": memory.succeeded_at,
        "detail": memory.detail,
        "run_id": (memory.run_id or "")[:128] or None,
        "attempts": memory.attempts,
    }


_memories: dict[str, TriggerMemory] = {}
_memories_lock = threading.Lock()


def memory_for(engine: Any) -> TriggerMemory:
    """The trigger's memory on ``engine``'s database: its tables checked once per process
    and database."""
    key = engine.url.render_as_string(hide_password=False)
    with _memories_lock:
        memory = _memories.get(key)
        if memory is None or memory.engine is not engine:
            memory = TriggerMemory(engine) if memory is None else memory.on(engine)
            _memories[key] = memory
        return memory
