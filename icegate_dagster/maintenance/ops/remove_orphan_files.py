"""``remove_orphan_files``: delete files in a table's folder that no snapshot references
and that are older than the retention threshold (never under Iceberg's 24 h floor).

A folder that other tables' folders overlap (a table registered on another's metadata, a
table inside another's folder) holds their files too: there a file goes only when no table
sharing the location references it either (:mod:`~icegate_dagster.maintenance.sharing`).
Iceberg's procedure cannot consult them, so it is asked for its list as a dry run, the
files the other tables reference are left out, and the rest is deleted through the table's
FileIO under its lease; a dry run lists exactly that. When another table's location or
metadata cannot be read and whose files may lie in the folder, the operation is skipped,
naming it: nothing is deleted (that table fails on its own; a table whose metadata file lies
in a folder apart does not stop this one).

Where the table's metadata and one listing tell Iceberg's answer exactly (a store pyarrow
lists, up to :data:`~icegate_dagster.maintenance.orphans.listing.MAX_MANIFESTS` manifests:
:func:`~icegate_dagster.maintenance.orphans.listing.iceberg_orphans`), that answer is used
and the files are deleted through the table's pyiceberg FileIO under its lease, without a
Spark job (or a JVM): on a small table Iceberg's procedure costs seconds of Spark jobs to
list a few files. Everywhere else, Iceberg's procedure lists and deletes.
"""

from __future__ import annotations

from typing import Any

from icegate_dagster.config.secrets import scrub
from icegate_dagster.maintenance.ops.base import (
    OpContext,
    Operation,
    Plan,
    refuse_crossing_paths,
)
from icegate_dagster.maintenance.ops.file_deletes import (
    delete_files,
    delete_files_without_spark,
)
from icegate_dagster.maintenance.ops.procedures import call_procedure, timestamp_literal
from icegate_dagster.maintenance.orphans.listing import iceberg_orphans, orphan_candidates
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.maintenance.sharing import (
    NO_SHARED_FILES,
    SharedFiles,
    SharingUnknownError,
    refuse_unreadable_near,
    shared_files,
    table_sharing,
)

#: Paths of kept files named in the output (the count is always there).
_SAMPLE = 20
#: Table locations Iceberg's procedure lists through the table's FileIO, not Hadoop's.
_OBJECT_STORE_SCHEMES = ("s3://", "s3a://", "s3n://")


def _shared(ctx: OpContext) -> SharedFiles:
    """What the tables sharing the folder reference now (none: :data:`NO_SHARED_FILES`);
    raises, naming why, when that cannot be established."""
    # Listing the folder is only safe when every table whose files may lie in it is known.
    refuse_unreadable_near(
        ctx.locations,
        ctx.ref.key,
        ctx.table.location(),
        for_what="files of theirs would look orphaned there",
    )
    if not table_sharing(ctx.locations, ctx.ref.key, ctx.table).shared:
        return NO_SHARED_FILES
    return shared_files(
        ctx.locations,
        ctx.ref.key,
        ctx.table.location(),
        clean=lambda text: scrub(text, ctx.config),
    )


