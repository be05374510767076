"""The maintenance log: an Iceberg table with one row per table per operation."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier, sql_string
from icegate_dagster.maintenance.pyiceberg_writes import commit_attempts, create_table_once
from icegate_dagster.maintenance.results import OpResult, TableResult

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession

#: The contract's columns, in order.
LOG_COLUMNS = (
    "table_name",
    "operation",
    "status",
    "details",
    "snapshots_before",
    "snapshots_after",
    "files_before",
    "files_after",
    "bytes_before",
    "bytes_after",
    "duration_ms",
    "run_id",
    "executed_at",
)
_STRING_COLUMNS = {"table_name", "operation", "status", "details", "run_id"}


def log_schema() -> Any:
    """The Iceberg schema of the log table."""
    from pyiceberg.schema import Schema
    from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

    fields = []
    for field_id, name in enumerate(LOG_COLUMNS, start=1):
        if name in _STRING_COLUMNS:
            kind: Any = StringType()
        elif name == "executed_at":
            kind = TimestamptzType()
        else:
            kind = LongType()
        fields.append(NestedField(field_id, name, kind, required=False))
    return Schema(*fields)


def ensure_log_table(catalog: Catalog, ref: TableRef) -> None:
    """Create the log table (and its namespace) if missing; another maintainer creating
    them at the same moment is fine."""
    create_table_once(catalog, ref, log_schema())


def log_row(result: OpResult, run_id: str, executed_at: datetime | None = None) -> dict[str, Any]:
    """One log row for one operation result (``details`` carries the error of a failure)."""
    before, after = result.before, result.after
    return {
        "table_name": result.table,
        "operation": result.operation,
        "status": result.status,
        "details": result.details,
        "snapshots_before": before.snapshots if before else None,
        "snapshots_after": after.snapshots if after else None,
        "files_before": before.data_files if before else None,
        "files_after": after.data_files if after else None,
        "bytes_before": before.data_bytes if before else None,
        "bytes_after": after.data_bytes if after else None,
        "duration_ms": int(round(result.duration_s * 1000)),
        "run_id": run_id,
        "executed_at": executed_at or result.finished_at,
    }


def _sql_literal(value: Any) -> str:
    """A typed Spark SQL literal for one log value."""
    if value is None:
        return "NULL"
    if isinstance(value, datetime):
        stamp = value.astimezone(UTC) if value.tzinfo else value.replace(tzinfo=UTC)
        return f"TIMESTAMP '{stamp.strftime('%Y-%m-%d %H:%M:%S.%f')}Z'"
    if isinstance(value, bool):
        raise TypeError(f"unexpected boolean in a log row: {value!r}")
    if isinstance(value, int):
        return f"{value}L"
    return sql_string(str(value))


def append_log_rows(
    spark: SparkSession, catalog_name: str, ref: TableRef, rows: list[dict[str, Any]]
) -> None:
    """Append rows to the log table with Spark, in one commit.

    One ``INSERT ... VALUES`` statement rather than ``createDataFrame``: a local Python
    list becomes a Python RDD, which on a cluster needs a matching Python on every
    executor host just to write a few log rows.
    """
    if not rows:
        return
    columns = ", ".join(quote_identifier(name) for name in LOG_COLUMNS)
    values = ",\n".join(
        "(" + ", ".join(_sql_literal(row[name]) for name in LOG_COLUMNS) + ")" for row in rows
    )
    spark.sql(f"INSERT INTO {ref.spark_identifier(catalog_name)} ({columns}) VALUES\n{values}")


def append_log_rows_without_spark(
    catalog: Catalog, ref: TableRef, rows: list[dict[str, Any]]
) -> None:
    """Append rows with pyiceberg, in one commit, with no JVM: how a pass that started no
    Spark job logs. Another writer committing first is retried on fresh metadata."""
    import pyarrow as pa

    for attempt in commit_attempts():
        with attempt:
            table = catalog.load_table(ref.identifier)
            table.append(pa.Table.from_pylist(rows, schema=table.schema().as_arrow()))


def read_log(catalog: Catalog, ref: TableRef, run_id: str | None = None) -> list[dict[str, Any]]:
    """Rows of the log table (only ``run_id``'s when given), read with pyiceberg (no JVM)."""
    from pyiceberg.expressions import AlwaysTrue, EqualTo

    table = catalog.load_table(ref.identifier)
    # pyiceberg's runtime signature is (term, literal); its pydantic stub hides that from mypy.
    row_filter = EqualTo("run_id", run_id) if run_id is not None else AlwaysTrue()  # type: ignore[call-arg,arg-type]
    rows: list[dict[str, Any]] = table.scan(row_filter=row_filter).to_arrow().to_pylist()
    return rows


def log_size(catalog: Catalog, ref: TableRef) -> int:
    """How many rows the log table holds, from its snapshot summary."""
    snapshot = catalog.load_table(ref.identifier).current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get("total-records", 0) or 0)


