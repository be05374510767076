"""Sensors: table discovery, WAL size and table health, all on metadata only (never a JVM)."""

import hashlib
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from icegate_dagster.assets.health_events import (
    LAKEHOUSE_HEARTBEAT_S,
    TICK_SECONDS,
    HealthCursor,
    lakehouse_digest,
    table_health_events,
)
from icegate_dagster.assets.lakehouse_health import (
    ASSESS_SECONDS,
    LAKEHOUSE_HEALTH,
    describe,
    evaluate_health_trigger,
    lakehouse_health_metadata,
)
from icegate_dagster.assets.partition_events import MAINTAINED_TABLE
from icegate_dagster.batches import sensor_run_requests
from icegate_dagster.catalog import scrub
from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import IcegateError, describe_error
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import RunLiveness
from icegate_dagster.maintenance.wal import WalStats, compaction_due, wal_stats
from icegate_dagster.partitions import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.runs import (
    BATCH_JOB,
    HEALTH_SENSOR,
    WAL_SENSOR,
    BatchEntry,
    fail_dead_runs,
    runs_by_table,
    unfinished_run_targets,
)


def partition_changes(discovered: list[str], current: list[str]) -> tuple[list[str], list[str]]:
    """Tables to add as partitions, and partitions whose table is gone."""
    found, known = set(discovered), set(current)
    return sorted(found - known), sorted(known - found)


def _some(keys: list[str], shown: int = 10) -> str:
    """A readable list: the first ``shown`` keys, then how many more."""
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(keys[:shown]) + more


