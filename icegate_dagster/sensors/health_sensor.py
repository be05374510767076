"""``table_health_sensor``: one tick, top to bottom.

1. **List** the catalog's tables (one query on a SQL catalog); tables that are not
   partitions yet become partitions in this tick's result.
2. **Heal**: fail the ``STARTED`` runs whose worker is gone (``healing``).
3. **Look** at the tables whose health may have changed, until the look budget is spent
   (``trigger.look``); every other table keeps its last look.
4. **Remember**: read the trigger's memory (every table's last request and pass, and the
   operations of the due tables and of those that keep failing) and the busy tables (one
   question to the instance, one to the lease store); a request no pass answered counts
   as a failure of its operations when its run ended, and is forgotten when Dagster never
   made one (``Tick.count_lost``).
5. **Decide** which due tables go now (``trigger.decision``: back-off, unchanged state,
   ``min_interval``, longest-waiting first within the budget), make the run requests and
   remember them with their keys (``requests``).
6. **Record** what changed on partition pages (``assets.partition_observations``), the
   check verdicts that changed as evaluations of each table's partition, in one short run
   (``assets.partition_checks``), and, when the lakehouse's verdicts changed or an hour
   passed, ``lakehouse_health`` over every table (``assets.lakehouse_health``).

The whole evaluation ends within ``maintain.trigger.tick_deadline``: the look stops at
three quarters of it, and the cursor (a position, not per-table state) says where the next
tick resumes. Everything per table lives in the trigger's memory.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import dagster as dg

from icegate_dagster.assets.lakehouse_health import (
    LAKEHOUSE_HEARTBEAT_S,
    lakehouse_digest,
    lakehouse_event,
)
from icegate_dagster.assets.names import BATCH_JOB, HEALTH_SENSOR, max_runtime_tags
from icegate_dagster.assets.partition_checks import record_checks
from icegate_dagster.assets.partition_observations import partition_events
from icegate_dagster.assets.runs import BatchEntry
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.trigger.decision import decide, lakehouse_report
from icegate_dagster.maintenance.trigger.look import (
    LakehouseLook,
    look_at_lakehouse,
    unsafe_sharing,
)
from icegate_dagster.maintenance.trigger.selection import LakehouseHealth, Selection
from icegate_dagster.maintenance.trigger.store import MemoryBusy
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.requests import request_runs
from icegate_dagster.sensors.tick import Tick, partitions_to_add

#: The neediest table's need (100 - score) on a health trigger run.
NEED_TAG = "icegate/need"
#: The share of the tick's deadline the look may use; the rest is for deciding and
#: recording.
LOOK_SHARE = 0.75
#: Tables named per reason in a log line or skip reason (Dagster stores both with the tick).
NAMED = 10
#: Seconds before the tick's deadline by which the recording of check verdicts stops,
#: leaving time to remember what was recorded and end the tick.
CHECKS_MARGIN_S = 2.0


@dataclass
class HealthCursor:
    """What ``table_health_sensor`` keeps between ticks (its Dagster cursor, stored with
    every tick): where the look resumes, and the last ``lakehouse_health`` recorded. Its size
    does not grow with the lakehouse."""

    resume_at: str | None = None
    lakehouse: str | None = None
    lakehouse_at: float = 0.0

    @classmethod
    def parse(cls, raw: str | None) -> HealthCursor:
        """The cursor as stored; one that does not read starts afresh."""
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {}
        if not isinstance(data, dict):
            data = {}
        resume_at, digest = data.get("resume_at"), data.get("lakehouse")
        try:
            at = float(data.get("lakehouse_at") or 0.0)
        except (TypeError, ValueError):
            at = 0.0
        return cls(
            resume_at if isinstance(resume_at, str) else None,
            digest if isinstance(digest, str) else None,
            at,
        )

    def serialize(self) -> str:
        """The cursor to store."""
        data = {"resume_at": self.resume_at, "lakehouse": self.lakehouse}
        data["lakehouse_at"] = round(self.lakehouse_at, 3)  # type: ignore[assignment]
        return json.dumps(data, separators=(",", ":"), sort_keys=True)


def _some(items: Sequence[str], shown: int = NAMED) -> str:
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    return "; ".join(items[:shown]) + more


def health_tick(context: dg.SensorEvaluationContext, tick: Tick) -> dg.SensorResult | dg.SkipReason:
    """One evaluation of ``table_health_sensor`` (the module docstring's six steps)."""
    config = tick.config
    cursor = HealthCursor.parse(context.cursor)
    maintainer = tick.lakehouse.maintainer(run_id="health")
    listing = tick.list_lakehouse(maintainer)
    if isinstance(listing, dg.SkipReason):
        return listing
    partitions, add = partitions_to_add(context.instance, list(listing.tables))
    tick.heal()

    budget = config.trigger.tick_deadline.total_seconds() * (1 - LOOK_SHARE)
    try:
        look = look_at_lakehouse(
            maintainer,
            tick.memory,
            tick.now,
            until=tick.deadline - budget,
            resume_at=cursor.resume_at,
            listing=listing,
        )
    except MemoryBusy as exc:  # its looks stay in this process; stored at the next tick
        return dg.SensorResult(
            skip_reason=f"cannot store this tick's looks: {exc}",
            dynamic_partitions_requests=add,
        )
    if look.waiting:
        context.log.warning(
            f"looked at {len(look.fresh)} tables in this tick; {look.waiting} more out of date "
            f"wait for the next (it starts at {look.resume_at}); their last look stands"
        )
    for table, error in sorted(look.errors.items())[:NAMED]:
        context.log.warning(f"{table}: cannot assess its health: {error}")

    due = [t for t, h in look.healths.items() if h.due]
    memory = tick.read_memory(operations_of=due)
    if tick.memory is None and tick.store_error:
        tick.warnings.append(f"no trigger memory: {tick.store_error}")
    busy = tick.busy(partitions)
    lost = tick.count_lost(memory, busy)
    if lost:
        tick.warnings.append("requests no run answered, counted as failures: " + _some(lost))
    selection, states = decide(look, memory, busy, now=tick.now, trigger=config.trigger)
    backing_off = selection.skipped_as("backoff")
    if backing_off:
        tick.warnings.append(
            "backing off: " + _some([f"{s.table} ({s.reason})" for s in backing_off])
        )

    requests: list[dg.RunRequest] = []
    unrequested = None
    if selection.requested and tick.memory is None:
        unrequested = (
            "no run requested: the trigger's memory (the lease store) is needed to number "
            f"run requests: {tick.store_error}"
        )
    elif selection.requested and tick.memory is not None:
        entries = [BatchEntry(r.table, r.operations, states[r.table]) for r in selection.requested]
        needs = {r.table: r.need for r in selection.requested}
        try:
            requests = request_runs(
                tick.memory,
                entries,
                memory,
                trigger=HEALTH_SENSOR,
                tables_per_run=config.trigger.tables_per_run,
                now=tick.now,
                limits=max_runtime_tags(config),
                tags=lambda chunk: {NEED_TAG: f"{max(needs[e.table] for e in chunk):g}"},
            )
        except Exception as exc:
            unrequested = (
                f"no run requested: cannot remember the {len(entries)} requests in the "
                f"trigger's memory: {describe_error(exc, tick.scrub)}"
            )
    if unrequested is not None:
        tick.warnings.append(unrequested)
    if requests:
        context.log.info(
            f"requesting {len(selection.requested)} tables in {len(requests)} runs: "
            + _some([f"{r.table} ({', '.join(r.operations)})" for r in selection.requested])
        )

    # What partition pages and lakehouse_health show: recorded on change only.
    page = partition_events(
        context.instance,
        look,
        memory,
        busy=[r.table for r in selection.requested if requests] + list(busy),
        settings_of=config.for_table,
    )
    # Without the trigger's memory nothing is remembered: no run would be the last.
    checked = record_checks(
        context.instance,
        tick.lakehouse,
        page.checks if tick.memory is not None else {},
        until=tick.deadline - CHECKS_MARGIN_S,
    )
    if checked.problem is not None:
        tick.warnings.append(checked.problem)
    if checked.tables:
        context.log.info(
            f"recorded the check verdicts of {len(checked.tables)} tables in run "
            f"{checked.run_id}: " + _some(checked.tables)
        )
    sharing = unsafe_sharing(look)
    if sharing:
        tick.warnings.append(
            f"{len(sharing)} tables share their location without gc.enabled=false: "
            + _some([f"{t} (with {', '.join(sh.overlapping)})" for t, sh in sharing.items()])
        )
    report = lakehouse_report(look, selection, memory, sharing=sharing)
    events = list(page.events)
    digest = lakehouse_digest(report)
    if digest != cursor.lakehouse or tick.now - cursor.lakehouse_at >= LAKEHOUSE_HEARTBEAT_S:
        events.insert(0, lakehouse_event(report))
        cursor.lakehouse, cursor.lakehouse_at = digest, tick.now
    if tick.memory is not None and page.shown:
        try:
            tick.memory.show(page.shown_after(checked.tables), tick.now)
        except Exception as exc:
            tick.warnings.append(f"cannot remember what partition pages show: {exc}")
    cursor.resume_at = look.resume_at
    for warning in tick.warnings:
        context.log.warning(warning)
    stored = cursor.serialize()
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=None
        if requests
        else "; ".join(filter(None, [unrequested, skip_reason(selection, report, look)])),
        asset_events=events,
        dynamic_partitions_requests=add,
        cursor=stored if stored != context.cursor else None,
    )


