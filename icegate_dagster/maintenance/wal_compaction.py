"""WAL -> Iceberg compaction, exactly-once.

One run takes the WAL files present when it starts (later arrivals wait for the
next run), reads them with Spark, writes them into the table in one append
(Iceberg's write distribution and ordering sort by the table's partition keys
and sort order, files near ``target_file_size``) and then deletes them.

Exactly-once rests on the commit itself: the append's snapshot summary records
the batch's file names and sizes (``icegate.wal-files``). A run first looks for
WAL files that a snapshot already holds, which only a crash between commit and
delete can leave behind, and deletes them without ingesting them again. A
crash before the commit leaves the WAL untouched (and at worst unreferenced
data files, which orphan removal collects), so the next run ingests it once.
The record lives as long as its snapshot; WAL compaction runs first in every
pass, long before ``expire_snapshots`` could remove it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import CompactionSettings
from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier
from icegate_dagster.maintenance.locks import check_lease
from icegate_dagster.maintenance.operations import describe_error
from icegate_dagster.maintenance.results import Status
from icegate_dagster.maintenance.wal import (
    WalFile,
    compaction_due,
    list_wal_files,
    quarantine,
    wal_filesystem,
    wal_location,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType
    from pyspark.sql import Column, DataFrame, SparkSession

#: Snapshot summary keys written by every WAL commit.
BATCH_PROPERTY = "icegate.wal-batch"
FILES_PROPERTY = "icegate.wal-files"
#: Table property naming the WAL files committed but perhaps not yet deleted. Written in
#: the same atomic commit as the data, and kept in table metadata (not in a snapshot), so
#: an expiry run by any engine between a crash and the next run cannot remove it.
LEDGER_PROPERTY = "icegate.wal-ledger"
#: Staging branches: Spark writes a batch there, then one validated commit publishes it.
STAGING_PREFIX = "icegate_wal_"
#: A staging branch older than this belongs to a run that died before publishing.
STALE_STAGING = timedelta(hours=1)
#: Publish attempts when other writers keep committing first (each re-checks the WAL record).
PUBLISH_ATTEMPTS = 8

#: The step boundaries of a compaction, where a crash is survivable by design.
CHECKPOINTS = ("before_write", "after_commit", "mid_delete", "after_delete")
#: Test-only: ``ICEGATE_TEST_KILL_AT=after_commit`` SIGKILLs the process at that checkpoint.
KILL_AT_ENV = "ICEGATE_TEST_KILL_AT"

FaultHook = Callable[[str], None]


@dataclass
class WalCompactionOutcome:
    """What one compaction did."""

    details: str
    status: Status = "completed"
    output: dict[str, Any] = field(default_factory=dict)


def _checkpoint(point: str, hook: FaultHook | None) -> None:
    if hook is not None:
        hook(point)
    if os.environ.get(KILL_AT_ENV) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _identities(text: str | None) -> set[tuple[str, int, int]]:
    if not text:
        return set()
    try:
        return {(str(n), int(size), int(ns)) for n, size, ns in json.loads(text)}
    except (ValueError, TypeError):  # not ours (or damaged): it records nothing we wrote
        return set()


def _main_ancestry(table: Table) -> Iterator[Any]:
    snapshot = table.current_snapshot()
    seen: set[int] = set()
    while snapshot is not None and snapshot.snapshot_id not in seen:
        seen.add(snapshot.snapshot_id)
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None


def committed_wal_files(table: Table) -> set[tuple[str, int, int]]:
    """``(name, size, mtime_ns)`` of every WAL file the table has committed and whose
    deletion may not have happened yet.

    Two records: the table property ``icegate.wal-ledger``, written in the same commit as
    the data (it survives snapshot expiry by any engine), and the snapshot summaries of
    the main branch's history (commits made before the ledger existed). The
    modification time tells a new file apart from an ingested one of the same name.
    """
    done = _identities(table.properties.get(LEDGER_PROPERTY))
    for snapshot in _main_ancestry(table):
        summary = snapshot.summary
        done |= _identities(summary.get(FILES_PROPERTY) if summary is not None else None)
    return done


def settle_committed(table: Table, wal_root: str | None, ref: TableRef) -> int:
    """Delete the WAL files a snapshot of ``table`` already holds; return how many.

    Only a crash between a WAL commit and its deletes leaves such files. Expiry
    calls this first, so that it never drops the record while its files remain.
    """
    if not wal_root:
        return 0
    committed = committed_wal_files(table)
    leftovers = [f for f in list_wal_files(wal_root, ref) if f.identity in committed]
    if not leftovers:
        return 0
    filesystem, _folder = wal_filesystem(wal_root, ref)
    return _delete(filesystem, leftovers, None)


# -- schema compatibility (pyarrow footer vs Iceberg schema, no JVM) ----------


def _type_problem(arrow_type: pa.DataType, iceberg_type: IcebergType) -> str | None:
    """Why a WAL column of ``arrow_type`` cannot land in an Iceberg column, or None."""
    import pyarrow as pa
    from pyiceberg import types as t

    def ok(condition: bool) -> str | None:
        return None if condition else f"{arrow_type} cannot be written to {iceberg_type}"

    if pa.types.is_dictionary(arrow_type):  # dictionary encoding is storage, not type
        return _type_problem(arrow_type.value_type, iceberg_type)

    def fits(bits: int) -> bool:
        # An unsigned value needs a strictly wider signed column (Spark would wrap it).
        if pa.types.is_signed_integer(arrow_type):
            return bool(arrow_type.bit_width <= bits)
        return bool(pa.types.is_unsigned_integer(arrow_type) and arrow_type.bit_width < bits)

    if isinstance(iceberg_type, t.StringType):
        return ok(
            pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type)
        )
    if isinstance(iceberg_type, t.BooleanType):
        return ok(pa.types.is_boolean(arrow_type))
    if isinstance(iceberg_type, t.IntegerType):
        return ok(fits(32))
    if isinstance(iceberg_type, t.LongType):
        return ok(fits(64))
    # float16 is left out: Spark 3.5 cannot read it.
    if isinstance(iceberg_type, t.FloatType):
        return ok(pa.types.is_float32(arrow_type))
    if isinstance(iceberg_type, t.DoubleType):
        return ok(pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type))
    if isinstance(iceberg_type, t.DecimalType):
        return ok(
            pa.types.is_decimal(arrow_type)
            and arrow_type.scale == iceberg_type.scale
            and arrow_type.precision <= iceberg_type.precision
        )
    if isinstance(iceberg_type, t.DateType):
        return ok(pa.types.is_date(arrow_type))
    if isinstance(iceberg_type, (t.TimestampType, t.TimestamptzType)):
        return ok(pa.types.is_timestamp(arrow_type))
    if isinstance(iceberg_type, (t.BinaryType, t.FixedType, t.UUIDType)):
        return ok(
            pa.types.is_binary(arrow_type)
            or pa.types.is_large_binary(arrow_type)
            or pa.types.is_binary_view(arrow_type)
        )
    if isinstance(iceberg_type, t.ListType):
        if not (
            pa.types.is_list(arrow_type)
            or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type)
        ):
            return ok(False)
        return _type_problem(arrow_type.value_type, iceberg_type.element_type)
    if isinstance(iceberg_type, t.MapType):
        if not pa.types.is_map(arrow_type):
            return ok(False)
        return _type_problem(arrow_type.key_type, iceberg_type.key_type) or _type_problem(
            arrow_type.item_type, iceberg_type.value_type
        )
    if isinstance(iceberg_type, t.StructType):
        # Spark casts structs by position, so nested fields must match name for name.
        if not pa.types.is_struct(arrow_type):
            return ok(False)
        names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
        if names != [f.name for f in iceberg_type.fields]:
            return f"struct fields {names} differ from {[f.name for f in iceberg_type.fields]}"
        for i, nested in enumerate(iceberg_type.fields):
            problem = _type_problem(arrow_type.field(i).type, nested.field_type)
            if problem:
                return f"{nested.name}: {problem}"
        return None
    return ok(False)


def schema_problem(file_schema: pa.Schema, table: Table) -> str | None:
    """Why a WAL file's schema cannot be ingested into ``table``, or None when it can.

    Every WAL column must exist in the table with a type that widens to the
    table's (a column the table lacks would be dropped silently: refused), and
    every required table column must be present.
    """
    iceberg_schema = table.schema()
    columns = {f.name: f for f in iceberg_schema.fields}
    for arrow_field in file_schema:
        target = columns.get(arrow_field.name)
        if target is None:
            return f"column {arrow_field.name!r} is not in the table"
        problem = _type_problem(arrow_field.type, target.field_type)
        if problem:
            return f"column {arrow_field.name!r}: {problem}"
    missing = [
        f.name for f in iceberg_schema.fields if f.required and f.name not in file_schema.names
    ]
    if missing:
        return f"required column(s) {', '.join(missing)} missing"
    return None


@dataclass(frozen=True)
class _Good:
    """A WAL file fit to ingest: its schema, row count and INT64-nanosecond columns."""

    file: WalFile
    schema: pa.Schema
    rows: int
    nanos: frozenset[str]


@dataclass
class _Inspected:
    good: list[_Good]
    bad: list[tuple[WalFile, str]]


def _read_footer(filesystem: Any, wal_file: WalFile, full_read: bool) -> tuple[Any, int, set[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with filesystem.open_input_file(wal_file.path) as handle:
        parquet = pq.ParquetFile(handle)
        schema = parquet.schema_arrow
        # INT96 timestamps also look like timestamp[ns] to pyarrow, but Spark reads them
        # natively; only INT64 nanoseconds need the long path.
        physical = {
            parquet.schema.column(i).path: parquet.schema.column(i).physical_type
            for i in range(len(parquet.schema))
        }
        nanos = {
            f.name
            for f in schema
            if pa.types.is_timestamp(f.type)
            and f.type.unit == "ns"
            and physical.get(f.name) == "INT64"
        }
        if full_read:
            parquet.read()
        return schema, parquet.metadata.num_rows, nanos


def _inspect(filesystem: Any, files: list[WalFile], table: Table, full_read: bool) -> _Inspected:
    """Read each footer (or, with ``full_read``, every page) and check its schema.

    A file that is not Parquet goes to ``bad``; an I/O error is retried once
    before it counts (a flaky store must not quarantine a good file); a file
    that vanished is left out.
    """
    result = _Inspected([], [])
    for wal_file in files:
        for attempt in (1, 2):
            try:
                schema, rows, nanos = _read_footer(filesystem, wal_file, full_read)
                error = None
            except FileNotFoundError:
                error = "vanished"
            except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
                error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if isinstance(exc, OSError) and attempt == 1:
                    continue
            break
        if error == "vanished":
            continue
        if error is not None:
            result.bad.append((wal_file, f"unreadable Parquet: {error}"))
            continue
        problem = schema_problem(schema, table)
        if problem:
            result.bad.append((wal_file, f"schema incompatible with the table: {problem}"))
        else:
            result.good.append(_Good(wal_file, schema, rows, frozenset(nanos)))
    return result


# -- the Spark side ------------------------------------------------------------


_GLOB_CHARS = re.compile(r"([\\\[\]{}*?])")


def spark_path(uri: str) -> str:
    """``uri`` with Hadoop glob characters escaped, so Spark reads exactly that file."""
    return _GLOB_CHARS.sub(r"\\\1", uri)


# Spark's casts between TIMESTAMP (an instant) and TIMESTAMP_NTZ (a wall clock) use the
# session time zone, and so does its arithmetic on TIMESTAMP values. A WAL file may hold
# either kind (pyarrow writes naive timestamps as NTZ, zoned ones as instants), so every
# conversion goes through epoch microseconds with zone-free operations instead: a wall
# clock is that clock in UTC (Iceberg's convention for ``timestamp``), and back. Exact,
# also in the hour a daylight-saving change repeats, whatever the session time zone.
_EPOCH_NTZ = "TIMESTAMP_NTZ '1970-01-01 00:00:00'"


def _is_ltz(data_type: Any) -> bool:
    from pyspark.sql.types import TimestampType

    return isinstance(data_type, TimestampType)


def _is_ntz(data_type: Any) -> bool:
    from pyspark.sql.types import TimestampNTZType

    return isinstance(data_type, TimestampNTZType)


def _micros_of_wall_clock(ntz_sql: str) -> str:
    """SQL for the epoch microseconds of a TIMESTAMP_NTZ read as a UTC wall clock."""
    seconds = f"CAST(CAST({ntz_sql} - {_EPOCH_NTZ} AS INTERVAL SECOND) AS DECIMAL(20, 6))"
    return f"CAST({seconds} * 1000000 AS BIGINT)"


def _timestamp_of_micros(micros_sql: str, wanted: Any) -> Column:
    """Epoch microseconds as an instant (TIMESTAMP) or as its UTC wall clock (NTZ)."""
    from pyspark.sql import functions as F

    if _is_ntz(wanted):
        seconds = f"CAST(CAST({micros_sql} AS DECIMAL(20, 0)) / 1000000 AS DECIMAL(20, 6))"
        return F.expr(f"{_EPOCH_NTZ} + CAST({seconds} AS INTERVAL SECOND)")
    return F.expr(f"timestamp_micros({micros_sql})").cast(wanted)


def _batch_frame(spark: SparkSession, identifier: str, good: list[_Good]) -> DataFrame:
    """All good files as one frame in the table's column order and types."""
    from functools import reduce

    from pyspark.sql import functions as F

    target = spark.table(identifier).schema
    groups: dict[tuple[pa.Schema, frozenset[str]], list[WalFile]] = {}
    for item in good:
        groups.setdefault((item.schema, item.nanos), []).append(item.file)
    frames = []
    for (schema, nanos), members in groups.items():
        # Corrupt or missing files must fail the read, whatever the session says.
        reader = spark.read.option("ignoreCorruptFiles", "false").option(
            "ignoreMissingFiles", "false"
        )
        frame = reader.parquet(*(spark_path(m.uri) for m in members))
        columns = []
        for spark_field in target.fields:
            name = spark_field.name
            wanted = spark_field.dataType
            quoted = quote_identifier(name)
            if name not in schema.names:
                column = F.lit(None).cast(wanted)
            elif name in nanos:
                # Read as a long (spark.sql.legacy.parquet.nanosAsLong, set for the whole
                # session): floor to microseconds in integers, since a double cannot hold
                # today's epoch nanoseconds exactly.
                column = _timestamp_of_micros(f"({quoted} - pmod({quoted}, 1000)) div 1000", wanted)
            elif _is_ntz(frame.schema[name].dataType) and _is_ltz(wanted):
                column = _timestamp_of_micros(_micros_of_wall_clock(quoted), wanted)
            elif _is_ltz(frame.schema[name].dataType) and _is_ntz(wanted):
                column = _timestamp_of_micros(f"unix_micros({quoted})", wanted)
            else:
                column = F.col(name).cast(wanted)
            columns.append(column.alias(name))
        frames.append(frame.select(*columns))
    return reduce(lambda a, b: a.unionByName(b), frames)


