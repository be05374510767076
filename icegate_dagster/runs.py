"""What the Dagster instance says about the runs of this code location: which tables an
unfinished run covers, how a table's sensor runs went, and which runs lost their worker
(no JVM, no Iceberg).

A run covers tables in one of three ways: one partition (``dagster/partition``), a range
of partitions (the schedule's and backfills' batches), or a list of tables in its run
config (``maintenance_batch_job``, what the sensors request: each table with its own
operations and the state the sensor saw).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import dagster as dg

from icegate_dagster.config import format_duration

if TYPE_CHECKING:
    from icegate_dagster.maintenance.leases.store import RunLiveness

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

#: The sensors that request maintenance runs, and the tags on those runs: who asked, the
#: table and the state the sensor saw (one-table runs), how many tables (every batch run).
HEALTH_SENSOR = "table_health_sensor"
WAL_SENSOR = "wal_size_sensor"
TRIGGER_TAG = "icegate/trigger"
TABLE_TAG = "icegate/table"
STATE_TAG = "icegate/table_state"
TABLES_TAG = "icegate/tables"

#: On every run of a job that maintains tables with Spark (one JVM each): the instance's
#: tag limit on it bounds how many run side by side (dagster.yaml), counted exactly from
#: the first dequeue, where a fresh instance's pool limit is not applied yet.
MAINTENANCE_TAG = "icegate/maintenance"
MAINTENANCE_TAGS = {MAINTENANCE_TAG: "spark"}

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


def unfinished_run_targets(
    instance: dg.DagsterInstance, current: list[str], *, wal_only: bool = False
) -> dict[str, str]:
    """Every table an unfinished run names (``dagster/partition``, a range over the
    partitions' stored order ``current``, or a batch run's tables), with the first such
    run's id and status.

    ``wal_only`` keeps only the tables a run will run ``wal_compaction`` on (a full pass
    does; a run limited to other operations does not).
    """
    position = {key: i for i, key in enumerate(current)}
    targets: dict[str, str] = {}
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=UNFINISHED)):
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


#: How many of a sensor's latest runs are read to know each table's recent runs.
RECENT_RUNS = 500


@dataclass(frozen=True)
class SensorRun:
    """One sensor run that covered a table, and the state it was requested on."""

    record: Any  # dg.RunRecord
    state: str | None

    @property
    def run(self) -> dg.DagsterRun:
        return self.record.dagster_run  # type: ignore[no-any-return]


def runs_by_table(
    instance: dg.DagsterInstance,
    trigger: str,
    tables: Iterable[str] | None = None,
    *,
    per_table: int = 25,
    recent: int = RECENT_RUNS,
) -> dict[str, list[SensorRun]]:
    """Each table's runs requested by ``trigger`` (newest first, at most ``per_table``), from
    the sensor's ``recent`` latest runs: a batch run counts for each table it lists."""
    wanted = set(tables) if tables is not None else None
    found: dict[str, list[SensorRun]] = {}
    records = instance.get_run_records(
        filters=dg.RunsFilter(tags={TRIGGER_TAG: trigger}), limit=recent
    )
    for record in records:
        for entry in batch_entries(record.dagster_run):
            if wanted is not None and entry.table not in wanted:
                continue
            runs = found.setdefault(entry.table, [])
            if len(runs) < per_table:
                runs.append(SensorRun(record, entry.state))
    return found


def run_end(record: Any) -> datetime:
    """When a finished run ended (its last update, if Dagster recorded no end)."""
    ended = record.end_time or record.update_timestamp.timestamp()
    return datetime.fromtimestamp(ended, UTC)


