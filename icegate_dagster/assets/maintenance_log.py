"""``maintenance_log``: the Iceberg log table, downstream of every maintained table."""

from typing import Any

import dagster as dg

from icegate_dagster import render
from icegate_dagster.assets.names import MAINTAINED_TABLE
from icegate_dagster.maintenance.log.writer import ensure_log_table, log_size, read_log
from icegate_dagster.resources import LakehouseResource, SparkResource

MAINTENANCE_LOG = dg.AssetKey("maintenance_log")
PREVIEW_ROWS = 20


def _markdown(rows: list[dict[str, Any]]) -> str:
    columns = [
        "executed_at",
        "table_name",
        "operation",
        "status",
        "files_before",
        "files_after",
        "duration_ms",
        "details",
    ]
    return render.markdown_table(
        columns, [[str(row.get(c, ""))[:120] for c in columns] for row in rows]
    )


def log_table_report(
    context: dg.OpExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> dict[str, Any]:
    """Keep the log table itself compact, then report it: size, this run's rows and
    failures (the ``maintenance_log`` metadata, for the asset and the batch job alike)."""
    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    ref = maintainer.log_table
    ensure_log_table(maintainer.catalog, ref)
    upkeep = maintainer.maintain_log_table()
    for op in upkeep:
        log = context.log.error if op.status == "failed" else context.log.info
        log(f"{ref.key} {op.operation}: {op.status}: {op.details}")
    this_run = read_log(maintainer.catalog, ref, run_id=context.run.run_id)
    latest = sorted(this_run, key=lambda r: r["executed_at"], reverse=True)[:PREVIEW_ROWS]
    failures = [r for r in this_run if r["status"] == "failed"]
    for row in failures:
        context.log.warning(f"{row['table_name']} {row['operation']} failed: {row['details']}")
    return {
        "table": ref.key,
        "rows": log_size(maintainer.catalog, ref),
        "rows_this_run": len(this_run),
        "failures_this_run": len(failures),
        "log_table_upkeep": dg.MetadataValue.json(
            {op.operation: {"status": op.status, "details": op.details} for op in upkeep}
        ),
        "log_table_files": upkeep[-1].after.data_files if upkeep and upkeep[-1].after else 0,
        "log_table_snapshots": (upkeep[-1].after.snapshots if upkeep and upkeep[-1].after else 0),
        "rows_of_this_run": dg.MetadataValue.md(_markdown(latest)),
    }


@dg.asset(
    name="maintenance_log",
    deps=[MAINTAINED_TABLE],
    group_name="iceberg_maintenance",
    kinds={"iceberg"},
    description="The Iceberg table <namespace>._maintenance_log: one row per table per operation. "
    "Metadata rows, rows_this_run, failures_this_run, a markdown table of this run's rows, and "
    "the log table's own upkeep (log_table_upkeep).",
)
def maintenance_log(
    context: dg.AssetExecutionContext, lakehouse: LakehouseResource, spark: SparkResource
) -> dg.MaterializeResult:  # type: ignore[type-arg]
    """Keep the log table itself compact, then report it: size, this run's failures, rows."""
    return dg.MaterializeResult(
        metadata=log_table_report(context.op_execution_context, lakehouse, spark)
    )