def _require_nanos_as_long(spark: SparkSession, needed: bool) -> None:
    """Spark 3.5 reads nanosecond Parquet timestamps only as longs, behind a legacy flag.

    The session sets it once (``spark_session.NANOS_AS_LONG``); it is only read here,
    never switched: tables share the session from several threads. Without it the files
    would look unreadable and be quarantined, so the op fails instead and they stay.
    """
    from icegate_dagster.spark_session import NANOS_AS_LONG

    if needed and str(spark.conf.get(NANOS_AS_LONG, "false")).lower() != "true":
        raise OperationError(
            f"{NANOS_AS_LONG} is off in this Spark session, so WAL files with INT64 "
            "nanosecond timestamps cannot be read; icegate turns it on when it starts or "
            "joins a session: leave it on"
        )


def _append(
    spark: SparkSession,
    identifier: str,
    good: list[_Good],
    branch: str,
    target_file_size: int,
) -> None:
    """Write the batch to the staging ``branch`` (created fresh): the main branch and its
    readers see nothing until :func:`_publish` commits it."""
    _drop_branch(spark, identifier, branch)  # an earlier attempt of this run: start clean
    # On a table with no snapshot yet, Iceberg branches from a new empty snapshot.
    _manage_refs(spark, identifier, lambda manage: manage.createBranch(branch))
    _require_nanos_as_long(spark, any(g.nanos for g in good))
    (
        _batch_frame(spark, identifier, good)
        .writeTo(f"{identifier}.{quote_identifier('branch_' + branch)}")
        .option("target-file-size-bytes", str(target_file_size))
        .append()
    )