def trigger_history(
    runs: Sequence[SensorRun],
    ops_failed: dict[str, int],
    state: str,
    held_elsewhere: frozenset[str] = frozenset(),
) -> tuple[tuple[int, datetime] | None, int, str | None]:
    """From a table's sensor runs (newest first): its failures in a row and when the last of
    them ended; how many runs its current ``state`` already had; and the run that already
    succeeded on that state, if one did.

    A run failed when Dagster says so (a run whose worker died is marked failed too), or
    when it succeeded with a failed operation on the table (``ops_failed``: run id -> that
    figure of the table's materialization): both are what back-off is for. A canceled run
    ends the count without being a failure. A run whose operations were skipped because
    another maintainer held the table (``held_elsewhere``: run ids) settles nothing: its
    work may still be due.
    """
    in_row, last_failure, counting = 0, None, True
    attempts, settled = 0, None
    for table_run in runs:
        run = table_run.run
        same_state = table_run.state == state
        attempts += same_state
        if run.status in UNFINISHED:
            continue
        failed = run.status == dg.DagsterRunStatus.FAILURE or (
            run.status == dg.DagsterRunStatus.SUCCESS and ops_failed.get(run.run_id, 0) > 0
        )
        if counting and failed:
            in_row += 1
            if last_failure is None:
                last_failure = run_end(table_run.record)
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


# -- runs whose worker is gone ----------------------------------------------------------------


def is_maintenance_run(run: dg.DagsterRun) -> bool:
    """Whether ``run`` belongs to this code location (and so keeps a heartbeat)."""
    selected = set(run.asset_selection or ())
    return run.job_name in MAINTENANCE_JOBS or bool(selected & MAINTENANCE_ASSETS)


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def dead_run_reason(
    started: datetime, liveness: RunLiveness, lease: timedelta, now: datetime
) -> str | None:
    """Why a ``STARTED`` run has no worker any more, or None while it may have one.

    Dead: no heartbeat and no table lease renewed within the last ``lease`` (by the lease
    store's clock), and it started more than a lease ago (by ``now``), so a run that is
    still setting up its first heartbeat is never taken for dead.
    """
    if liveness.alive or now - started < lease:
        return None
    if liveness.heartbeat_until is not None:
        last = liveness.heartbeat_until - lease
        silence = f"its heartbeat was last renewed at {_utc(last)}"
    else:
        silence = f"it started at {_utc(started)} and never recorded a heartbeat"
    return (
        f"the run's worker is gone (host restart, OOM kill, evicted pod or killed daemon): "
        f"{silence} and it holds no table lease, for longer than maintain.locks.lease "
        f"({format_duration(lease)}). icegate marked it failed so that queued runs can start; "
        f"the sensors request its tables again"
    )


@dataclass(frozen=True)
class DeadRun:
    """A run marked failed because its worker was gone, and why."""

    run_id: str
    job_name: str
    reason: str
    tables: tuple[str, ...]


def started_at(record: Any) -> datetime:
    """When a run started (its creation, if Dagster recorded no start)."""
    if record.start_time is not None:
        return datetime.fromtimestamp(record.start_time, UTC)
    created: datetime = record.create_timestamp
    return created if created.tzinfo else created.replace(tzinfo=UTC)


def fail_dead_runs(
    instance: dg.DagsterInstance,
    liveness: Callable[[list[str]], Mapping[str, RunLiveness]],
    lease: timedelta,
    now: datetime | None = None,
) -> list[DeadRun]:
    """Mark failed every ``STARTED`` run of this code location whose worker is gone (see
    :func:`dead_run_reason`), with an event that says why; return them.

    ``liveness`` asks the lease store about run ids (``TableLocks.run_liveness``). Dagster's
    own run monitoring does this for launchers that can check a worker's health; the
    default launcher cannot, and a run whose process died with ``dagster dev`` or the
    daemon would otherwise stay ``STARTED`` forever, holding its tables and its run slot.
    """
    now = now or datetime.now(UTC)
    records = instance.get_run_records(
        filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])
    )
    candidates = [
        r for r in records if is_maintenance_run(r.dagster_run) and now - started_at(r) >= lease
    ]
    if not candidates:
        return []
    known = liveness([r.dagster_run.run_id for r in candidates])
    dead = []
    for record in candidates:
        run = record.dagster_run
        state = known.get(run.run_id)
        reason = None if state is None else dead_run_reason(started_at(record), state, lease, now)
        if reason is None:
            continue
        latest = instance.get_run_by_id(run.run_id)
        if latest is None or latest.status != dg.DagsterRunStatus.STARTED:
            continue  # it ended on its own meanwhile
        instance.report_run_failed(latest, reason)
        tables = tuple(entry.table for entry in batch_entries(latest))
        dead.append(DeadRun(run.run_id, run.job_name, reason, tables))
    return dead
