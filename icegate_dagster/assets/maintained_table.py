"""``maintained_table``: one partition per Iceberg table, each maintenance op a visible step.

The graph runs ``plan`` -> ``wal_compaction`` (where ``wal.root`` is set) ->
``optimize`` -> ``rewrite_manifests`` -> ``expire_snapshots`` ->
``remove_orphan_files`` -> ``retention`` (tables with a TTL rule only) ->
``record``. Every step handles all tables of the run (a backfill batch holds
several), ``maintain.parallel_tables`` at a time in the run's one Spark
session. ``record`` appends the log rows, adds each partition's metadata and
evaluates each partition's checks. ``plan``'s config ``operations`` limits a
run to some steps (the WAL sensor runs ``wal_compaction`` only).
"""

import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
from pydantic import Field

from icegate_dagster.assets.names import ASSESSMENT_SOURCE, MAINTAINED_TABLE, iceberg_tables
from icegate_dagster.assets.partition_events import (
    TableRecord,
    log_checks,
    source_of,
    table_record,
)
from icegate_dagster.config.secrets import scrub
from icegate_dagster.maintenance import (
    OPERATIONS,
    Maintainer,
    OpResult,
    TableRef,
    TableResult,
    TableStats,
)
from icegate_dagster.maintenance.health.checks import CHECK_DESCRIPTIONS, CHECK_NAMES
from icegate_dagster.maintenance.ops import Operation
from icegate_dagster.maintenance.parallel import each_table
from icegate_dagster.maintenance.pass_memory import pass_record
from icegate_dagster.resources import LakehouseResource, SparkResource

#: Maintenance steps take a slot of this pool (see dagster.yaml): they never overlap.
POOL = "iceberg_maintenance"
#: Tables per run when a backfill is split into batches; each batch shares one Spark session.
TABLES_PER_BACKFILL_RUN = 25
#: A step's per-table lines go to Dagster's log together, at most this often: every log
#: line is an event the instance stores (tens of ms each on SQLite), and a run of a hundred
#: tables would otherwise write hundreds of them.
PROGRESS_SECONDS = 5.0


class ProgressLog:
    """A step's per-table lines, sent to the run's log a few at a time (every
    :data:`PROGRESS_SECONDS`, and at the end), so progress stays visible without one event
    per table; a failure goes out at once, on its own, as an error."""

    def __init__(self, context: dg.OpExecutionContext, what: str) -> None:
        self.context = context
        self.what = what
        self.lines: list[str] = []
        self.sent = time.monotonic()
        self.count = 0

    def info(self, line: str) -> None:
        """One table's line; sent with the others once enough time has passed."""
        self.lines.append(line)
        if time.monotonic() - self.sent >= PROGRESS_SECONDS:
            self.flush()

    def error(self, line: str) -> None:
        """A failure: the lines before it, then it, at once."""
        self.flush()
        self.context.log.error(line)

    def flush(self) -> None:
        """Send the lines waiting (one log event)."""
        if self.lines:
            self.count += len(self.lines)
            head = f"{self.what}: {len(self.lines)} table{'s' if len(self.lines) != 1 else ''}"
            self.context.log.info(head + "\n" + "\n".join(self.lines))
            self.lines = []
        self.sent = time.monotonic()


@dataclass
class TableRun:
    """One table's progress through the run's steps, and the operations it does."""

    key: str
    ref: TableRef | None
    before: TableStats | None
    started: float
    operations: tuple[str, ...]
    ops: list[OpResult] = field(default_factory=list)
    error: str | None = None
    #: Its materialization and checks are recorded already (see ``MaintenanceBatch``).
    recorded: bool = False
    #: The operations a sensor asked for because they were due (its batch runs).
    requested: tuple[str, ...] = ()

    def result(self) -> TableResult:
        """The table's outcome so far."""
        return TableResult.from_ops(
            self.key, self.before, self.ops, time.monotonic() - self.started, self.error
        )


@dataclass
class MaintenanceBatch:
    """The tables of one run, passed from step to step (each with its own operations).

    With ``record_when_done`` (the sensors' batch runs), a table is recorded by the step
    of its last operation, as soon as that is done: its partition shows in the UI while the
    run goes on, and Dagster's event writes overlap the other tables' Spark work. A run of
    ``maintained_table`` records every partition in its ``record`` step (the only step
    that may add an asset's metadata).
    """

    tables: list[TableRun]
    record_when_done: bool = False


