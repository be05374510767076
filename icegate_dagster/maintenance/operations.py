"""The Spark side of each maintenance operation: one Iceberg procedure call each.

Each function takes the Spark session, the catalog name, the table and its
settings, runs the procedure and returns Iceberg's own output plus a one-line
summary. Errors propagate; the runner turns them into failed results.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import (
    ExpireSnapshotsSettings,
    OptimizeSettings,
    RemoveOrphanFilesSettings,
    RetentionSettings,
)
from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier, sql_string
from icegate_dagster.maintenance.locks import check_lease

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

#: Iceberg's default ``write.target-file-size-bytes``.
DEFAULT_TARGET_FILE_SIZE = 512 * 1024**2


@dataclass
class ProcedureOutcome:
    """What a procedure reported, and a sentence for people."""

    details: str
    output: dict[str, Any] = field(default_factory=dict)


#: Commit conflicts worth retrying: another writer committed first (the procedure
#: re-reads the table on the next attempt, as the Spark catalog caches nothing).
#: An unknown commit state is never retried: the commit may have happened.
_CONFLICTS = ("CommitFailedException", "ValidationException")
#: Attempts per procedure call, and the backoff between them (seconds).
COMMIT_ATTEMPTS = 4


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a commit that lost a race with another writer."""
    text = describe_error(exc)
    return any(name in text for name in _CONFLICTS) and "CommitStateUnknown" not in text


@dataclass
class Called:
    """A procedure's result rows, how many commit conflicts were retried, and its time."""

    rows: list[Any]
    retries: int
    seconds: float = 0.0

    def output(self) -> dict[str, Any]:
        """The first row, plus the retries and the time spent in Spark."""
        first = self.rows[0].asDict() if self.rows else {}
        return {**first, "commit_retries": self.retries, "procedure_s": round(self.seconds, 3)}


def _call(spark: SparkSession, catalog: str, procedure: str, args: dict[str, str]) -> Called:
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    arguments = ", ".join(f"{name} => {value}" for name, value in args.items())
    sql = f"CALL {quote_identifier(catalog)}.system.{procedure}({arguments})"
    retrying = Retrying(
        stop=stop_after_attempt(COMMIT_ATTEMPTS),
        wait=wait_exponential(multiplier=0.5, max=8),
        retry=retry_if_exception(is_commit_conflict),
        reraise=True,
    )
    attempts = 0
    started = time.perf_counter()
    for attempt in retrying:
        with attempt:
            attempts += 1
            check_lease()  # the procedure commits: only while the table's lease is ours
            rows = spark.sql(sql).collect()
    return Called(rows, attempts - 1, time.perf_counter() - started)


def _utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive ``moment`` is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _wall_clock(moment: datetime) -> str:
    return _utc(moment).strftime("%Y-%m-%d %H:%M:%S.%f")


def _timestamp(moment: datetime) -> str:
    """An instant as a TIMESTAMP literal: the UTC offset is spelled out.

    A zone-less literal is read in ``spark.sql.session.timeZone``, which users may set
    (rule 7). Iceberg's CALL takes literals only (``TIMESTAMP_MILLIS(n)`` is refused by
    its parser), and a literal with an offset is an instant whatever the session says.
    """
    return f"TIMESTAMP {sql_string(_wall_clock(moment) + '+00:00')}"


def _options(options: dict[str, str]) -> str:
    pairs = ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in options.items())
    return f"map({pairs})"


def rewrite_options(settings: OptimizeSettings, table: Table) -> dict[str, str]:
    """Map ``file_size_threshold``/``min_input_files`` onto ``rewrite_data_files`` options.

    Files smaller than the threshold are candidates (``min-file-size-bytes``);
    a group is rewritten once it has ``min_input_files`` of them. The target
    size stays the table's own unless the threshold would reach it, in which
    case it is raised to twice the threshold (Iceberg requires min < target).
    """
    target = int(table.properties.get("write.target-file-size-bytes", DEFAULT_TARGET_FILE_SIZE))
    options = {
        "min-input-files": str(settings.min_input_files),
        "min-file-size-bytes": str(settings.file_size_threshold),
        # Not "partial-progress.enabled": it commits the groups that worked and only logs
        # the ones that failed (a missing file, say), so the op would report success.
        # Conflicts with writers are retried instead (see _call).
    }
    if settings.file_size_threshold >= target:
        options["target-file-size-bytes"] = str(2 * settings.file_size_threshold)
    return options


