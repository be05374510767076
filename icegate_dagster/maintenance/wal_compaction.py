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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import CompactionSettings
from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier
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
    from pyspark.sql import DataFrame, SparkSession

#: Snapshot summary keys written by every WAL commit.
BATCH_PROPERTY = "icegate.wal-batch"
FILES_PROPERTY = "icegate.wal-files"

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


def committed_wal_files(table: Table) -> set[tuple[str, int, int]]:
    """``(name, size, mtime_ns)`` of every WAL file recorded by a snapshot the table still has.

    The modification time tells a new file apart from an ingested one of the same name.
    """
    done: set[tuple[str, int, int]] = set()
    for snapshot in table.metadata.snapshots:
        summary = snapshot.summary
        recorded = summary.get(FILES_PROPERTY) if summary is not None else None
        if not recorded:
            continue
        try:
            done.update((str(n), int(size), int(ns)) for n, size, ns in json.loads(recorded))
        except (ValueError, TypeError):  # not ours (or damaged): it records nothing we wrote
            continue
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
            if name not in schema.names:
                column = F.lit(None).cast(spark_field.dataType)
            elif name in nanos:
                # Read as a long (see _nanos_as_long): floor to microseconds in integers,
                # since a double cannot hold today's epoch nanoseconds exactly.
                quoted = quote_identifier(name)
                micros = F.expr(f"({quoted} - pmod({quoted}, 1000)) div 1000")
                column = F.timestamp_micros(micros).cast(spark_field.dataType)
            else:
                column = F.col(name).cast(spark_field.dataType)
            columns.append(column.alias(name))
        frames.append(frame.select(*columns))
    return reduce(lambda a, b: a.unionByName(b), frames)


@contextlib.contextmanager
def _nanos_as_long(spark: SparkSession, needed: bool) -> Iterator[None]:
    """Spark 3.5 reads nanosecond Parquet timestamps only as longs, behind a legacy flag."""
    key = "spark.sql.legacy.parquet.nanosAsLong"
    if not needed:
        yield
        return
    previous = spark.conf.get(key, "false") or "false"
    spark.conf.set(key, "true")
    try:
        yield
    finally:
        spark.conf.set(key, previous)


def _append(
    spark: SparkSession,
    identifier: str,
    good: list[_Good],
    batch_id: str,
    target_file_size: int,
) -> None:
    recorded = json.dumps([list(g.file.identity) for g in good], separators=(",", ":"))
    with _nanos_as_long(spark, any(g.nanos for g in good)):
        (
            _batch_frame(spark, identifier, good)
            .writeTo(identifier)
            .option(f"snapshot-property.{BATCH_PROPERTY}", batch_id)
            .option(f"snapshot-property.{FILES_PROPERTY}", recorded)
            .option("target-file-size-bytes", str(target_file_size))
            .append()
        )


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
    # A crash between commit and delete leaves files a snapshot already holds.
    settled = settle_committed(table, wal_root, ref)
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
    if good:
        spark = spark_provider()
        good, unreadable = _write_batch(
            spark, ref.spark_identifier(catalog), filesystem, table, good, batch_id, settings
        )
        quarantined += _quarantine_all(wal_root, ref, unreadable)
    output["quarantined"] = quarantined
    if not good:
        return WalCompactionOutcome(
            f"nothing ingested: all {len(quarantined)} waiting WAL files were quarantined"
            f"{recovered}",
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
    try:
        with _nanos_as_long(spark, bool(item.nanos)):
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
    """Append ``good`` in one commit; return what was committed and what could not be read.

    When the append fails, each file is read on its own (pyarrow, then Spark):
    the ones that fail are set aside and the rest is appended once more, unless
    the first attempt committed after all (a commit whose outcome was unknown).
    """
    try:
        _append(spark, identifier, good, batch_id, settings.target_file_size)
        return good, []
    except Exception:
        if _find_batch_snapshot(table, batch_id) is not None:
            return good, []
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
        _append(spark, identifier, keep, batch_id, settings.target_file_size)
    return keep, unreadable
