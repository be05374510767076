"""The jobs of the ``migrate`` and ``rollback`` commands: create or evolve IceGate's tables,
and make an earlier snapshot of a table current again."""

import dagster as dg
from pydantic import Field

from icegate_dagster.assets.names import CODE_LOCATION_TAGS, SPARK_JOB_TAGS
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance.migrate import migrate, target_namespace
from icegate_dagster.resources import LakehouseResource, SparkResource


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
