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


def _some(keys: list[str], shown: int = 10) -> str:
    """A readable list: the first ``shown`` keys, then how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


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
        context.log.info(f"{len(added)} new tables: {_some(added)}")
        requests.append(iceberg_tables.build_add_request(added))
    if removed:
        context.log.info(f"{len(removed)} tables gone from the catalog: {_some(removed)}")
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


#: Runs that have not finished: while one exists for a backlog, no other is requested.
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
]
BACKLOG_TAG = "icegate/wal_backlog"


def backlog_id(table: str, stats: WalStats) -> str:
    """Names one backlog: the table and its oldest waiting file, which only an ingest removes."""
    return hashlib.sha256(f"{table}\n{stats.oldest}".encode()).hexdigest()[:16]


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
    """One run per backlog at a time: none while a run for it is unfinished, a new one after.

    A backlog is the table plus its oldest waiting file. Its runs carry the tag
    ``icegate/wal_backlog``; the ``run_key`` adds how many runs it had, so a run
    that failed (the backlog is still there) is followed by a new attempt, while
    repeated ticks during one attempt request the same key and Dagster launches
    no duplicate.
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
    if not due:
        return dg.SkipReason(
            f"no WAL over its thresholds: {waiting} files waiting across {len(tables)} tables"
        )
    requests, busy = [], []
    for key, stats in due.items():
        backlog = backlog_id(key, stats)
        runs = context.instance.get_runs(filters=dg.RunsFilter(tags={BACKLOG_TAG: backlog}))
        if any(run.status in UNFINISHED for run in runs):
            busy.append(key)
            continue
        context.log.info(
            f"{key}: {stats.files} WAL files, {stats.bytes} bytes: compacting"
            + (f" (attempt {len(runs) + 1})" if runs else "")
        )
        requests.append(
            dg.RunRequest(
                run_key=f"wal:{key}:{backlog}:{len(runs)}",
                partition_key=key,
                run_config=operations_run_config(["wal_compaction"]),
                tags={"icegate/trigger": "wal_size_sensor", BACKLOG_TAG: backlog},
            )
        )
    cursor = json.dumps({"due": sorted(due), "busy": busy})
    if not requests:
        return dg.SkipReason(
            f"{len(busy)} tables over their WAL thresholds already have a run in progress: "
            + ", ".join(busy)
        )
    return dg.SensorResult(run_requests=requests, cursor=cursor)
