"""Sensors: table discovery and WAL size, both on metadata only (never a JVM)."""

import hashlib
import json

import dagster as dg

from icegate_dagster.assets.maintained_table import operations_run_config
from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import IcegateError
from icegate_dagster.jobs import maintenance_job
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.wal import WalStats, compaction_due, wal_stats
from icegate_dagster.partitions import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.resources import LakehouseResource


def partition_changes(discovered: list[str], current: list[str]) -> tuple[list[str], list[str]]:
    """Tables to add as partitions, and partitions whose table is gone."""
    found, known = set(discovered), set(current)
    return sorted(found - known), sorted(known - found)


@dg.sensor(
    name="iceberg_table_discovery",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Adds a partition of maintained_table for each new table; removes dropped ones.",
)
def iceberg_table_discovery(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Keep the partitions equal to the catalog's tables (``_``-prefixed ones excluded)."""
    maintainer = lakehouse.maintainer(run_id="discovery")
    discovered = [ref.key for ref in maintainer.discover()]
    current = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    added, removed = partition_changes(discovered, current)
    cursor = hashlib.sha256("\n".join(sorted(discovered)).encode()).hexdigest()[:16]
    if not added and not removed:
        return dg.SkipReason(
            f"no change: the {len(discovered)} tables of catalog "
            f"{maintainer.config.catalog.name!r} are all partitions already"
        )
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if added:
        context.log.info(f"new tables: {', '.join(added)}")
        requests.append(iceberg_tables.build_add_request(added))
    if removed:
        context.log.info(f"tables gone from the catalog: {', '.join(removed)}")
        requests.append(iceberg_tables.build_delete_request(removed))
    return dg.SensorResult(dynamic_partitions_requests=requests, cursor=cursor)


def wal_backlogs(config: IcegateConfig, tables: list[str]) -> dict[str, tuple[WalStats, bool]]:
    """Each table's waiting WAL and whether it has reached its compaction thresholds."""
    backlogs = {}
    for key in tables:
        try:
            stats = wal_stats(config.wal_root, TableRef.parse(key))
        except (IcegateError, OSError):  # an unreadable WAL folder must not stop the others
            continue
        backlogs[key] = (
            stats,
            compaction_due(stats.files, stats.bytes, config.for_table(key).compaction),
        )
    return backlogs


def wal_run_key(table: str, stats: WalStats) -> str:
    """Stable while the same backlog waits: its oldest file goes only when a run ingests it."""
    return f"wal:{table}:{stats.oldest}"


@dg.sensor(
    name="wal_size_sensor",
    job=maintenance_job,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests a wal_compaction run of a table once its WAL reaches min_files or "
        "min_size_bytes. Sizes the WAL from the file system only."
    ),
)
def wal_size_sensor(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """One run per table over threshold; its ``run_key`` names the backlog's oldest file.

    While that file waits (the run is queued, running, or failed), the key stays
    the same and Dagster launches no duplicate; once a run ingests it, the next
    backlog has a new oldest file and a new key.
    """
    config = lakehouse.config()
    if not config.wal_root:
        return dg.SkipReason("wal.root is not configured: there is no WAL to watch")
    tables = sorted(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    if not tables:
        return dg.SkipReason(
            "no tables are partitions of maintained_table yet: "
            "turn on the iceberg_table_discovery sensor"
        )
    backlogs = wal_backlogs(config, tables)
    due = {key: stats for key, (stats, is_due) in backlogs.items() if is_due}
    waiting = sum(stats.files for stats, _ in backlogs.values())
    previous = json.loads(context.cursor) if context.cursor else {}
    cursor = json.dumps({key: wal_run_key(key, stats) for key, stats in due.items()})
    if not due:
        return dg.SkipReason(
            f"no WAL over its thresholds: {waiting} files waiting across {len(tables)} tables"
        )
    requests = []
    for key, stats in due.items():
        run_key = wal_run_key(key, stats)
        if previous.get(key) != run_key:
            context.log.info(f"{key}: {stats.files} WAL files, {stats.bytes} bytes: compacting")
        requests.append(
            dg.RunRequest(
                run_key=run_key,
                partition_key=key,
                run_config=operations_run_config(["wal_compaction"]),
                tags={"icegate/trigger": "wal_size_sensor"},
            )
        )
    return dg.SensorResult(run_requests=requests, cursor=cursor)
