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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import dagster as dg
from pydantic import Field

from icegate_dagster import render
from icegate_dagster.catalog import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import (
    OPERATIONS,
    Maintainer,
    OpResult,
    TableRef,
    TableResult,
    TableStats,
)
from icegate_dagster.maintenance.health.checks import (
    CHECK_NAMES,
    CheckOutcome,
    evaluate_health,
    health_score_check,
)
from icegate_dagster.maintenance.health.score import TableHealth, assess_table, thresholds_for
from icegate_dagster.maintenance.ops import Operation
from icegate_dagster.maintenance.parallel import each_table
from icegate_dagster.maintenance.wal import WalStats, wal_stats
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource, SparkResource

MAINTAINED_TABLE = dg.AssetKey("maintained_table")
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


def partition_metadata(
    result: TableResult, wal: WalStats, health: TableHealth | None = None
) -> dict[str, Any]:
    """The contract's metadata for one partition's materialization (with the table's
    health after the pass, where it was assessed)."""
    before, after = result.before, result.after

    def number(stats: TableStats | None, name: str) -> int | None:
        value = getattr(stats, name) if stats is not None else None
        return int(value) if value is not None else None

    metadata: dict[str, Any] = {
        "files_before": number(before, "data_files"),
        "files_after": number(after, "data_files"),
        "bytes_before": number(before, "data_bytes"),
        "bytes_after": number(after, "data_bytes"),
        "snapshots_before": number(before, "snapshots"),
        "snapshots_after": number(after, "snapshots"),
        # Live rows (what a reader sees); absent where a table with delete files saw no
        # commit (not counted: see rows_preserved). Records in data files apart.
        "rows_before": number(before, "live_rows"),
        "rows_after": number(after, "live_rows"),
        "records_before": number(before, "rows"),
        "records_after": number(after, "rows"),
        "delete_files_before": number(before, "delete_files"),
        "delete_files_after": number(after, "delete_files"),
        "small_files_after": number(after, "small_files"),
        **{key: render.output_sum(result, key) for key in OPERATIONS.metadata_sums()},
        "wal_files_count": wal.files,
        "wal_size_bytes": wal.bytes,
        "wal_files_quarantined": wal.quarantined,
        "duration_s": round(result.duration_s, 3),
        "ops_failed": sum(1 for op in result.ops if op.status == "failed"),
        # Skipped because another maintainer held the table: the work may still be due.
        "ops_held_elsewhere": sum(1 for op in result.ops if op.output.get("held_elsewhere")),
    }
    if health is not None:
        # A float, so the Plots tab draws each table's score over its runs.
        metadata["health_score"] = dg.MetadataValue.float(float(health.score))
        metadata["due_operations"] = dg.MetadataValue.text(
            ", ".join(health.due_operations) or "none"
        )
    metadata = {k: v for k, v in metadata.items() if v is not None}
    for op in result.ops:
        metadata[f"{op.operation}_status"] = op.status
        metadata[f"{op.operation}_duration_s"] = round(op.duration_s, 3)
    if result.error:
        metadata["error"] = result.error
    metadata["ops"] = dg.MetadataValue.md(render.ops_markdown(result))
    metadata["ops_json"] = dg.MetadataValue.json([op.as_dict() for op in result.ops])
    return metadata


def check_event(outcome: CheckOutcome, partition: str) -> dg.AssetCheckEvaluation:
    """One check's verdict on one partition, as a Dagster event."""
    metadata = {
        k: (dg.MetadataValue.json(v) if isinstance(v, list | dict) else v)
        for k, v in outcome.metadata.items()
    }
    metadata["summary"] = dg.MetadataValue.text(outcome.description)
    return dg.AssetCheckEvaluation(
        asset_key=MAINTAINED_TABLE,
        check_name=outcome.name,
        passed=outcome.passed,
        partition=partition,
        metadata=metadata,
        description=outcome.description,
        severity=dg.AssetCheckSeverity.ERROR
        if outcome.name in ("rows_preserved", "ops_succeeded")
        else dg.AssetCheckSeverity.WARN,
    )


#: Where a step records one table's materialization: its partition key and metadata.
RecordPartition = Callable[[str, dict[str, Any]], None]