def optimize(
    spark: SparkSession, catalog: str, ref: TableRef, settings: OptimizeSettings, table: Table
) -> ProcedureOutcome:
    """Compact small data files with ``rewrite_data_files`` (binpack, or sort/z-order)."""
    args = {"table": ref.procedure_argument(), "strategy": sql_string(settings.strategy)}
    if settings.strategy == "sort":
        if settings.sort_order:
            args["sort_order"] = sql_string(settings.sort_order)
        elif table.sort_order().is_unsorted:
            raise OperationError(
                f"table {ref.key}: optimize.strategy is 'sort' but the table has no sort order; "
                "set optimize.sort_order (e.g. 'zorder(tenant_id, timestamp)')"
            )
    args["options"] = _options(rewrite_options(settings, table))
    called = _call(spark, catalog, "rewrite_data_files", args)
    row = called.output()
    return ProcedureOutcome(
        details=(
            f"rewrote {row['rewritten_data_files_count']} data files "
            f"({row['rewritten_bytes_count']} bytes) into {row['added_data_files_count']}"
        ),
        output=row,
    )


def rewrite_manifests(spark: SparkSession, catalog: str, ref: TableRef) -> ProcedureOutcome:
    """Cluster manifests by partition with ``rewrite_manifests``."""
    called = _call(spark, catalog, "rewrite_manifests", {"table": ref.procedure_argument()})
    out = called.output()
    return ProcedureOutcome(
        details=(
            f"rewrote {out['rewritten_manifests_count']} manifests "
            f"into {out['added_manifests_count']}"
        ),
        output=out,
    )


def expire_snapshots(
    spark: SparkSession,
    catalog: str,
    ref: TableRef,
    settings: ExpireSnapshotsSettings,
    now: datetime,
) -> ProcedureOutcome:
    """Expire snapshots older than the threshold, keeping the last ``retain_last``.

    Iceberg itself keeps the current snapshot and every branch and tag head.
    """
    older_than = now - settings.retention_threshold
    args = {
        "table": ref.procedure_argument(),
        "older_than": _timestamp(older_than),
        "retain_last": str(settings.retain_last),
    }
    called = _call(spark, catalog, "expire_snapshots", args)
    out = called.output()
    return ProcedureOutcome(
        details=(
            f"expired snapshots older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
            f"(keeping the last {settings.retain_last}); deleted {out['deleted_data_files_count']} "
            f"data files, {out['deleted_manifest_files_count']} manifests, "
            f"{out['deleted_manifest_lists_count']} manifest lists"
        ),
        output=out,
    )


def remove_orphan_files(
    spark: SparkSession,
    catalog: str,
    ref: TableRef,
    settings: RemoveOrphanFilesSettings,
    now: datetime,
    dry_run: bool = False,
) -> ProcedureOutcome:
    """Delete files under the table location that no snapshot references and are old enough."""
    older_than = now - settings.retention_threshold
    dry = dry_run or settings.dry_run
    args = {
        "table": ref.procedure_argument(),
        "older_than": _timestamp(older_than),
        "dry_run": "true" if dry else "false",
    }
    called = _call(spark, catalog, "remove_orphan_files", args)
    rows = called.rows
    files = sorted(row["orphan_file_location"] for row in rows)
    verb = "would remove" if dry else "removed"
    return ProcedureOutcome(
        details=(
            f"{verb} {len(files)} orphan files older than "
            f"{older_than:%Y-%m-%d %H:%M:%S} UTC" + (" (dry run)" if dry else "")
        ),
        output={
            "orphan_files": files,
            "orphans_removed": 0 if dry else len(files),
            "dry_run": dry,
            "procedure_s": round(called.seconds, 3),
        },
    )