class LogWriter:
    """Appends a pass's outcomes to the log table: creates it once, then one commit per
    call, with the pass's Spark session if it started one, else with pyiceberg."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        config: IcegateConfig,
        run_id: str,
        started_spark: Callable[[], SparkSession | None],
    ) -> None:
        self.ref = TableRef.parse(config.log_table)
        self.run_id = run_id
        self._catalog = catalog
        self._config = config
        self._started_spark = started_spark
        self._ready = False
        self._lock = threading.Lock()

    def write(self, results: Sequence[OpResult]) -> None:
        """One row per result, in one commit; raises :class:`IcegateError` naming the cause."""
        cause = self._append(results)
        if cause is not None:
            raise IcegateError(f"cannot write the maintenance log: {cause}")

    def write_tables(self, tables: Sequence[TableResult]) -> None:
        """The rows of all ``tables`` in one commit; a failure is added to each table's
        error (``maintenance log not written: ...``), never raised. ``tables`` is kept."""
        cause = self._append([op for table in tables for op in table.ops])
        if cause is not None:
            note = f"maintenance log not written: {cause}"
            for table in tables:
                table.error = f"{table.error}; {note}" if table.error else note

    def _append(self, results: Sequence[OpResult]) -> str | None:
        """Append the rows; what went wrong (secrets masked), or ``None``."""
        if not results:
            return None
        try:
            with self._lock:
                if not self._ready:
                    ensure_log_table(self._catalog(), self.ref)
                    self._ready = True
            rows = [log_row(r, self.run_id) for r in results]
            # A pass whose operations started no JVM (nothing to do, or Spark cannot start
            # with this configuration) does not start one to log: pyiceberg appends.
            spark = self._started_spark()
            if spark is None:
                append_log_rows_without_spark(self._catalog(), self.ref, rows)
            else:
                append_log_rows(spark, self._config.catalog.name, self.ref, rows)
        except Exception as exc:
            return describe_error(exc, lambda text: scrub(text, self._config))
        return None

    @contextlib.contextmanager
    def batches(
        self,
        tables_per_write: int,
        seconds_between: float,
        *,
        enabled: bool = True,
        also: Callable[[list[TableResult]], object] | None = None,
    ) -> Iterator[LogBatch]:
        """Collect finished tables and write their rows once ``tables_per_write`` tables
        are waiting and ``seconds_between`` have passed since the last write (a crash loses
        at most those rows), and the rest when the block ends, however it ends; ``also`` is
        given each batch's tables after their rows."""
        batch = LogBatch(self, tables_per_write if enabled else 0, seconds_between, also)
        try:
            yield batch
        finally:
            batch.flush()


class LogBatch:
    """Tables whose rows are not written yet (see :meth:`LogWriter.batches`)."""

    def __init__(
        self,
        writer: LogWriter,
        size: int,
        seconds_between: float,
        also: Callable[[list[TableResult]], object] | None = None,
    ) -> None:
        self._writer = writer
        self._also = also
        self._size = size
        self._seconds = seconds_between
        self._last_write = time.monotonic()
        self._pending: list[TableResult] = []

    def add(self, table: TableResult) -> None:
        """Queue ``table``'s rows; write the queue once it holds a batch and the interval
        has passed (never when the batch size is 0: a dry run logs nothing). Healthy tables
        finish in milliseconds: writing every batch of them would give the log table a
        small file per batch, and a pass of a thousand tables a JVM to compact them."""
        if self._size <= 0:
            return
        self._pending.append(table)
        waited = time.monotonic() - self._last_write
        if len(self._pending) >= self._size and waited >= self._seconds:
            self.flush()

    def flush(self) -> None:
        """Write the queued rows now."""
        pending, self._pending = self._pending, []
        if pending:
            self._writer.write_tables(pending)
            if self._also is not None:
                self._also(pending)
            self._last_write = time.monotonic()
