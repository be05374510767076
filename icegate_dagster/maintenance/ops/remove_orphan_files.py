"""``remove_orphan_files``: delete files in a table's folder that no snapshot references
and that are older than the retention threshold (never under Iceberg's 24 h floor)."""

from __future__ import annotations

from icegate_dagster.maintenance.ops.base import (
    OpContext,
    Operation,
    Plan,
    refuse_crossing_paths,
)
from icegate_dagster.maintenance.ops.procedures import call_procedure, timestamp_literal
from icegate_dagster.maintenance.orphans.listing import orphan_candidates
from icegate_dagster.maintenance.results import Outcome


class RemoveOrphanFiles(Operation):
    """Old unreferenced files deleted (listed only under a dry run)."""

    name = "remove_orphan_files"
    description = "Delete old unreferenced files with remove_orphan_files (Spark)."
    settings_block = "remove_orphan_files"
    cli_command = "orphans"
    deletes_files = True
    dry_run_describes = False  # a dry run lists the files: Iceberg's own answer
    metadata_sums = {"orphans_removed": "orphans"}

    def refuse(self, ctx: OpContext) -> None:
        refuse_crossing_paths(self.name, ctx)

    def plan(self, ctx: OpContext) -> Plan:
        # Listing the folder is only safe when no other table's files can be in it.
        ctx.locations.refuse_overlaps(self.name, ctx.ref.key, ctx.table.location())
        older_than = ctx.now - ctx.settings.remove_orphan_files.retention_threshold
        # One listing of the folder against the manifests: usually nothing, and no Spark.
        if orphan_candidates(ctx.table, older_than) == []:
            return Outcome.skip(
                f"no unreferenced file older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
                "in the table's folder",
                orphan_files=[],
                orphans_removed=0,
            )
        return None

    def run(self, ctx: OpContext) -> Outcome:
        # A dry run asks Iceberg itself for the list: the plan above is only a pre-check.
        rule = ctx.settings.remove_orphan_files
        older_than = ctx.now - rule.retention_threshold
        dry = ctx.dry_run or rule.dry_run
        args = {
            "table": ctx.ref.procedure_argument(),
            "older_than": timestamp_literal(older_than),
            "dry_run": "true" if dry else "false",
        }
        called = call_procedure(ctx.spark(), ctx.catalog_name, "remove_orphan_files", args)
        files = sorted(row["orphan_file_location"] for row in called.rows)
        verb = "would remove" if dry else "removed"
        return Outcome.done(
            f"{verb} {len(files)} orphan files older than "
            f"{older_than:%Y-%m-%d %H:%M:%S} UTC" + (" (dry run)" if dry else ""),
            orphan_files=files,
            orphans_removed=0 if dry else len(files),
            dry_run=dry,
            procedure_s=round(called.seconds, 3),
        )
