"""Deferred orphan deletion as two operations: collect the candidates now, delete them
later (as Nessie GC splits "mark" from "sweep").

:class:`CollectOrphans` asks Iceberg (``remove_orphan_files`` as a dry run, with that
operation's refusals, ``gc.enabled`` gate and floor, and its leaving out the files that
tables sharing the location reference) which files of a table's folder are
unreferenced and old, stats them and records them as ``pending`` rows of the candidates
table (:mod:`~icegate_dagster.maintenance.orphans.candidates`). It changes no file of the
table, so it takes no lease and writes no log row.

:class:`DeleteCollectedOrphans` runs under the table's lease: it asks Iceberg again and
deletes only the pending candidates it still lists, unchanged since they were collected,
one file at a time (the lease checked before each); every other candidate is kept, and
its row says why. Its outcome is one ``remove_orphan_files`` row of the maintenance log.
A candidate whose delete fails stays ``pending`` and is retried next time.

Both run through ``Maintainer.run_each``; :func:`deferred_report` is their JSON.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan, perform
from icegate_dagster.maintenance.ops.remove_orphan_files import RemoveOrphanFiles
from icegate_dagster.maintenance.orphans.candidates import (
    CandidateStatus,
    KeptFile,
    OrphanFile,
    Rows,
    candidates_table,
    pending_rows,
    read_candidates,
    resolve_rows,
    resolved_cutoff,
    rewrite_rows,
    stat_files,
    triage,
)
from icegate_dagster.maintenance.results import Outcome, TableResult
from icegate_dagster.maintenance.sharing import NO_SHARED_FILES, shared_files

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

_REMOVE = RemoveOrphanFiles()


def _floor(ctx: OpContext) -> datetime:
    return ctx.now - ctx.settings.remove_orphan_files.retention_threshold


def _history_cutoff(ctx: OpContext) -> datetime | None:
    # Resolved candidates older than maintain.history.orphan_candidates are dropped.
    return resolved_cutoff(ctx.config.history.orphan_candidates, ctx.now)


def _catalog(ctx: OpContext) -> Catalog:
    return ctx.table.catalog


def _describe(ctx: OpContext, exc: BaseException) -> str:
    return describe_error(exc, lambda text: scrub(text, ctx.config))


def _iceberg_orphans(ctx: OpContext) -> tuple[list[str] | None, Outcome]:
    """Iceberg's own list of the table's orphans older than the floor (``remove_orphan_files``
    as a dry run at ``ctx.now``), or ``None`` when it was not asked (skipped for a reason
    other than "none": GC off, no snapshot)."""
    asked = perform(_REMOVE, dataclasses.replace(ctx, dry_run=True))
    if "orphan_files" not in asked.output:
        return None, asked
    return list(asked.output["orphan_files"]), asked


class CollectOrphans(Operation):
    """Record a table's orphan candidates for a later :class:`DeleteCollectedOrphans`."""

    name = "collect_orphans"
    description = "Record old unreferenced files as pending candidates; delete nothing."
    settings_block = "remove_orphan_files"
    holds_lease = False  # changes no file of the table
    # The gates are remove_orphan_files' own, applied when it is asked.
    needs_snapshot = False
    dry_run_describes = False

    def run(self, ctx: OpContext) -> Outcome:
        floor = _floor(ctx)
        paths, asked = _iceberg_orphans(ctx)
        if paths is None:
            return asked
        stats = stat_files(ctx.table, paths)
        candidates = [f for f in (stats[p] for p in paths) if f is not None]
        size = sum(f.size_bytes for f in candidates)
        target = candidates_table(ctx.config)
        figures: dict[str, Any] = {
            "candidates_table": target.key,
            "candidates": [c.as_dict() for c in candidates],
            "candidate_bytes": size,
            "replaced": 0,
        }
        older = f"older than {floor:%Y-%m-%d %H:%M:%S} UTC"
        if ctx.dry_run:
            return Outcome.done(
                f"would collect {len(candidates)} orphan candidates ({size} bytes) {older}",
                **figures,
            )
        rows = pending_rows(
            ctx.ref.key, candidates, datetime.now(UTC), ctx.run_id, f"unreferenced and {older}"
        )

        def replace(old: Rows) -> Rows:
            kept = [r for r in old if r["status"] != "pending"]
            figures["replaced"] = len(old) - len(kept)
            return kept + rows

        rewrite_rows(_catalog(ctx), target, ctx.ref.key, replace, _history_cutoff(ctx))
        replaced = figures["replaced"]
        return Outcome.done(
            f"collected {len(candidates)} orphan candidates ({size} bytes) {older} into "
            f"{target.key}" + (f"; replaced {replaced} earlier pending" if replaced else ""),
            **figures,
        )


