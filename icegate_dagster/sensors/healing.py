"""Runs whose worker is gone: the sensors mark them failed, so queued runs start and their
tables are asked for again.

Only this code location's runs are judged (:func:`is_maintenance_run`), and one is failed
only when its worker is provably gone:

* **same host** (same host name, kernel boot and PID namespace as the sensor's code
  server): the process its heartbeat names no longer exists, is a zombie, or its PID now
  belongs to a younger process. A process that still runs is never failed, however late
  its beats (a lease store that was unreachable for a while); a hung one is failed by
  Dagster's run monitoring past the run's ``dagster/max_runtime`` (``runs.max_runtime``);
* **another host**, or a heartbeat that does not say which process beats: no heartbeat and
  no table lease renewed for :data:`SILENT_LEASES` leases (6 minutes with the default
  ``maintain.locks.lease`` of 2 minutes). A worker that is cut off from the lease store
  that long has stopped its own commits already: it holds no lease after two thirds of
  one;
* a run that never recorded a heartbeat: after :data:`SILENT_LEASES` leases since it started
  (a run that cannot reach its lease store fails at its set-up instead).

Dagster's own run monitoring does this for launchers that can check a worker's health;
the default launcher cannot, and a run whose process died with ``dagster dev`` or the
daemon would otherwise stay ``STARTED`` forever, holding its tables and its run slot.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg

from icegate_dagster.assets.names import (
    CLI_SOURCE,
    CODE_LOCATION_TAG,
    MAINTENANCE_ASSETS,
    MAINTENANCE_JOBS,
    PACKAGE,
    SOURCE_TAG,
    TRIGGER_TAG,
)
from icegate_dagster.assets.runs import batch_entries
from icegate_dagster.config import format_duration
from icegate_dagster.maintenance.leases.process import describe_process, process_gone
from icegate_dagster.maintenance.leases.store import RunLiveness

#: Leases of silence after which a run whose process cannot be asked about is failed.
SILENT_LEASES = 3


#: Where this package's modules are (a code location loaded from a file names one).
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def is_maintenance_run(run: dg.DagsterRun) -> bool:
    """Whether ``run`` belongs to this code location (and so keeps a heartbeat): a run of
    one of its jobs or assets that carries a tag only this project sets, or whose code, as
    Dagster recorded it, is this package. Another code location's job of the same name
    (a ``migrate_job`` of its own) is none of the healer's business."""
    selected = set(run.asset_selection or ())
    if not (run.job_name in MAINTENANCE_JOBS or selected & MAINTENANCE_ASSETS):
        return False
    return _tagged_by_this_project(run) or _code_of_this_package(run)


def _tagged_by_this_project(run: dg.DagsterRun) -> bool:
    """Our jobs' own tag (Dagster copies a job's tags onto its runs), the tag of a sensor's
    request, or a CLI pass's."""
    tags = run.tags
    return (
        tags.get(CODE_LOCATION_TAG) == PACKAGE
        or TRIGGER_TAG in tags
        or tags.get(SOURCE_TAG) == CLI_SOURCE
    )


def _code_of_this_package(run: dg.DagsterRun) -> bool:
    """Whether the code Dagster recorded for ``run`` (its job's code pointer, else its code
    location's loadable target) is a module or file of this package: a run launched from
    this code location's asset graph carries no job tags of ours."""
    modules: list[str | None] = []
    files: list[tuple[str | None, str | None]] = []
    if run.job_code_origin is not None:
        pointer = run.job_code_origin.repository_origin.code_pointer
        folder = getattr(pointer, "working_directory", None)
        modules.append(getattr(pointer, "module", None))
        files.append((getattr(pointer, "python_file", None), folder))
    elif run.remote_job_origin is not None:
        location = run.remote_job_origin.repository_origin.code_location_origin
        target = getattr(location, "loadable_target_origin", None)
        if target is not None:
            modules += [target.module_name, target.package_name, target.autoload_defs_module_name]
            files.append((target.python_file, target.working_directory))
    if any(name == PACKAGE or name.startswith(f"{PACKAGE}.") for name in modules if name):
        return True
    for name, folder in files:
        if name:
            path = Path(folder or ".", name) if not Path(name).is_absolute() else Path(name)
            if path.resolve().is_relative_to(PACKAGE_DIR):
                return True
    return False


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def dead_run_reason(
    started: datetime, liveness: RunLiveness, lease: timedelta, now: datetime
) -> str | None:
    """Why a ``STARTED`` run has no worker any more, or None while it may have one (the
    rules in the module docstring). ``now`` is the caller's clock for ``started``; the
    heartbeat is judged by the store's clock (``liveness.now``)."""
    if liveness.tables_held:
        return None
    gone = process_gone(liveness.process)
    if gone is False:
        return None
    head = "the run's worker is gone (host restart, OOM kill, evicted pod or killed daemon): "
    tail = (
        ". icegate marked it failed so that queued runs can start; the sensors ask for its "
        "tables again"
    )
    if gone:
        return head + f"its {describe_process(liveness.process)} no longer exists" + tail
    silence = lease * SILENT_LEASES
    if liveness.heartbeat_until is not None:
        last = liveness.heartbeat_until - lease
        if liveness.now - last < silence:
            return None
        quiet = f"its heartbeat was last renewed at {_utc(last)}"
    else:
        if now - started < silence:
            return None
        quiet = f"it started at {_utc(started)} and never recorded a heartbeat"
    return (
        head + f"{quiet} and it holds no table lease, for longer than {SILENT_LEASES} × "
        f"maintain.locks.lease ({format_duration(silence)}), from a host that cannot be asked "
        f"whether its process still runs" + tail
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
    records: Sequence[Any] | None = None,
) -> list[DeadRun]:
    """Mark failed every ``STARTED`` run of this code location whose worker is gone (see
    :func:`dead_run_reason`), with an event that says why; return them. ``records``: the
    unfinished runs' records when the caller has them (else one question to the
    instance); then one question to the lease store (``TableLocks.run_liveness``)."""
    now = now or datetime.now(UTC)
    if records is None:
        records = instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])
        )
    candidates = [
        r
        for r in records
        if r.dagster_run.status == dg.DagsterRunStatus.STARTED and is_maintenance_run(r.dagster_run)
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
