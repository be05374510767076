"""The Dagster names of this code location, the bottom of its Dagster layer: the asset keys,
the partitions (every Iceberg table is a partition, key ``namespace.table``, of
``maintained_table``), the names of the jobs and sensors, and the tags its runs and events
carry. Everything above (assets, sensors, jobs) names things from here, so that a sensor
needs no import of the job it launches."""

from __future__ import annotations

from datetime import timedelta

import dagster as dg

from icegate_dagster.config import IcegateConfig

# -- assets and partitions ----------------------------------------------------------------------

MAINTAINED_TABLE = dg.AssetKey("maintained_table")
LAKEHOUSE_HEALTH = dg.AssetKey("lakehouse_health")
ICEBERG_TABLES = "iceberg_tables"
iceberg_tables = dg.DynamicPartitionsDefinition(name=ICEBERG_TABLES)

#: Who recorded an event outside a maintenance run: on the health sensor's assessments
#: (``assessment``) and observations, and on a CLI pass's run and materializations (``cli``).
SOURCE_TAG = "icegate/source"
CLI_SOURCE = "cli"
ASSESSMENT_SOURCE = "assessment"
#: On a CLI pass's run and materializations: the CLI's run id (``cli-<time>-<id>``), as in
#: the log table.
CLI_RUN_TAG = "icegate/cli_run_id"

# -- jobs and sensors ---------------------------------------------------------------------------

#: The sensors that request maintenance runs.
HEALTH_SENSOR = "table_health_sensor"
WAL_SENSOR = "wal_size_sensor"
#: The schedule that maintains the tables found due once a day (its runs are the sensors'
#: job's, tagged and keyed as theirs).
DAILY_SCHEDULE = "daily_maintenance"
#: The job the sensors request, and the op whose config lists its tables.
BATCH_JOB = "maintenance_batch_job"
BATCH_PLAN = "plan_batch"
#: The run in which an ``icegate-maintain`` pass with a Dagster instance records its tables.
CLI_PASS_JOB = "icegate_cli_pass"
#: The short run in which the health sensor records the check verdicts that changed (see
#: ``assets.partition_checks``).
HEALTH_CHECKS_JOB = "icegate_health_checks"
#: This code location's jobs and assets: a run of one of them keeps a heartbeat in the
#: lease store (see ``LakehouseResource``), so a run of one without it has no worker.
MAINTENANCE_JOBS = frozenset(
    {
        "maintenance_job",
        BATCH_JOB,
        "migrate_job",
        "rollback_job",
        "collect_orphans_job",
        "delete_collected_orphans_job",
        CLI_PASS_JOB,
        HEALTH_CHECKS_JOB,
    }
)
MAINTENANCE_ASSETS = frozenset(
    dg.AssetKey(name) for name in ("maintained_table", "maintenance_log", "lakehouse_health")
)

# -- run tags -----------------------------------------------------------------------------------

#: Dagster's run tags for a run over one partition, or a range of partitions.
RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
#: On every run a sensor requests: which sensor asked (``table_health_sensor``,
#: ``wal_size_sensor``).
TRIGGER_TAG = "icegate/trigger"
#: On a one-table run a sensor requests: the table.
TABLE_TAG = "icegate/table"
#: On a one-table run a sensor requests: the table's state as the sensor saw it (its
#: metadata file, WAL and due work).
STATE_TAG = "icegate/table_state"
#: On every run a sensor requests: how many tables it maintains.
TABLES_TAG = "icegate/tables"

#: On every run of a job that maintains tables with Spark (one JVM each): the instance's
#: tag limit on it bounds how many run side by side (dagster.yaml), counted exactly from
#: the first dequeue, where a fresh instance's pool limit is not applied yet.
MAINTENANCE_TAG = "icegate/maintenance"
MAINTENANCE_TAGS = {MAINTENANCE_TAG: "spark"}

#: The package whose code location this is.
PACKAGE = __name__.split(".", 1)[0]
#: On every run of this code location's jobs (value: the package): the sensors' healer
#: looks after runs of this code location only, never another's job of the same name.
CODE_LOCATION_TAG = "icegate/code_location"
CODE_LOCATION_TAGS = {CODE_LOCATION_TAG: PACKAGE}
#: The tags of the jobs that start Spark.
SPARK_JOB_TAGS = {**CODE_LOCATION_TAGS, **MAINTENANCE_TAGS}
#: Dagster's run monitoring fails a run that ran longer than this many seconds.
MAX_RUNTIME_TAG = "dagster/max_runtime"


def max_runtime(config: IcegateConfig) -> timedelta:
    """How long a run the sensors or the schedule request may run: ``maintain.locks.
    stuck_after`` (by then an operation that hung gave its lease up) plus one lease (by then
    that lease ran out). A run still going then is taken for hung: it holds a run slot that
    every other maintenance run waits for."""
    return config.locks.stuck_after + config.locks.lease


def max_runtime_tags(config: IcegateConfig) -> dict[str, str]:
    """``dagster/max_runtime`` of :func:`max_runtime`, for a run request's tags: Dagster's run
    monitoring (on in both ``dagster.yaml`` files) fails the run past it."""
    return {MAX_RUNTIME_TAG: str(int(max_runtime(config).total_seconds()))}
