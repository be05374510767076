"""The maintenance pass: runs operations table by table, isolating every failure.

:class:`Maintainer` is the one implementation the CLI and the Dagster assets
share. Metadata reads (discovery, stats, planning) use pyiceberg; the work
itself runs on Spark, which is started only when an operation needs it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from icegate_dagster.catalog import open_catalog, scrub
from icegate_dagster.config import IcegateConfig, TableSettings, format_duration
from icegate_dagster.errors import (
    IcegateError,
    InvalidIdentifierError,
    OperationError,
    SparkStartError,
    TableNotFoundError,
)
from icegate_dagster.maintenance import operations as ops
from icegate_dagster.maintenance.discovery import (
    discover_tables,
    overlapping_tables,
    table_locations,
    wal_root_conflict,
)
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.locks import (
    Lease,
    LockHolder,
    TableLocks,
    commit_guard,
    holder_description,
)
from icegate_dagster.maintenance.log import (
    append_log_rows,
    append_log_rows_without_spark,
    ensure_log_table,
    log_row,
)
from icegate_dagster.maintenance.orphans import orphan_candidates
from icegate_dagster.maintenance.results import (
    OPERATIONS,
    OpResult,
    Status,
    TableResult,
    TableStats,
)
from icegate_dagster.maintenance.stats import table_stats
from icegate_dagster.maintenance.wal import compaction_due, wal_stats
from icegate_dagster.maintenance.wal_compaction import FaultHook, compact_wal, settle_committed

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

SparkProvider = Callable[[], "SparkSession"]


#: Tables whose log rows a pass writes together (a crash loses at most these rows).
LOG_BATCH_TABLES = 25
#: The log table keeps this many snapshots; it is expired once it has twice as many.
LOG_TABLE_SNAPSHOTS = 20
#: Small log files compacted together, and manifests above which they are rewritten.
LOG_TABLE_SMALL_FILES = 20
LOG_TABLE_MAX_MANIFESTS = 20


def log_table_settings(defaults: TableSettings) -> TableSettings:
    """The log table's own upkeep: nobody time-travels it, so it keeps its last
    ``LOG_TABLE_SNAPSHOTS`` snapshots whatever their age, and compacts its one-file
    appends in groups of ``LOG_TABLE_SMALL_FILES`` (``maintain.tables.<log table>``
    overrides all of this)."""
    return dataclasses.replace(
        defaults,
        optimize=defaults.optimize.model_copy(update={"min_input_files": LOG_TABLE_SMALL_FILES}),
        expire_snapshots=defaults.expire_snapshots.model_copy(
            update={"retention_threshold": timedelta(seconds=1), "retain_last": LOG_TABLE_SNAPSHOTS}
        ),
        retention=None,
    )


def unreadable_result(table: str, operation: str, error: str) -> OpResult:
    """The outcome of an operation on a table whose metadata could not be read."""
    return OpResult(table, operation, "failed", error, None, None, 0.0, error=error)


#: Operations that delete files and that Iceberg refuses on a table with ``gc.enabled=false``.
GC_OPERATIONS = ("expire_snapshots", "remove_orphan_files")


def gc_disabled(table: Table) -> str | None:
    """Why GC operations are planned away on ``table``, or ``None`` when GC is on.

    Iceberg reads ``gc.enabled`` as Java's ``Boolean.parseBoolean``: any value other than
    ``true`` (any case) turns GC off, and then ``expire_snapshots`` and
    ``remove_orphan_files`` throw ``ValidationException: ... GC is disabled``.
    """
    value = table.properties.get("gc.enabled")
    if value is None or value.lower() == "true":
        return None
    return (
        f"gc.enabled={value} on this table: its files may be shared (Nessie sets this; so do "
        "tables that share files), so snapshots are not expired and orphans not removed here. "
        "Run the catalog owner's own GC instead (for Nessie: Nessie GC's mark-and-sweep, "
        "see README 'Tables with GC turned off'); compaction still runs"
    )


def new_run_id() -> str:
    """A run id for CLI runs (Dagster runs use Dagster's own)."""
    return f"cli-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


class Maintainer:
    """Maintains tables of one catalog under one configuration.

    ``spark`` is a callable returning the session, so that nothing starts a JVM
    until an operation actually needs one.
    """

    def __init__(
        self,
        config: IcegateConfig,
        *,
        catalog: Catalog | None = None,
        spark: SparkProvider | None = None,
        run_id: str | None = None,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.config = config
        #: Test-only: called at each WAL compaction checkpoint (see ``wal_compaction``).
        self.fault_hook = fault_hook
        self._catalog = catalog
        self._spark_provider = spark
        self._spark: SparkSession | None = None
        self.run_id = run_id or new_run_id()
        self._locks: TableLocks | None = None
        self._locks_checked = False
        self._locations: dict[str, str] | None = None
        self._unreadable_locations: dict[str, str] = {}
        self._stats_cache: dict[tuple[str, str], TableStats] = {}
        self._init_lock = threading.Lock()
        self._log_ready = False
        #: The log table's own upkeep in the last :meth:`maintain` (see maintain_log_table).
        self.log_upkeep: list[OpResult] = []

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog, opened on first use."""
        if self._catalog is None:
            self._catalog = open_catalog(self.config.catalog)
        return self._catalog

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use."""
        if self._spark is None:
            if self._spark_provider is None:
                from icegate_dagster.spark_session import get_spark

                self._spark = get_spark(self.config)
            else:
                self._spark = self._spark_provider()
        return self._spark

    @property
    def log_table(self) -> TableRef:
        """Where operation outcomes are appended."""
        return TableRef.parse(self.config.log_table)

    # -- metadata (no JVM) -------------------------------------------------

    def discover(self) -> list[TableRef]:
        """Tables of the configured namespaces, ``_``-prefixed ones and the log table left out.

        (Catalogs such as SeaweedFS and S3 Tables refuse ``_`` names, so the log table may
        be an ordinary name in a maintained namespace.)
        """
        log_table = self.log_table.key
        tables = discover_tables(self.catalog, self.config.namespaces)
        return [ref for ref in tables if ref.key != log_table]

    def resolve(self, name: str) -> TableRef:
        """Parse a user-given ``namespace.table`` and check that the table exists."""
        ref = TableRef.parse(name)
        if not self.catalog.table_exists(ref.identifier):
            parts = tuple(name.split("."))
            if len(parts) > 2 and self.catalog.table_exists(parts):
                raise InvalidIdentifierError(
                    f"table {name!r} is in the nested namespace {'.'.join(parts[:-1])!r}; "
                    "only one-level namespaces are maintained"
                )
            raise TableNotFoundError(
                f"table {ref.key!r} does not exist in catalog {self.config.catalog.name!r}"
            )
        return ref

    def load(self, ref: TableRef) -> Table:
        """Load a table's current metadata; a clear error when it is gone."""
        from pyiceberg.exceptions import NoSuchTableError

        try:
            return self.catalog.load_table(ref.identifier)
        except NoSuchTableError:
            raise TableNotFoundError(
                f"table {ref.key!r} does not exist in catalog {self.config.catalog.name!r}"
            ) from None
        except IcegateError:
            raise
        except Exception as exc:  # corrupt or unreachable metadata: name the table
            detail = scrub(ops.describe_error(exc), self.config)
            raise OperationError(f"table {ref.key!r}: cannot read its metadata: {detail}") from None

    def operations_for(self, ref: TableRef) -> tuple[str, ...]:
        """The full pass for ``ref``: ``wal_compaction`` only where ``wal.root`` is set,
        ``retention`` only where a TTL rule is configured."""
        left_out = set()
        if self.config.wal_root is None:
            left_out.add("wal_compaction")
        if self.settings(ref).retention is None:
            left_out.add("retention")
        return tuple(op for op in OPERATIONS if op not in left_out)

    def settings(self, ref: TableRef) -> TableSettings:
        """The table's effective settings (the log table's own unless configured)."""
        if ref.key == self.config.log_table and ref.key not in self.config.table_overrides:
            return log_table_settings(self.config.defaults)
        return self.config.for_table(ref.key)

    def maintain_log_table(self) -> list[OpResult]:
        """Keep the log table from rotting: every pass appends to it, so its small files,
        snapshots and manifests are compacted, expired and rewritten once they pass
        bounds (planned from metadata: most passes start no Spark job for it). Its
        outcomes are returned, not logged into itself."""
        ref = self.log_table
        try:
            table = self.load(ref)
        except TableNotFoundError:
            return []
        stats = self.stats(ref, table)
        due = []
        if stats.compactable_files:
            due.append("optimize")
        if stats.manifests > LOG_TABLE_MAX_MANIFESTS:
            due.append("rewrite_manifests")
        if stats.snapshots > 2 * LOG_TABLE_SNAPSHOTS:
            due.append("expire_snapshots")
        due.append("remove_orphan_files")  # planned from one listing: usually skipped
        return [self.run_op(ref, operation) for operation in due]

    def stats(self, ref: TableRef, table: Table | None = None) -> TableStats:
        """Files, bytes, small files, snapshots, rows and manifests of a table."""
        table = table if table is not None else self.load(ref)
        # One metadata file, one answer: stats are read once per table version.
        key = (ref.key, table.metadata_location)
        cached = self._stats_cache.get(key)
        if cached is None:
            optimize = self.settings(ref).optimize
            cached = table_stats(table, optimize.file_size_threshold, optimize.min_input_files)
            if len(self._stats_cache) > 512:
                self._stats_cache.clear()
            self._stats_cache[key] = cached
        return cached

    # -- operations ----------------------------------------------------------

    def run_op(
        self, ref: TableRef, operation: str, *, dry_run: bool = False, force: bool = False
    ) -> OpResult:
        """Run one operation on one table; any failure becomes a ``failed`` result.

        ``force`` makes ``wal_compaction`` ingest a WAL below its thresholds.
        """
        if operation not in OPERATIONS:
            raise IcegateError(
                f"operation {operation!r} is unknown (known: {', '.join(OPERATIONS)})"
            )
        return self._execute(
            ref,
            operation,
            lambda table, before: self._dispatch(ref, operation, table, before, dry_run, force),
            locked=not dry_run,
        )

    def _execute(
        self,
        ref: TableRef,
        operation: str,
        action: Callable[[Table, TableStats], tuple[Status, str, dict[str, object]]],
        *,
        locked: bool = True,
    ) -> OpResult:
        """Take the table's lock, load it, run ``action``, and wrap the outcome with stats
        before and after. When another maintainer holds the table past ``lock_wait``, the
        operation is ``skipped`` and says who holds it."""
        started = time.monotonic()
        before: TableStats | None = None
        after: TableStats | None = None
        output: dict[str, object] = {}
        error: str | None = None
        status: Status
        try:
            with self._table_lock(ref, locked) as held:
                table = self.load(ref)
                before = self.stats(ref, table)
                if isinstance(held, LockHolder):
                    status, details = self._held_elsewhere(ref, held)
                    if status == "failed":
                        error = details
                else:
                    with commit_guard(self._guard(ref, held)):
                        status, details, output = action(table, before)
        except Exception as exc:  # rule: a failing op never stops the others
            error = scrub(ops.describe_error(exc), self.config)
            status, details = "failed", error
        try:
            after = self.stats(ref) if before is not None else None
        except Exception:
            after = None
        return OpResult(
            table=ref.key,
            operation=operation,
            status=status,
            details=details,
            before=before,
            after=after,
            duration_s=time.monotonic() - started,
            output=output,
            error=error,
        )

    def _refuse_shared_location(self, ref: TableRef, table: Table) -> None:
        """Orphan removal lists a table's folder: another table's files there would look
        orphaned to it, so tables whose locations overlap are refused."""
        with self._init_lock:
            if self._locations is None:
                unreadable: dict[str, str] = {}
                self._locations = table_locations(self.catalog, unreadable)
                self._unreadable_locations = unreadable
        # Fail closed: a table whose location is unknown may lie inside this one's folder.
        unknown = {k: v for k, v in self._unreadable_locations.items() if k != ref.key}
        if unknown:
            named = "; ".join(f"{k} ({scrub(v, self.config)})" for k, v in unknown.items())
            raise OperationError(
                f"refusing remove_orphan_files on {ref.key}: the location of "
                f"{len(unknown)} table(s) of the catalog cannot be read, so their files may lie "
                f"in {table.location()} and look orphaned: {named}; repair or drop "
                f"{'it' if len(unknown) == 1 else 'them'} first"
            )
        shared = overlapping_tables(ref.key, table.location(), self._locations)
        if shared:
            raise OperationError(
                f"refusing remove_orphan_files on {ref.key}: its location {table.location()} "
                f"overlaps the location of {', '.join(shared)}, whose live files would look "
                "orphaned; give each table its own folder"
            )

    @property
    def locks(self) -> TableLocks | None:
        """The deployment-wide lease store: ``maintain.locks.uri``, else the catalog's own
        SQL database, else a SQLite file beside the configuration."""
        with self._init_lock:  # tables maintained in parallel share one lease store
            if not self._locks_checked:
                settings = self.config.locks
                self._locks = TableLocks.for_catalog(
                    self.catalog,
                    uri=settings.uri,
                    fallback_uri=self.config.locks_fallback_uri,
                    lease=settings.lease,
                    stuck_after=settings.stuck_after,
                )
                self._locks_checked = True
        return self._locks

    @contextlib.contextmanager
    def _table_lock(self, ref: TableRef, locked: bool) -> Iterator[Lease | LockHolder | None]:
        if not locked or self.locks is None:
            yield None
            return
        holder = holder_description(self.run_id)
        with self.locks.hold(ref.key, holder, self.config.lock_wait) as held:
            yield held

    def _held_elsewhere(self, ref: TableRef, other: LockHolder) -> tuple[Status, str]:
        """A table another maintainer holds is skipped; one held past ``stuck_after`` fails,
        naming the holder, so a stuck holder cannot make a table skip silently forever."""
        stuck_after = self.config.locks.stuck_after
        if other.held_for >= stuck_after:
            return (
                "failed",
                f"{ref.key} has been held by {other.describe()} for "
                f"{format_duration(other.held_for)} (over maintain.locks.stuck_after "
                f"{format_duration(stuck_after)}): is that maintainer stuck? Stop it, or delete "
                f"its row from the lease table icegate_table_leases",
            )
        return (
            "skipped",
            f"{ref.key} is being maintained by {other.describe()}; "
            f"waited {self.config.lock_wait.total_seconds():g}s, left it alone",
        )

    def _guard(self, ref: TableRef, lease: Lease | None) -> Callable[[], None]:
        """What runs right before each commit and delete of an operation: the test-only
        fault hook, then the lease check in the database. While the lease is held, losing
        it cancels the Spark jobs this thread started, so nothing commits after."""

        def guard() -> None:
            if self.fault_hook is not None:
                self.fault_hook("before_commit")
            if lease is None:
                return
            lease.verify()
            spark = self._spark
            if spark is not None:
                context = spark.sparkContext
                context.setJobGroup(lease.token, f"icegate {ref.key}", True)
                lease.on_lost(lambda: context.cancelJobGroup(lease.token))

        return guard

    def _dispatch(
        self,
        ref: TableRef,
        operation: str,
        table: Table,
        before: TableStats,
        dry_run: bool,
        force: bool = False,
    ) -> tuple[Status, str, dict[str, object]]:
        settings = self.settings(ref)
        now = datetime.now(UTC)
        if operation in ("wal_compaction", "remove_orphan_files"):
            # Paths cannot cross: orphan removal would delete waiting WAL files, or WAL
            # work would list the table's own files.
            conflict = wal_root_conflict(ref.key, table.location(), self.config.wal_root)
            if conflict is not None:
                raise OperationError(f"refusing {operation} on {ref.key}: {conflict}")
        if operation in GC_OPERATIONS:
            gc_off = gc_disabled(table)
            if gc_off is not None:
                return "skipped", gc_off, {}
        if operation == "wal_compaction":  # an empty table still takes its WAL
            if dry_run:
                return "skipped", self._plan_wal(ref, settings), {}
            wal = compact_wal(
                lambda: self.spark,
                self.config.catalog.name,
                ref,
                table,
                self.config.wal_root,
                settings.compaction,
                force=force,
                fault_hook=self.fault_hook,
            )
            return wal.status, wal.details, wal.output
        if table.current_snapshot() is None:
            return "skipped", "table has no snapshot yet: nothing to maintain", {}
        catalog = self.config.catalog.name
        if dry_run and operation != "remove_orphan_files":
            return "skipped", self._plan(operation, table, settings, before, now), {}
        # Planned from metadata: an operation with nothing to do starts no Spark job.
        if operation == "optimize":
            if before.compactable_files == 0 and before.delete_files == 0:
                return "skipped", "nothing to compact: " + self._plan_optimize(settings, before), {}
            outcome = ops.optimize(self.spark, catalog, ref, settings.optimize, table)
        elif operation == "rewrite_manifests":
            if before.manifests <= 1:
                return "skipped", f"nothing to rewrite: {before.manifests} manifest", {}
            outcome = ops.rewrite_manifests(self.spark, catalog, ref)
        elif operation == "expire_snapshots":
            # Expiry may drop a WAL commit's record: first settle any WAL files it still covers.
            settled = settle_committed(table, self.config.wal_root, ref)
            rule = settings.expire_snapshots
            if ops.expirable_snapshots(table, rule, now) == 0:
                age = format_duration(rule.retention_threshold)
                return (
                    "skipped",
                    f"nothing to expire: no snapshot older than {age} beyond the last "
                    f"{rule.retain_last} and the branch and tag heads",
                    {"wal_files_settled": settled},
                )
            outcome = ops.expire_snapshots(self.spark, catalog, ref, settings.expire_snapshots, now)
            if settled:
                outcome.details += f"; first deleted {settled} WAL files already committed"
        elif operation == "remove_orphan_files":
            self._refuse_shared_location(ref, table)
            older_than = now - settings.remove_orphan_files.retention_threshold
            if orphan_candidates(table, older_than) == []:
                return (
                    "skipped",
                    f"no unreferenced file older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
                    "in the table's folder",
                    {"orphan_files": [], "orphans_removed": 0},
                )
            outcome = ops.remove_orphan_files(
                self.spark, catalog, ref, settings.remove_orphan_files, now, dry_run=dry_run
            )
        elif operation == "retention":
            if settings.retention is None:
                return "skipped", "no retention rule for this table", {}
            outcome = ops.retention(self.spark, catalog, ref, settings.retention, now, table)
        else:  # run_op validated the name; a new operation must be wired in here
            raise IcegateError(f"operation {operation!r} has no implementation")
        return "completed", outcome.details, outcome.output

    def _plan_wal(self, ref: TableRef, settings: TableSettings) -> str:
        wal = wal_stats(self.config.wal_root, ref)
        rule = settings.compaction
        due = compaction_due(wal.files, wal.bytes, rule)
        return (
            f"dry run: {wal.files} WAL files ({wal.bytes} bytes) waiting; "
            + ("they would be ingested" if due else "below thresholds, nothing would be ingested")
            + f" (runs at {rule.min_files} files or {rule.min_size_bytes} bytes)"
        )

    @staticmethod
    def _plan_optimize(settings: TableSettings, before: TableStats) -> str:
        return (
            f"{before.compactable_files} small files would be rewritten "
            f"({before.small_files} of {before.data_files} data files are under "
            f"{settings.optimize.file_size_threshold} bytes; a partition needs "
            f"{settings.optimize.min_input_files} of them)"
        )

    @staticmethod
    def _plan(
        operation: str, table: Table, settings: TableSettings, before: TableStats, now: datetime
    ) -> str:
        if operation == "optimize":
            return "dry run: " + Maintainer._plan_optimize(settings, before)
        if operation == "expire_snapshots":
            count = ops.expirable_snapshots(table, settings.expire_snapshots, now)
            return f"dry run: {count} of {before.snapshots} snapshots would expire"
        if operation == "retention":
            rule = settings.retention
            if rule is None:
                return "dry run: no retention rule for this table"
            return f"dry run: rows with {rule.column} older than {rule.days} days would be deleted"
        return f"dry run: {before.manifests} manifests would be rewritten by partition"

    def maintain_table(
        self,
        ref: TableRef,
        operations: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        write_log: bool = True,
        force: bool = False,
    ) -> TableResult:
        """Run ``operations`` (default: the table's full pass) in order, then log every outcome."""
        started = time.monotonic()
        if operations is None:
            operations = self.operations_for(ref)
        try:
            before: TableStats | None = self.stats(ref)
        except Exception as exc:
            # Rule 1: every outcome reaches the log, a table that cannot be read included.
            message = scrub(ops.describe_error(exc), self.config)
            failed = [unreadable_result(ref.key, name, message) for name in operations]
            result = TableResult(
                ref.key, None, None, failed, time.monotonic() - started, error=message
            )
            if write_log and not dry_run:
                self.write_log(failed, result)
            return result
        results = [self.run_op(ref, name, dry_run=dry_run, force=force) for name in operations]
        table_result = TableResult.from_ops(ref.key, before, results, time.monotonic() - started)
        if write_log and not dry_run:
            self.write_log(results, table_result)
        return table_result

    def maintain(
        self,
        refs: Iterable[TableRef],
        operations: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        on_table: Callable[[TableResult], None] | None = None,
        parallel: int | None = None,
    ) -> list[TableResult]:
        """Maintain the tables, ``parallel`` at a time (default ``maintain.parallel_tables``)
        in one Spark session; a failing table never stops the others. Results keep the
        order of ``refs``; ``on_table`` is called as each table finishes."""
        from concurrent.futures import ThreadPoolExecutor, as_completed

        refs = list(refs)
        workers = max(1, min(parallel or self.config.parallel_tables, len(refs)))
        done: dict[int, TableResult] = {}
        # Log rows go out in one Spark append per LOG_BATCH_TABLES tables, not one per table.
        unlogged: list[TableResult] = []

        def finished(index: int, result: TableResult) -> None:
            done[index] = result
            if not dry_run:
                unlogged.append(result)
                if len(unlogged) >= LOG_BATCH_TABLES:
                    self.write_logs(unlogged)
            if on_table is not None:
                on_table(result)

        try:
            if workers == 1:
                for i, ref in enumerate(refs):
                    finished(
                        i, self.maintain_table(ref, operations, dry_run=dry_run, write_log=False)
                    )
            else:
                with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="maintain") as pool:
                    futures = {
                        pool.submit(
                            self.maintain_table, ref, operations, dry_run=dry_run, write_log=False
                        ): i
                        for i, ref in enumerate(refs)
                    }
                    for future in as_completed(futures):
                        finished(futures[future], future.result())
        finally:
            self.write_logs(unlogged)
        if not dry_run and refs:
            self.log_upkeep = self.maintain_log_table()
        return [done[i] for i in range(len(refs))]

    def write_logs(self, results: list[TableResult]) -> None:
        """Append the log rows of all ``results`` in one write, then empty the list; a log
        failure is recorded on each result."""
        rows = [op for result in results for op in result.ops]
        if rows:
            try:
                self.write_log(rows)
            except IcegateError as exc:
                for result in results:
                    result.error = result.error or str(exc)
        results.clear()

    def rollback(self, ref: TableRef, snapshot_id: int) -> TableResult:
        """Roll ``ref`` back to one of its snapshots (``rollback_to_snapshot``), logged."""
        known = [s.snapshot_id for s in self.load(ref).metadata.snapshots]
        if snapshot_id not in known:
            raise OperationError(
                f"snapshot {snapshot_id} is not in the history of {ref.key} "
                f"(its snapshots: {', '.join(map(str, known[-10:])) or 'none'})"
            )

        def roll_back(table: Table, before: TableStats) -> tuple[Status, str, dict[str, object]]:
            catalog = self.config.catalog.name
            outcome = ops.rollback_to_snapshot(self.spark, catalog, ref, snapshot_id)
            return "completed", outcome.details, outcome.output

        result = self._execute(ref, "rollback", roll_back)
        table_result = TableResult.from_ops(ref.key, result.before, [result], result.duration_s)
        self.write_log([result], table_result)
        return table_result

    def write_log(self, results: list[OpResult], table_result: TableResult | None = None) -> None:
        """Append one log row per result; a log failure is recorded on the table result."""
        if not results:
            return
        try:
            with self._init_lock:
                if not self._log_ready:
                    ensure_log_table(self.catalog, self.log_table)
                    self._log_ready = True
            rows = [log_row(r, self.run_id) for r in results]
            try:
                spark = self.spark
            except SparkStartError:
                # Spark cannot run with this configuration (the ops said why): the outcomes
                # still reach the log, appended by pyiceberg in one commit.
                append_log_rows_without_spark(self.catalog, self.log_table, rows)
                return
            append_log_rows(spark, self.config.catalog.name, self.log_table, rows)
        except Exception as exc:
            message = scrub(ops.describe_error(exc), self.config)
            if table_result is None:
                raise IcegateError(f"cannot write the maintenance log: {message}") from None
            table_result.error = f"maintenance log not written: {message}"
