"""The runs of this code location as the trigger reads and writes them: the tables a
sensor's batch run lists, and which tables an unfinished run covers (no JVM, no Iceberg;
their tags and job names are in :mod:`.names`).

A run covers tables in one of three ways: one partition (``dagster/partition``), a range
of partitions (the schedule's and backfills' batches), or a list of tables in its run
config (``maintenance_batch_job``, what the sensors request: each table with its own
operations and the state the sensor saw).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import dagster as dg

from icegate_dagster.assets.names import (
    BATCH_JOB,
    BATCH_PLAN,
    PARTITION_TAG,
    RANGE_END_TAG,
    RANGE_START_TAG,
    STATE_TAG,
    TABLE_TAG,
)

#: Runs that have not finished: while one names a table, no sensor requests it again.
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    # Still executing until its steps stop: its table is not free yet.
    dg.DagsterRunStatus.CANCELING,
]


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
