"""``lakehouse_health``: the whole lakehouse's health over time, and its least healthy tables.

Recorded two ways, with the same metadata: by ``table_health_sensor`` whenever its
figures change and at least hourly (a materialization reported with the tick, no run),
and by materializing the asset (the UI's Materialize button), which assesses every table
now and reports what the trigger would do. Numbers are numeric metadata, so the asset's
Plots tab draws them over time.

:func:`evaluate_health_trigger` is that one evaluation: each table's health from its
metadata (pyiceberg, no JVM), then the trigger's decision from what the instance knows.
"""

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from icegate_dagster import render
from icegate_dagster.assets.partition_events import (
    ASSESSMENT_SOURCE,
    MAINTAINED_TABLE,
    source_of,
)
from icegate_dagster.catalog import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import OPERATIONS, TableRef
from icegate_dagster.maintenance.health.score import TableHealth, assess_table, thresholds_for
from icegate_dagster.maintenance.health.selection import (
    LakehouseHealth,
    Selection,
    rotation,
    select_runs,
    summarize,
)
from icegate_dagster.maintenance.wal import WalStats, wal_stats
from icegate_dagster.partitions import ICEBERG_TABLES
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.runs import (
    HEALTH_SENSOR,
    runs_by_table,
    trigger_history,
    unfinished_run_targets,
)

LAKEHOUSE_HEALTH = dg.AssetKey("lakehouse_health")
LEAST_HEALTHY_COLUMNS = ("table", "score", "due operations", "why", "trigger")
#: Seconds one sensor evaluation spends assessing tables before it leaves the rest to the
#: next (Dagster cancels a sensor evaluation after 60 s by default); it resumes there.
ASSESS_SECONDS = 40.0
#: A table's recent trigger runs and materializations read to count failures in a row.
HISTORY = 25


@dataclass
class HealthEvaluation:
    """One look at the lakehouse: each table's health, and what the trigger does about it."""

    #: Every partition of ``iceberg_tables``.
    tables: list[str]
    healths: dict[str, TableHealth]
    #: Tables that could not be assessed, with the error.
    errors: dict[str, str]
    #: Per assessed table: its metadata, WAL and due work in one id (see :func:`table_state`).
    states: dict[str, str]
    #: Per due table: the trigger's earlier runs on its current state.
    attempts: dict[str, int]
    #: Per assessed table: the score its ``healthy`` check fails below.
    min_scores: dict[str, float]
    #: Tables an unfinished run names, with that run.
    in_flight: dict[str, str]
    selection: Selection
    #: Where the next evaluation starts, when this one ran out of time (else ``None``).
    resume_at: str | None

    def report(self, default_min_score: float) -> LakehouseHealth:
        """The ``lakehouse_health`` figures of this evaluation."""
        return summarize(
            list(self.healths.values()),
            tables=len(self.tables),
            default_min_score=default_min_score,
            errors=self.errors,
            selection=self.selection,
        )


def table_state(metadata_location: str, wal: WalStats | None, health: TableHealth) -> str:
    """Names what the trigger knows of a table: its metadata file, its waiting WAL, and what
    is due and why. A run that succeeded on one state is not repeated until it changes."""
    wal_part = f"{wal.files}/{wal.bytes}/{wal.oldest}" if wal is not None else "-"
    due = "\n".join(f"{d.operation}: {d.reason}" for d in health.due)
    return hashlib.sha256(f"{metadata_location}\n{wal_part}\n{due}".encode()).hexdigest()[:16]


