"""``maintenance_batch_job``: the runs the sensors request, several tables each.

One run is one process and one Spark session for up to ``maintain.trigger.tables_per_run``
tables, scattered anywhere in the partition list; each table does only its own
operations (run config ``plan_batch.config.tables``: table, operations, and the state the
sensor saw). The steps are ``maintained_table``'s own (one per operation); ``record_batch``
records one materialization of each table's partition of ``maintained_table``, with the
same metadata and check evaluations a run of the asset records, and
``update_maintenance_log`` keeps the log table and records ``maintenance_log``.

Why a job and not a run of the asset: a run of a partitioned asset covers one partition
or one contiguous range of them, and the tables a sensor finds due are rarely contiguous.
"""

from collections.abc import Mapping, Sequence

import dagster as dg
from pydantic import Field

from icegate_dagster.assets.maintained_table import (
    STEPS,
    MaintenanceBatch,
    chosen_operations,
    log_materialization,
    plan_tables,
    record_tables,
)
from icegate_dagster.assets.maintenance_log import MAINTENANCE_LOG, log_table_report
from icegate_dagster.assets.names import BATCH_JOB, BATCH_PLAN, SPARK_JOB_TAGS
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.resources import LakehouseResource, SparkResource


class BatchTableConfig(dg.Config):
    """One table of a batch run."""

    table: str = Field(description="namespace.table")
    operations: list[str] = Field(description="the operations to run on it, in any order")
    state: str = Field(default="", description="the state the requesting sensor saw")


class BatchConfig(dg.Config):
    """The tables of a batch run, each with its own operations."""

    tables: list[BatchTableConfig] = Field(description="the tables, neediest first")


@dg.op(
    name=BATCH_PLAN,
    description="Resolve the batch's tables and read their state from Iceberg metadata.",
)
def plan_batch(
    context: dg.OpExecutionContext,
    config: BatchConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> MaintenanceBatch:
    """Every listed table becomes a table of the run with its own operations; a bad one
    fails alone. A table listed twice is maintained once, doing what both entries ask.

    The tables are listed because their operations are due, so the JVM starts now, beside
    the planning from metadata, rather than after it."""
    wanted: dict[str, set[str]] = {}
    for index, entry in enumerate(config.tables):
        where = f"{BATCH_PLAN}.config.tables[{index}].operations"
        wanted.setdefault(entry.table, set()).update(chosen_operations(entry.operations, where))
    maintainer = lakehouse.maintainer(context.run.run_id)
    if any(wanted.values()):
        spark.start_in_background(
            lakehouse.config(), lambda: _rewrites_are_small(maintainer, wanted)
        )
    plan = [(key, chosen_operations(sorted(ops), BATCH_PLAN)) for key, ops in wanted.items()]
    batch = plan_tables(context, maintainer, plan)
    batch.record_when_done = True  # each table shows in the UI as soon as it is done
    for table in batch.tables:  # what the sensor found due (the trigger's memory judges it)
        table.requested = table.operations
    return batch


def _rewrites_are_small(maintainer: Maintainer, wanted: Mapping[str, set[str]]) -> bool:
    """Whether the batch's rewrites are small enough for the quicker JIT, bounded from its
    tables' metadata as a CLI pass bounds them (``Maintainer.rewrites_are_small``, over
    each table's full pass: a bound; a table that cannot be read leaves it unbounded). The
    plan's own maintainer: the stats it reads here serve the plan too."""
    try:
        refs = [TableRef.parse(key) for key, operations in wanted.items() if operations]
    except Exception:  # a name that is no table's: the plan reports it
        return False
    return maintainer.rewrites_are_small(refs)


@dg.op(description="Append log rows; record each table's partition of maintained_table.")
def record_batch(
    context: dg.OpExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    batch: MaintenanceBatch,
) -> MaintenanceBatch:
    """The log rows of every table; one materialization of each table's partition and one
    evaluation of each check, as a run of ``maintained_table`` records them, for the tables
    their last operation's step did not record already."""
    record_tables(context, lakehouse, spark, batch, log_materialization(context))
    return batch


@dg.op(description="Keep the maintenance log table compact and record maintenance_log.")
def update_maintenance_log(
    context: dg.OpExecutionContext,
    lakehouse: LakehouseResource,
    spark: SparkResource,
    batch: MaintenanceBatch,
) -> None:
    """The ``maintenance_log`` asset's work and metadata, after the batch's tables."""
    metadata = log_table_report(context, lakehouse, spark)
    context.log_event(dg.AssetMaterialization(asset_key=MAINTENANCE_LOG, metadata=metadata))


def build_batch_job(steps: Sequence[dg.OpDefinition]) -> dg.JobDefinition:
    """The batch job over ``steps`` (the same step definitions ``maintained_table`` uses)."""

    @dg.job(
        name=BATCH_JOB,
        executor_def=dg.in_process_executor,
        tags=SPARK_JOB_TAGS,
        description=(
            "Maintain a batch of tables in one run (one Spark session), each doing its own "
            "operations (config plan_batch.tables); what the sensors request. Each table is "
            "recorded as its partition of maintained_table, with its metadata and checks."
        ),
    )
    def maintenance_batch_job() -> None:
        """plan_batch -> one step per operation -> record_batch -> update_maintenance_log."""
        batch = plan_batch()
        for step in steps:
            batch = step(batch)
        update_maintenance_log(record_batch(batch))

    return maintenance_batch_job


maintenance_batch_job = build_batch_job(STEPS)
