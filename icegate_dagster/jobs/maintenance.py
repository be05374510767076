"""``maintenance_job`` (the selected partitions of ``maintained_table``, then
``maintenance_log``) and its daily schedule, in batches of tables sharing one Spark session."""

from collections.abc import Iterator, Mapping, Sequence

import dagster as dg

from icegate_dagster.assets.maintained_table import TABLES_PER_BACKFILL_RUN, maintained_table
from icegate_dagster.assets.maintenance_log import maintenance_log
from icegate_dagster.assets.names import (
    ICEBERG_TABLES,
    RANGE_END_TAG,
    RANGE_START_TAG,
    SPARK_JOB_TAGS,
    max_runtime_tags,
)
from icegate_dagster.resources import LakehouseResource

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