def evaluate_health_trigger(
    instance: dg.DagsterInstance,
    lakehouse: LakehouseResource,
    tables: list[str],
    now: datetime,
    *,
    resume_at: str | None = None,
    seconds: float | None = ASSESS_SECONDS,
) -> HealthEvaluation:
    """Assess each table from its metadata (pyiceberg, no JVM), then decide with
    :func:`~icegate_dagster.maintenance.triggering.select_runs` from the runs and
    materializations the instance holds (asked only about tables with due work).

    With ``seconds`` set, tables are assessed in name order from ``resume_at`` until that
    time is spent (one table at least); the rest wait for the next evaluation.
    """
    maintainer = lakehouse.maintainer(run_id="health")
    config = maintainer.config
    deadline = None if seconds is None else time.monotonic() + seconds
    healths: dict[str, TableHealth] = {}
    errors: dict[str, str] = {}
    states: dict[str, str] = {}
    intervals: dict[str, timedelta] = {}
    min_scores: dict[str, float] = {}
    next_start: str | None = None
    for key in rotation(tables, resume_at):
        if deadline is not None and (healths or errors) and time.monotonic() > deadline:
            next_start = key
            break
        try:  # a table that cannot be read is reported; the others go on
            ref = TableRef.parse(key)
            table = maintainer.load(ref)
            settings = maintainer.settings(ref)
            wal = wal_stats(config.wal_root, ref) if config.wal_root else None
            health = assess_table(table, key, settings, now, wal)
            thresholds = thresholds_for(settings, table.properties)
            intervals[key], min_scores[key] = thresholds.min_interval, thresholds.min_score
        except Exception as exc:
            errors[key] = describe_error(exc, lambda text: scrub(text, config))
            continue
        healths[key] = health
        states[key] = table_state(table.metadata_location, wal, health)

    runnable = OPERATIONS.names()
    due = [key for key, h in healths.items() if set(h.due_operations) & set(runnable)]
    # Every table a queued or running run names (one question): the trigger does not
    # request them, and the sensor records nothing for them (their run will).
    in_flight = unfinished_run_targets(instance, tables)
    sensor_runs = runs_by_table(instance, HEALTH_SENSOR, due, per_table=HISTORY) if due else {}
    last_maintained: dict[str, datetime] = {}
    failures: dict[str, tuple[int, datetime]] = {}
    settled: dict[str, str] = {}
    attempts: dict[str, int] = {}
    for key in due:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]),
            limit=HISTORY,
        ).records
        # Whoever maintained it: schedule, backfill, sensor, UI, CLI; an assessment is not
        # maintenance.
        maintained = [r for r in records if source_of(r) != ASSESSMENT_SOURCE]
        if maintained:
            last_maintained[key] = datetime.fromtimestamp(maintained[0].timestamp, UTC)
        ops_failed = _figure_by_run(records, "ops_failed")
        held = frozenset(
            run_id for run_id, n in _figure_by_run(records, "ops_held_elsewhere").items() if n
        )
        runs = sensor_runs.get(key, [])
        # A run that ended without recording the table (canceled) has no materialization:
        # its end counts as the table's last maintenance too, for health.min_interval. A
        # failed one does not: failures are retried at once, then backed off (a run whose
        # worker died is requested again at the next tick).
        ended = [
            r.record.end_time
            for r in runs
            if r.record.end_time is not None and r.run.status != dg.DagsterRunStatus.FAILURE
        ]
        if ended:
            last_run = datetime.fromtimestamp(max(ended), UTC)
            last_maintained[key] = max(last_maintained.get(key, last_run), last_run)
        failed, attempts[key], settled_by = trigger_history(runs, ops_failed, states[key], held)
        if failed is not None:
            failures[key] = failed
        if settled_by is not None:
            settled[key] = settled_by
    selection = select_runs(
        list(healths.values()),
        now=now,
        trigger=config.trigger,
        min_interval=intervals,
        in_flight=in_flight,
        last_maintained=last_maintained,
        failures=failures,
        settled=settled,
        runnable=runnable,
    )
    return HealthEvaluation(
        tables=list(tables),
        healths=healths,
        errors=errors,
        states=states,
        attempts=attempts,
        min_scores=min_scores,
        in_flight=in_flight,
        selection=selection,
        resume_at=next_start,
    )


def _figure_by_run(records: Sequence[dg.EventLogRecord], name: str) -> dict[str, int]:
    """A numeric metadata value of each materialization, by its run id."""
    return {
        record.run_id: int(getattr(value, "value", 0) or 0)
        for record in records
        if record.asset_materialization is not None
        and (value := record.asset_materialization.metadata.get(name)) is not None
    }


def lakehouse_health_metadata(report: LakehouseHealth) -> dict[str, Any]:
    """The asset's metadata: every total as a number (so it plots), the least healthy
    tables as a markdown table, and the due operations and unreadable tables as JSON."""
    metadata: dict[str, Any] = {
        key: dg.MetadataValue.float(float(value))
        if isinstance(value, float)
        else dg.MetadataValue.int(int(value))
        for key, value in report.numbers().items()
    }
    metadata["summary"] = dg.MetadataValue.text(describe(report))
    metadata["least_healthy"] = dg.MetadataValue.md(
        render.markdown_table(LEAST_HEALTHY_COLUMNS, report.least_healthy)
        if report.least_healthy
        else "no tables assessed"
    )
    metadata["due_by_operation"] = dg.MetadataValue.json(report.due_by_operation)
    if report.errors:
        metadata["unreadable_tables"] = dg.MetadataValue.json(report.errors)
    return metadata


def describe(report: LakehouseHealth) -> str:
    """One line a person reads first."""
    if not report.assessed:
        return f"none of {report.tables} tables could be assessed"
    return (
        f"{report.assessed} of {report.tables} tables assessed: {report.unhealthy} unhealthy, "
        f"{report.tables_due} with due work, mean score {report.mean_score}"
    )


@dg.asset(
    name="lakehouse_health",
    deps=[MAINTAINED_TABLE],
    group_name="iceberg_maintenance",
    kinds={"iceberg"},
    description=(
        "Health of the whole lakehouse from table metadata (no JVM): tables, unhealthy "
        "tables, mean and lowest score, due work, small files, delete files, snapshots, WAL, "
        "the health trigger's backlog, and the least healthy tables. Recorded by "
        "table_health_sensor when its figures change (at least hourly); materializing it "
        "assesses every table now."
    ),
)
def lakehouse_health(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Assess every table and report what the health trigger would request now."""
    tables = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    evaluation = evaluate_health_trigger(
        context.instance, lakehouse, tables, datetime.now(UTC), seconds=None
    )
    for key, error in sorted(evaluation.errors.items()):
        context.log.warning(f"{key}: cannot assess its health: {error}")
    report = evaluation.report(lakehouse.config().defaults.health.min_score)
    context.log.info(describe(report))
    return dg.MaterializeResult(metadata=lakehouse_health_metadata(report))
