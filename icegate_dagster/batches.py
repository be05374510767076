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

import hashlib
from collections.abc import Callable, Mapping, Sequence

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
from icegate_dagster.resources import LakehouseResource, SparkResource
from icegate_dagster.runs import (
    BATCH_JOB,
    BATCH_PLAN,
    HEALTH_SENSOR,
    MAINTENANCE_TAGS,
    STATE_TAG,
    TABLE_TAG,
    TABLES_TAG,
    TRIGGER_TAG,
    WAL_SENSOR,
    BatchEntry,
    batch_run_config,
)


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
    if any(wanted.values()):
        spark.start_in_background(lakehouse.config())
    maintainer = lakehouse.maintainer(context.run.run_id)
    plan = [(key, chosen_operations(sorted(ops), BATCH_PLAN)) for key, ops in wanted.items()]
    batch = plan_tables(context, maintainer, plan)
    batch.record_when_done = True  # each table shows in the UI as soon as it is done
    return batch


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
        tags=MAINTENANCE_TAGS,
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


#: How each sensor's run keys begin.
RUN_KEY_PREFIXES = {HEALTH_SENSOR: "health", WAL_SENSOR: "wal"}


def split_evenly(count: int, per_run: int) -> list[int]:
    """Sizes of the runs that ``count`` tables make at up to ``per_run`` each, as even as
    possible (30 tables at 25 a run: 15 and 15, so side-by-side runs end together)."""
    if count <= 0:
        return []
    runs = -(-count // per_run)
    return [count // runs + (1 if i < count % runs else 0) for i in range(runs)]


def sensor_run_requests(
    entries: Sequence[tuple[BatchEntry, str]],
    *,
    trigger: str,
    tables_per_run: int,
    tags: Callable[[Sequence[BatchEntry]], Mapping[str, str]] | None = None,
) -> list[dg.RunRequest]:
    """Runs of ``maintenance_batch_job`` over ``entries`` in their order (neediest first),
    up to ``tables_per_run`` tables each.

    Each entry comes with its part of the run key (table, state, attempt), so a tick that
    sees the same tables in the same states asks for the same runs again and Dagster
    launches no duplicate. ``tags`` adds tags to a run from its entries. A one-table run is
    keyed and tagged as before batching (``<prefix>:<table>:<state>:<attempt>``,
    ``icegate/table``, ``icegate/table_state``).
    """
    prefix = RUN_KEY_PREFIXES.get(trigger, trigger)
    requests, start = [], 0
    for size in split_evenly(len(entries), tables_per_run):
        chunk = entries[start : start + size]
        start += size
        run_tags = {TRIGGER_TAG: trigger, TABLES_TAG: str(len(chunk))}
        run_tags.update(tags([entry for entry, _ in chunk]) if tags is not None else {})
        if len(chunk) == 1:
            [(entry, key)] = chunk
            run_key = f"{prefix}:{key}"
            run_tags[TABLE_TAG] = entry.table
            if entry.state:
                run_tags[STATE_TAG] = entry.state
        else:
            digest = hashlib.sha256("\n".join(key for _, key in chunk).encode()).hexdigest()
            run_key = f"{prefix}:batch:{digest[:20]}"
        requests.append(
            dg.RunRequest(
                run_key=run_key,
                job_name=BATCH_JOB,
                run_config=batch_run_config([entry for entry, _ in chunk]),
                tags=run_tags,
            )
        )
    return requests