class RemoveOrphanFiles(Operation):
    """Old unreferenced files deleted (listed only under a dry run)."""

    name = "remove_orphan_files"
    description = (
        "Delete old unreferenced files: Iceberg's remove_orphan_files answer, worked out "
        "from metadata on small tables, else its procedure (Spark)."
    )
    settings_block = "remove_orphan_files"
    cli_command = "orphans"
    dry_run_help = "list the orphan files that would be deleted; delete nothing"
    deletes_files = True
    dry_run_describes = False  # a dry run lists the files: Iceberg's answer
    metadata_sums = {"orphans_removed": "orphans"}

    def refuse(self, ctx: OpContext) -> None:
        refuse_crossing_paths(self.name, ctx)

    def plan(self, ctx: OpContext) -> Plan:
        try:
            shared = _shared(ctx)
        except SharingUnknownError as exc:
            if not exc.unreadable:  # the catalog itself: a failure
                raise
            # Another table is broken, not this one: its own failure is the alert.
            return Outcome.skip(
                f"no file deleted: {exc}", unreadable_tables=list(exc.unreadable)
            )
        older_than = ctx.now - ctx.settings.remove_orphan_files.retention_threshold
        # One listing of the folder against the manifests: usually nothing, and no Spark.
        candidates = orphan_candidates(ctx.table, older_than)
        if candidates is not None:
            candidates = [path for path in candidates if not shared.keeps(path)]
        if candidates == []:
            return Outcome.skip(
                f"no unreferenced file older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
                "in the table's folder" + _consulted(shared),
                orphan_files=[],
                orphans_removed=0,
                tables_consulted=list(shared.tables),
            )
        return None

    def run(self, ctx: OpContext) -> Outcome:
        # Iceberg's answer, worked out from the metadata without Spark where that can be
        # done exactly (see iceberg_orphans); else Iceberg's procedure is asked. The plan's
        # pre-check above is only that: it may err either way.
        rule = ctx.settings.remove_orphan_files
        older_than = ctx.now - rule.retention_threshold
        dry = ctx.dry_run or rule.dry_run
        sharing = table_sharing(ctx.locations, ctx.ref.key, ctx.table)
        decided = iceberg_orphans(ctx.table, older_than)
        figures: dict[str, Any] = {}
        if decided is not None:
            listed, deleted_by_iceberg = decided, False
        else:
            args = {
                "table": ctx.ref.procedure_argument(),
                "older_than": timestamp_literal(older_than),
                # Where other tables share the folder, Iceberg only lists: this op decides.
                "dry_run": "true" if dry or sharing.shared else "false",
            }
            if ctx.table.location().lower().startswith(_OBJECT_STORE_SCHEMES):
                # Listed through the table's FileIO (S3FileIO): Spark has no Hadoop file
                # system for s3:// ("No FileSystem for scheme"), and needs none.
                args["prefix_listing"] = "true"
            called = call_procedure(ctx.spark(), ctx.catalog_name, "remove_orphan_files", args)
            listed = sorted(row["orphan_file_location"] for row in called.rows)
            figures["procedure_s"] = round(called.seconds, 3)
            deleted_by_iceberg = not (dry or sharing.shared)
        files = listed
        shared = NO_SHARED_FILES
        if sharing.shared:
            shared = _shared(ctx)  # read after the listing: what they reference now stays
            kept = {path: owner for path in listed if (owner := shared.owner(path)) is not None}
            files = [path for path in listed if path not in kept]
            figures.update(
                tables_consulted=list(shared.tables),
                files_kept_shared=len(kept),
                kept_shared_sample=dict(list(kept.items())[:_SAMPLE]),
            )
        if not dry and files and not deleted_by_iceberg:
            # Decided from metadata, or on Spark Connect (no Java FileIO here): pyiceberg's.
            deletion = (
                delete_files_without_spark(ctx, files)
                if decided is not None or ctx.on_connect
                else delete_files(ctx, ctx.java_table().io(), files)
            )
            if deletion.failed:
                return self._partly(ctx, files, deletion.failed, deletion.lease_lost, figures)
        verb = "would remove" if dry else "removed"
        return Outcome.done(
            f"{verb} {len(files)} orphan files older than "
            f"{older_than:%Y-%m-%d %H:%M:%S} UTC"
            + (" (dry run)" if dry else "")
            + _consulted(shared, figures.get("files_kept_shared")),
            orphan_files=files,
            orphans_removed=0 if dry else len(files),
            dry_run=dry,
            **figures,
        )

    @staticmethod
    def _partly(
        ctx: OpContext,
        files: list[str],
        failed: dict[str, str],
        lease_lost: str | None,
        figures: dict[str, Any],
    ) -> Outcome:
        """Some deletes failed (or the lease was lost): what went, and why the rest stays."""
        removed = [path for path in files if path not in failed]
        why = (
            f"stopped deleting, the table's lease is lost ({lease_lost})"
            if lease_lost
            else f"{len(failed)} files could not be deleted"
        )
        return Outcome(
            "failed",
            f"removed {len(removed)} of {len(files)} orphan files; {why}",
            {
                "orphan_files": removed,
                "orphans_removed": len(removed),
                "dry_run": False,
                "delete_failures": dict(list(failed.items())[:_SAMPLE]),
                "delete_failure_count": len(failed),
                **figures,
            },
        )


def _consulted(shared: SharedFiles, kept: int | None = None) -> str:
    """What the details say of the tables consulted (nothing when none shares the folder)."""
    if not shared.tables:
        return ""
    files = f"kept {kept} files they reference" if kept is not None else "their files kept"
    return f"; consulted {', '.join(shared.tables)} (sharing this location): {files}"