@dg.sensor(
    name="iceberg_table_discovery",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Adds a partition of maintained_table for each new table; removes dropped ones.",
)
def iceberg_table_discovery(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Keep the partitions equal to the catalog's tables (``_``-prefixed ones excluded)."""
    maintainer = lakehouse.maintainer(run_id="discovery")
    discovered = [ref.key for ref in maintainer.discover()]
    current = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    added, removed = partition_changes(discovered, current)
    deferred = still_targeted(context.instance, current, removed)
    if deferred:
        # Deleting a partition an unfinished run names as its range start or end fails
        # that whole run in Dagster (none of its tables is maintained); one in the middle
        # of a range would silently leave the run. They go once the runs are over.
        removed = [key for key in removed if key not in deferred]
        context.log.info(
            f"{len(deferred)} dropped tables stay partitions until the runs or backfills "
            f"naming them finish: {_some(sorted(deferred))}"
        )
    if not added and not removed:
        if deferred:
            return dg.SkipReason(
                f"{len(deferred)} tables gone from the catalog stay partitions until the "
                f"unfinished runs or backfills that target them finish (deleting them now "
                f"would fail those runs): "
                + "; ".join(f"{key} ({why})" for key, why in sorted(deferred.items()))
            )
        return dg.SkipReason(
            f"no change: the {len(discovered)} tables of catalog "
            f"{maintainer.config.catalog.name!r} are all partitions already"
        )
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if added:
        context.log.info(f"{len(added)} new tables: {_some(added)}")
        requests.append(iceberg_tables.build_add_request(added))
    if removed:
        context.log.info(f"{len(removed)} tables gone from the catalog: {_some(removed)}")
        requests.append(iceberg_tables.build_delete_request(removed))
    return dg.SensorResult(dynamic_partitions_requests=requests)


#: Backfill statuses (``BulkActionStatus`` values) that may still launch runs.
UNFINISHED_BACKFILLS = {"REQUESTED", "CANCELING", "FAILING"}


def still_targeted(
    instance: dg.DagsterInstance, current: list[str], removed: list[str]
) -> dict[str, str]:
    """Which of the ``removed`` partitions an unfinished run or backfill still targets, and
    why (run or backfill id and status).

    A run names its partition in the tag ``dagster/partition``, a batch of several as the
    range ``dagster/asset_partition_range_start``..``_end`` over the partitions' stored
    order (``current``). Dagster fails a whole run whose range start or end partition no
    longer exists, so those partitions wait until the run is over. An in-progress backfill
    of ``maintained_table`` holds every dropped table back (which partitions an asset
    backfill still has to launch is not public), a job backfill the ones it names.
    """
    if not removed:
        return {}
    gone = set(removed)
    deferred = {
        key: why for key, why in unfinished_run_targets(instance, current).items() if key in gone
    }
    for backfill in instance.get_backfills(limit=200):
        status = getattr(getattr(backfill, "status", None), "value", "")
        if status not in UNFINISHED_BACKFILLS:
            continue
        names = set(getattr(backfill, "partition_names", None) or ())
        assets = set(getattr(backfill, "asset_selection", None) or ())
        targeted = gone & names if names else (gone if MAINTAINED_TABLE in assets else set())
        for key in sorted(targeted):
            deferred.setdefault(key, f"backfill {backfill.backfill_id} is {status.lower()}")
    return deferred


def settle_dead_runs(context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> None:
    """Mark failed the ``STARTED`` runs whose worker is gone (see ``runs.fail_dead_runs``),
    so their tables are requested again and queued runs start. A lease store that cannot be
    read leaves every run as it is, saying why."""
    config = lakehouse.config()

    def liveness(run_ids: list[str]) -> dict[str, RunLiveness]:
        store = lease_store(config, lakehouse.catalog())
        return store.run_liveness(run_ids) if store is not None else {}

    try:
        dead = fail_dead_runs(context.instance, liveness, config.locks.lease)
    except Exception as exc:  # the sensor's own work goes on
        error = describe_error(exc, lambda text: scrub(text, config))
        context.log.warning(f"cannot check for runs whose worker is gone: {error}")
        return
    for run in dead:
        tables = f" (tables: {', '.join(run.tables)})" if run.tables else ""
        context.log.warning(
            f"run {run.run_id} of {run.job_name}{tables} marked failed: {run.reason}"
        )


#: After a second failed WAL run of a backlog, the next attempt waits this long, doubling
#: with each further failure...
BACKOFF_BASE = timedelta(minutes=1)
#: ...up to this.
BACKOFF_MAX = timedelta(hours=1)


def backoff_until(records: list[Any]) -> tuple[int, datetime | None]:
    """How many runs of a backlog failed, and until when the next attempt must wait."""
    failed = [r for r in records if r.dagster_run.status == dg.DagsterRunStatus.FAILURE]
    if len(failed) < 2:  # one failure is retried at the next tick
        return len(failed), None
    last = max(
        (r.end_time if r.end_time is not None else r.update_timestamp.timestamp()) for r in failed
    )
    wait = min(BACKOFF_BASE * 2 ** (len(failed) - 2), BACKOFF_MAX)
    return len(failed), datetime.fromtimestamp(last, UTC) + wait


def wal_backlogs(config: IcegateConfig, tables: list[str]) -> dict[str, tuple[WalStats, bool]]:
    """Each table's waiting WAL and whether it has reached its compaction thresholds."""
    backlogs = {}
    for key in tables:
        try:
            stats = wal_stats(config.wal_root, TableRef.parse(key))
        except (IcegateError, OSError):  # an unreadable WAL folder must not stop the others
            continue
        backlogs[key] = (
            stats,
            compaction_due(stats.files, stats.bytes, config.for_table(key).compaction),
        )
    return backlogs


BACKLOG_TAG = "icegate/wal_backlog"
#: The neediest table's need (100 - score) on a health trigger run.
NEED_TAG = "icegate/need"


def backlog_id(table: str, stats: WalStats) -> str:
    """Names one backlog: the table and its oldest waiting file, which only an ingest removes."""
    return hashlib.sha256(f"{table}\n{stats.oldest}".encode()).hexdigest()[:16]


@dg.sensor(
    name=WAL_SENSOR,
    job_name=BATCH_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Requests wal_compaction of the tables whose WAL reached min_files or min_size_bytes, "
        "maintain.trigger.tables_per_run tables per run. Sizes the WAL from the file system "
        "only."
    ),
)
def wal_size_sensor(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """One run per backlog at a time: none while a run covers the table, a new one after.

    A backlog is the table plus its oldest waiting file. The tables due at one tick share
    runs of ``maintenance_batch_job`` (each doing ``wal_compaction`` only), each table
    with its backlog as its state; the ``run_key`` adds how many runs the backlog had, so a
    run that failed (the backlog is still there) is followed by a new attempt, while
    repeated ticks during one attempt request the same key and Dagster launches no
    duplicate.
    """
    config = lakehouse.config()
    if not config.wal_root:
        return dg.SkipReason("wal.root is not configured: there is no WAL to watch")
    stored = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    tables = sorted(stored)
    if not tables:
        return dg.SkipReason(
            "no tables are partitions of maintained_table yet: "
            "turn on the iceberg_table_discovery sensor"
        )
    backlogs = wal_backlogs(config, tables)
    due = {key: stats for key, (stats, is_due) in backlogs.items() if is_due}
    waiting = sum(stats.files for stats, _ in backlogs.values())
    if not due:
        return dg.SkipReason(
            f"no WAL over its thresholds: {waiting} files waiting across {len(tables)} tables"
        )
    settle_dead_runs(context, lakehouse)
    entries: list[tuple[BatchEntry, str]] = []
    busy, waiting_out = [], []
    # A queued or running run that ingests the table's WAL covers it: one of ours, the
    # schedule's, a backfill's.
    covered = unfinished_run_targets(context.instance, stored, wal_only=True)
    history = runs_by_table(context.instance, WAL_SENSOR, due)
    now = datetime.now(UTC)
    for key, stats in due.items():
        backlog = backlog_id(key, stats)
        if key in covered:
            busy.append(f"{key} ({covered[key]})")
            continue
        records = [run.record for run in history.get(key, []) if run.state == backlog]
        failures, not_before = backoff_until(records)
        if not_before is not None and now < not_before:
            waiting_out.append(
                f"{key} ({failures} failed runs; next attempt after "
                f"{not_before:%Y-%m-%d %H:%M:%S} UTC)"
            )
            continue
        context.log.info(
            f"{key}: {stats.files} WAL files, {stats.bytes} bytes: compacting"
            + (f" (attempt {len(records) + 1})" if records else "")
        )
        entry = BatchEntry(key, ("wal_compaction",), backlog)
        entries.append((entry, f"{key}:{backlog}:{len(records)}"))
    if waiting_out:
        context.log.warning(
            "backing off WAL backlogs whose runs keep failing: " + "; ".join(waiting_out)
        )
    if not entries:
        reasons = []
        if busy:
            reasons.append(
                f"{len(busy)} tables over their WAL thresholds already have a run in progress: "
                + ", ".join(busy)
            )
        if waiting_out:
            reasons.append("backing off after failed runs: " + "; ".join(waiting_out))
        return dg.SkipReason("; ".join(reasons))

    def backlog_tags(chunk: Sequence[BatchEntry]) -> dict[str, str]:
        return {BACKLOG_TAG: chunk[0].state or ""} if len(chunk) == 1 else {}

    return dg.SensorResult(
        run_requests=sensor_run_requests(
            entries,
            trigger=WAL_SENSOR,
            tables_per_run=config.trigger.tables_per_run,
            tags=backlog_tags,
        )
    )


@dg.sensor(
    name=HEALTH_SENSOR,
    job_name=BATCH_JOB,
    minimum_interval_seconds=30,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description=(
        "Assesses every table's health from its metadata (no JVM) and requests runs of the "
        "tables with due operations, each doing exactly its own, neediest first within "
        "maintain.trigger's budget and up to maintain.trigger.tables_per_run tables per run; "
        "never a table with a run in flight, none more often than its health.min_interval, "
        "backing off tables whose runs keep failing. Marks failed the runs whose worker is "
        "gone. Records each table's health on its partition (an assessment of a table never "
        "maintained, then observations) and lakehouse_health when they change."
    ),
)
def table_health_sensor(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Runs of ``maintenance_batch_job`` for the selected tables; each table's health and
    ``lakehouse_health`` in the UI, recorded when they change (see ``health_events``).

    The runs carry ``icegate/trigger=table_health_sensor`` and ``icegate/need`` (the
    neediest table's); each table's state is in the run config (and in ``icegate/table``
    and ``icegate/table_state`` on a one-table run). The ``run_key`` is made of each table,
    its state and the attempt on that state, so ticks during one attempt request the same
    key (Dagster launches no duplicate) while a failed attempt is followed by a new one
    (after its back-off). The cursor (:class:`HealthCursor`) holds the table the next
    evaluation starts at when one ran out of time, and what the UI shows of each table.
    """
    started, assessed_at = time.monotonic(), time.time()
    tables = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    if not tables:
        return dg.SkipReason(
            "no tables are partitions of maintained_table yet: "
            "turn on the iceberg_table_discovery sensor"
        )
    settle_dead_runs(context, lakehouse)
    config = lakehouse.config()
    cursor = HealthCursor.parse(context.cursor)
    evaluation = evaluate_health_trigger(
        context.instance,
        lakehouse,
        tables,
        datetime.now(UTC),
        resume_at=cursor.resume_at,
        seconds=ASSESS_SECONDS,
    )
    selection = evaluation.selection
    report = evaluation.report(config.defaults.health.min_score)
    for key, error in sorted(evaluation.errors.items()):
        context.log.warning(f"{key}: cannot assess its health, skipped: {error}")
    if evaluation.resume_at is not None:
        context.log.warning(
            f"assessed {report.assessed} of {report.tables} tables in {ASSESS_SECONDS:g} s; "
            f"the next evaluation resumes at {evaluation.resume_at}"
        )
    backing_off = selection.skipped_as("backoff")
    if backing_off:
        context.log.warning(
            "backing off tables whose runs keep failing: "
            + "; ".join(f"{s.table} ({s.reason})" for s in backing_off)
        )
    entries: list[tuple[BatchEntry, str]] = []
    needs: dict[str, float] = {}
    for request in selection.requested:
        state = evaluation.states[request.table]
        attempt = evaluation.attempts.get(request.table, 0)
        context.log.info(
            f"{request.table}: need {request.need}, requesting {', '.join(request.operations)}"
            + (f" (attempt {attempt + 1} on this state)" if attempt else "")
            + ": "
            + "; ".join(request.reasons)
        )
        entries.append(
            (
                BatchEntry(request.table, request.operations, state),
                f"{request.table}:{state}:{attempt}",
            )
        )
        needs[request.table] = request.need

    def need_tag(chunk: Sequence[BatchEntry]) -> dict[str, str]:
        return {NEED_TAG: f"{max(needs[entry.table] for entry in chunk):g}"}

    requests = sensor_run_requests(
        entries,
        trigger=HEALTH_SENSOR,
        tables_per_run=config.trigger.tables_per_run,
        tags=need_tag,
    )
    # What the UI shows of each table, and the lakehouse's totals: recorded on change only.
    events, cursor = table_health_events(
        context.instance,
        cursor,
        tables,
        evaluation.healths,
        evaluation.errors,
        evaluation.min_scores,
        busy=[r.table for r in selection.requested] + list(evaluation.in_flight),
        assessed_at=assessed_at,
        deadline=started + TICK_SECONDS,
    )
    cursor.resume_at = evaluation.resume_at
    digest, now = lakehouse_digest(report.numbers()), time.time()
    if digest != cursor.lakehouse or now - cursor.lakehouse_at >= LAKEHOUSE_HEARTBEAT_S:
        lakehouse_event = dg.AssetMaterialization(
            asset_key=LAKEHOUSE_HEALTH,
            description=describe(report),
            metadata=lakehouse_health_metadata(report),
        )
        events.insert(0, lakehouse_event)
        cursor.lakehouse, cursor.lakehouse_at = digest, now
    stored = cursor.serialize()
    skip = None
    if not requests:
        skip = selection.summary()
        if evaluation.errors:
            skip += f"; {len(evaluation.errors)} tables could not be assessed: " + _some(
                sorted(evaluation.errors)
            )
    return dg.SensorResult(
        run_requests=requests,
        skip_reason=skip,
        asset_events=events,
        cursor=stored if stored != context.cursor else None,
    )
