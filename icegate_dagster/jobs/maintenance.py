"""``maintenance_job`` (the selected partitions of ``maintained_table``, then
``maintenance_log``: a backfill's or a Materialize's runs) and ``daily_maintenance``, the
schedule that runs the tables found due each day (``maintenance_batch_job``, see
:mod:`.daily`)."""

import dagster as dg

from icegate_dagster.assets.maintained_table import maintained_table
from icegate_dagster.assets.maintenance_log import maintenance_log
from icegate_dagster.assets.names import DAILY_SCHEDULE, SPARK_JOB_TAGS
from icegate_dagster.jobs.batch import maintenance_batch_job
from icegate_dagster.jobs.daily import daily_tick
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.tick import Tick

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


@dg.schedule(
    name=DAILY_SCHEDULE,
    cron_schedule="0 3 * * *",
    execution_timezone="UTC",
    job=maintenance_batch_job,
    description="Every day at 03:00 UTC: looks at every table from its metadata (no JVM; the "
    "health trigger's look and decision, time-based work such as expiry and retention "
    "included) and requests runs of maintenance_batch_job for the tables with work, up to "
    "maintain.trigger.tables_per_run a run; every other table gets its maintenance-log rows "
    "(skipped, and why) from the tick. An idle lakehouse gets no run.",
)
def daily_maintenance(
    context: dg.ScheduleEvaluationContext, lakehouse: LakehouseResource
) -> list[dg.RunRequest] | dg.SkipReason:
    """See :mod:`icegate_dagster.jobs.daily`. Each run carries the configuration's maximum
    runtime (``dagster/max_runtime``: a hung run does not hold its slot forever)."""
    return daily_tick(context, Tick.start(context, lakehouse))