def _java_table(spark: SparkSession, identifier: str) -> Any:
    """Iceberg's own Java ``Table`` on the Spark driver (no Spark job)."""
    jvm: Any = spark._jvm
    session: Any = spark._jsparkSession
    # Outside spark.sql() the JVM reads settings from the calling thread's active session;
    # a maintenance thread (parallel_tables) has none, so a catalog not loaded yet would
    # be "not defined" and the name misread as a spark_catalog namespace.
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(session)
    return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, identifier)


def _manage_refs(spark: SparkSession, identifier: str, change: Callable[[Any], Any]) -> None:
    """Commit one branch change with Iceberg's ``manageSnapshots``, retried on a fresh table
    when another writer committed in between (Iceberg's own retry of a snapshot-reference
    change replays it on stale metadata and gives up)."""
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        try:
            change(_java_table(spark, identifier).manageSnapshots()).commit()
            return
        except Exception as exc:
            if "CommitFailedException" not in describe_error(exc) or attempt == PUBLISH_ATTEMPTS:
                raise
        time.sleep(min(2.0, 0.05 * 2**attempt))


def _java_list(iterable: Any) -> list[Any]:
    iterator = iterable.iterator()
    items = []
    while iterator.hasNext():
        items.append(iterator.next())
    return items


class AlreadyCommitted(Exception):
    """Another ingester committed some of this batch's WAL files first."""

    def __init__(self, files: set[tuple[str, int, int]]) -> None:
        super().__init__(f"{len(files)} WAL files already committed")
        self.files = files