class PlanConfig(dg.Config):
    """Which operations this run performs (default: the full pass)."""

    operations: list[str] | None = Field(
        default=None,
        description=f"a subset of {', '.join(OPERATIONS.names())}; unset runs them all",
    )


def operations_run_config(operations: list[str]) -> dict[str, Any]:
    """``run_config`` for a run of ``maintained_table`` doing only ``operations``."""
    return {"ops": {"maintained_table": {"ops": {"plan": {"config": {"operations": operations}}}}}}


def chosen_operations(operations: Sequence[str] | None, where: str) -> tuple[str, ...]:
    """``operations`` in pass order (None: all of them); an unknown name fails the run,
    naming it and ``where`` it was given."""
    known = OPERATIONS.names()
    unknown = sorted(set(operations or ()) - set(known))
    if unknown:
        raise dg.Failure(
            f"{where}: {', '.join(map(repr, unknown))} "
            f"is not an operation (known: {', '.join(known)})"
        )
    return tuple(op for op in known if operations is None or op in operations)


def plan_tables(
    context: dg.OpExecutionContext,
    maintainer: Maintainer,
    wanted: Sequence[tuple[str, tuple[str, ...]]],
) -> MaintenanceBatch:
    """Each ``(table, operations)`` becomes a :class:`TableRun` with its stats before; a
    table that cannot be resolved or read fails alone."""
    tables = []
    progress = ProgressLog(context, "planned")
    for key, operations in wanted:
        started = time.monotonic()
        ref: TableRef | None = None
        try:
            ref = maintainer.resolve(key)
            before = maintainer.stats(ref)
        except Exception as exc:  # the table fails alone; the others go on
            error = scrub(str(exc), maintainer.config)
            progress.error(f"{key}: {error}")
            # Dropped before its run, never a table, or unreadable: each operation it would
            # have run fails, and ``record`` logs a failed row for each.
            try:
                would_run = maintainer.operations_for(ref or TableRef.parse(key))
            except Exception:
                would_run = ()
            failed = TableResult.failed(key, error, [op for op in would_run if op in operations])
            tables.append(
                TableRun(key, None, None, started, operations, ops=failed.ops, error=error)
            )
            continue
        progress.info(
            f"{key}: {before.data_files} data files ({before.small_files} small), "
            f"{before.snapshots} snapshots, {before.rows} rows in data files, "
            f"{before.delete_files} delete files; to do: {', '.join(operations) or 'nothing'}"
        )
        tables.append(TableRun(key, ref, before, started, operations))
    progress.flush()
    return MaintenanceBatch(tables)


@dg.op(description="Resolve the run's tables and read their state from Iceberg metadata.")
def plan(
    context: dg.OpExecutionContext, config: PlanConfig, lakehouse: LakehouseResource
) -> MaintenanceBatch:
    """Every partition of the run becomes a :class:`TableRun`; a bad one fails alone."""
    operations = chosen_operations(config.operations, "plan.config.operations")
    maintainer = lakehouse.maintainer(context.run.run_id)
    batch = plan_tables(context, maintainer, [(key, operations) for key in context.partition_keys])
    if operations != OPERATIONS.names():
        context.log.info(f"this run does only: {', '.join(operations)}")
    return batch


def maintenance_step(operation: Operation) -> dg.OpDefinition:
    """The Dagster step of one registered operation: it runs on every table of the batch."""
    name = operation.name

    @dg.op(
        name=name,
        pool=POOL,
        description=operation.description,
        tags={"icegate/operation": name},
    )
    def step(
        context: dg.OpExecutionContext,
        lakehouse: LakehouseResource,
        spark: SparkResource,
        batch: MaintenanceBatch,
    ) -> MaintenanceBatch:
        maintainer = lakehouse.maintainer(context.run.run_id, spark)
        todo = [
            (table, table.ref)
            for table in batch.tables
            if table.ref is not None
            and name in table.operations
            and name in maintainer.operations_for(table.ref)
        ]
        if not todo:
            return batch
        # Tables side by side in the run's one Spark session (maintain.parallel_tables);
        # results are logged here, in the step's own thread, as tables finish.
        progress = ProgressLog(context, name)
        later = OPERATIONS.names()[OPERATIONS.names().index(name) + 1 :]
        for (table, ref), result in each_table(
            todo,
            lambda item: maintainer.run_op(item[1], operation),
            maintainer.config.parallel_tables,
            f"icegate-{name}",
        ):
            table.ops.append(result)
            line = (
                f"{table.key} {name}: {result.status} in {result.duration_s:.1f}s: {result.details}"
            )
            if result.status == "failed":
                progress.error(line)
            else:
                progress.info(line)
            applicable = maintainer.operations_for(ref)
            if batch.record_when_done and not any(
                op in table.operations and op in applicable for op in later
            ):
                record_table(context, maintainer, table, log_materialization(context), progress)
        progress.flush()
        return batch

    return step


