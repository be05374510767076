"""``wal_size_sensor``: one tick, top to bottom.

1. **List** the catalog's tables (tables that are not partitions yet become partitions in
   this tick's result) and **size every WAL** with one recursive listing of ``wal.root``.
2. Tables whose WAL reached ``compaction.min_files`` or ``min_size_bytes`` are **due**.
3. **Heal** runs whose worker is gone; leave the tables an unfinished run ingests, or a
   live lease holds, to them.
4. **Remember**: a request no run answered counts as a failed ingest; an ingest that
   failed (inside a successful run too) or left its WAL due twice or more in a row backs
   off, doubling to ``trigger.backoff_max`` (the trigger's memory).
5. **Request** the rest, longest-waiting first, up to ``trigger.max_tables`` a tick and
   ``tables_per_run`` tables a run, each doing ``wal_compaction`` only, keyed by a new
   decision number each.

Everything ends within ``maintain.trigger.tick_deadline``; the only I/O per tick is the
catalog listing, the WAL listing, one question to the instance, and the trigger's memory
for the due tables.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Sequence

import dagster as dg

from icegate_dagster.automation.look import list_tables
from icegate_dagster.automation.requests import sensor_run_requests
from icegate_dagster.automation.runs import BATCH_JOB, WAL_SENSOR, BatchEntry, max_runtime_tags
from icegate_dagster.automation.tick import Tick, partitions_to_add
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.exclusion import exclusion_of
from icegate_dagster.maintenance.trigger.records import TableMemory
from icegate_dagster.maintenance.trigger.selection import waiting_since
from icegate_dagster.maintenance.wal import WalStats, compaction_due, wal_backlogs
from icegate_dagster.resources import LakehouseResource

#: On a one-table run of ``wal_size_sensor``: its backlog (the table and its oldest waiting
#: file), the state the run answers.
BACKLOG_TAG = "icegate/wal_backlog"
OPERATION = "wal_compaction"
NAMED = 10


def backlog_id(table: str, stats: WalStats) -> str:
    """Names one backlog: the table and its oldest waiting file, which only an ingest removes."""
    return hashlib.sha256(f"{table}\n{stats.oldest}".encode()).hexdigest()[:16]


def _some(items: Sequence[str]) -> str:
    more = f"; and {len(items) - NAMED} more" if len(items) > NAMED else ""
    return "; ".join(items[:NAMED]) + more


def wal_exclusions(tick: Tick, tables: list[str]) -> dict[str, str]:
    """The tables whose WAL ingest is excluded from maintenance, with why: by the
    configuration, or by a table property the health trigger's last look read (one question
    to the trigger's memory; a table not looked at yet is judged by the configuration)."""
    looks = {}
    if tick.memory is not None:
        with contextlib.suppress(Exception):  # judged by the configuration alone
            looks = tick.memory.stored_looks(tables)
    excluded = {}
    for table in tables:
        seen = looks.get(table)
        why = seen.health.excluded_operations.get(OPERATION) if seen and seen.health else None
        if why is None:
            with contextlib.suppress(IcegateError):  # a bad setting fails the run, naming it
                why = exclusion_of(tick.config, table, {}).reason(OPERATION)
        if why is not None:
            excluded[table] = why
    return excluded


