"""The maintenance pass: runs operations table by table, isolating every failure.

:class:`Maintainer` is the one implementation the CLI and the Dagster assets
share. It resolves tables, holds each one's lease, reads stats, runs the table's
operations (from the registry in :mod:`.ops`) and batches the log rows. Metadata reads
use pyiceberg; the work itself runs on Spark, which starts only when an operation needs it.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, TableSettings
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import IcegateError, TableNotFoundError, describe_error
from icegate_dagster.maintenance.discovery import (
    TableLocations,
    discover_tables,
    load_table,
    resolve_table,
)
from icegate_dagster.maintenance.exclusion import Exclusion, table_exclusion
from icegate_dagster.maintenance.health.stats import StatsCache
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.leases.holder import TableLeasing
from icegate_dagster.maintenance.log import upkeep
from icegate_dagster.maintenance.log.writer import LogWriter
from icegate_dagster.maintenance.ops import (
    OPERATIONS,
    FaultHook,
    OpContext,
    Operation,
    RollbackToSnapshot,
    SparkProvider,
    perform,
    skip_reason,
)
from icegate_dagster.maintenance.orphans.candidates import candidates_table
from icegate_dagster.maintenance.parallel import each_table
from icegate_dagster.maintenance.results import OpResult, Outcome, TableResult, TableStats
from icegate_dagster.maintenance.sharing import Sharing, table_sharing
from icegate_dagster.maintenance.trigger.records import (
    OperationAttempt,
    OperationMemory,
    PassRecord,
)
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for
from icegate_dagster.maintenance.wal.files import compaction_due, wal_stats

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

#: A pass writes its log rows once this many tables are waiting and this long has passed
#: since its last write (a crash loses at most those rows).
LOG_BATCH_TABLES = 25
LOG_BATCH_SECONDS = 10.0


def new_run_id() -> str:
    """A run id for CLI runs (Dagster runs use Dagster's own)."""
    return f"cli-{datetime.now(UTC):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"


def _start_spark(config: IcegateConfig, *, small_work: bool = False) -> SparkSession:
    from icegate_dagster.spark.session import get_spark

    return get_spark(config, small_work=small_work)


#: A pass over at most this many tables sums their bytes to rewrite before its JVM starts
#: (:meth:`Maintainer.rewrites_are_small`); a longer one amortizes the JIT's start anyway.
SMALL_PASS_TABLES = 50
#: Operations whose bytes to rewrite nothing here bounds (TTL deletes rewrite any file).
_UNBOUNDED_OPERATIONS = ("retention",)


@dataclass(frozen=True)
class PassOutlook:
    """What a pass will ask of Spark, read from metadata before its JVM starts
    (:meth:`Maintainer.outlook`)."""

    #: The most its rewrites can write (data files and WAL files), or None: not bounded.
    rewrite_bytes: int | None
    #: Some table certainly has Spark work: files to compact, a WAL due.
    needs_spark: bool

    def rewrites_at_most(self, limit: int) -> bool:
        """Whether its rewrites are bounded, by ``limit`` bytes or less."""
        return self.rewrite_bytes is not None and self.rewrite_bytes <= limit


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
        #: Test-only: called at each commit point and WAL checkpoint.
        self.fault_hook = fault_hook
        self._catalog = catalog
        #: Set by :meth:`maintain` before Spark starts: this pass's rewrites are small
        #: (read only where this maintainer starts Spark itself: not with ``spark`` given).
        self.small_work = False
        self._starts_spark = spark is None
        self._spark_provider = spark or (lambda: _start_spark(config, small_work=self.small_work))
        self._spark: SparkSession | None = None
        self._spark_lock = threading.Lock()
        self.run_id = run_id or new_run_id()
        self._stats = StatsCache()
        #: Live rows counted by Spark, per (table, snapshot id): see :meth:`count_live_rows`.
        self._live_rows: dict[tuple[str, int], int] = {}
        self._live_lock = threading.Lock()
        self._locations = TableLocations(lambda: self.catalog, self._scrub, self._known_locations)
        self.leasing = TableLeasing(
            config,
            lambda: self.catalog,
            self.run_id,
            started_spark=lambda: self._spark,
            fault_hook=lambda point: self.fault_hook(point) if self.fault_hook else None,
        )
        self.log = LogWriter(lambda: self.catalog, config, self.run_id, lambda: self._spark)
        self._memory: TriggerMemory | None = None
        self._memory_lock = threading.Lock()
        #: The log table's own upkeep in the last :meth:`maintain` (see :mod:`.log.upkeep`).
        self.log_upkeep: list[OpResult] = []

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog, opened on first use."""
        if self._catalog is None:
            self._catalog = open_catalog(self.config.catalog)
        return self._catalog

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use (once: a caller waits for a start
        under way)."""
        with self._spark_lock:
            if self._spark is None:
                self._spark = self._spark_provider()
        return self._spark

    @property
    def spark_started(self) -> bool:
        """Whether this maintainer has asked for its Spark session (started a JVM)."""
        return self._spark is not None

    @property
    def log_table(self) -> TableRef:
        """Where operation outcomes are appended."""
        return TableRef.parse(self.config.log_table)

    def own_tables(self) -> tuple[str, ...]:
        """The project's own tables, never maintained as a lakehouse table: the log table and
        the orphan-candidates table."""
        return (self.log_table.key, candidates_table(self.config).key)

    def discover(self) -> list[TableRef]:
        """Tables of the configured namespaces; ``_``-prefixed ones and :meth:`own_tables`
        left out."""
        return discover_tables(self.catalog, self.config.namespaces, self.own_tables())

    @property
    def memory(self) -> TriggerMemory | None:
        """The trigger's memory, in the lease store's database (None without a store)."""
        with self._memory_lock:
            if self._memory is None:
                locks = self.leasing.locks
                if locks is not None:
                    self._memory = memory_for(locks.engine)
            return self._memory

    def _known_locations(self) -> dict[str, str]:
        """Locations by metadata file from the trigger's looks (none without a store): a pass
        need not load every table of the catalog to know where each one lives."""
        try:
            memory = self.memory
            return memory.known_locations() if memory is not None else {}
        except Exception:  # the tables are loaded instead
            return {}

    def remember(self, *records: PassRecord) -> list[OperationMemory] | str:
        """Keep tables' passes in the trigger's memory (their outcomes, per operation), in
        one transaction; the operations' new memory, or why it could not be kept (the pass
        itself stands: the log has every outcome)."""
        try:
            memory = self.memory
            if memory is None:
                return "no lease store: the trigger's memory is not kept"
            trigger = self.config.trigger
            kept = memory.record_passes(
                records, backoff=trigger.backoff, backoff_max=trigger.backoff_max
            )
            return [m for ops in kept.values() for m in ops]
        except Exception as exc:
            return f"the trigger's memory could not be updated: {describe_error(exc, self._scrub)}"

    def resolve(self, name: str) -> TableRef:
        """Parse a user-given ``namespace.table`` and check that the table exists."""
        return resolve_table(self.catalog, name, self.config.catalog.name)

    def load(self, ref: TableRef) -> Table:
        """Load a table's current metadata; a clear error when it is gone or unreadable."""
        return load_table(self.catalog, ref, self.config.catalog.name, self._scrub)

    def settings(self, ref: TableRef) -> TableSettings:
        """The table's effective settings (the log table's own unless configured)."""
        if ref.key == self.config.log_table and ref.key not in self.config.table_overrides:
            return upkeep.log_table_settings(self.config.defaults, self.config.history.log)
        return self.config.for_table(ref.key)

    def exclusion(self, ref: TableRef, table: Table) -> Exclusion:
        """What ``ref`` is excluded from (its settings and ``table``'s properties); raises
        naming a bad ``icegate.maintenance.enabled`` value."""
        return table_exclusion(self.settings(ref), ref.key, table.properties)

    def sharing(self, ref: TableRef, table: Table) -> Sharing:
        """The tables whose location overlaps ``ref``'s, and whether that is unsafe
        (every table's location listed once per maintainer)."""
        return table_sharing(self._locations, ref.key, table)

    def operations_for(self, ref: TableRef) -> tuple[str, ...]:
        """The full pass for ``ref``: the registered operations that apply to it
        (``wal_compaction`` where ``wal.root`` is set, ``retention`` where a TTL rule is)."""
        settings = self.settings(ref)
        return tuple(op.name for op in OPERATIONS if op.applies(self.config, settings))

    def stats(self, ref: TableRef, table: Table | None = None) -> TableStats:
        """Files, bytes, small files, snapshots, rows and manifests of a table."""
        table = table if table is not None else self.load(ref)
        rule = self.settings(ref).optimize
        return self._stats.get(
            ref.key,
            table,
            rule.file_size_threshold,
            rule.min_input_files,
            delete_file_threshold=rule.delete_file_threshold,
            delete_ratio_threshold=rule.delete_ratio_threshold,
        )

    def count_live_rows(self, ref: TableRef, stats: TableStats) -> TableStats:
        """``stats`` with the rows a reader sees, counted by Spark at ``stats.snapshot_id``
        (``count(*) ... VERSION AS OF``, deletes applied) where metadata cannot tell:
        only a table with delete files needs it. Counted once per snapshot."""
        if stats.live_rows is not None or stats.snapshot_id is None:
            return stats
        key = (ref.key, stats.snapshot_id)
        with self._live_lock:
            counted = self._live_rows.get(key)
        if counted is None:
            name = ref.spark_identifier(self.config.catalog.name)
            sql = f"SELECT count(*) FROM {name} VERSION AS OF {int(stats.snapshot_id)}"
            counted = int(self.spark.sql(sql).collect()[0][0])
            with self._live_lock:
                self._live_rows[key] = counted
        return stats.with_live_rows(counted)

    def _live_rows_around(
        self, ref: TableRef, before: TableStats, after: TableStats, outcome: Outcome
    ) -> tuple[TableStats, TableStats]:
        """Live rows before and after an operation that ran, for ``rows_preserved``:
        counted only where a table has delete files, and only when the operation committed
        (an unchanged table needs no count: no scan, no JVM). The snapshot before is
        counted now, while no expiry can have removed it yet."""
        changed = before.snapshot_id != after.snapshot_id
        unknown = before.live_rows is None or after.live_rows is None
        if not unknown or not changed:  # no commit: rows_preserved needs no count
            return before, after
        try:
            before = self.count_live_rows(ref, before)
            after = self.count_live_rows(ref, after)
        except Exception as exc:  # the op's own outcome stands; rows_preserved says why
            outcome.output["live_rows_error"] = describe_error(exc, self._scrub)
        return before, after

    def run_op(
        self,
        ref: TableRef,
        operation: str | Operation,
        *,
        dry_run: bool = False,
        force: bool = False,
        table: Table | None = None,
    ) -> OpResult:
        """Run one operation on one table; any failure becomes a ``failed`` result.

        Planned first from metadata (``table``, when the caller has just read it): with
        nothing to do, it is skipped without a lease, a reload or a JVM. Otherwise the table
        is held (its lease) unless ``dry_run``, reloaded and planned again; when another
        maintainer holds it past ``lock_wait``, the operation is ``skipped`` and says who.
        ``force`` makes ``wal_compaction`` ingest a WAL below its thresholds.
        """
        op = operation if isinstance(operation, Operation) else OPERATIONS.get(operation)
        started = time.monotonic()
        before: TableStats | None = None
        after: TableStats | None = None
        ran = False
        try:
            table = table if table is not None else self.load(ref)
            before = self.stats(ref, table)
            context = self._context(ref, table, before, dry_run=dry_run, force=force)
            skipped = skip_reason(op, context)
            if skipped is not None:
                outcome, after = skipped, before
            else:
                ran = True
                leased = op.holds_lease and not dry_run
                with self.leasing.hold(ref.key, leased=leased) as held:
                    table = self.load(ref)  # as it is now that the table is ours
                    before = self.stats(ref, table)
                    context = self._context(ref, table, before, dry_run=dry_run, force=force)
                    outcome = held.elsewhere or perform(op, context)
        except Exception as exc:  # a failing op never stops the others
            outcome = Outcome("failed", describe_error(exc, self._scrub))
        try:
            after = after or (self.stats(ref) if before is not None else None)
        except Exception:
            after = None
        if before is not None and after is not None and ran and not dry_run:
            before, after = self._live_rows_around(ref, before, after, outcome)
        # Outcomes name paths and URIs (wal.root, locations) that may hold a secret.
        outcome.details = self._scrub(outcome.details)
        return OpResult.of(ref.key, op.name, outcome, (before, after), time.monotonic() - started)

    def _scrub(self, text: str) -> str:
        return scrub(text, self.config)

    def _context(
        self, ref: TableRef, table: Table, before: TableStats, *, dry_run: bool, force: bool
    ) -> OpContext:
        settings, now = self.settings(ref), datetime.now(UTC)
        return OpContext(
            ref,
            table,
            before,
            settings,
            self.config,
            now,
            lambda: self.spark,
            self._locations,
            dry_run=dry_run,
            force=force,
            fault_hook=self.fault_hook,
            run_id=self.run_id,
        )

    def maintain_table(
        self,
        ref: TableRef,
        operations: Sequence[str | Operation] | None = None,
        *,
        dry_run: bool = False,
        write_log: bool = True,
        force: bool = False,
    ) -> TableResult:
        """Run ``operations`` (names or operations; default: the table's full pass) in
        order, then log every outcome."""
        started = time.monotonic()
        if operations is None:
            operations = self.operations_for(ref)
        try:
            table: Table | None = self.load(ref)
            before = self.stats(ref, table)
        except Exception as exc:
            # Every outcome reaches the log, a table that cannot be read included.
            message = describe_error(exc, self._scrub)
            names = [op if isinstance(op, str) else op.name for op in operations]
            result = TableResult.failed(ref.key, message, names, time.monotonic() - started)
        else:
            results = []
            for operation in operations:
                op_result = self.run_op(ref, operation, dry_run=dry_run, force=force, table=table)
                results.append(op_result)
                # The metadata read once serves every plan until an operation changes it.
                table = table if op_result.status == "skipped" else None
            result = TableResult.from_ops(ref.key, before, results, time.monotonic() - started)
        if write_log and not dry_run:  # else the caller writes both, batched
            self.write_logs([result])
            self.remember(pass_record(result, self.run_id))
        return result

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
        refs = list(refs)
        done: dict[int, TableResult] = {}
        if not dry_run and self._starts_spark and self._spark is None:
            from icegate_dagster.spark.jvm_options import QUICK_JIT_MAX_BYTES

            outlook = self.outlook(refs, operations)
            self.small_work = outlook.rewrites_at_most(QUICK_JIT_MAX_BYTES)
            if outlook.needs_spark:  # the JVM starts beside the planning, not after it
                self.start_spark_in_background()

        def maintain_one(item: tuple[int, TableRef]) -> TableResult:
            return self.maintain_table(item[1], operations, dry_run=dry_run, write_log=False)

        workers = parallel or self.config.parallel_tables
        # Log rows go out in one append per batch of tables, not one per table.
        with self.log.batches(
            LOG_BATCH_TABLES,
            LOG_BATCH_SECONDS,
            enabled=not dry_run,
            # The trigger's memory of the same tables, in the same batches.
            also=lambda results: self.remember(*(pass_record(r, self.run_id) for r in results)),
        ) as unlogged:
            for (index, _), result in each_table(
                list(enumerate(refs)), maintain_one, workers, "maintain"
            ):
                done[index] = result
                unlogged.add(result)
                if on_table is not None:
                    on_table(result)
        if not dry_run and refs:
            self.log_upkeep = self.maintain_log_table()
        return [done[index] for index in range(len(refs))]

    def outlook(
        self,
        refs: Sequence[TableRef],
        operations: Sequence[str] | None = None,
        *,
        max_tables: int = SMALL_PASS_TABLES,
    ) -> PassOutlook:
        """What a pass over ``refs`` will ask of Spark, from metadata, before its JVM starts
        (the stats are cached for the pass): the bytes its rewrites can write at most (every
        byte of a table with files to compact or deletes to apply, where the pass compacts,
        and its waiting WAL files), and whether some table certainly has Spark work (files
        to compact, a WAL due). Not looked at beyond ``max_tables`` tables; bytes not
        bounded with TTL deletes to do or a table or WAL folder that cannot be read (the
        pass reports it)."""
        if len(refs) > max_tables:
            return PassOutlook(None, needs_spark=False)
        total: int | None = 0
        needs_spark = False
        for ref in refs:
            names = operations if operations is not None else self.operations_for(ref)
            if any(name in _UNBOUNDED_OPERATIONS for name in names):
                total = None
            try:
                table = self.load(ref)
                stats = self.stats(ref, table)
                ctx = self._context(ref, table, stats, dry_run=False, force=False)
                if "wal_compaction" in names and self.config.wal_root is not None:
                    # Its waiting files are written into the table.
                    wal = wal_stats(self.config.wal_root, ref)
                    total = None if total is None else total + wal.bytes
                    needs_spark = needs_spark or (
                        compaction_due(wal.files, wal.bytes, ctx.settings.compaction)
                        and skip_reason(OPERATIONS.get("wal_compaction"), ctx) is None
                    )
                if "optimize" in names:  # the one operation that rewrites data files
                    if stats.compactable_files or stats.delete_rewrite_files:
                        total = None if total is None else total + stats.data_bytes
                    optimize = OPERATIONS.get("optimize")
                    needs_spark = needs_spark or skip_reason(optimize, ctx) is None
            except Exception:
                total = None
        return PassOutlook(total, needs_spark)

    def rewrites_are_small(
        self,
        refs: Sequence[TableRef],
        operations: Sequence[str] | None = None,
        *,
        max_bytes: int | None = None,
        max_tables: int = SMALL_PASS_TABLES,
    ) -> bool:
        """Whether a pass over ``refs`` rewrites at most ``max_bytes`` (default
        ``spark.jvm_options.QUICK_JIT_MAX_BYTES``) of data files, as :meth:`outlook` bounds
        them: a Spark session it starts uses the quicker JIT
        (``spark.jvm_options.local_jit_options``)."""
        from icegate_dagster.spark.jvm_options import QUICK_JIT_MAX_BYTES

        limit = QUICK_JIT_MAX_BYTES if max_bytes is None else max_bytes
        return self.outlook(refs, operations, max_tables=max_tables).rewrites_at_most(limit)

    def start_spark_in_background(self) -> None:
        """Start the Spark session in a thread while the pass plans its tables from
        metadata; the first operation that needs it waits for it. A start that fails is
        left for that operation to report."""

        def start() -> None:
            with contextlib.suppress(Exception):
                _ = self.spark

        threading.Thread(target=start, name="icegate-spark-start", daemon=True).start()

    def run_each(
        self, names: Sequence[str] | None, operation: Operation, *, write_log: bool = True
    ) -> list[TableResult]:
        """``operation`` alone on each named table (every discovered table when none is
        named), one table at a time, logged unless ``write_log`` is false. A name that does
        not resolve fails alone, with a ``failed`` log row when it is a table name at all."""
        if not names:
            return [
                self.maintain_table(ref, [operation], write_log=write_log)
                for ref in self.discover()
            ]
        results = []
        for name in dict.fromkeys(names):
            try:
                ref = self.resolve(name)
            except IcegateError as exc:
                try:
                    key = TableRef.parse(name).key
                except IcegateError:  # not a table name at all: nothing to log
                    results.append(TableResult.failed(name, str(exc), [operation.name]))
                    continue
                failed = TableResult.failed(key, str(exc), [operation.name])
                if write_log:
                    self.write_logs([failed])
                results.append(failed)
                continue
            results.append(self.maintain_table(ref, [operation], write_log=write_log))
        return results

    def maintain_log_table(self) -> list[OpResult]:
        """Keep the log table from rotting (see :mod:`.log.upkeep`): run the operations it
        is due for; an absent log table needs nothing."""
        ref = self.log_table
        try:
            table = self.load(ref)
            stats = self.stats(ref, table)
        except TableNotFoundError:
            return []
        rule = self.settings(ref).retention
        try:
            history_due = upkeep.rows_past_history(table, rule, datetime.now(UTC)) is not None
        except Exception:  # unreadable bounds: the retention operation finds out itself
            history_due = rule is not None
        due = upkeep.due_operations(stats, history_due)
        return [self.run_op(ref, operation) for operation in due]

    def rollback(self, ref: TableRef, snapshot_id: int) -> TableResult:
        """Roll ``ref`` back to one of its snapshots (``rollback_to_snapshot``), logged."""
        rollback = RollbackToSnapshot(snapshot_id)
        rollback.require_in_history(ref.key, self.load(ref))
        result = self.run_op(ref, rollback)
        table_result = TableResult.from_ops(ref.key, result.before, [result], result.duration_s)
        self.write_logs([table_result])
        return table_result

    def write_logs(self, results: Sequence[TableResult]) -> None:
        """Append the log rows of all ``results`` in one write; a log failure is recorded
        on each result. ``results`` itself is left as it was."""
        self.log.write_tables(results)


def pass_record(
    result: TableResult,
    run_id: str,
    *,
    requested: Sequence[str] = (),
    still_due: dict[str, str] | None = None,
    settled_state: str | None = None,
    shown_state: str | None = None,
) -> PassRecord:
    """A table's pass as the trigger's memory keeps it (see ``memory.records``)."""
    return PassRecord(
        table=result.table,
        run_id=run_id,
        attempts=tuple(
            OperationAttempt(
                op.operation,
                op.status,
                held_elsewhere=bool(op.output.get("held_elsewhere")),
                error=op.error,
            )
            for op in result.ops
        ),
        requested=tuple(requested),
        still_due=still_due,
        settled_state=settled_state,
        shown_state=shown_state,
    )