#: Where a step records one table's materialization: its partition key and metadata.
RecordPartition = Callable[[str, dict[str, Any]], None]


def log_materialization(context: dg.OpExecutionContext) -> RecordPartition:
    """Record a partition from any step of an op job: an ``AssetMaterialization`` event."""

    def materialize(key: str, metadata: dict[str, Any]) -> None:
        context.log_event(
            dg.AssetMaterialization(asset_key=MAINTAINED_TABLE, partition=key, metadata=metadata)
        )

    return materialize


def _recorded_line(table: TableRun, record: TableRecord) -> str:
    result = table.result()
    state = "ok" if result.ok else "FAILED"
    score = f"; health score {record.health.score:.1f}" if record.health is not None else ""
    return f"{table.key}: recorded, {state} in {result.duration_s:.1f}s{score}"


def remember_table(
    maintainer: Maintainer, table: TableRun, record: TableRecord, progress: ProgressLog
) -> dict[str, Any]:
    """Keep the table's pass in the trigger's memory (see ``maintenance.trigger``), as the
    page records it; returns the metadata that says what the trigger now makes of it:
    ``trigger`` (operations that keep failing or stay due, and when they are tried next)."""
    remembered = maintainer.remember(
        pass_record(
            table.result(),
            maintainer.run_id,
            requested=table.requested,
            still_due=record.still_due(),
            settled_state=record.settled_state,
            shown_state=record.shown(),
        )
    )
    if isinstance(remembered, str):
        progress.error(f"{table.key}: {remembered}")
        return {}
    troubled = [m.describe() for m in remembered if m.failures >= 2 or m.ineffective >= 2]
    return {"trigger": "; ".join(troubled)} if troubled else {}


def record_table(
    context: dg.OpExecutionContext,
    maintainer: Maintainer,
    table: TableRun,
    materialize: RecordPartition,
    progress: ProgressLog,
) -> None:
    """One table's materialization (through ``materialize``, stored at once) and one
    evaluation of each check, judging it."""
    record = table_record(maintainer, table.ref, table.result())
    if record.wal_error is not None:
        progress.error(record.wal_error)
    materialize(
        table.key, {**record.metadata, **remember_table(maintainer, table, record, progress)}
    )
    log_checks(context, table.key, record.outcomes)
    table.recorded = True
    progress.info(_recorded_line(table, record))


def record_tables(
    context: dg.OpExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    batch: MaintenanceBatch,
    materialize: RecordPartition,
) -> None:
    """Finish a run: append the log rows of every table (one append for the run), then
    record each table not recorded yet (see :func:`record_table`)."""
    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    maintainer.write_logs([table.result() for table in batch.tables])
    progress = ProgressLog(context, "recorded")
    for table in batch.tables:
        if not table.recorded:
            record_table(context, maintainer, table, materialize, progress)
    progress.flush()


@dg.op(
    description="Append log rows, record each table's metadata and checks.",
    out=dg.Out(dg.Nothing),
)
def record(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    batch: MaintenanceBatch,
) -> Iterator[dg.Output[None]]:
    """Finish the asset: one materialization and one evaluation of each check per table.

    The materializations are this step's output (one per partition, with the metadata
    added here), stored when the output is yielded; the check evaluations come after it,
    so each names the materialization it judges."""
    op_context = context.op_execution_context
    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    maintainer.write_logs([table.result() for table in batch.tables])
    progress = ProgressLog(op_context, "recorded")
    records = []
    for table in batch.tables:
        record = table_record(maintainer, table.ref, table.result())
        if record.wal_error is not None:
            progress.error(record.wal_error)
        trigger = remember_table(maintainer, table, record, progress)
        context.add_asset_metadata({**record.metadata, **trigger}, partition_key=table.key)
        records.append((table, record))
    yield dg.Output(None)
    for table, record in records:
        log_checks(op_context, table.key, record.outcomes)
        table.recorded = True
        progress.info(_recorded_line(table, record))
    progress.flush()


