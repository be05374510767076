"""What the Dagster instance says about runs of ``maintained_table``: which tables an
unfinished run covers, and how a table's health-trigger runs went (no JVM, no Iceberg)."""

from datetime import UTC, datetime
from typing import Any

import dagster as dg

RANGE_START_TAG = "dagster/asset_partition_range_start"
RANGE_END_TAG = "dagster/asset_partition_range_end"
PARTITION_TAG = "dagster/partition"
#: Runs that have not finished: while one exists for a backlog, no other is requested.
UNFINISHED = [
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    # Still executing until its steps stop: its table is not free yet.
    dg.DagsterRunStatus.CANCELING,
]

#: The health trigger's name, and the tags on the runs it requests: who asked, the table,
#: and the table's state when asked (see ``lakehouse_health.table_state``).
HEALTH_SENSOR = "table_health_sensor"
TRIGGER_TAG = "icegate/trigger"
TABLE_TAG = "icegate/table"
STATE_TAG = "icegate/table_state"


def unfinished_run_targets(
    instance: dg.DagsterInstance, current: list[str], *, wal_only: bool = False
) -> dict[str, str]:
    """Every partition an unfinished run names (``dagster/partition``, or a range over the
    partitions' stored order ``current``), with the first such run's id and status.

    ``wal_only`` keeps only runs that will run ``wal_compaction`` (a full pass does; a run
    limited to other operations does not).
    """
    position = {key: i for i, key in enumerate(current)}
    targets: dict[str, str] = {}
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED)):
        if wal_only and not _runs_wal_compaction(run.run_config):
            continue
        tags = run.tags
        start, end = tags.get(RANGE_START_TAG), tags.get(RANGE_END_TAG)
        named = {tags.get(PARTITION_TAG), start, end}
        if start in position and end in position:
            named |= set(current[position[start] : position[end] + 1])
        for key in sorted(k for k in named if k is not None):
            targets.setdefault(key, f"run {run.run_id} is {run.status.value.lower()}")
    return targets


def _runs_wal_compaction(run_config: Any) -> bool:
    try:
        operations = run_config["ops"]["maintained_table"]["ops"]["plan"]["config"]["operations"]
    except (KeyError, TypeError):
        return True  # the full pass
    return operations is None or "wal_compaction" in operations


def trigger_history(
    records: list[Any],
    ops_failed: dict[str, int],
    state: str,
    held_elsewhere: frozenset[str] = frozenset(),
) -> tuple[tuple[int, datetime] | None, int, str | None]:
    """From a table's health-trigger runs (newest first): its failures in a row and when the
    last of them ended; how many runs its current ``state`` already had; and the run that
    already succeeded on that state, if one did.

    A run failed when Dagster says so, or when it succeeded with a failed operation on the
    table (``ops_failed``: run id -> that figure of the table's materialization): both are
    what back-off is for. A canceled run ends the count without being a failure. A run
    whose operations were skipped because another maintainer held the table
    (``held_elsewhere``: run ids) settles nothing: its work may still be due.
    """
    in_row, last_failure, counting = 0, None, True
    attempts, settled = 0, None
    for record in records:
        run = record.dagster_run
        same_state = run.tags.get(STATE_TAG) == state
        attempts += same_state
        if run.status in UNFINISHED:
            continue
        failed = run.status == dg.DagsterRunStatus.FAILURE or (
            run.status == dg.DagsterRunStatus.SUCCESS and ops_failed.get(run.run_id, 0) > 0
        )
        if counting and failed:
            in_row += 1
            if last_failure is None:
                ended = record.end_time or record.update_timestamp.timestamp()
                last_failure = datetime.fromtimestamp(ended, UTC)
        else:
            counting = False
        clean = (
            run.status == dg.DagsterRunStatus.SUCCESS
            and not failed
            and run.run_id not in held_elsewhere
        )
        if settled is None and same_state and clean:
            settled = f"run {run.run_id} already succeeded on this table state"
    failures = (in_row, last_failure) if last_failure is not None else None
    return failures, attempts, settled
