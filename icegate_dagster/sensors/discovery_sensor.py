"""``iceberg_table_discovery``: the partitions of ``maintained_table`` follow the catalog.

A new table becomes a partition (the health and WAL sensors add them too, so a fresh
lakehouse is maintained from their first tick). A partition is removed only once its
table is **confirmed gone**: missing from the listing *and* the catalog answering, when
asked for that very table, that it does not exist. A listing that comes back short (a
REST catalog in failover answering "no such namespace", a namespace listed while it is
being recreated) removes nothing; a table that cannot be asked about stays. Partitions an
unfinished run or a requested backfill still names wait until it is over (a canceled
or failing backfill launches no more runs: only its unfinished runs hold their tables).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime

import dagster as dg

from icegate_dagster.assets.names import ICEBERG_TABLES, MAINTAINED_TABLE, iceberg_tables
from icegate_dagster.assets.runs import unfinished_run_targets
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.trigger.look import list_tables
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.run_history import forget_old_runs
from icegate_dagster.sensors.tick import Tick

#: The key of the sensor's cursor that says where the run history's pruning goes on.
RUNS_CURSOR = "runs_after"
#: Backfill statuses (``BulkActionStatus`` values) that may still launch runs: only a
#: requested backfill does. CANCELING and FAILING only cancel the runs it launched (and
#: last until a daemon's backfill loop has seen them all end: without a daemon, for ever);
#: those runs pin their tables by themselves while they are unfinished.
LAUNCHING_BACKFILLS = {"REQUESTED"}


def partition_changes(discovered: list[str], current: list[str]) -> tuple[list[str], list[str]]:
    """Tables to add as partitions, and partitions whose table is not listed."""
    found, known = set(discovered), set(current)
    return sorted(found - known), sorted(known - found)


def _some(keys: Sequence[str], shown: int = 10) -> str:
    """A readable list: the first ``shown`` keys, then how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


def confirmed_gone(tick: Tick, missing: list[str]) -> tuple[list[str], dict[str, str]]:
    """Of the partitions the listing left out, those the catalog confirms do not exist,
    and the others with why they stay (the table is there after all, or could not be asked
    about). Stops asking at the tick's deadline: the rest stay for the next tick."""
    catalog = tick.lakehouse.catalog()
    gone: list[str] = []
    kept: dict[str, str] = {}
    for key in missing:
        if tick.left() < 1.0:
            kept[key] = "not asked about yet (the tick's deadline)"
            continue
        try:
            exists = catalog.table_exists(TableRef.parse(key).identifier)
        except Exception as exc:
            kept[key] = f"cannot confirm it is gone: {describe_error(exc, tick.scrub)}"
            continue
        if exists:
            kept[key] = "missing from the listing, but the catalog still has it"
        else:
            gone.append(key)
    return gone, kept


def still_targeted(
    instance: dg.DagsterInstance, current: list[str], removed: list[str]
) -> dict[str, str]:
    """Which of the ``removed`` partitions an unfinished run or backfill still targets, and
    why (run or backfill id and status).

    Dagster fails a whole run whose range start or end partition no longer exists, so
    those partitions wait until the run is over. A requested backfill of
    ``maintained_table`` holds every dropped table back (which partitions an asset
    backfill still has to launch is not public), a job backfill the ones it names. A
    backfill canceled or failing (CANCELING, FAILING) launches no more runs and holds
    nothing: the runs it launched and are not over still hold their tables.
    """
    if not removed:
        return {}
    gone = set(removed)
    deferred = {
        key: why for key, why in unfinished_run_targets(instance, current).items() if key in gone
    }
    for backfill in instance.get_backfills(limit=200):
        status = getattr(getattr(backfill, "status", None), "value", "")
        if status not in LAUNCHING_BACKFILLS:
            continue
        names = set(getattr(backfill, "partition_names", None) or ())
        assets = set(getattr(backfill, "asset_selection", None) or ())
        targeted = gone & names if names else (gone if MAINTAINED_TABLE in assets else set())
        for key in sorted(targeted):
            deferred.setdefault(key, f"backfill {backfill.backfill_id} is {status.lower()}")
    return deferred


