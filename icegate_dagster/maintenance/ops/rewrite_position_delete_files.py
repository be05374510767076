"""``rewrite_position_delete_files``: compact position delete files, and drop the dangling
ones (their data files gone), with Iceberg's ``rewrite_position_delete_files``.

Merge-on-read ``DELETE``/``UPDATE``/``MERGE`` write position delete files that every read
opens. ``optimize`` applies them by rewriting the data files they delete from; the delete
files it leaves behind (Iceberg drops one with its data file only when it is a deletion
vector, or older than every data file) delete nothing yet are still read: this operation,
next in the pass, rewrites them, keeping only the rows whose data file is still live.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan
from icegate_dagster.maintenance.ops.procedures import call_procedure, options_map
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from icegate_dagster.config import RewritePositionDeletesSettings
    from icegate_dagster.maintenance.results import TableStats

#: Format version from which Iceberg keeps deletes as deletion vectors (one per data file,
#: merged at commit) and this procedure only turns older position delete files into them.
DELETION_VECTORS_FROM = 3


def rewrite_all(before: TableStats, format_version: int) -> bool:
    """Whether every position delete file is to be rewritten (``rewrite-all``) rather than
    groups of ``min_input_files``: where some are dangling (a single file is never a
    group), and on a v3 table, where Iceberg turns them all into deletion vectors."""
    return before.dangling_delete_files > 0 or format_version >= DELETION_VECTORS_FROM


def position_delete_options(
    rule: RewritePositionDeletesSettings, before: TableStats, format_version: int
) -> dict[str, str]:
    """The procedure's options: ``min-input-files``, and ``rewrite-all`` where due."""
    options = {"min-input-files": str(rule.min_input_files)}
    if rewrite_all(before, format_version):
        options["rewrite-all"] = "true"
    return options


def position_deletes_plan(
    rule: RewritePositionDeletesSettings, before: TableStats, format_version: int
) -> str | None:
    """Why there is nothing to rewrite, from metadata; ``None`` when there is work."""
    if before.position_delete_files == 0:
        vectors = (
            f" ({before.deletion_vectors} deletion vectors: Iceberg keeps one per data file, "
            "merging them at commit, and optimize applies them)"
            if before.deletion_vectors
            else ""
        )
        return "no position delete files" + vectors
    if rewrite_all(before, format_version):
        return None
    if before.max_partition_position_deletes >= rule.min_input_files:
        return None
    return (
        f"nothing to rewrite: {before.position_delete_files} position delete files, at most "
        f"{before.max_partition_position_deletes} in one partition (rewritten from "
        f"{rule.min_input_files}), none dangling"
    )


class RewritePositionDeleteFiles(Operation):
    """Position delete files compacted per partition; dangling ones dropped."""

    name = "rewrite_position_delete_files"
    description = (
        "Compact position delete files and drop dangling ones with Iceberg's "
        "rewrite_position_delete_files (Spark)."
    )
    settings_block = "rewrite_position_delete_files"
    # A dry run plans first: most tables have no position delete files at all.
    dry_run_describes = False

    def plan(self, ctx: OpContext) -> Plan:
        return position_deletes_plan(
            ctx.settings.rewrite_position_delete_files, ctx.before, ctx.table.format_version
        )

    def run(self, ctx: OpContext) -> Outcome:
        rule, before = ctx.settings.rewrite_position_delete_files, ctx.before
        version = ctx.table.format_version
        options = position_delete_options(rule, before, version)
        scope = "every one" if "rewrite-all" in options else f"groups of {rule.min_input_files}"
        figures = (
            f"{before.position_delete_files} position delete files, "
            f"{before.dangling_delete_files} dangling"
        )
        if ctx.dry_run:
            return Outcome.skip(f"dry run: {figures}; would rewrite {scope}")
        args = {"table": ctx.ref.procedure_argument(), "options": options_map(options)}
        called = call_procedure(
            ctx.spark(), ctx.catalog_name, "rewrite_position_delete_files", args
        )
        row = called.output()
        details = (
            f"rewrote {row['rewritten_delete_files_count']} position delete files "
            f"({row['rewritten_bytes_count']} bytes) into {row['added_delete_files_count']} "
            f"({figures} before; rewrote {scope}"
        )
        if version >= DELETION_VECTORS_FROM:
            details += ", as deletion vectors"
        details += "; rows of data files that are gone were dropped)"
        return Outcome(
            "completed",
            details,
            {
                **row,
                "dangling_delete_files": before.dangling_delete_files,
                "rewrite_all": "rewrite-all" in options,
            },
        )
