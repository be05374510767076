"""``lakehouse_health``: the whole lakehouse's health over time, its least healthy tables and
those that keep failing.

Recorded two ways, with the same metadata: by ``table_health_sensor`` when the
lakehouse's verdicts change (unhealthy, due, unreadable or failing tables) and at least
hourly, as a materialization with no run (:func:`lakehouse_event`); and by materializing the
asset (the UI's Materialize button), which looks at every table now and reports what the
trigger would do. Both build the report with
:func:`~icegate_dagster.maintenance.trigger.decision.lakehouse_report`. Numbers are numeric
metadata, so the asset's Plots tab draws them over time.
"""

import hashlib
import json
from typing import Any

import dagster as dg

from icegate_dagster import render
from icegate_dagster.assets.names import LAKEHOUSE_HEALTH, MAINTAINED_TABLE
from icegate_dagster.assets.trigger_state import TriggerState
from icegate_dagster.maintenance.trigger.decision import decide, lakehouse_report
from icegate_dagster.maintenance.trigger.look import look_at_lakehouse
from icegate_dagster.maintenance.trigger.selection import LakehouseHealth
from icegate_dagster.resources import LakehouseResource

LEAST_HEALTHY_COLUMNS = ("table", "score", "due operations", "why", "trigger")
#: ``lakehouse_health`` is recorded again after this long even when nothing changed, so its
#: plots keep a point an hour.
LAKEHOUSE_HEARTBEAT_S = 3600.0


@dg.asset(
    name="lakehouse_health",
    deps=[MAINTAINED_TABLE],
    group_name="iceberg_maintenance",
    kinds={"iceberg"},
    description=(
        "Health of the whole lakehouse from table metadata (no JVM): tables, unhealthy and "
        "failing tables, mean and lowest score, due work, small files, delete files, "
        "snapshots, WAL, the health trigger's backlog, and the least healthy tables. "
        "Recorded by table_health_sensor when its verdicts change (at least hourly); "
        "materializing it looks at every table now."
    ),
)
def lakehouse_health(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Look at every table now and report what the health trigger would request."""
    state = TriggerState.for_run(context.instance, lakehouse)
    maintainer = lakehouse.maintainer(context.run.run_id)
    look = look_at_lakehouse(maintainer, state.memory, state.now, until=None)
    for key, error in sorted(look.errors.items()):
        context.log.warning(f"{key}: cannot assess its health: {error}")
    due = [t for t, h in look.healths.items() if h.due]
    memory = state.memory.tables_memory(operations_of=due) if state.memory is not None else {}
    selection, _ = decide(
        look, memory, state.busy(look.tables), now=state.now, trigger=state.config.trigger
    )
    report = lakehouse_report(look, selection, memory)
    context.log.info(describe(report))
    return dg.MaterializeResult(metadata=lakehouse_health_metadata(report))


def lakehouse_digest(report: LakehouseHealth) -> str:
    """Names the lakehouse's verdicts (``LakehouseHealth.verdicts``), to record
    ``lakehouse_health`` when they change and not with every write's new figures."""
    text = json.dumps(report.verdicts(), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def describe(report: LakehouseHealth) -> str:
    """One line a person reads first."""
    if not report.assessed:
        return f"none of {report.tables} tables could be assessed"
    failing = f", {len(report.failing)} failing" if report.failing else ""
    failing += f", {len(report.excluded)} excluded" if report.excluded else ""
    return (
        f"{report.assessed} of {report.tables} tables assessed: {report.unhealthy} unhealthy"
        f"{failing}, {report.tables_due} with due work, mean score {report.mean_score}"
    )


def lakehouse_health_metadata(report: LakehouseHealth) -> dict[str, Any]:
    """The asset's metadata: every total as a number (so it plots), the least healthy
    tables as a markdown table, the due operations, unreadable and failing tables as JSON."""
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
    if report.failing:
        metadata["failing_tables"] = dg.MetadataValue.json(report.failing)
    if report.excluded:
        metadata["excluded_tables"] = dg.MetadataValue.json(report.excluded)
    if report.unsafe_sharing:
        metadata["unsafe_sharing"] = dg.MetadataValue.json(report.unsafe_sharing)
    return metadata


def lakehouse_event(report: LakehouseHealth) -> dg.AssetMaterialization:
    """``lakehouse_health`` recorded by the sensor (no run)."""
    return dg.AssetMaterialization(
        asset_key=LAKEHOUSE_HEALTH,
        description=describe(report),
        metadata=lakehouse_health_metadata(report),
    )
