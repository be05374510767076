"""The maintenance pass: runs operations table by table, isolating every failure.

:class:`Maintainer` is the one implementation the CLI and the Dagster assets share. It
reads its tables as :class:`~.tables.CatalogTables` does, holds each one's lease, runs the
table's operations (from the registry in :mod:`.ops`), batches the log rows, keeps each
table's pass in the trigger's memory (:mod:`.pass_memory`) and the log table itself in
shape (:mod:`.log.upkeep`). Metadata reads use pyiceberg; the work itself runs on Spark,
which starts when an operation first needs it, or beside the planning when the pass's
outlook says some table has Spark work (:mod:`.outlook`, :mod:`.spark_start`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.leases.holder import TableLeasing
from icegate_dagster.maintenance.live_rows import LiveRows
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
from icegate_dagster.maintenance.outlook import SMALL_PASS_TABLES, PassOutlook, pass_outlook
from icegate_dagster.maintenance.parallel import each_table
from icegate_dagster.maintenance.pass_memory import PassMemory, pass_record
from icegate_dagster.maintenance.results import OpResult, Outcome, TableResult, TableStats
from icegate_dagster.maintenance.spark_start import PassSpark
from icegate_dagster.maintenance.tables import CatalogTables
from icegate_dagster.maintenance.trigger.records import OperationMemory, PassRecord
from icegate_dagster.maintenance.trigger.store import TriggerMemory
from icegate_dagster.spark.jvm_options import QUICK_JIT_MAX_BYTES

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


class Maintainer(CatalogTables):
    """Maintains tables of one catalog under one configuration (read as
    :class:`~.tables.CatalogTables` reads them).

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
        super().__init__(config, catalog, known_locations=lambda: self._memory.known_locations())
        #: Test-only: called at each commit point and WAL checkpoint.
        self.fault_hook = fault_hook
        self._spark = PassSpark(config, spark)
        self.run_id = run_id or new_run_id()
        self._live_rows = LiveRows(lambda: self.spark, config.catalog.name)
        self.leasing = TableLeasing(
            config,
            lambda: self.catalog,
            self.run_id,
            started_spark=lambda: self._spark.started,
            fault_hook=lambda point: self.fault_hook(point) if self.fault_hook else None,
        )
        self.log = LogWriter(lambda: self.catalog, config, self.run_id, lambda: self._spark.started)
        self._memory = PassMemory(config, lambda: self.leasing.locks, self._scrub)
        #: The log table's own upkeep in the last :meth:`maintain` (see :mod:`.log.upkeep`).
        self.log_upkeep: list[OpResult] = []

    @property
    def spark(self) -> SparkSession:
        """The Spark session, started on first use (see :class:`.spark_start.PassSpark`)."""
        return self._spark.session

    @property
    def spark_started(self) -> bool:
        """Whether this maintainer has asked for its Spark session (started a JVM)."""
        return self._spark.started is not None

    @property
    def memory(self) -> TriggerMemory | None:
        """The trigger's memory, in the lease store's database (None without a store)."""
        return self._memory.store

    def remember(self, *records: PassRecord) -> list[OperationMemory] | str:
        """Keep tables' passes in the trigger's memory, in one transaction (see
        :meth:`.pass_memory.PassMemory.remember`)."""
        return self._memory.remember(*records)

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
            context = self.op_context(ref, table, before, dry_run=dry_run, force=force)
            skipped = skip_reason(op, context)
            if skipped is not None:
                outcome, after = skipped, before
            else:
                ran = True
                leased = op.holds_lease and not dry_run
                with self.leasing.hold(ref.key, leased=leased) as held:
                    table = self.load(ref)  # as it is now that the table is ours
                    before = self.stats(ref, table)
                    context = self.op_context(ref, table, before, dry_run=dry_run, force=force)
                    outcome = held.elsewhere or perform(op, context)
        except Exception as exc:  # a failing op never stops the others
            outcome = Outcome("failed", describe_error(exc, self._scrub))
        try:
            after = after or (self.stats(ref) if before is not None else None)
        except Exception:
            after = None
        if before is not None and after is not None and ran and not dry_run:
            before, after = self._live_rows.around(ref, before, after, outcome, self._scrub)
        # Outcomes name paths and URIs (wal.root, locations) that may hold a secret.
        outcome.details = self._scrub(outcome.details)
        return OpResult.of(ref.key, op.name, outcome, (before, after), time.monotonic() - started)

    def op_context(
        self, ref: TableRef, table: Table, before: TableStats, *, dry_run: bool, force: bool
    ) -> OpContext:
        """What an operation on ``ref`` is given: the table as read, its settings, now."""
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
        if not dry_run:  # the quick JIT or not, and Spark's start beside the planning
            self._spark.prepare(lambda: self.outlook(refs, operations))

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
        (see :func:`.outlook.pass_outlook`)."""
        return pass_outlook(self, refs, operations, max_tables=max_tables)

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
        limit = QUICK_JIT_MAX_BYTES if max_bytes is None else max_bytes
        return self.outlook(refs, operations, max_tables=max_tables).rewrites_at_most(limit)

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
        """Keep the log table from rotting: see :func:`.log.upkeep.maintain_log_table`."""
        return upkeep.maintain_log_table(self)

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
