"""One tick of ``daily_maintenance``: the health trigger's look and decision over every
table, runs for the tables with work, log rows for the rest.

1. **List** the catalog's tables (as the health trigger does); a table that is not a
   partition yet becomes one.
2. **Look** at the tables whose health may have changed since their last look
   (``trigger.look``: metadata only, no JVM; the health sensor keeps the looks fresh, so
   this is usually a handful of tables), until three quarters of
   ``maintain.trigger.tick_deadline``; a table it had no time for keeps its last look, and
   one never looked at before is logged as not looked at (the health trigger looks at it
   at its next ticks).
3. **Decide** as the health trigger does (``trigger.decision``: in flight, back-off,
   unchanged, ``min_interval``), without its per-evaluation budget, and add the tables whose
   daily pass holds time-based work no look judges (``trigger.daily``).
4. **Request** runs of ``maintenance_batch_job`` over those tables, up to
   ``maintain.trigger.tables_per_run`` a run, keyed and remembered as the sensors' requests
   are (``sensors.requests``).
5. **Log** every other table: one row per operation of its daily pass (``skipped`` with the
   reason, ``failed`` for a table that cannot be read), in one pyiceberg commit, no JVM.

No table due: no run, and the skip reason says how many tables were looked at; unless the
log table itself is due for its upkeep and no run would do it (:func:`_log_upkeep`).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

from icegate_dagster.assets.names import (
    BATCH_JOB,
    DAILY_SCHEDULE,
    ICEBERG_TABLES,
    TABLES_TAG,
    TRIGGER_TAG,
    max_runtime_tags,
)
from icegate_dagster.assets.runs import BatchEntry, batch_run_config
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.log.upkeep import log_table_due
from icegate_dagster.maintenance.trigger.daily import DailyPass, plan_daily_pass
from icegate_dagster.maintenance.trigger.decision import decide
from icegate_dagster.maintenance.trigger.look import look_at_lakehouse
from icegate_dagster.maintenance.trigger.records import TableMemory
from icegate_dagster.maintenance.trigger.store import MemoryBusy
from icegate_dagster.sensors.health_sensor import LOOK_SHARE, NEED_TAG
from icegate_dagster.sensors.requests import new_decisions, request_runs, sensor_run_requests
from icegate_dagster.sensors.tick import Tick, partitions_to_add

#: Jobs whose every run keeps the log table in its last step.
MAINTENANCE_RUN_JOBS = frozenset({BATCH_JOB, "maintenance_job"})
#: How the log rows of a day's looked-at tables name their pass (``run_id``), after the
#: scheduled instant: ``schedule-20261127T030000Z``.
RUN_ID_PREFIX = "schedule-"


def daily_run_id(scheduled: datetime) -> str:
    """The ``run_id`` of the log rows the tick scheduled at ``scheduled`` writes."""
    return f"{RUN_ID_PREFIX}{scheduled.astimezone(UTC):%Y%m%dT%H%M%SZ}"


def daily_tick(
    context: dg.ScheduleEvaluationContext, tick: Tick
) -> list[dg.RunRequest] | dg.SkipReason:
    """One evaluation of ``daily_maintenance`` (the module docstring's five steps)."""
    config = tick.config
    scheduled = context.scheduled_execution_time or datetime.now(UTC)
    maintainer = tick.lakehouse.maintainer(run_id=daily_run_id(scheduled))
    listing = tick.list_lakehouse(maintainer)
    if isinstance(listing, dg.SkipReason):
        return listing
    partitions, add = partitions_to_add(context.instance, list(listing.tables))
    for request in add:  # a schedule returns no partition requests: added here
        context.instance.add_dynamic_partitions(ICEBERG_TABLES, list(request.partition_keys))

    budget = config.trigger.tick_deadline.total_seconds() * (1 - LOOK_SHARE)
    try:
        look = look_at_lakehouse(
            maintainer, tick.memory, tick.now, until=tick.deadline - budget, listing=listing
        )
    except MemoryBusy as exc:
        return dg.SkipReason(f"no daily pass: cannot store this tick's looks: {exc}")
    for table, error in sorted(look.errors.items())[:10]:
        context.log.warning(f"{table}: cannot assess its health: {error}")

    due = [t for t, h in look.healths.items() if h.due]
    memory = tick.read_memory(operations_of=due)
    busy = tick.busy(partitions)
    lost = tick.count_lost(memory, busy)
    if lost:
        tick.warnings.append(
            f"{len(lost)} requests no run answered, counted as failures: " + "; ".join(lost[:10])
        )
    # The daily pass serves every due table it may: the sensors' per-evaluation budget
    # (a tick every 30 s) is no bound on a pass made once a day.
    unbounded = config.trigger.model_copy(
        update={"max_tables": max(1, len(look.tables)), "max_bytes": 2**62}
    )
    selection, states = decide(look, memory, busy, now=tick.now, trigger=unbounded)
    daily = {table: maintainer.operations_for(TableRef.parse(table)) for table in look.tables}
    plan = plan_daily_pass(look, selection, daily, busy, at=datetime.fromtimestamp(tick.now, UTC))

    requests, unrequested = _requests(tick, plan, memory, states)
    written = _write_rows(maintainer, plan, tick)
    if not requests:
        requests = _log_upkeep(maintainer, tick, scheduled)
    for warning in tick.warnings:
        context.log.warning(warning)
    summary = f"{plan.summary()}; {written}"
    if unrequested:
        summary += f"; {unrequested}"
    if requests:
        context.log.info(
            f"{summary}; requesting {len(plan.requested)} tables in {len(requests)} runs"
        )
        return requests
    return dg.SkipReason(summary)


def _requests(
    tick: Tick, plan: DailyPass, memory: dict[str, TableMemory], states: dict[str, str]
) -> tuple[list[dg.RunRequest], str | None]:
    """The runs of the tables the pass asks for, remembered as the sensors' are; without a
    memory, keyed by fresh decisions (their nonces keep every key new)."""
    if not plan.requested:
        return [], None
    config = tick.config
    entries = [BatchEntry(r.table, r.operations, states.get(r.table)) for r in plan.requested]
    needs = {r.table: r.need for r in plan.requested}

    def need(chunk: Sequence[BatchEntry]) -> dict[str, str]:
        return {NEED_TAG: f"{max(needs[e.table] for e in chunk):g}"}

    per_run, limits = config.trigger.tables_per_run, max_runtime_tags(config)
    if tick.memory is None:
        decisions = new_decisions([e.table for e in entries], {})
        requests = sensor_run_requests(
            entries,
            decisions,
            trigger=DAILY_SCHEDULE,
            tables_per_run=per_run,
            tags=need,
            limits=limits,
        )
        return requests, None
    try:
        requests = request_runs(
            tick.memory,
            entries,
            memory,
            trigger=DAILY_SCHEDULE,
            tables_per_run=per_run,
            now=tick.now,
            tags=need,
            limits=limits,
        )
    except Exception as exc:
        return [], (
            f"no run requested: cannot remember the {len(entries)} requests in the trigger's "
            f"memory: {describe_error(exc, tick.scrub)}"
        )
    return requests, None


def _log_upkeep(maintainer: Maintainer, tick: Tick, scheduled: datetime) -> list[dg.RunRequest]:
    """A run of no table when the log table itself is due for upkeep (small files, rows past
    ``maintain.history.log``: every run keeps it, in its last step) and no maintenance run is
    unfinished: on a lakehouse where nothing else runs for weeks, the log the tick appends to
    every day does not rot. Its own orphan sweep alone asks for no run."""
    if any(r.dagster_run.job_name in MAINTENANCE_RUN_JOBS for r in tick.runs()):
        return []
    try:
        due = [op for op in log_table_due(maintainer) or () if op != "remove_orphan_files"]
    except Exception as exc:
        tick.warnings.append(f"cannot read the log table: {describe_error(exc, tick.scrub)}")
        return []
    if not due:
        return []
    stamp = f"{scheduled.astimezone(UTC):%Y%m%dT%H%M%SZ}"
    tick.warnings.append(f"the log table {maintainer.log_table.key} is due for {', '.join(due)}")
    return [
        dg.RunRequest(
            run_key=f"daily:log:{stamp}-{secrets.token_hex(8)}",
            job_name=BATCH_JOB,
            run_config=batch_run_config([]),
            tags={
                TRIGGER_TAG: DAILY_SCHEDULE,
                TABLES_TAG: "0",
                **max_runtime_tags(tick.config),
            },
        )
    ]


def _write_rows(maintainer: Maintainer, plan: DailyPass, tick: Tick) -> str:
    """Append the looked-at tables' rows in one commit (pyiceberg: no JVM); what was done."""
    ops = [op for table in plan.looked_at for op in table.ops]
    if not ops:
        return "no log row to write"
    try:
        maintainer.log.write(ops)
    except Exception as exc:
        message = f"{len(ops)} log rows not written: {describe_error(exc, tick.scrub)}"
        tick.warnings.append(message)
        return message
    return f"{len(ops)} log rows written (run_id {maintainer.run_id})"