def _publish(
    spark: SparkSession,
    identifier: str,
    table: Table,
    wal_root: str,
    ref: TableRef,
    branch: str,
    batch_id: str,
    good: list[_Good],
) -> None:
    """Commit the staged batch to the main branch exactly once, whatever else runs.

    Just before each commit attempt the table's current state is read, and the attempt is
    abandoned (:class:`AlreadyCommitted`) if any file of the batch is already recorded.
    The commit itself is validated by Iceberg against exactly that state: it fails if any
    data was added to the table since (``validateFromSnapshot`` +
    ``validateNoConflictingData`` on every internal retry), so a second ingester of the
    same files cannot slip in between the check and the commit, with or without locks.
    Data, the WAL record (snapshot summary and the ledger property) and the removal of the
    staging branch land in one atomic metadata commit.
    """
    jvm: Any = spark._jvm
    always_true = jvm.org.apache.iceberg.expressions.Expressions.alwaysTrue()
    batch = {g.file.identity for g in good}
    recorded = json.dumps(sorted(list(i) for i in batch), separators=(",", ":"))
    java_table = _java_table(spark, identifier)
    staged = java_table.snapshot(branch)
    if staged is None:
        raise OperationError(f"WAL batch {batch_id}: staging branch {branch} is gone")
    files = _java_list(staged.addedDataFiles(java_table.io()))
    for attempt in range(1, PUBLISH_ATTEMPTS + 1):
        current = table.refresh()
        already = batch & committed_wal_files(current)
        if already:
            raise AlreadyCommitted(already)
        base = current.current_snapshot()
        # The ledger keeps what may still be waiting: this batch, and earlier entries whose
        # files are still in the WAL folder (a crash between commit and delete).
        present = {f.identity for f in list_wal_files(wal_root, ref)}
        earlier = _identities(current.properties.get(LEDGER_PROPERTY)) & present
        ledger = json.dumps(sorted(list(i) for i in batch | earlier), separators=(",", ":"))
        check_lease()  # commits only while the table's lease is ours
        java_table.refresh()
        transaction = java_table.newTransaction()
        append = transaction.newOverwrite()
        for data_file in files:
            append.addFile(data_file)
        if base is not None:
            append.validateFromSnapshot(base.snapshot_id)
        append.conflictDetectionFilter(always_true)
        append.validateNoConflictingData()
        append.set(BATCH_PROPERTY, batch_id)
        append.set(FILES_PROPERTY, recorded)
        try:
            append.commit()
            transaction.updateProperties().set(LEDGER_PROPERTY, ledger).commit()
            transaction.manageSnapshots().removeBranch(branch).commit()
            transaction.commitTransaction()
            return
        except Exception as exc:
            # Another writer committed first (Iceberg's validation, or a reference change it
            # could not replay): look at the table again, the WAL record included.
            text = describe_error(exc)
            conflict = "ValidationException" in text or "CommitFailedException" in text
            if not conflict or "CommitStateUnknown" in text or attempt == PUBLISH_ATTEMPTS:
                raise
        time.sleep(min(4.0, 0.1 * 2**attempt))


