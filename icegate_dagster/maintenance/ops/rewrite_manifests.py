"""``rewrite_manifests``: cluster manifests by partition, so planning reads fewer of them."""

from __future__ import annotations

from typing import Any

from icegate_dagster.maintenance.iceberg_java import one_cluster
from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import call_procedure, committing
from icegate_dagster.maintenance.results import Outcome


class RewriteManifests(Operation):
    """Many small manifests rewritten into few, grouped by partition."""

    name = "rewrite_manifests"
    description = "Cluster manifests by partition with Iceberg's rewrite_manifests (Spark)."
    settings_block = ""  # no settings of its own

    def plan(self, ctx: OpContext) -> str | None:
        if ctx.before.manifests <= 1:
            return f"nothing to rewrite: {ctx.before.manifests} manifest"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        if ctx.dry_run:
            return Outcome.skip(
                f"dry run: {ctx.before.manifests} manifests would be rewritten by partition"
            )
        if ctx.driver_side:
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
