"""The runs of this code location as the trigger reads them: their tags and jobs, the
tables a sensor's batch run lists, and which tables an unfinished run covers (no JVM, no
Iceberg).

A run covers tables in one of three ways: one partition (``dagster/partition``), a range
of partitions (the schedule's and backfills' batches), or a list of tables in its run
config (``maintenance_batch_job``, what the sensors request: each table with its own
operations and the state the sensor saw).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import dagster as dg

from icegate_dagster.config import IcegateConfig

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
#: Runs that have not finished: while one names a table, no sensor requests it again.
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    # Still executing until its steps stop: its table is not free yet.
    dg.DagsterRunStatus.CANCELING,
]

#: The sensors that request maintenance runs.
HEALTH_SENSOR = "table_health_sensor"
WAL_SENSOR = "wal_size_sensor"
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

#: The job the sensors request, and the op whose config lists its tables.
BATCH_JOB = "maintenance_batch_job"
#: The run in which an ``icegate-maintain`` pass records its tables (see ``cli_history``).
CLI_PASS_JOB = "icegate_cli_pass"
BATCH_PLAN = "plan_batch"
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
    }
)
MAINTENANCE_ASSETS = frozenset(
    dg.AssetKey(name) for name in ("maintained_table", "maintenance_log", "lakehouse_health")
)


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


@dataclass(frozen=True)
class BatchEntry:
    """One table of a sensor's run: what it does there, and the state the sensor saw."""

    table: str
    operations: tuple[str, ...] | None
    state: str | None = None

    def as_config(self) -> dict[str, Any]:
        """The entry as ``plan_batch``'s run config writes it."""
        return {
            "table": self.table,
            "operations": list(self.operations or ()),
            "state": self.state or "",
        }


def batch_run_config(entries: Sequence[BatchEntry]) -> dict[str, Any]:
    """``run_config`` of a ``maintenance_batch_job`` run over ``entries``."""
    return {"ops": {BATCH_PLAN: {"config": {"tables": [e.as_config() for e in entries]}}}}


def batch_entries(run: dg.DagsterRun) -> list[BatchEntry]:
    """The tables a sensor's run covers, each with its operations and state: from a batch
    run's config, or the tags of a one-table run of ``maintenance_job``."""
    config: Any = run.run_config
    try:
        listed = config["ops"][BATCH_PLAN]["config"]["tables"]
    except (KeyError, TypeError):
        listed = None
    if isinstance(listed, list):
        entries = []
        for item in listed:
            if isinstance(item, Mapping) and isinstance(item.get("table"), str):
                operations = item.get("operations")
                entries.append(
                    BatchEntry(
                        item["table"],
                        tuple(operations) if isinstance(operations, list) else None,
                        str(item.get("state") or "") or None,
                    )
                )
        return entries
    table = run.tags.get(TABLE_TAG) or run.tags.get(PARTITION_TAG)
    if table is None:
        return []
    return [BatchEntry(table, _asset_run_operations(config), run.tags.get(STATE_TAG))]


def _asset_run_operations(run_config: Any) -> tuple[str, ...] | None:
    """The operations a run of ``maintained_table`` limits itself to (None: the full pass)."""
    try:
        operations = run_config["ops"]["maintained_table"]["ops"]["plan"]["config"]["operations"]
    except (KeyError, TypeError):
        return None
    return None if operations is None else tuple(operations)


def unfinished_runs(instance: dg.DagsterInstance) -> list[Any]:
    """The records of every unfinished run (one question to the instance)."""
    return list(instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED)))


def run_targets(
    runs: Iterable[dg.DagsterRun], current: list[str], *, wal_only: bool = False
) -> dict[str, str]:
    """Every table one of ``runs`` names (``dagster/partition``, a range over the
    partitions' stored order ``current``, or a batch run's tables), with the first such
    run's id and status.

    ``wal_only`` keeps only the tables a run will run ``wal_compaction`` on (a full pass
    does; a run limited to other operations does not).
    """
    position = {key: i for i, key in enumerate(current)}
    targets: dict[str, str] = {}
    for run in runs:
        why = f"run {run.run_id} is {run.status.value.lower()}"
        if run.job_name == BATCH_JOB:
            for entry in batch_entries(run):
                if not wal_only or entry.operations is None or "wal_compaction" in entry.operations:
                    targets.setdefault(entry.table, why)
            continue
        operations = _asset_run_operations(run.run_config)
        if wal_only and operations is not None and "wal_compaction" not in operations:
            continue
        tags = run.tags
        start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
        named = {tags.get(PARTITION_TAG), start, end}
        if start in position and end in position:
            named |= set(current[position[start] : position[end] + 1])
        for key in sorted(k for k in named if k is not None):
            targets.setdefault(key, why)
    return targets


def unfinished_run_targets(
    instance: dg.DagsterInstance, current: list[str], *, wal_only: bool = False
) -> dict[str, str]:
    """:func:`run_targets` of every unfinished run."""
    return run_targets(
        (record.dagster_run for record in unfinished_runs(instance)), current, wal_only=wal_only
    )