def wal_tick(context: dg.SensorEvaluationContext, tick: Tick) -> dg.SensorResult | dg.SkipReason:
    """One evaluation of ``wal_size_sensor`` (the module docstring's five steps)."""
    config = tick.config
    if not config.wal_root:
        return dg.SkipReason("wal.root is not configured: there is no WAL to watch")
    maintainer = tick.lakehouse.maintainer(run_id="wal")
    try:
        tables = list(list_tables(maintainer).tables)
    except Exception as exc:
        return dg.SkipReason(
            f"cannot list the tables of catalog {config.catalog.name!r}: "
            f"{describe_error(exc, tick.scrub)}"
        )
    partitions, add = partitions_to_add(context.instance, tables)
    try:
        backlogs, unusable = wal_backlogs(config.wal_root, [TableRef.parse(t) for t in tables])
    except Exception as exc:
        return dg.SensorResult(
            skip_reason=f"cannot list wal.root: {describe_error(exc, tick.scrub)}",
            dynamic_partitions_requests=add,
        )
    due = {
        table: stats
        for table, stats in backlogs.items()
        if compaction_due(stats.files, stats.bytes, config.for_table(table).compaction)
    }
    if not due:
        waiting = sum(stats.files for stats in backlogs.values())
        return dg.SensorResult(
            skip_reason=(
                f"no WAL over its thresholds: {waiting} files waiting across {len(tables)} tables"
            ),
            dynamic_partitions_requests=add,
        )
    tick.heal()
    busy = tick.busy(partitions, wal_only=True)
    memory: dict[str, TableMemory] = {}
    if tick.memory is not None:
        try:
            memory = tick.memory.tables_memory(list(due), operations_of=list(due))
        except Exception as exc:
            tick.warnings.append(
                f"cannot read the trigger's memory: {describe_error(exc, tick.scrub)}"
            )
    lost = tick.count_lost(memory, busy)
    if lost:
        tick.warnings.append("requests no run answered, counted as failures: " + _some(lost))

    excluded = wal_exclusions(tick, list(due))
    in_flight, backing_off, ready = [], [], []
    for table in due:
        if table in excluded:
            continue
        if table in busy:
            in_flight.append(f"{table} ({busy[table]})")
            continue
        remembered = memory.get(table)
        attempt = remembered.operations.get(OPERATION) if remembered is not None else None
        if attempt is not None and attempt.waits(tick.now):
            backing_off.append(f"{table} ({attempt.describe()})")
            continue
        ready.append(table)

    def turn(table: str) -> tuple[float, int, str]:
        # Waiting since its oldest file was written, or since it was last served.
        return (waiting_since(memory.get(table), due[table].oldest_at), -due[table].bytes, table)

    ready.sort(key=turn)
    chosen, later = ready[: config.trigger.max_tables], ready[config.trigger.max_tables :]
    if backing_off:
        tick.warnings.append("backing off WAL ingests that keep failing: " + _some(backing_off))
    for warning in tick.warnings:
        context.log.warning(warning)
    if not chosen or tick.memory is None:
        reasons = []
        if chosen:
            reasons.append(
                f"{len(chosen)} tables over their WAL thresholds, but the trigger's memory "
                f"(the lease store) is needed to number run requests: {tick.store_error}"
            )
        if in_flight:
            reasons.append(
                f"{len(in_flight)} tables over their WAL thresholds already have a run or a "
                "maintainer: " + _some(in_flight)
            )
        if backing_off:
            reasons.append("backing off after failed ingests: " + _some(backing_off))
        if excluded:
            reasons.append(
                f"{len(excluded)} tables over their WAL thresholds are excluded from "
                "maintenance: " + _some([f"{t} ({why})" for t, why in excluded.items()])
            )
        return dg.SensorResult(skip_reason="; ".join(reasons), dynamic_partitions_requests=add)

    decisions = tick.memory.record_requests(
        [(t, (OPERATION,)) for t in chosen], WAL_SENSOR, tick.now
    )
    entries = [BatchEntry(t, (OPERATION,), backlog_id(t, due[t])) for t in chosen]
    context.log.info(
        f"requesting wal_compaction of {len(chosen)} tables: "
        + _some([f"{t} ({due[t].files} files, {due[t].bytes} bytes)" for t in chosen])
        + (f"; {len(later)} more wait for the next tick (trigger.max_tables)" if later else "")
    )

    def backlog_tags(chunk: Sequence[BatchEntry]) -> dict[str, str]:
        return {BACKLOG_TAG: chunk[0].state or ""} if len(chunk) == 1 else {}

    return dg.SensorResult(
        run_requests=sensor_run_requests(
            entries,
            decisions,
            trigger=WAL_SENSOR,
            tables_per_run=config.trigger.tables_per_run,
            tags=backlog_tags,
            limits=max_runtime_tags(config),
        ),
        dynamic_partitions_requests=add,
    )


@dg.sensor(
    name=WAL_SENSOR,
    job_name=BATCH_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests wal_compaction of the tables whose WAL reached min_files or min_size_bytes "
        "(one listing of wal.root a tick), maintain.trigger.tables_per_run tables per run, "
        "longest-waiting first; backs off ingests that keep failing (the trigger's memory)."
    ),
)
def wal_size_sensor(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """See :func:`wal_tick`."""
    return wal_tick(context, Tick.start(context, lakehouse))