class DeleteCollectedOrphans(Operation):
    """Delete a table's collected candidates that are still orphans, old and unchanged."""

    #: Logged as the operation it defers.
    name = RemoveOrphanFiles.name
    description = "Delete the collected orphan candidates still unreferenced, old and unchanged."
    settings_block = "remove_orphan_files"
    deletes_files = True
    dry_run_describes = False

    def plan(self, ctx: OpContext) -> Plan:
        if not self._pending(ctx):
            target = candidates_table(ctx.config)
            return (
                f"no pending orphan candidates of {ctx.ref.key} in {target.key}: collect them first"
            )
        return None

    @staticmethod
    def _pending(ctx: OpContext) -> Rows:
        target = candidates_table(ctx.config)
        try:
            rows = read_candidates(_catalog(ctx), target, ctx.ref.key)
        except Exception as exc:
            raise OperationError(f"cannot read {target.key}: {_describe(ctx, exc)}") from exc
        return [r for r in rows if r["status"] == "pending"]

    def run(self, ctx: OpContext) -> Outcome:
        rows = self._pending(ctx)
        pending = [OrphanFile.of_row(r) for r in rows]
        # The floor and Iceberg's own cut-off are one instant (``ctx.now``): a candidate
        # older than it that Iceberg leaves out is left out because the table references it.
        floor = _floor(ctx)
        orphans, asked = _iceberg_orphans(ctx)
        if orphans is None:
            return Outcome(
                asked.status,
                f"Iceberg was not asked again, so no collected candidate was deleted "
                f"({len(pending)} stay pending): {asked.details}",
            )
        elsewhere = NO_SHARED_FILES
        if asked.output.get("tables_consulted"):  # whose references kept a file, if any
            elsewhere = shared_files(ctx.locations, ctx.ref.key, ctx.table.location())
        go, kept = triage(
            pending,
            orphans,
            stat_files(ctx.table, [c.path for c in pending]),
            floor,
            elsewhere.owner,
        )
        if ctx.dry_run:
            return Outcome.done(
                f"would delete {len(go)} of {len(pending)} collected orphan candidates "
                f"({sum(f.size_bytes for f in go)} bytes){_kept_summary(kept)} (dry run)",
                **_figures(go, kept, {}, dry_run=True),
            )
        deleted: list[OrphanFile] = []
        failed: dict[str, str] = {}
        for candidate in go:
            try:
                check_lease()  # nothing is deleted once the lease is lost
                ctx.table.io.delete(candidate.path)
                deleted.append(candidate)
            except Exception as exc:
                failed[candidate.path] = _describe(ctx, exc)
        details = (
            f"deleted {len(deleted)} of {len(pending)} collected orphan candidates "
            f"({sum(f.size_bytes for f in deleted)} bytes)" + _kept_summary(kept)
        )
        problems = []
        if failed:
            listed = ", ".join(f"{path}: {error}" for path, error in failed.items())
            problems.append(f"{len(failed)} deletes failed, still pending ({listed})")
        target = candidates_table(ctx.config)
        try:
            fate: dict[str, tuple[CandidateStatus, str]] = {
                f.path: ("deleted", "deleted") for f in deleted
            }
            fate.update({k.path: (k.reason, k.detail) for k in kept})
            fate.update({path: ("pending", f"delete failed: {e}") for path, e in failed.items()})
            collections = {r["path"]: r["run_id"] for r in rows}
            resolved_at = datetime.now(UTC)
            rewrite_rows(
                _catalog(ctx),
                target,
                ctx.ref.key,
                lambda old: resolve_rows(old, fate, collections, resolved_at, ctx.run_id),
                _history_cutoff(ctx),
            )
        except Exception as exc:
            problems.append(f"cannot record the outcome in {target.key}: {_describe(ctx, exc)}")
        return Outcome(
            "failed" if problems else "completed",
            "; ".join([details, *problems]),
            _figures(deleted, kept, failed, dry_run=False),
        )


def _figures(
    deleted: list[OrphanFile], kept: list[KeptFile], failed: dict[str, str], *, dry_run: bool
) -> dict[str, Any]:
    removed = 0 if dry_run else len(deleted)
    return {
        "deferred": True,
        "dry_run": dry_run,
        "orphans_removed": removed,
        "bytes_removed": 0 if dry_run else sum(f.size_bytes for f in deleted),
        "orphan_files": [f.path for f in deleted],
        "deleted": [f.as_dict() for f in deleted],
        "bytes_deleted": sum(f.size_bytes for f in deleted),
        "kept": [k.as_dict() for k in kept],
        "failed": [{"path": path, "error": error} for path, error in failed.items()],
    }


def _kept_summary(kept: list[KeptFile]) -> str:
    if not kept:
        return ""
    counts: dict[str, int] = {}
    for k in kept:
        counts[k.reason] = counts.get(k.reason, 0) + 1
    return "; kept " + ", ".join(f"{n} {reason}" for reason, n in sorted(counts.items()))


#: The figures each mode reports per table, with their value when the operation never ran.
REPORT_FIGURES: dict[str, dict[str, Any]] = {
    "collect": {"candidates": [], "candidate_bytes": 0, "replaced": 0},
    "delete_collected": {"deleted": [], "bytes_deleted": 0, "kept": [], "failed": []},
}


def deferred_report(result: TableResult, mode: str) -> dict[str, Any]:
    """One table's outcome of ``mode`` (``collect`` or ``delete_collected``) as plain data,
    for the CLI's JSON and the Dagster step's metadata."""
    op = result.ops[0] if result.ops else None
    output = op.output if op is not None else {}
    status = op.status if op is not None else "failed"
    details = op.details if op is not None else (result.error or "")
    figures = {key: output.get(key, empty) for key, empty in REPORT_FIGURES[mode].items()}
    return {"table": result.table, "ok": result.ok, "status": status, "details": details, **figures}
