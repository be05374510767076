"""``lakehouse_health``: the whole lakehouse's health over time, its least healthy tables and
those that keep failing.

Recorded two ways, with the same metadata: by ``table_health_sensor`` when the
lakehouse's verdicts change (unhealthy, due, unreadable or failing tables) and at least
hourly, as a materialization with no run; and by materializing the asset (the UI's
Materialize button), which looks at every table now and reports what the trigger would do.
Numbers are numeric metadata, so the asset's Plots tab draws them over time.
"""

import dagster as dg

from icegate_dagster.assets.partition_events import MAINTAINED_TABLE
from icegate_dagster.maintenance.trigger.selection import summarize
from icegate_dagster.resources import LakehouseResource


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
    # The trigger's own code, imported here: it records partition pages with
    # ``assets.partition_events``, whose package imports this module.
    from icegate_dagster.automation.events import describe, lakehouse_health_metadata
    from icegate_dagster.automation.health_sensor import decide, failing_tables
    from icegate_dagster.automation.look import look_at_lakehouse
    from icegate_dagster.automation.tick import Tick

    tick = Tick.for_run(context.instance, lakehouse)
    maintainer = lakehouse.maintainer(context.run.run_id)
    look = look_at_lakehouse(maintainer, tick.memory, tick.now, until=None)
    for key, error in sorted(look.errors.items()):
        context.log.warning(f"{key}: cannot assess its health: {error}")
    due = [t for t, h in look.healths.items() if h.due]
    memory = tick.memory.tables_memory(operations_of=due) if tick.memory is not None else {}
    selection, _ = decide(tick, look, memory, tick.busy(look.tables))
    report = summarize(
        list(look.healths.values()),
        tables=len(look.tables),
        errors=look.errors,
        selection=selection,
        failing=failing_tables(memory),
    )
    context.log.info(describe(report))
    return dg.MaterializeResult(metadata=lakehouse_health_metadata(report))
