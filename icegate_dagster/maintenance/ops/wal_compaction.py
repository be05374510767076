"""``wal_compaction``: ingest a table's WAL Parquet files once they reach a threshold,
exactly once (see :mod:`icegate_dagster.maintenance.wal`). Runs where ``wal.root`` is
set, on empty tables too."""

from __future__ import annotations

from typing import TYPE_CHECKING

from icegate_dagster.maintenance.ops.base import OpContext, Operation, refuse_crossing_paths
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.maintenance.wal import (
    STAGING_PREFIX,
    compact_wal,
    compaction_due,
    configured_wal_root,
    wal_stats,
)

if TYPE_CHECKING:
    from icegate_dagster.config import IcegateConfig, TableSettings


class WalCompaction(Operation):
    """Waiting WAL files appended to the table in one commit, then deleted."""

    name = "wal_compaction"
    description = "Ingest each table's WAL Parquet files once they reach a threshold (Spark)."
    settings_block = "compaction"
    cli_command = "compact"
    force_help = "ingest the WAL even below its thresholds"
    needs_snapshot = False  # an empty table still takes its WAL
    metadata_sums = {"wal_files_ingested": "WAL files in"}

    def applies(self, config: IcegateConfig, settings: TableSettings) -> bool:
        return config.wal_root is not None

    def refuse(self, ctx: OpContext) -> None:
        refuse_crossing_paths(self.name, ctx)

    def plan(self, ctx: OpContext) -> str | None:
        # An empty folder with no staging branch left by a crash needs nothing (no lease, no
        # JVM); otherwise compact_wal decides under the lease: it settles files an earlier
        # commit holds, sweeps stale branches and checks the thresholds.
        wal_root = configured_wal_root(ctx.config)
        if wal_root is None:
            return "no wal.root configured"
        staging = any(name.startswith(STAGING_PREFIX) for name in ctx.table.metadata.refs)
        if not staging and wal_stats(wal_root, ctx.ref).files == 0:
            return f"no WAL files waiting in {wal_root.location(ctx.ref)}"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        rule = ctx.settings.compaction
        if ctx.dry_run:
            wal = wal_stats(configured_wal_root(ctx.config), ctx.ref)
            due = compaction_due(wal.files, wal.bytes, rule)
            return Outcome.skip(
                f"dry run: {wal.files} WAL files ({wal.bytes} bytes) waiting; "
                + (
                    "they would be ingested"
                    if due
                    else "below thresholds, nothing would be ingested"
                )
                + f" (runs at {rule.min_files} files or {rule.min_size_bytes} bytes)"
            )
        return compact_wal(
            ctx.spark,
            ctx.catalog_name,
            ctx.ref,
            ctx.table,
            configured_wal_root(ctx.config),
            rule,
            force=ctx.force,
            fault_hook=ctx.fault_hook,
        )