def discovery_tick(
    context: dg.SensorEvaluationContext, tick: Tick
) -> dg.SensorResult | dg.SkipReason:
    """One evaluation of ``iceberg_table_discovery``."""
    config = tick.config
    maintainer = tick.lakehouse.maintainer(run_id="discovery")
    try:
        discovered = list(list_tables(maintainer).tables)
    except Exception as exc:
        return dg.SkipReason(
            f"cannot list the tables of catalog {config.catalog.name!r}, nothing changed: "
            f"{describe_error(exc, tick.scrub)}"
        )
    current = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    added, missing = partition_changes(discovered, current)
    removed, kept = confirmed_gone(tick, missing)
    deferred = still_targeted(context.instance, current, removed)
    if deferred:
        # Deleting a partition an unfinished run names as its range start or end fails
        # that whole run in Dagster (none of its tables is maintained); one in the middle
        # of a range would silently leave the run. They go once the runs are over.
        removed = [key for key in removed if key not in deferred]
        kept.update(deferred)
    if kept:
        context.log.info(
            f"{len(kept)} partitions missing from the listing stay: "
            + _some([f"{key} ({why})" for key, why in sorted(kept.items())])
        )
    if not added and not removed:
        if kept:
            return dg.SkipReason(
                f"{len(kept)} partitions missing from the listing stay: "
                + _some([f"{key} ({why})" for key, why in sorted(kept.items())])
            )
        return dg.SkipReason(
            f"no change: the {len(discovered)} tables of catalog "
            f"{config.catalog.name!r} are all partitions already"
        )
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if added:
        context.log.info(f"{len(added)} new tables: {_some(added)}")
        requests.append(iceberg_tables.build_add_request(added))
    if removed:
        context.log.info(f"{len(removed)} tables confirmed gone from the catalog: {_some(removed)}")
        requests.append(iceberg_tables.build_delete_request(removed))
        if tick.memory is not None:
            try:
                tick.memory.forget(removed)
            except Exception as exc:
                context.log.warning(f"cannot forget dropped tables: {exc}")
    return dg.SensorResult(dynamic_partitions_requests=requests)


@dg.sensor(
    name="iceberg_table_discovery",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Adds a partition of maintained_table for each new table; removes a partition once "
        "the catalog, asked for that very table, confirms it is gone: a listing that comes "
        "back short (a REST catalog in failover answering 'no such namespace') removes "
        "nothing, and a table that cannot be asked about stays (pyiceberg only, no JVM). A "
        "dropped table stays a partition while an unfinished run names it as "
        "dagster/partition or lies in its range, or while a backfill of maintained_table is "
        "requested (a canceled or failing one launches no more runs: only its unfinished "
        "runs hold their tables; Dagster fails a whole run whose range start or end "
        "partition no longer exists); the tick's skip reason names the tables kept and what "
        "holds them. Each tick also deletes, a bounded number at a time, this code "
        "location's finished runs older than maintain.history.runs (never unfinished runs, "
        "other code locations' runs or a run holding a table's latest materialization)."
    ),
)
def iceberg_table_discovery(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """See :func:`discovery_tick`, then :func:`keep_run_history`."""
    tick = Tick.start(context, lakehouse)
    result = discovery_tick(context, tick)
    keep_run_history(context, tick)
    return result


def keep_run_history(context: dg.SensorEvaluationContext, tick: Tick) -> None:
    """Delete this code location's finished runs older than ``maintain.history.runs``
    (see :mod:`~icegate_dagster.sensors.run_history`), a bounded number per tick, going
    on where the last tick stopped (the sensor's cursor). A failure is logged, never fatal."""
    keep = tick.config.history.runs
    if keep is None:
        return
    origin = context.code_location_origin
    try:
        cursor = json.loads(context.cursor).get(RUNS_CURSOR) if context.cursor else None
    except (ValueError, AttributeError):
        cursor = None
    try:
        # Dagster stamps a run's end with this host's clock: the cutoff is read from it too.
        forgotten = forget_old_runs(
            context.instance,
            origin.location_name if origin is not None else None,
            keep,
            datetime.now(UTC),
            cursor=cursor,
            seconds_left=tick.left,
        )
    except Exception as exc:
        context.log.warning(f"run history not pruned: {describe_error(exc, tick.scrub)}")
        return
    if forgotten.deleted:
        context.log.info(forgotten.summary())
    context.update_cursor(json.dumps({RUNS_CURSOR: forgotten.cursor}))
