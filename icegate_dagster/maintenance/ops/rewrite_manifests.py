"""``rewrite_manifests``: cluster manifests by partition, so planning reads fewer of them."""

from __future__ import annotations

from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import call_procedure
from icegate_dagster.maintenance.results import Outcome


class RewriteManifests(Operation):
    """Many small manifests rewritten into few, grouped by partition."""

    name = "rewrite_manifests"
    description = "Cluster manifests by partition with Iceberg's rewrite_manifests (Spark)."
    settings_block = "rewrite_manifests"

    def plan(self, ctx: OpContext) -> str | None:
        if ctx.before.manifests <= 1:
            return f"nothing to rewrite: {ctx.before.manifests} manifest"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        if ctx.dry_run:
            return Outcome.skip(
                f"dry run: {ctx.before.manifests} manifests would be rewritten by partition"
            )
        args = {"table": ctx.ref.procedure_argument()}
        out = call_procedure(ctx.spark(), ctx.catalog_name, "rewrite_manifests", args).output()
        return Outcome.done(
            f"rewrote {out['rewritten_manifests_count']} manifests "
            f"into {out['added_manifests_count']}",
            **out,
        )
