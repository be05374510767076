"""The Dagster instance's history of this code location's runs, kept for
``maintain.history.runs``: older finished runs are deleted with their events.

Dagster keeps every run forever; at 10,000 tables the sensors' batch runs, the daily
schedule and the CLI's recorded passes add runs (and their event-log entries) every day.
``iceberg_table_discovery`` calls :func:`forget_old_runs` at each tick, bounded in runs
deleted and records read, and within the tick's deadline.

A run is deleted only when all of these hold:

- it is **finished** (``SUCCESS``, ``FAILURE``, ``CANCELED``) and its last status change
  (its end) is older than the setting;
- it is **this code location's**: launched from the code location the sensor runs in (its
  origin names that location) and of one of its jobs or assets; or, with no origin (run in
  process), a pass ``icegate-maintain`` recorded (job ``icegate_cli_pass``, tag
  ``icegate/source=cli``). Another code location's run is never deleted, even one of a job
  with the same name; when the sensor cannot tell its own location, only CLI passes are;
- it holds no table's **latest materialization** of ``maintained_table`` (nor the latest of
  ``maintenance_log`` or ``lakehouse_health``): a quiet table's page keeps its last pass.

Deletion is Dagster's public ``DagsterInstance.delete_run`` (the run and its events).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import dagster as dg

from icegate_dagster.assets.names import (
    CLI_PASS_JOB,
    CLI_SOURCE,
    MAINTENANCE_ASSETS,
    MAINTENANCE_JOBS,
    SOURCE_TAG,
)

#: Finished runs: nothing will write to them any more.
FINISHED = [
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
]
#: Runs deleted per tick at most (each is a few queries; a day of runs at 10,000 tables is
#: a few hundred, so a backlog is cleared within hours).
RUNS_PER_TICK = 100
#: Run records read per tick at most: runs of other code locations and runs kept for a
#: table's latest materialization are stepped over, from where the last tick stopped.
RECORDS_PER_TICK = 500
#: Seconds of the tick's deadline left, below which no further run is deleted.
MIN_SECONDS_LEFT = 1.0

_MAINTAINED_TABLE = dg.AssetKey("maintained_table")


@dataclass(frozen=True)
class RunsForgotten:
    """What one call deleted and looked at."""

    deleted: tuple[str, ...]
    #: Old finished runs of this code location kept: they hold a latest materialization.
    kept_latest: int
    #: Old finished runs looked at (every code location's).
    scanned: int
    #: Where the next call continues (a run id), None: from the oldest again.
    cursor: str | None
    cutoff: datetime

    def summary(self) -> str:
        """One line for the tick's log."""
        return (
            f"run history: deleted {len(self.deleted)} finished runs of this code location "
            f"that ended before {self.cutoff:%Y-%m-%d %H:%M:%S} UTC ({self.scanned} old runs "
            f"looked at, {self.kept_latest} kept for a table's latest materialization)"
        )


def is_own_run(run: dg.DagsterRun, location_name: str | None) -> bool:
    """Whether ``run`` is this code location's (see the module docstring)."""
    origin = run.remote_job_origin
    if origin is None:
        return run.job_name == CLI_PASS_JOB and run.tags.get(SOURCE_TAG) == CLI_SOURCE
    if location_name is None or origin.location_name != location_name:
        return False
    selected = set(run.asset_selection or ())
    return run.job_name in MAINTENANCE_JOBS or bool(selected & MAINTENANCE_ASSETS)


#: Latest materializations read per query (the storage ids of one IN list).
_IDS_PER_QUERY = 1000


def _runs_holding_latest(instance: dg.DagsterInstance) -> set[str]:
    """The runs that hold a table's latest materialization of ``maintained_table``, or the
    latest of ``maintenance_log`` or ``lakehouse_health`` (a few queries: one for the
    latest per partition, one per thousand tables for their runs)."""
    latest = sorted(
        instance.get_latest_storage_id_by_partition(
            _MAINTAINED_TABLE, dg.DagsterEventType.ASSET_MATERIALIZATION
        ).values()
    )
    runs: set[str] = set()
    for start in range(0, len(latest), _IDS_PER_QUERY):
        ids = latest[start : start + _IDS_PER_QUERY]
        found = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=_MAINTAINED_TABLE, storage_ids=ids), limit=len(ids)
        )
        runs.update(record.run_id for record in found.records)
    for key in MAINTENANCE_ASSETS - {_MAINTAINED_TABLE}:
        event = instance.get_latest_materialization_event(key)
        if event is not None:
            runs.add(event.run_id)
    return runs


def forget_old_runs(
    instance: dg.DagsterInstance,
    location_name: str | None,
    keep: timedelta,
    now: datetime,
    *,
    cursor: str | None = None,
    seconds_left: Callable[[], float] = lambda: float("inf"),
    runs_per_call: int = RUNS_PER_TICK,
    records_per_call: int = RECORDS_PER_TICK,
) -> RunsForgotten:
    """Delete this code location's finished runs that ended before ``now - keep``, oldest
    first, at most ``runs_per_call`` of them among ``records_per_call`` old finished runs
    read from ``cursor`` on, while ``seconds_left()`` allows."""
    cutoff = now - keep
    records = instance.get_run_records(
        dg.RunsFilter(statuses=FINISHED, updated_before=cutoff),
        limit=records_per_call,
        ascending=True,
        cursor=cursor,
    )
    if not records:
        return RunsForgotten((), 0, 0, None, cutoff)
    holding_latest: set[str] | None = None
    deleted: list[str] = []
    kept_latest = scanned = 0
    last_kept = cursor
    for record in records:
        run = record.dagster_run
        if len(deleted) >= runs_per_call or seconds_left() < MIN_SECONDS_LEFT:
            break
        scanned += 1
        if not is_own_run(run, location_name):
            last_kept = run.run_id
            continue
        if holding_latest is None:
            holding_latest = _runs_holding_latest(instance)
        if run.run_id in holding_latest:
            kept_latest += 1
            last_kept = run.run_id
            continue
        instance.delete_run(run.run_id)
        deleted.append(run.run_id)
    # The next call goes on after the last run kept (a deleted run id is no cursor); a
    # page read to its end that was short means the oldest runs are all looked at.
    finished_page = scanned == len(records) and len(records) < records_per_call
    return RunsForgotten(
        tuple(deleted), kept_latest, scanned, None if finished_page else last_kept, cutoff
    )
