"""The maintenance job, its daily schedule, the migrate and rollback jobs, and the two
jobs of deferred orphan deletion."""

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from icegate_dagster.assets import maintained_table, maintenance_log
from icegate_dagster.assets.maintained_table import TABLES_PER_BACKFILL_RUN
from icegate_dagster.automation.runs import CODE_LOCATION_TAGS, SPARK_JOB_TAGS, max_runtime_tags
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.migrate import migrate, target_namespace
from icegate_dagster.partitions import ICEBERG_TABLES
from icegate_dagster.resources import LakehouseResource, SparkResource

# Dagster's run tags for a run over a range of partitions.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"

#: The selected tables of ``maintained_table``, then ``maintenance_log``. The checks are
#: evaluated inside the ``record`` step (per table, also in multi-table runs), so their
#: standalone functions are left out. In-process: every step shares one Spark session.
maintenance_job = dg.define_asset_job(
    name="maintenance_job",
    selection=dg.AssetSelection.assets(maintained_table, maintenance_log).without_checks(),
    executor_def=dg.in_process_executor,
    tags=SPARK_JOB_TAGS,
    description="Maintain the selected partitions of maintained_table, then report the "
    "maintenance log: all steps in one process (one Spark session), each step maintaining "
    "maintain.parallel_tables tables at a time.",
)


def range_run_requests(
    keys: Sequence[str],
    run_key_prefix: str,
    batch_size: int = TABLES_PER_BACKFILL_RUN,
    tags: Mapping[str, str] | None = None,
) -> Iterator[dg.RunRequest]:
    """Runs covering ``keys`` in order, ``batch_size`` tables each (one Spark session per
    run), each also tagged ``tags``."""
    for start in range(0, len(keys), batch_size):
        batch = keys[start : start + batch_size]
        yield dg.RunRequest(
            run_key=f"{run_key_prefix}:{batch[0]}..{batch[-1]}",
            tags={**(tags or {}), RANGE_START_TAG: batch[0], RANGE_END_TAG: batch[-1]},
        )


@dg.schedule(
    name="daily_maintenance",
    cron_schedule="0 3 * * *",
    execution_timezone="UTC",
    job=maintenance_job,
    description="Every table, every day at 03:00 UTC, in batches sharing one Spark session.",
)
def daily_maintenance(
    context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource
) -> Iterator[dg.RunRequest] | dg.SkipReason:
    """One run per batch of current partitions, each with the configuration's maximum
    runtime (``dagster/max_runtime``: a hung run does not hold its slot forever)."""
    keys = context.instance.get_dynamic_partitions(ICEBERG_TABLES)
    if not keys:
        return dg.SkipReason(
            "no tables are partitions of maintained_table yet: "
            "turn on the iceberg_table_discovery sensor"
        )
    stamp = context.scheduled_execution_time.strftime("%Y-%m-%d")
    limits = max_runtime_tags(lakehouse.config())
    return range_run_requests(list(keys), f"daily-{stamp}", tags=limits)


class MigrateConfig(dg.Config):
    """Where to create or evolve IceGate's tables."""

    namespace: str | None = Field(
        default=None,
        description="target namespace; default: the first of `namespaces`, else `lakehouse`",
    )


@dg.op(description="Create IceGate's logs/spans/metrics/events tables, or add missing columns.")
def migrate_tables(
    context: dg.OpExecutionContext, config: MigrateConfig, lakehouse: LakehouseResource
) -> None:
    """Run the migration (pyiceberg only); fail the step if any table failed."""
    settings = lakehouse.config()
    namespace = target_namespace(settings.namespaces, config.namespace)
    results = migrate(lakehouse.catalog(), namespace)
    for result in results:
        if result.ok:
            added = f": added {', '.join(result.added_columns)}" if result.added_columns else ""
            context.log.info(f"{result.table}: {result.action}{added}")
        else:
            context.log.error(f"{result.table}: {result.error}")
    context.add_output_metadata(
        {
            "namespace": namespace,
            "results": dg.MetadataValue.json([r.as_dict() for r in results]),
            **{r.table: r.action for r in results},
        }
    )
    failed = [r for r in results if not r.ok]
    if failed:
        raise dg.Failure(
            f"{len(failed)} of {len(results)} tables failed to migrate: "
            + "; ".join(str(r.error) for r in failed)
        )


@dg.job(
    name="migrate_job",
    tags=CODE_LOCATION_TAGS,
    description="Create or evolve IceGate's tables (logs, spans, metrics, events; op config "
    "`namespace`); safe to re-run. Fails if any table failed, with each table's action in the "
    "step's metadata.",
    executor_def=dg.in_process_executor,
)
def migrate_job() -> None:
    """The ``migrate`` command as a Dagster job."""
    migrate_tables()


class RollbackConfig(dg.Config):
    """Which table to roll back, and to which of its snapshots."""

    table: str = Field(description="namespace.table")
    snapshot_id: int = Field(description="a snapshot id from the table's history")