def log_materialization(context: dg.OpExecutionContext) -> RecordPartition:
    """Record a partition from any step of an op job: an ``AssetMaterialization`` event."""

    def materialize(key: str, metadata: dict[str, Any]) -> None:
        context.log_event(
            dg.AssetMaterialization(asset_key=MAINTAINED_TABLE, partition=key, metadata=metadata)
        )

    return materialize


def record_table(
    context: dg.OpExecutionContext,
    maintainer: Maintainer,
    table: TableRun,
    materialize: RecordPartition,
    progress: ProgressLog,
) -> None:
    """One table's metadata (through ``materialize``) and one evaluation of each check."""
    config = maintainer.config
    result = table.result()
    # A table that could not be resolved has no WAL folder to size. One whose WAL
    # cannot be listed fails its wal_backlog check alone: the others are recorded.
    wal_error: str | None = None
    try:
        wal = wal_stats(config.wal_root, table.ref) if table.ref is not None else WalStats(0, 0)
    except Exception as exc:
        wal_error = scrub(
            f"cannot list the WAL of {table.key}: {type(exc).__name__}: {exc}", config
        )
        wal = WalStats(0, 0)
        progress.error(wal_error)
    outcomes = evaluate_health(result, config.for_table(table.key), wal)
    if wal_error is not None:
        outcomes = [
            CheckOutcome("wal_backlog", False, wal_error, {"error": wal_error})
            if outcome.name == "wal_backlog"
            else outcome
            for outcome in outcomes
        ]
    health, health_check = _health_after(maintainer, table, wal if wal_error is None else None)
    outcomes.append(health_check)
    metadata = partition_metadata(result, wal, health)
    if health is None:
        metadata["health_error"] = health_check.description
    if wal_error is not None:
        for name in ("wal_files_count", "wal_size_bytes", "wal_files_quarantined"):
            metadata.pop(name, None)  # unknown, not zero
        metadata["wal_error"] = wal_error
        metadata.setdefault("error", wal_error)
    metadata["checks"] = dg.MetadataValue.json(
        {o.name: {"passed": o.passed, "description": o.description} for o in outcomes}
    )
    materialize(table.key, metadata)
    for outcome in outcomes:
        # Dagster 1.13 takes check evaluations here; its annotation leaves them out.
        context.log_event(check_event(outcome, table.key))  # type: ignore[arg-type]
    table.recorded = True
    state = "ok" if result.ok else "FAILED"
    score = f"; health score {health.score:.1f}" if health is not None else ""
    progress.info(f"{table.key}: recorded, {state} in {result.duration_s:.1f}s{score}")


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


@dg.op(description="Append log rows, record each table's metadata and checks.")
def record(
    context: dg.AssetExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    batch: MaintenanceBatch,
) -> None:
    """Finish the asset: one materialization and one evaluation of each check per table."""

    def materialize(key: str, metadata: dict[str, Any]) -> None:
        context.add_asset_metadata(metadata, partition_key=key)

    record_tables(context.op_execution_context, lakehouse, spark, batch, materialize)


def _health_after(
    maintainer: Maintainer, table: TableRun, wal: WalStats | None
) -> tuple[TableHealth | None, CheckOutcome]:
    """The table's health after its pass (pyiceberg, no JVM) and its ``healthy`` verdict;
    a table that cannot be assessed fails that check alone."""
    if table.ref is None:
        return None, health_score_check(None, 0.0, f"{table.key} could not be resolved")
    settings = maintainer.settings(table.ref)
    min_score = settings.health.min_score
    try:
        iceberg = maintainer.load(table.ref)
        min_score = thresholds_for(settings, iceberg.properties).min_score
        health = assess_table(iceberg, table.key, settings, datetime.now(UTC), wal)
    except Exception as exc:  # this check fails; the table's other checks stand
        error = describe_error(exc, lambda text: scrub(text, maintainer.config))
        return None, health_score_check(
            None, min_score, f"cannot assess the health of {table.key}: {error}"
        )
    return health, health_score_check(health, min_score)


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
            "TTL applied. One partition per table."
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
            f"{name}: evaluated per table by every maintenance run (step `record`). "
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
