"""``compute_table_stats``: Puffin statistics (Theta sketches of each column's distinct
values) for the current snapshot, which engines' cost-based planners read (join order,
broadcast choice). Opt-in: ``maintain.compute_table_stats.enabled``.

Runs Iceberg's ``compute_table_stats`` procedure (a Spark job reading the columns), which
writes ``<table>/metadata/<snapshot>-<uuid>.stats`` and registers it in the table
metadata for that snapshot. It is skipped while the current snapshot already has
statistics for the columns asked for, so a pass computes them after compaction or new
writes changed the table and never on an unchanged one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import sql_string
from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan
from icegate_dagster.maintenance.ops.procedures import call_procedure
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import IcegateConfig, TableSettings

#: The blob type of an NDV sketch in a Puffin file (Iceberg's ``StandardBlobTypes``).
NDV_BLOB = "apache-datasketches-theta-v1"


def stats_columns(table: Table, columns: tuple[str, ...] | None, key: str) -> dict[str, int]:
    """The columns of table ``key`` to sketch, name -> field id: ``columns``, each checked
    against the table's schema, or (unset) every top-level primitive column, as Iceberg
    picks them."""
    schema = table.schema()
    if columns is None:
        return {f.name: f.field_id for f in schema.fields if f.field_type.is_primitive}
    found: dict[str, int] = {}
    for name in columns:
        try:
            field = schema.find_field(name, case_sensitive=True)
        except ValueError:
            names = ", ".join(schema.column_names)
            raise OperationError(
                f"maintain.compute_table_stats.columns names {name!r}, which is not a column "
                f"of {key} (its columns: {names})"
            ) from None
        if not field.field_type.is_primitive:
            raise OperationError(
                f"maintain.compute_table_stats.columns names {name!r}, a {field.field_type} "
                f"column of {key}: sketches need a column of a primitive type "
                "(name its primitive sub-fields instead)"
            )
        found[name] = field.field_id
    return found


def sketched_fields(table: Table, snapshot_id: int) -> set[int]:
    """Field ids that already have an NDV sketch registered for ``snapshot_id``."""
    return {
        field_id
        for stats in table.metadata.statistics
        if stats.snapshot_id == snapshot_id
        for blob in stats.blob_metadata
        if blob.type == NDV_BLOB
        for field_id in blob.fields
    }


def _columns(ctx: OpContext) -> dict[str, int]:
    return stats_columns(ctx.table, ctx.settings.compute_table_stats.columns, ctx.ref.key)


class ComputeTableStats(Operation):
    """NDV sketches of the current snapshot's columns, registered as its statistics file."""

    name = "compute_table_stats"
    description = (
        "Compute Puffin NDV statistics for cost-based planning with Iceberg's "
        "compute_table_stats (Spark); opt-in."
    )
    settings_block = "compute_table_stats"
    dry_run_describes = False  # a dry run says whether the current snapshot has them

    def applies(self, config: IcegateConfig, settings: TableSettings) -> bool:
        return settings.compute_table_stats.enabled

    def refuse(self, ctx: OpContext) -> None:
        # A column misnamed in the config fails the operation, whatever the table's state.
        _columns(ctx)

    def plan(self, ctx: OpContext) -> Plan:
        snapshot = ctx.table.current_snapshot()
        if snapshot is None:  # the shared gate skips such a table first
            return "table has no snapshot yet: nothing to compute"
        wanted = _columns(ctx)
        if not wanted:
            return "no top-level column of a primitive type to sketch: name columns"
        missing = set(wanted.values()) - sketched_fields(ctx.table, snapshot.snapshot_id)
        if not missing:
            return f"statistics already computed for snapshot {snapshot.snapshot_id}"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        snapshot = ctx.table.current_snapshot()
        if snapshot is None:  # the shared gate skips such a table first
            return Outcome.skip("table has no snapshot yet: nothing to compute")
        columns = _columns(ctx)
        if ctx.dry_run:
            return Outcome.skip(
                f"dry run: NDV sketches of {len(columns)} columns would be computed for "
                f"snapshot {snapshot.snapshot_id}",
                columns=sorted(columns),
            )
        # No snapshot_id argument: the procedure sketches whatever is current when it runs.
        args = {
            "table": ctx.ref.procedure_argument(),
            "columns": f"array({', '.join(sql_string(c) for c in columns)})",
        }
        called = call_procedure(ctx.spark(), ctx.catalog_name, "compute_table_stats", args)
        path = called.output().get("statistics_file")
        if path is None:
            return Outcome.skip("Iceberg computed no statistics: the table has no snapshot")
        table = ctx.table.refresh()
        registered = next((s for s in table.metadata.statistics if s.statistics_path == path), None)
        if registered is None:  # a writer replaced the statistics right after our commit
            raise OperationError(
                f"compute_table_stats wrote {path} but the table metadata does not list it"
            )
        return Outcome.done(
            f"computed NDV sketches of {len(columns)} columns for snapshot "
            f"{registered.snapshot_id} ({registered.file_size_in_bytes} bytes of Puffin)",
            statistics_file=path,
            snapshot_id=registered.snapshot_id,
            columns=sorted(columns),
            blobs=len(registered.blob_metadata),
            statistics_bytes=registered.file_size_in_bytes,
            commit_retries=called.retries,
            procedure_s=round(called.seconds, 3),
        )