@dg.op(description="Make an earlier snapshot of a table current again (rollback_to_snapshot).")
def rollback_table(
    context: dg.OpExecutionContext,
    config: RollbackConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> None:
    """Roll back with Spark, logged like every operation; fail the step if it failed."""
    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    try:
        result = maintainer.rollback(maintainer.resolve(config.table), config.snapshot_id)
    except IcegateError as exc:
        raise dg.Failure(f"rollback of {config.table!r}: {exc}") from None
    [op] = result.ops
    context.add_output_metadata(
        {
            "table": result.table,
            "status": op.status,
            "details": op.details,
            "rows_before": result.before.rows if result.before else None,
            "rows_after": result.after.rows if result.after else None,
        }
    )
    if not result.ok:
        raise dg.Failure(f"rollback of {result.table} failed: {op.error or result.error}")
    context.log.info(f"{result.table}: {op.details}")


@dg.job(
    name="rollback_job",
    tags=SPARK_JOB_TAGS,
    description="Roll a table back to one of its snapshots (op rollback_table, config: table, "
    "snapshot_id); logged like the CLI's. An unknown snapshot fails the run, naming the ids the "
    "table has.",
    executor_def=dg.in_process_executor,
)
def rollback_job() -> None:
    """``icegate-maintain rollback`` as a Dagster job."""
    rollback_table()


class OrphanTablesConfig(dg.Config):
    """Which tables deferred orphan deletion works on."""

    tables: list[str] = Field(
        default_factory=list,
        description="namespace.table names; empty: every discovered table",
    )


def _orphan_step_end(
    context: dg.OpExecutionContext,
    what: str,
    reports: Sequence[dict[str, Any]],
    metadata: dict[str, Any],
) -> None:
    """Log each table's report, attach ``metadata`` to the step; fail it at the end, naming
    each failing table, when any failed (every other table was done first)."""
    failed = {}
    for report in reports:
        log = context.log.info if report["ok"] else context.log.error
        log(f"{report['table']}: {report['status']}: {report['details']}")
        if not report["ok"]:
            failed[report["table"]] = report["details"]
    metadata["results"] = dg.MetadataValue.json(list(reports))
    if failed:
        named = "; ".join(f"{table}: {error}" for table, error in failed.items())
        raise dg.Failure(
            f"{what} failed on {len(failed)} table(s): {named}",
            metadata={**metadata, "failed_tables": dg.MetadataValue.json(sorted(failed))},
        )
    context.add_output_metadata(metadata)


@dg.op(description="Record each table's orphan candidates (Iceberg's dry run); delete nothing.")
def collect_orphans(
    context: dg.OpExecutionContext,
    config: OrphanTablesConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> None:
    """``orphans --collect`` over the configured tables: counts and bytes as metadata."""
    from icegate_dagster.maintenance.ops.deferred_orphans import CollectOrphans, deferred_report
    from icegate_dagster.maintenance.orphans.candidates import candidates_table

    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    results = maintainer.run_each(config.tables, CollectOrphans(), write_log=False)
    reports = [deferred_report(result, "collect") for result in results]
    metadata: dict[str, Any] = {
        "candidates_table": candidates_table(maintainer.config).key,
        "tables": len(reports),
        "candidates": sum(len(r["candidates"]) for r in reports),
        "candidate_bytes": sum(r["candidate_bytes"] for r in reports),
        "replaced": sum(r["replaced"] for r in reports),
    }
    _orphan_step_end(context, "collecting orphans", reports, metadata)


@dg.op(
    description="Delete the collected orphan candidates that are still unreferenced, old and "
    "unchanged (Iceberg asked again, under each table's lease); record the rest and why."
)
def delete_collected_orphans(
    context: dg.OpExecutionContext,
    config: OrphanTablesConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> None:
    """``orphans --delete-collected`` over the configured tables: counts and bytes as metadata."""
    from icegate_dagster.maintenance.ops.deferred_orphans import (
        DeleteCollectedOrphans,
        deferred_report,
    )
    from icegate_dagster.maintenance.orphans.candidates import candidates_table

    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    results = maintainer.run_each(config.tables, DeleteCollectedOrphans())
    reports = [deferred_report(result, "delete_collected") for result in results]
    metadata: dict[str, Any] = {
        "candidates_table": candidates_table(maintainer.config).key,
        "tables": len(reports),
        "orphans_removed": sum(len(r["deleted"]) for r in reports),
        "bytes_removed": sum(r["bytes_deleted"] for r in reports),
        "kept": sum(len(r["kept"]) for r in reports),
        "delete_failures": sum(len(r["failed"]) for r in reports),
    }
    _orphan_step_end(context, "deleting collected orphans", reports, metadata)


@dg.job(
    name="collect_orphans_job",
    tags=SPARK_JOB_TAGS,
    description="Record orphan candidates of the configured tables (op config `tables`; "
    "empty: every table) for a later delete_collected_orphans_job; deletes nothing. Metadata "
    "`candidates`, `candidate_bytes` and `results` (per file); a failing table fails alone, "
    "and the step fails at the end naming it.",
    executor_def=dg.in_process_executor,
)
def collect_orphans_job() -> None:
    """``icegate-maintain orphans --collect`` as a Dagster job."""
    collect_orphans()


@dg.job(
    name="delete_collected_orphans_job",
    tags=SPARK_JOB_TAGS,
    description="Delete the collected orphan candidates still unreferenced, old and unchanged "
    "(op config `tables`; empty: every table); logged as remove_orphan_files. Metadata "
    "`orphans_removed`, `bytes_removed`, `kept`, `delete_failures` and `results` (per file); a "
    "failing table fails alone, and the step fails at the end naming it.",
    executor_def=dg.in_process_executor,
)
def delete_collected_orphans_job() -> None:
    """``icegate-maintain orphans --delete-collected`` as a Dagster job."""
    delete_collected_orphans()