def maintenance_steps() -> list[dg.OpDefinition]:
    """One step per operation registered now (see ``ops``), in pass order."""
    return [maintenance_step(operation) for operation in OPERATIONS]


def build_maintained_table(steps: Sequence[dg.OpDefinition] | None = None) -> dg.AssetsDefinition:
    """``maintained_table`` with ``steps`` (default: one per operation registered now)."""
    steps = list(steps) if steps is not None else maintenance_steps()

    @dg.graph_asset(
        name="maintained_table",
        partitions_def=iceberg_tables,
        backfill_policy=dg.BackfillPolicy.multi_run(max_partitions_per_run=TABLES_PER_BACKFILL_RUN),
        group_name="iceberg_maintenance",
        kinds={"iceberg", "spark"},
        description=(
            "Every Iceberg table of the lakehouse, kept healthy: WAL ingested, small files "
            "compacted, manifests rewritten, old snapshots expired, orphaned files removed, "
            "TTL applied. One partition per table (key namespace.table; tables whose name starts "
            "with _ are left out). Each operation is a step of its own; the run config "
            "ops: {maintained_table: {ops: {plan: {config: {operations: [wal_compaction]}}}}} "
            "limits a run to some steps (unknown names fail the run, naming them)."
        ),
    )
    def maintained_table() -> Any:
        """The maintenance pass as a graph: each operation is its own step."""
        batch = plan()
        for step in steps:
            batch = step(batch)
        return record(batch)

    return maintained_table


#: The steps of this code location: shared by ``maintained_table`` and the sensors' batch job.
STEPS = maintenance_steps()
maintained_table = build_maintained_table(STEPS)


def _declared_check(name: str) -> dg.AssetChecksDefinition:
    @dg.asset_check(
        asset=MAINTAINED_TABLE,
        name=name,
        partitions_def=iceberg_tables,
        description=(
            f"{CHECK_DESCRIPTIONS[name]} Evaluated per table by every maintenance run (step "
            "`record`). "
            "Executed as its own step, it re-reports the latest verdict of each table in the run."
        ),
    )
    def _check(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        return stored_verdicts(context.instance, list(context.partition_keys), name)

    return _check


def latest_verdict(instance: dg.DagsterInstance, partition: str, name: str) -> tuple[bool, str]:
    """The verdict on ``name`` stored with the partition's latest materialization."""
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[partition]), limit=1
    ).records
    materialization = records[0].asset_materialization if records else None
    if materialization is None:
        return False, f"{partition} was never maintained"
    verdicts = getattr(materialization.metadata.get("checks"), "value", None) or {}
    verdict = verdicts.get(name)
    if verdict is None and source_of(records[0]) == ASSESSMENT_SOURCE:
        return False, f"{partition} was assessed by table_health_sensor, never maintained"
    if verdict is None:
        return False, f"no {name} verdict recorded for {partition}"
    return bool(verdict["passed"]), str(verdict["description"])


def stored_verdicts(
    instance: dg.DagsterInstance, partitions: list[str], name: str
) -> dg.AssetCheckResult:
    """One result for the step: the table's verdict, or a summary over a multi-table run.

    (A multi-table step cannot attach a partition to an ``AssetCheckResult``; the
    per-table verdicts are the ones ``record`` logged.)
    """
    verdicts = {key: latest_verdict(instance, key, name) for key in partitions}
    if len(verdicts) == 1:
        [(passed, description)] = verdicts.values()
        return dg.AssetCheckResult(passed=passed, description=f"latest run: {description}")
    failed = sorted(key for key, (passed, _) in verdicts.items() if not passed)
    return dg.AssetCheckResult(
        passed=not failed,
        description=f"{len(verdicts) - len(failed)} of {len(verdicts)} tables pass"
        + (f"; failing: {', '.join(failed)}" if failed else ""),
        metadata={"failing_tables": dg.MetadataValue.json(failed)},
    )


with warnings.catch_warnings():
    # Partitioned asset checks are a preview feature of Dagster 1.13; they work as used here.
    warnings.simplefilter("ignore", dg.PreviewWarning)
    MAINTAINED_TABLE_CHECKS = [_declared_check(name) for name in CHECK_NAMES]