def retention_condition(
    ref: TableRef, rule: RetentionSettings, cutoff: datetime, table: Table
) -> tuple[str, str]:
    """The TTL filter for ``rule.column`` from its Iceberg type, and the bound for people.

    The filter holds exactly for rows past ``cutoff`` whatever the session time zone:
    ``timestamptz`` is compared with the instant, ``timestamp`` (a UTC wall clock by
    convention) with the cutoff's UTC wall clock, and ``date`` with the cutoff's UTC
    date (a day is past once it ended, at the next midnight UTC, by the cutoff).
    """
    from pyiceberg import types as t

    try:
        field = table.schema().find_field(rule.column, case_sensitive=False)
    except ValueError:
        raise OperationError(
            f"table {ref.key}: retention column {rule.column!r} is not in the table"
        ) from None
    column = quote_identifier(rule.column)
    wall = _wall_clock(cutoff)
    kind = field.field_type
    if isinstance(kind, t.TimestamptzType):
        return f"{column} < {_timestamp(cutoff)}", f"{wall} UTC"
    if isinstance(kind, t.TimestampType):
        return f"{column} < TIMESTAMP_NTZ {sql_string(wall)}", f"{wall} (UTC wall clock)"
    if isinstance(kind, t.DateType):
        day = _utc(cutoff).date().isoformat()
        return f"{column} < DATE {sql_string(day)}", f"{day} (days that ended by the cutoff)"
    raise OperationError(
        f"table {ref.key}: retention column {rule.column!r} has type {kind}; "
        "TTL needs a timestamptz, timestamp or date column"
    )


def retention(
    spark: SparkSession,
    catalog: str,
    ref: TableRef,
    rule: RetentionSettings,
    now: datetime,
    table: Table,
) -> ProcedureOutcome:
    """Delete rows whose ``rule.column`` is older than ``rule.days`` days (TTL).

    ``table`` (pyiceberg) gives the column's type, which decides the comparison (see
    :func:`retention_condition`). A filter aligned with the table's partitions is
    applied by Iceberg as a metadata-only delete (whole files dropped, nothing rewritten).
    """
    cutoff = _utc(now) - timedelta(days=rule.days)
    condition, bound = retention_condition(ref, rule, cutoff, table)
    name = ref.spark_identifier(catalog)
    doomed = int(spark.sql(f"SELECT count(*) FROM {name} WHERE {condition}").collect()[0][0])
    if doomed:
        check_lease()
        spark.sql(f"DELETE FROM {name} WHERE {condition}")
    return ProcedureOutcome(
        details=f"deleted {doomed} rows with {rule.column} before {bound} ({rule.days} days)",
        output={"rows_deleted": doomed, "cutoff": cutoff.isoformat()},
    )


def rollback_to_snapshot(
    spark: SparkSession, catalog: str, ref: TableRef, snapshot_id: int
) -> ProcedureOutcome:
    """Make ``snapshot_id`` the table's current snapshot again."""
    args = {"table": ref.procedure_argument(), "snapshot_id": str(int(snapshot_id))}
    out = _call(spark, catalog, "rollback_to_snapshot", args).rows[0].asDict()
    return ProcedureOutcome(
        details=f"rolled back from snapshot {out['previous_snapshot_id']} "
        f"to {out['current_snapshot_id']}",
        output=out,
    )


def expirable_snapshots(table: Table, settings: ExpireSnapshotsSettings, now: datetime) -> int:
    """How many snapshots an expiry at ``now`` would remove, from metadata alone (a plan)."""
    cutoff_ms = int((now - settings.retention_threshold).timestamp() * 1000)
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    current = table.current_snapshot()
    ancestors: list[int] = []
    snapshot = current
    while snapshot is not None and len(ancestors) < settings.retain_last:
        ancestors.append(snapshot.snapshot_id)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    protected.update(ancestors)
    return sum(
        1
        for s in table.metadata.snapshots
        if s.timestamp_ms < cutoff_ms and s.snapshot_id not in protected
    )


def describe_error(exc: BaseException) -> str:
    """One readable line for an error, Java root cause included, no stack trace."""

    def first_line(text: str) -> str:
        return next((line.strip() for line in text.splitlines() if line.strip()), "")

    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            top = first_line(str(java.toString()))
            root = java
            while root.getCause() is not None:
                root = root.getCause()
            bottom = first_line(str(root.toString()))
            text = top if bottom == top else f"{top}; caused by {bottom}"
        except Exception:  # the gateway may be gone; fall back to Python's text
            text = first_line(str(exc))
    else:
        text = first_line(str(exc)) or type(exc).__name__
        if not isinstance(exc, OperationError) and type(exc).__name__ not in text:
            text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= 1000 else text[:997] + "..."
