"""Deferred orphan deletion as two jobs: record each table's orphan candidates, and later
delete those still unreferenced, old and unchanged."""

from collections.abc import Sequence
from typing import Any

import dagster as dg
from pydantic import Field

from icegate_dagster.assets.names import SPARK_JOB_TAGS
from icegate_dagster.resources import LakehouseResource, SparkResource


class OrphanTablesConfig(dg.Config):
    """Which tables deferred orphan deletion works on."""

    tables: list[str] = Field(
        default_factory=list,
        description="namespace.table names; empty: every discovered table",
    )


def _orphan_step_end(
    context: dg.OpExecutionContext,
    what: str,
    reports: Sequence[dict[str, Any]],
    metadata: dict[str, Any],
) -> None:
    """Log each table's report, attach ``metadata`` to the step; fail it at the end, naming
    each failing table, when any failed (every other table was done first)."""
    failed = {}
    for report in reports:
        log = context.log.info if report["ok"] else context.log.error
        log(f"{report['table']}: {report['status']}: {report['details']}")
        if not report["ok"]:
            failed[report["table"]] = report["details"]
    metadata["results"] = dg.MetadataValue.json(list(reports))
    if failed:
        named = "; ".join(f"{table}: {error}" for table, error in failed.items())
        raise dg.Failure(
            f"{what} failed on {len(failed)} table(s): {named}",
            metadata={**metadata, "failed_tables": dg.MetadataValue.json(sorted(failed))},
        )
    context.add_output_metadata(metadata)


@dg.op(description="Record each table's orphan candidates (Iceberg's dry run); delete nothing.")
def collect_orphans(
    context: dg.OpExecutionContext,
    config: OrphanTablesConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> None:
    """``orphans --collect`` over the configured tables: counts and bytes as metadata."""
    from icegate_dagster.maintenance.ops.deferred_orphans import CollectOrphans, deferred_report
    from icegate_dagster.maintenance.orphans.candidates import candidates_table

    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    results = maintainer.run_each(config.tables, CollectOrphans(), write_log=False)
    reports = [deferred_report(result, "collect") for result in results]
    metadata: dict[str, Any] = {
        "candidates_table": candidates_table(maintainer.config).key,
        "tables": len(reports),
        "candidates": sum(len(r["candidates"]) for r in reports),
        "candidate_bytes": sum(r["candidate_bytes"] for r in reports),
        "replaced": sum(r["replaced"] for r in reports),
    }
    _orphan_step_end(context, "collecting orphans", reports, metadata)


@dg.op(
    description="Delete the collected orphan candidates that are still unreferenced, old and "
    "unchanged (Iceberg asked again, under each table's lease); record the rest and why."
)
def delete_collected_orphans(
    context: dg.OpExecutionContext,
    config: OrphanTablesConfig,
    lakehouse: LakehouseResource,
    spark: SparkResource,
) -> None:
    """``orphans --delete-collected`` over the configured tables: counts and bytes as metadata."""
    from icegate_dagster.maintenance.ops.deferred_orphans import (
        DeleteCollectedOrphans,
        deferred_report,
    )
    from icegate_dagster.maintenance.orphans.candidates import candidates_table

    maintainer = lakehouse.maintainer(context.run.run_id, spark)
    results = maintainer.run_each(config.tables, DeleteCollectedOrphans())
    reports = [deferred_report(result, "delete_collected") for result in results]
    metadata: dict[str, Any] = {
        "candidates_table": candidates_table(maintainer.config).key,
        "tables": len(reports),
        "orphans_removed": sum(len(r["deleted"]) for r in reports),
        "bytes_removed": sum(r["bytes_deleted"] for r in reports),
        "kept": sum(len(r["kept"]) for r in reports),
        "delete_failures": sum(len(r["failed"]) for r in reports),
    }
    _orphan_step_end(context, "deleting collected orphans", reports, metadata)


@dg.job(
    name="collect_orphans_job",
    tags=SPARK_JOB_TAGS,
    description="Record orphan candidates of the configured tables (op config `tables`; "
    "empty: every table) for a later delete_collected_orphans_job; deletes nothing. Metadata "
    "`candidates`, `candidate_bytes` and `results` (per file); a failing table fails alone, "
    "and the step fails at the end naming it.",
    executor_def=dg.in_process_executor,
)
def collect_orphans_job() -> None:
    """``icegate-maintain orphans --collect`` as a Dagster job."""
    collect_orphans()


@dg.job(
    name="delete_collected_orphans_job",
    tags=SPARK_JOB_TAGS,
    description="Delete the collected orphan candidates still unreferenced, old and unchanged "
    "(op config `tables`; empty: every table); logged as remove_orphan_files. Metadata "
    "`orphans_removed`, `bytes_removed`, `kept`, `delete_failures` and `results` (per file); a "
    "failing table fails alone, and the step fails at the end naming it.",
    executor_def=dg.in_process_executor,
)
def delete_collected_orphans_job() -> None:
    """``icegate-maintain orphans --delete-collected`` as a Dagster job."""
    delete_collected_orphans()