def skip_reason(selection: Selection, report: LakehouseHealth, look: LakehouseLook) -> str:
    """Why a tick asked for nothing, in one line."""
    reason = selection.summary(NAMED)
    if report.errors:
        reason += f"; {len(report.errors)} tables could not be assessed: " + _some(
            sorted(report.errors)
        )
    if look.waiting:
        reason += f"; {look.waiting} tables not looked at yet (next tick)"
    return reason


@dg.sensor(
    name=HEALTH_SENSOR,
    job_name=BATCH_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Looks at every table's health from its metadata (no JVM; a table is read again "
        "only when it changed) and requests runs of the tables with due operations, each "
        "doing exactly its own, longest-waiting first within maintain.trigger's budget, up "
        "to maintain.trigger.tables_per_run tables per run; never a table with a run in "
        "flight, none more often than its health.min_interval, backing off operations that "
        "keep failing or stay due (the trigger's memory). Marks failed the runs whose worker "
        "is gone. Records each table's health on its partition (and the verdicts of its "
        "healthy, small_files, snapshot_count and wal_backlog checks, in a short run of "
        "icegate_health_checks), and lakehouse_health, when they change."
    ),
)
def table_health_sensor(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """See :func:`health_tick`."""
    return health_tick(context, Tick.start(context, lakehouse))
