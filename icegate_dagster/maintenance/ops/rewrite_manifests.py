"""``rewrite_manifests``: cluster manifests by partition, so planning reads fewer of them.

Not on tables that keep row lineage (format version 3): on Iceberg before 1.12.0 (a
user's own runtime may be one) a manifest rewrite can renumber their rows' ``_row_id``
(see :func:`row_lineage_reason`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icegate_dagster.maintenance.iceberg_java import one_cluster
from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import call_procedure, committing
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from pyiceberg.table import Table

#: The first format version whose tables keep row lineage (``_row_id`` and
#: ``_last_updated_sequence_number`` for every row, from ``first_row_id``).
ROW_LINEAGE_FORMAT_VERSION = 3


def row_lineage_reason(format_version: int) -> str | None:
    """Why the manifest rewrite leaves a table of ``format_version`` alone, or ``None``.

    Tables with row lineage (format version 3) are skipped: before Iceberg 1.12.0, Spark's
    ``rewrite_manifests`` drops each entry's ``first_row_id``, so every row moved to a new
    manifest gets a new ``_row_id`` (apache/iceberg#16699, reproduced on 1.10.2). The
    pinned 1.12.0 carries the fix, but a user's ``spark.jars`` may load an older runtime,
    which nothing knows before the JVM starts (the health trigger has none).
    The table API's rewrite on the driver relies on core's row-ID
    fix for merged manifests (apache/iceberg#16263, in 1.10.2 as backport #16304); it is
    held to the same rule, so a table's row IDs never depend on which path its size picks.
    """
    if format_version < ROW_LINEAGE_FORMAT_VERSION:
        return None
    return (
        f"format-version {format_version} table: its rows carry lineage (_row_id, "
        "_last_updated_sequence_number), which a manifest rewrite on Iceberg before 1.12.0 "
        "can renumber (the rewrite_manifests procedure drops first_row_id: "
        "apache/iceberg#16699, fixed in 1.12.0; manifest merging gave existing entries new "
        "row IDs: apache/iceberg#16263, fixed in 1.11.0 and 1.10.2): manifests of v3 tables "
        "are not rewritten while a runtime older than 1.12.0 may be loaded"
    )


def _format_version(table: Table) -> int:
    return int(table.metadata.format_version)


class RewriteManifests(Operation):
    """Many small manifests rewritten into few, grouped by partition."""

    name = "rewrite_manifests"
    description = "Cluster manifests by partition with Iceberg's rewrite_manifests (Spark)."
    settings_block = ""  # no settings of its own

    def plan(self, ctx: OpContext) -> str | None:
        lineage = row_lineage_reason(_format_version(ctx.table))
        if lineage is not None:
            return lineage
        if ctx.before.manifests <= 1:
            return f"nothing to rewrite: {ctx.before.manifests} manifest"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        lineage = row_lineage_reason(_format_version(ctx.table))
        if lineage is not None:  # a dry run comes here unplanned
            return Outcome.skip(lineage)
        if ctx.dry_run:
            return Outcome.skip(
                f"dry run: {ctx.before.manifests} manifests would be rewritten by partition"
            )
        if ctx.driver_side:  # never on Spark Connect: the procedure below
            out = self._on_driver(ctx)
        else:
            args = {"table": ctx.ref.procedure_argument()}
            called = call_procedure(ctx.spark(), ctx.catalog_name, "rewrite_manifests", args)
            out = {**called.output(), "execution": "distributed"}
        return Outcome(
            "completed",
            f"rewrote {out['rewritten_manifests_count']} manifests "
            f"into {out['added_manifests_count']}",
            out,
        )

    @staticmethod
    def _on_driver(ctx: OpContext) -> dict[str, Any]:
        """Iceberg's ``RewriteManifests`` on the driver: every live entry into as few
        manifests as ``commit.manifest.target-size-bytes`` allows (one per spec for a
        small table), which is what a partition-clustered rewrite gives a small table."""

        def rewrite() -> dict[str, str]:
            table = ctx.java_table()
            table.rewriteManifests().clusterBy(one_cluster(ctx.spark())).commit()
            return dict(table.currentSnapshot().summary())

        called = committing(rewrite)
        summary = called.rows
        return {
            "rewritten_manifests_count": int(summary.get("manifests-replaced", 0)),
            "added_manifests_count": int(summary.get("manifests-created", 0)),
            "commit_retries": called.retries,
            "procedure_s": round(called.seconds, 3),
            "execution": "driver",
        }