def _drop_branch(spark: SparkSession, identifier: str, branch: str) -> None:
    with contextlib.suppress(Exception):  # best effort: a stale branch is removed later
        if _java_table(spark, identifier).refs().containsKey(branch):
            _manage_refs(spark, identifier, lambda manage: manage.removeBranch(branch))


def drop_stale_staging(table: Table) -> int:
    """Remove staging branches left by runs that died before publishing; return how many."""
    cutoff_ms = int((datetime.now(UTC) - STALE_STAGING).timestamp() * 1000)
    stale = []
    for name, snapshot_ref in table.metadata.refs.items():
        snapshot = table.snapshot_by_id(snapshot_ref.snapshot_id)
        if name.startswith(STAGING_PREFIX) and (
            snapshot is None or snapshot.timestamp_ms < cutoff_ms
        ):
            stale.append(name)
    if stale:
        manage = table.manage_snapshots()
        for name in stale:
            manage = manage.remove_branch(name)
        manage.commit()
    return len(stale)


# -- one run -----------------------------------------------------------------


@contextlib.contextmanager
def _exclusive(wal_root: str, ref: TableRef) -> Iterator[str | None]:
    """One compaction per table at a time on this host: yields None, or the lock's holder path.

    The lock is ``flock`` on ``_icegate.lock`` in the WAL folder; it dies with its
    process, so a crashed run never leaves a stale lock. Remote file systems get
    no lock here; Dagster's one-run-per-partition limit covers them.
    """
    filesystem, folder = wal_filesystem(wal_root, ref)
    if type(filesystem).__name__ != "LocalFileSystem" or not os.path.isdir(folder):
        yield None
        return
    import fcntl

    with open(os.path.join(folder, "_icegate.lock"), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield lock.name
            return
        try:
            yield None
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def compact_wal(
    spark_provider: Callable[[], SparkSession],
    catalog: str,
    ref: TableRef,
    table: Table,
    wal_root: str | None,
    settings: CompactionSettings,
    *,
    force: bool = False,
    fault_hook: FaultHook | None = None,
) -> WalCompactionOutcome:
    """Ingest the table's WAL files once, if they reach a threshold (or ``force``).

    ``spark_provider`` is only called when there is something to write, so a
    table below its thresholds never starts a JVM.
    """
    if not wal_root:
        return WalCompactionOutcome("no wal.root configured", status="skipped")
    with _exclusive(wal_root, ref) as held_by:
        if held_by is not None:
            return WalCompactionOutcome(
                f"another WAL compaction of {ref.key} is running (it holds {held_by}); "
                "its WAL is left to that run",
                status="skipped",
            )
        # Metadata read before the lock may predate a commit made by the lock's last holder.
        return _compact_locked(
            spark_provider, catalog, ref, table.refresh(), wal_root, settings, force, fault_hook
        )


def _delete(filesystem: Any, files: list[WalFile], hook: FaultHook | None) -> int:
    check_lease()  # deleting WAL files: only while the table's lease is ours
    deleted = 0
    for wal_file in files:
        with contextlib.suppress(FileNotFoundError):
            filesystem.delete_file(wal_file.path)
        deleted += 1
        if deleted == 1 and len(files) > 1:
            _checkpoint("mid_delete", hook)
    return deleted


def _compact_locked(
    spark_provider: Callable[[], SparkSession],
    catalog: str,
    ref: TableRef,
    table: Table,
    wal_root: str,
    settings: CompactionSettings,
    force: bool,
    hook: FaultHook | None,
) -> WalCompactionOutcome:
    filesystem, _folder = wal_filesystem(wal_root, ref)
    # A crash between commit and delete leaves files a commit already holds.
    settled = settle_committed(table, wal_root, ref)
    if drop_stale_staging(table):
        table = table.refresh()
    pending = list_wal_files(wal_root, ref)
    output: dict[str, Any] = {
        "wal_files_ingested": 0,
        "rows_added": 0,
        "wal_files_recovered": settled,
        "quarantined": [],
    }
    recovered = f"; deleted {settled} WAL files an earlier commit already holds" if settled else ""
    pending_bytes = sum(f.size for f in pending)
    output.update(wal_files_pending=len(pending), wal_bytes_pending=pending_bytes)
    if not pending:
        return WalCompactionOutcome(
            f"no WAL files waiting in {wal_location(wal_root, ref)}{recovered}",
            status="skipped" if not settled else "completed",
            output=output,
        )
    if not force and not compaction_due(len(pending), pending_bytes, settings):
        return WalCompactionOutcome(
            f"WAL below thresholds: {len(pending)} files, {pending_bytes} bytes "
            f"(runs at {settings.min_files} files or {settings.min_size_bytes} bytes){recovered}",
            status="skipped" if not settled else "completed",
            output=output,
        )

    inspected = _inspect(filesystem, pending, table, full_read=False)
    quarantined = _quarantine_all(wal_root, ref, inspected.bad)
    _checkpoint("before_write", hook)
    batch_id = uuid.uuid4().hex
    good = inspected.good
    identifier = ref.spark_identifier(catalog)
    if good:
        spark = spark_provider()
        good, unreadable = _write_batch(
            spark, identifier, filesystem, table, good, batch_id, settings
        )
        quarantined += _quarantine_all(wal_root, ref, unreadable)
        if good:
            try:
                branch = STAGING_PREFIX + batch_id
                _publish(spark, identifier, table, wal_root, ref, branch, batch_id, good)
            except AlreadyCommitted as exc:
                # Another ingester got there first: append nothing, settle what it holds.
                _drop_branch(spark, identifier, STAGING_PREFIX + batch_id)
                output["quarantined"] = quarantined
                output["wal_files_already_committed"] = len(exc.files)
                gone = settle_committed(table.refresh(), wal_root, ref)
                return WalCompactionOutcome(
                    f"another ingester committed {len(exc.files)} of these {len(good)} WAL "
                    f"files first: appended nothing (no duplicate), deleted {gone} files it "
                    "holds; any others wait for the next run",
                    status="skipped",
                    output=output,
                )
            except Exception:
                if _find_batch_snapshot(table, batch_id) is None:  # not committed: clean up
                    _drop_branch(spark, identifier, STAGING_PREFIX + batch_id)
                    raise
    output["quarantined"] = quarantined
    if not good:
        return WalCompactionOutcome(
            f"nothing ingested: all {len(quarantined)} waiting WAL files were quarantined"
            f"{recovered}",
            status="failed",
            output=output,
        )
    _checkpoint("after_commit", hook)

    snapshot = _find_batch_snapshot(table, batch_id)
    if snapshot is None:
        raise OperationError(f"the commit of WAL batch {batch_id} is not in the table's history")
    expected_rows = sum(g.rows for g in good)
    added = int(snapshot.summary.get("added-records", 0) if snapshot.summary else 0)
    if added != expected_rows:
        # Never reached in tests; if it is, keep the files out of reach of the settle step.
        reason = (
            f"batch {batch_id} (snapshot {snapshot.snapshot_id}) added {added} rows but its "
            f"files hold {expected_rows}: compare them with the snapshot before re-ingesting"
        )
        _quarantine_all(wal_root, ref, [(g.file, reason) for g in good])
        raise OperationError(f"WAL batch of {ref.key}: {reason}; its files are in quarantine")
    _delete(filesystem, [g.file for g in good], hook)
    _checkpoint("after_delete", hook)
    output.update(
        wal_files_ingested=len(good),
        rows_added=added,
        snapshot_id=snapshot.snapshot_id,
        batch_id=batch_id,
        data_files_added=int(snapshot.summary.get("added-data-files", 0)),
    )
    note = ""
    if quarantined:
        listed = "; ".join(f"{q['file']} ({q['reason']})" for q in quarantined)
        note = f"; quarantined {len(quarantined)}: {listed}"
    return WalCompactionOutcome(
        f"ingested {len(good)} WAL files ({added} rows) in snapshot {snapshot.snapshot_id}, "
        f"{output['data_files_added']} data files written{note}{recovered}",
        output=output,
    )


def _quarantine_all(
    wal_root: str, ref: TableRef, bad: list[tuple[WalFile, str]]
) -> list[dict[str, str]]:
    moved = []
    for wal_file, reason in bad:
        target = quarantine(wal_root, ref, wal_file, reason)
        moved.append({"file": wal_file.name, "reason": reason, "moved_to": target})
    return moved


def _find_batch_snapshot(table: Table, batch_id: str) -> Any:
    """The snapshot that committed ``batch_id``, or None."""
    table = table.refresh()
    for snapshot in reversed(table.metadata.snapshots):
        if snapshot.summary is not None and snapshot.summary.get(BATCH_PROPERTY) == batch_id:
            return snapshot
    return None


def _spark_problem(spark: SparkSession, identifier: str, item: _Good) -> str | None:
    """Why Spark cannot read and convert this one file, or None."""
    _require_nanos_as_long(spark, bool(item.nanos))  # fails the op, quarantines nothing
    try:
        _batch_frame(spark, identifier, [item]).write.format("noop").mode("overwrite").save()
    except Exception as exc:
        return f"Spark cannot read it: {describe_error(exc)}"
    return None


def _write_batch(
    spark: SparkSession,
    identifier: str,
    filesystem: Any,
    table: Table,
    good: list[_Good],
    batch_id: str,
    settings: CompactionSettings,
) -> tuple[list[_Good], list[tuple[WalFile, str]]]:
    """Stage ``good`` on the batch's branch; return what was staged and what could not be read.

    When the write fails, each file is read on its own (pyarrow, then Spark):
    the ones that fail are set aside and the rest is staged once more. Nothing
    reaches the main branch here (see :func:`_publish`).
    """
    branch = STAGING_PREFIX + batch_id
    try:
        _append(spark, identifier, good, branch, settings.target_file_size)
        return good, []
    except Exception:
        reread = _inspect(filesystem, [g.file for g in good], table, full_read=True)
        unreadable = list(reread.bad)
        keep = []
        for item in reread.good:
            problem = _spark_problem(spark, identifier, item)
            if problem:
                unreadable.append((item.file, problem))
            else:
                keep.append(item)
        if not unreadable:
            raise
    if keep:
        _append(spark, identifier, keep, branch, settings.target_file_size)
    else:
        _drop_branch(spark, identifier, branch)
    return keep, unreadable
