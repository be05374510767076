"""``expire_snapshots``: drop snapshots past the retention threshold, and the files only
they referenced, keeping the last ``retain_last`` and every branch and tag head."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import format_duration
from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan
from icegate_dagster.maintenance.ops.procedures import (
    call_procedure,
    committing,
    timestamp_literal,
)
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.maintenance.wal import settle_committed, wal_files_to_settle

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from icegate_dagster.config import ExpireSnapshotsSettings


def _ancestors(table: Table, snapshot_id: int) -> Iterator[Snapshot]:
    snapshot = table.snapshot_by_id(snapshot_id)
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None


def expirable_snapshots(table: Table, settings: ExpireSnapshotsSettings, now: datetime) -> int:
    """How many snapshots an expiry at ``now`` would remove, from metadata alone (a plan).

    Follows Iceberg's ``RemoveSnapshots``: a ref past its ``max_ref_age_ms`` (never
    ``main``) is dropped first; each remaining branch keeps its newest ancestors while
    fewer than its ``min_snapshots_to_keep`` (default ``retain_last``) are kept or they
    are younger than its ``max_snapshot_age_ms`` (default the threshold); a tag keeps
    its snapshot; a snapshot on no ref's history is kept while younger than the threshold.
    """
    now_ms = int(now.timestamp() * 1000)
    cutoff_ms = now_ms - int(settings.retention_threshold.total_seconds() * 1000)
    default_ref_age = table.properties.get("history.expire.max-ref-age-ms")
    retained: set[int] = set()
    on_a_ref: set[int] = set()
    for name, ref in table.metadata.refs.items():
        head = table.snapshot_by_id(ref.snapshot_id)
        if head is None:
            continue
        max_ref_age = ref.max_ref_age_ms or (int(default_ref_age) if default_ref_age else None)
        if name != "main" and max_ref_age is not None and now_ms - head.timestamp_ms > max_ref_age:
            continue  # the ref itself expires, and protects nothing
        if ref.snapshot_ref_type != "branch":  # a tag keeps its own snapshot only
            on_a_ref.add(head.snapshot_id)
            retained.add(head.snapshot_id)
            continue
        keep = ref.min_snapshots_to_keep or settings.retain_last
        older_than = now_ms - ref.max_snapshot_age_ms if ref.max_snapshot_age_ms else cutoff_ms
        in_window = True  # the branch's newest ancestors, up to the first one outside
        for kept, snapshot in enumerate(_ancestors(table, ref.snapshot_id)):
            on_a_ref.add(snapshot.snapshot_id)
            in_window = in_window and (kept < keep or snapshot.timestamp_ms >= older_than)
            if in_window:
                retained.add(snapshot.snapshot_id)
    return sum(
        1
        for s in table.metadata.snapshots
        if s.snapshot_id not in retained
        and (s.snapshot_id in on_a_ref or s.timestamp_ms < cutoff_ms)
    )


class ExpireSnapshots(Operation):
    """Old snapshots expired; Iceberg deletes the files no remaining snapshot needs."""

    name = "expire_snapshots"
    description = "Expire old snapshots with Iceberg's expire_snapshots (Spark)."
    settings_block = "expire_snapshots"
    cli_command = "expire"
    deletes_files = True

    def _nothing(self, ctx: OpContext) -> str | None:
        rule = ctx.settings.expire_snapshots
        if expirable_snapshots(ctx.table, rule, ctx.now) == 0:
            return (
                f"nothing to expire: no snapshot older than "
                f"{format_duration(rule.retention_threshold)} beyond the last "
                f"{rule.retain_last} and the branch and tag heads"
            )
        return None

    def plan(self, ctx: OpContext) -> Plan:
        reason = self._nothing(ctx)
        if reason is not None and not wal_files_to_settle(ctx.table, ctx.config.wal_root, ctx.ref):
            return Outcome.skip(reason, wal_files_settled=0)
        return None  # expiry due, or WAL leftovers of a commit to settle first

    def run(self, ctx: OpContext) -> Outcome:
        rule = ctx.settings.expire_snapshots
        if ctx.dry_run:
            count = expirable_snapshots(ctx.table, rule, ctx.now)
            return Outcome.skip(
                f"dry run: {count} of {ctx.before.snapshots} snapshots would expire"
            )
        # Expiry may drop a WAL commit's record: first settle any WAL files it still covers.
        settled = settle_committed(ctx.table, ctx.config.wal_root, ctx.ref)
        reason = self._nothing(ctx)
        if reason is not None:
            return Outcome.skip(reason, wal_files_settled=settled)
        older_than = ctx.now - rule.retention_threshold
        if ctx.driver_side:
            out = self._on_driver(ctx, older_than)
        else:
            args = {
                "table": ctx.ref.procedure_argument(),
                "older_than": timestamp_literal(older_than),
                "retain_last": str(rule.retain_last),
            }
            called = call_procedure(ctx.spark(), ctx.catalog_name, "expire_snapshots", args)
            out = {**called.output(), "execution": "distributed"}
        details = (
            f"expired snapshots older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
            f"(keeping the last {rule.retain_last}); deleted {out['deleted_data_files_count']} "
            f"data files, {out['deleted_manifest_files_count']} manifests, "
            f"{out['deleted_manifest_lists_count']} manifest lists"
        )
        if settled:
            details += f"; first deleted {settled} WAL files already committed"
        return Outcome("completed", details, {**out, "wal_files_settled": settled})

    @staticmethod
    def _on_driver(ctx: OpContext, older_than: datetime) -> dict[str, Any]:
        """Iceberg's ``ExpireSnapshots`` on the driver (it deletes the unreachable files
        itself); what it deleted is what was reachable before and is not any more."""
        rule = ctx.settings.expire_snapshots
        cutoff_ms = int(older_than.timestamp() * 1000)
        before = _reachable(ctx.table)

        def expire() -> None:
            expiry = ctx.java_table().expireSnapshots()
            expiry.expireOlderThan(cutoff_ms).retainLast(rule.retain_last).commit()

        called = committing(expire)
        after = _reachable(ctx.table.refresh())
        gone = [len(b - a) for b, a in zip(before, after, strict=True)]
        return {
            "deleted_data_files_count": gone[0],
            "deleted_delete_files_count": gone[1],
            "deleted_manifest_files_count": gone[2],
            "deleted_manifest_lists_count": gone[3],
            "commit_retries": called.retries,
            "procedure_s": round(called.seconds, 3),
            "execution": "driver",
        }


def _reachable(table: Table) -> tuple[set[str], set[str], set[str], set[str]]:
    """Data files, delete files, manifests and manifest lists any snapshot reaches."""
    from pyiceberg.manifest import DataFileContent

    data: set[str] = set()
    deletes: set[str] = set()
    manifests: set[str] = set()
    lists: set[str] = set()
    for snapshot in table.metadata.snapshots:
        lists.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            if manifest.manifest_path in manifests:
                continue
            manifests.add(manifest.manifest_path)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
                is_data = entry.data_file.content == DataFileContent.DATA
                (data if is_data else deletes).add(entry.data_file.file_path)
    return data, deletes, manifests, lists
