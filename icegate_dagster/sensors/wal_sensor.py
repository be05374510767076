"""``wal_size_sensor``: one tick, top to bottom.

1. **List** the catalog's tables (tables that are not partitions yet become partitions in
   this tick's result) and **size every WAL** with one recursive listing of ``wal.root``,
   waited for up to half of the tick's deadline: a longer one goes on in the background
   and serves the first tick after it ends (:mod:`~icegate_dagster.maintenance.wal.root_listing`).
   Tables with files in ``_quarantine`` are named, with since when, at every tick.
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
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import dagster as dg

from icegate_dagster.assets.names import BATCH_JOB, WAL_SENSOR, max_runtime_tags
from icegate_dagster.assets.runs import BatchEntry
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.exclusion import exclusion_of
from icegate_dagster.maintenance.trigger.look import list_tables
from icegate_dagster.maintenance.trigger.selection import waiting_since
from icegate_dagster.maintenance.wal import (
    ListingUnderWay,
    RootListings,
    WalStats,
    backlogs_of,
    compaction_due,
    configured_wal_root,
)
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.requests import request_runs
from icegate_dagster.sensors.tick import Tick, partitions_to_add

#: On a one-table run of ``wal_size_sensor``: its backlog (the table and its oldest waiting
#: file), the state the run answers.
BACKLOG_TAG = "icegate/wal_backlog"
OPERATION = "wal_compaction"
NAMED = 10
#: The share of ``tick_deadline`` a tick waits for the listing of ``wal.root``; the rest
#: is for healing, the trigger's memory and the requests.
LIST_SHARE = 0.5
#: The listings of ``wal.root`` under way in this code server (one per root): a listing
#: that outlasts its tick serves the next one.
WAL_LISTINGS = RootListings()


def backlog_id(table: str, stats: WalStats) -> str:
    """Names one backlog: the table and its oldest waiting file, which only an ingest removes."""
    return hashlib.sha256(f"{table}\n{stats.oldest}".encode()).hexdigest()[:16]


def _some(items: Sequence[str]) -> str:
    more = f"; and {len(items) - NAMED} more" if len(items) > NAMED else ""
    return "; ".join(items[:NAMED]) + more


def quarantine_note(backlogs: Mapping[str, WalStats]) -> list[str]:
    """The tables with files in ``_quarantine``, how many and since when, as one line (none
    when there are none). Such files are kept: they hold rows no table has, so only a
    person may move them back or delete them."""
    held = {t: s for t, s in backlogs.items() if s.quarantined}
    if not held:
        return []

    def since(stats: WalStats) -> str:
        at = stats.quarantined_oldest_at
        return datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds") if at else "?"

    ordered = sorted(held, key=lambda t: (held[t].quarantined_oldest_at or 0.0, t))
    files = sum(s.quarantined for s in held.values())
    return [
        f"{files} WAL files in quarantine need a person ({len(held)} tables; move a file back "
        "into its WAL folder once fixed, or delete it): "
        + _some([f"{t} ({held[t].quarantined} files, since {since(held[t])})" for t in ordered])
    ]


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
    wal_root = configured_wal_root(config)
    if wal_root is None:
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
    # The listing may use a share of the deadline; a slower one goes on for the next tick.
    waits_until = tick.deadline - config.trigger.tick_deadline.total_seconds() * (1 - LIST_SHARE)
    asked_at = time.time()
    try:
        listing = WAL_LISTINGS.wait(wal_root, waits_until)
    except Exception as exc:
        return dg.SensorResult(
            skip_reason=f"cannot list wal.root: {describe_error(exc, tick.scrub)}",
            dynamic_partitions_requests=add,
        )
    if isinstance(listing, ListingUnderWay):
        return dg.SensorResult(
            skip_reason=f"{listing.describe()}; nothing is requested meanwhile",
            dynamic_partitions_requests=add,
        )
    if listing.started_at < asked_at:
        context.log.info(
            "WAL sized by a listing of wal.root that an earlier tick started "
            f"{asked_at - listing.started_at:.0f} s ago (it took {listing.took_s:.0f} s)"
        )
    backlogs, unusable = backlogs_of(
        wal_root.uri, listing.folders, [TableRef.parse(t) for t in tables]
    )
    due = {
        table: stats
        for table, stats in backlogs.items()
        if compaction_due(stats.files, stats.bytes, config.for_table(table).compaction)
    }
    in_quarantine = quarantine_note(backlogs)
    if not due:
        waiting = sum(stats.files for stats in backlogs.values())
        reason = f"no WAL over its thresholds: {waiting} files waiting across {len(tables)} tables"
        return dg.SensorResult(
            skip_reason="; ".join([reason, *in_quarantine]), dynamic_partitions_requests=add
        )
    tick.warnings.extend(in_quarantine)
    tick.heal()
    busy = tick.busy(partitions, wal_only=True)
    memory = tick.read_memory(list(due), operations_of=list(due))
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
        reasons.extend(in_quarantine)
        return dg.SensorResult(skip_reason="; ".join(reasons), dynamic_partitions_requests=add)

    entries = [BatchEntry(t, (OPERATION,), backlog_id(t, due[t])) for t in chosen]

    def backlog_tags(chunk: Sequence[BatchEntry]) -> dict[str, str]:
        return {BACKLOG_TAG: chunk[0].state or ""} if len(chunk) == 1 else {}

    try:
        requests = request_runs(
            tick.memory,
            entries,
            memory,
            trigger=WAL_SENSOR,
            tables_per_run=config.trigger.tables_per_run,
            now=tick.now,
            limits=max_runtime_tags(config),
            tags=backlog_tags,
        )
    except Exception as exc:
        return dg.SensorResult(
            skip_reason=(
                f"no run requested: cannot remember the {len(entries)} requests in the "
                f"trigger's memory: {describe_error(exc, tick.scrub)}"
            ),
            dynamic_partitions_requests=add,
        )
    context.log.info(
        f"requesting wal_compaction of {len(chosen)} tables: "
        + _some([f"{t} ({due[t].files} files, {due[t].bytes} bytes)" for t in chosen])
        + (f"; {len(later)} more wait for the next tick (trigger.max_tables)" if later else "")
    )
    return dg.SensorResult(run_requests=requests, dynamic_partitions_requests=add)


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
