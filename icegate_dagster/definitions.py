"""The Dagster code location: ``dagster dev`` (via workspace.yaml) loads ``defs``."""

import dagster as dg

from icegate_dagster.assets.lakehouse_health import lakehouse_health
from icegate_dagster.assets.maintained_table import MAINTAINED_TABLE_CHECKS, maintained_table
from icegate_dagster.assets.maintenance_log import maintenance_log
from icegate_dagster.jobs.batch import maintenance_batch_job
from icegate_dagster.jobs.maintenance import daily_maintenance, maintenance_job
from icegate_dagster.jobs.orphans import collect_orphans_job, delete_collected_orphans_job
from icegate_dagster.jobs.tables import migrate_job, rollback_job
from icegate_dagster.resources import LakehouseResource, SparkResource
from icegate_dagster.sensors.discovery_sensor import iceberg_table_discovery
from icegate_dagster.sensors.health_sensor import table_health_sensor
from icegate_dagster.sensors.wal_sensor import wal_size_sensor

defs = dg.Definitions(
    assets=[maintained_table, maintenance_log, lakehouse_health],
    asset_checks=MAINTAINED_TABLE_CHECKS,
    jobs=[
        maintenance_job,
        maintenance_batch_job,
        migrate_job,
        rollback_job,
        collect_orphans_job,
        delete_collected_orphans_job,
    ],
    schedules=[daily_maintenance],
    sensors=[iceberg_table_discovery, wal_size_sensor, table_health_sensor],
    resources={"lakehouse": LakehouseResource(), "spark": SparkResource()},
    # All steps of a run in one process, so they share one Spark session.
    executor=dg.in_process_executor,
)
