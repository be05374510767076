"""``expire_snapshots``: drop snapshots past the retention threshold, and the files only
they referenced, keeping the last ``retain_last`` and every branch and tag head.

With ``clean_expired_metadata`` the same commit drops the partition specs and schemas no
remaining snapshot uses. A dry run says, from metadata alone, which files Iceberg would
then delete and how many bytes that frees (:func:`plan_expiry`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from icegate_dagster.config import format_bytes, format_duration
from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan
from icegate_dagster.maintenance.ops.procedures import (
    call_procedure,
    committing,
    timestamp_literal,
)
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.maintenance.wal import settle_committed, wal_files_to_settle

if TYPE_CHECKING:
    from pyiceberg.manifest import ManifestEntry, ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from icegate_dagster.config import ExpireSnapshotsSettings

#: How Iceberg finds the files an expiry frees: ``incremental`` (the files the expired
#: snapshots deleted; the driver's ``RemoveSnapshots`` on a table whose history is one
#: line) or ``reachable`` (whatever only expired snapshots reach: the Spark procedure, and
#: the driver once branches, tags or side snapshots are involved).
Cleanup = Literal["incremental", "reachable"]
_SOURCE_SNAPSHOT = "source-snapshot-id"  # set on a cherry-picked snapshot


def _ancestors(table: Table, snapshot_id: int) -> Iterator[Snapshot]:
    # One lookup table per walk: pyiceberg's snapshot_by_id scans the whole list, which
    # made a walk quadratic (54 s for 60,000 snapshots) where the health sensor runs it.
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    snapshot = by_id.get(snapshot_id)
    while snapshot is not None:
        yield snapshot
        parent = snapshot.parent_snapshot_id
        snapshot = by_id.get(parent) if parent is not None else None


def expiring_snapshots(
    table: Table, settings: ExpireSnapshotsSettings, now: datetime
) -> frozenset[int]:
    """The ids of the snapshots an expiry at ``now`` would remove, from metadata alone.

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
    return frozenset(
        s.snapshot_id
        for s in table.metadata.snapshots
        if s.snapshot_id not in retained
        and (s.snapshot_id in on_a_ref or s.timestamp_ms < cutoff_ms)
    )


def expirable_snapshots(table: Table, settings: ExpireSnapshotsSettings, now: datetime) -> int:
    """How many snapshots an expiry at ``now`` would remove (see :func:`expiring_snapshots`)."""
    return len(expiring_snapshots(table, settings, now))


class _Manifests:
    """A table's manifest lists and manifests, each read at most once."""

    def __init__(self, table: Table) -> None:
        self._table = table
        self._lists: dict[int, list[ManifestFile]] = {}
        self._entries: dict[str, list[ManifestEntry]] = {}

    def of(self, snapshot: Snapshot) -> list[ManifestFile]:
        if snapshot.snapshot_id not in self._lists:
            self._lists[snapshot.snapshot_id] = snapshot.manifests(self._table.io)
        return self._lists[snapshot.snapshot_id]

    def entries(self, manifest: ManifestFile) -> list[ManifestEntry]:
        """Every entry, deleted ones included (snapshot ids and sequence numbers inherited)."""
        path = manifest.manifest_path
        if path not in self._entries:
            self._entries[path] = manifest.fetch_manifest_entry(self._table.io, False)
        return self._entries[path]

    def live(self, manifest: ManifestFile) -> Iterator[ManifestEntry]:
        from pyiceberg.manifest import ManifestEntryStatus

        return (e for e in self.entries(manifest) if e.status != ManifestEntryStatus.DELETED)


def _source(snapshot: Snapshot) -> int | None:
    """The snapshot a cherry-picked snapshot copies, if it is one."""
    source = snapshot.summary.get(_SOURCE_SNAPSHOT) if snapshot.summary is not None else None
    return int(source) if source is not None else None


def _has_deleted(manifest: ManifestFile) -> bool:
    return manifest.deleted_files_count is None or manifest.deleted_files_count > 0


@dataclass
class _Doomed:
    """Files an expiry deletes, path -> size in bytes, by kind."""

    data_files: dict[str, int] = field(default_factory=dict)
    delete_files: dict[str, int] = field(default_factory=dict)
    manifests: dict[str, int] = field(default_factory=dict)
    manifest_lists: dict[str, int] = field(default_factory=dict)
    statistics_files: dict[str, int] = field(default_factory=dict)

    def add_content(self, entries: Iterable[ManifestEntry]) -> None:
        from pyiceberg.manifest import DataFileContent

        for entry in entries:
            file = entry.data_file
            kind = self.data_files if file.content == DataFileContent.DATA else self.delete_files
            kind[file.file_path] = file.file_size_in_bytes


@dataclass(frozen=True)
class ExpiryPlan:
    """What an expiry would do, read from metadata (no JVM): the snapshots it removes, the
    files Iceberg then deletes (path -> bytes, by kind), and with ``clean_expired_metadata``
    the partition specs and schemas it drops."""

    snapshot_ids: frozenset[int]
    cleanup: Cleanup
    data_files: dict[str, int]
    delete_files: dict[str, int]
    manifests: dict[str, int]
    manifest_lists: dict[str, int]
    statistics_files: dict[str, int]
    unused_specs: tuple[int, ...] = ()
    unused_schemas: tuple[int, ...] = ()

    def _kinds(self) -> tuple[dict[str, int], ...]:
        return (
            self.data_files,
            self.delete_files,
            self.manifests,
            self.manifest_lists,
            self.statistics_files,
        )

    @property
    def files(self) -> int:
        """Files to be deleted, every kind together."""
        return sum(len(kind) for kind in self._kinds())

    @property
    def bytes(self) -> int:
        """Bytes those files take."""
        return sum(sum(kind.values()) for kind in self._kinds())

    def summary(self) -> str:
        """The files and bytes in words."""
        text = (
            f"{self.files} files ({format_bytes(self.bytes)}): {len(self.data_files)} data, "
            f"{len(self.delete_files)} delete, {len(self.manifests)} manifests, "
            f"{len(self.manifest_lists)} manifest lists, "
            f"{len(self.statistics_files)} statistics files"
        )
        if self.unused_specs:
            text += f"; partition specs {list(self.unused_specs)} dropped"
        if self.unused_schemas:
            text += f"; schemas {list(self.unused_schemas)} dropped"
        return text

    def output(self) -> dict[str, Any]:
        """The figures, for JSON and the step's metadata."""
        return {
            "snapshots_expiring": len(self.snapshot_ids),
            "bytes_to_free": self.bytes,
            "files_to_free": self.files,
            "data_files_to_free": len(self.data_files),
            "data_bytes_to_free": sum(self.data_files.values()),
            "delete_files_to_free": len(self.delete_files),
            "manifests_to_free": len(self.manifests),
            "manifest_lists_to_free": len(self.manifest_lists),
            "statistics_files_to_free": len(self.statistics_files),
            "cleanup": self.cleanup,
            "partition_specs_dropped": list(self.unused_specs),
            "schemas_dropped": list(self.unused_schemas),
        }


#: Size lookups of manifest lists at once (a stat, or a HEAD request on object stores).
_SIZE_LOOKUPS = 16


def _sizes(table: Table, paths: list[str]) -> dict[str, int]:
    """The files' sizes, looked up side by side: metadata does not record a manifest
    list's size."""
    from concurrent.futures import ThreadPoolExecutor

    if not paths:
        return {}
    with ThreadPoolExecutor(min(_SIZE_LOOKUPS, len(paths))) as pool:
        sizes = pool.map(lambda path: len(table.io.new_input(path)), paths)
        return dict(zip(paths, sizes, strict=True))


def cleanup_strategy(table: Table, expiring: frozenset[int], *, driver_side: bool) -> Cleanup:
    """How Iceberg 1.10 will find the files to delete. The Spark procedure always diffs
    what is reachable before and after; the driver's ``RemoveSnapshots`` goes incremental
    unless a removed snapshot lies off ``main``'s history or a kept one does."""
    if not driver_side:
        return "reachable"
    head = table.current_snapshot()
    before = {s.snapshot_id for s in _ancestors(table, head.snapshot_id)} if head else set()
    kept = {s.snapshot_id for s in table.metadata.snapshots} - expiring
    after: set[int] = set()
    for snapshot in _ancestors(table, head.snapshot_id) if head else iter(()):
        if snapshot.snapshot_id not in kept:
            break  # main's history ends at its first expired ancestor
        after.add(snapshot.snapshot_id)
    if expiring - before or kept - after:
        return "reachable"
    return "incremental"


def _reachable_files(
    table: Table, manifests: _Manifests, expiring: frozenset[int], doomed: _Doomed
) -> None:
    """Iceberg's ``ReachableFileCleanup`` (and the Spark action's diff): manifests only
    expired snapshots list, and the live files in them that no kept manifest lists live."""
    expired = [s for s in table.metadata.snapshots if s.snapshot_id in expiring]
    kept = [s for s in table.metadata.snapshots if s.snapshot_id not in expiring]
    kept_manifests = {m.manifest_path: m for s in kept for m in manifests.of(s)}
    gone = {
        m.manifest_path: m
        for s in expired
        for m in manifests.of(s)
        if m.manifest_path not in kept_manifests
    }
    doomed.manifests.update((path, m.manifest_length) for path, m in gone.items())
    candidates = _Doomed()
    for manifest in gone.values():
        candidates.add_content(manifests.live(manifest))
    if candidates.data_files or candidates.delete_files:
        for manifest in kept_manifests.values():
            for entry in manifests.live(manifest):
                candidates.data_files.pop(entry.data_file.file_path, None)
                candidates.delete_files.pop(entry.data_file.file_path, None)
    doomed.data_files.update(candidates.data_files)
    doomed.delete_files.update(candidates.delete_files)


def _incremental_files(
    table: Table, manifests: _Manifests, expiring: frozenset[int], doomed: _Doomed
) -> list[Snapshot]:
    """Iceberg's ``IncrementalFileCleanup``: the files that expired ancestors of the current
    snapshot deleted, and those that expired snapshots off its history added; cherry-picked
    changes are left alone. Returns the expired snapshots whose manifest lists go."""
    from pyiceberg.manifest import ManifestEntryStatus

    head = table.current_snapshot()
    ancestors = {s.snapshot_id for s in _ancestors(table, head.snapshot_id)} if head else set()
    picked = {
        source
        for s in table.metadata.snapshots
        if s.snapshot_id in ancestors and (source := _source(s)) is not None
    }
    valid = {s.snapshot_id for s in table.metadata.snapshots} - expiring
    valid_manifests: set[str] = set()
    scan: dict[str, ManifestFile] = {}
    for snapshot in table.metadata.snapshots:
        if snapshot.snapshot_id not in valid:
            continue
        for manifest in manifests.of(snapshot):
            valid_manifests.add(manifest.manifest_path)
            writer = manifest.added_snapshot_id
            from_history = writer in ancestors or writer in picked
            if writer not in valid and from_history and _has_deleted(manifest):
                scan[manifest.manifest_path] = manifest
    revert: dict[str, ManifestFile] = {}
    listed: list[Snapshot] = []
    for snapshot in table.metadata.snapshots:
        if snapshot.snapshot_id in valid or snapshot.snapshot_id in picked:
            continue
        source = _source(snapshot)
        if source is not None and (source in ancestors or source in picked):
            continue  # its changes live on in a cherry-picked copy
        for manifest in manifests.of(snapshot):
            if manifest.manifest_path in valid_manifests:
                continue
            doomed.manifests[manifest.manifest_path] = manifest.manifest_length
            writer = manifest.added_snapshot_id
            if writer in ancestors and _has_deleted(manifest):
                scan[manifest.manifest_path] = manifest
            if writer not in ancestors and writer in expiring and manifest.has_added_files():
                revert[manifest.manifest_path] = manifest
        listed.append(snapshot)
    for manifest in scan.values():
        doomed.add_content(
            e
            for e in manifests.entries(manifest)
            if e.status == ManifestEntryStatus.DELETED and e.snapshot_id not in valid
        )
    for manifest in revert.values():
        doomed.add_content(
            e for e in manifests.entries(manifest) if e.status == ManifestEntryStatus.ADDED
        )
    return listed


def unused_metadata(
    table: Table,
    kept: Iterable[int],
    manifests: _Manifests | None = None,
    *,
    max_lists: int | None = None,
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The partition specs and schemas ``clean_expired_metadata`` drops when only ``kept``
    snapshots remain: as Iceberg 1.10's ``RemoveSnapshots``, those neither current nor used
    by a kept snapshot (its manifests' specs, its schema).

    Specs need the kept snapshots' manifest lists, read newest first until every spec is
    seen in use; past ``max_lists`` reads no spec is reported (a plan's bound: the next
    real expiry drops them anyway).
    """
    metadata = table.metadata
    kept_snapshots = sorted(
        (s for s in metadata.snapshots if s.snapshot_id in kept),
        key=lambda s: s.timestamp_ms,
        reverse=True,
    )
    schemas_used = {metadata.current_schema_id} | {s.schema_id for s in kept_snapshots}
    schemas = tuple(s.schema_id for s in metadata.schemas if s.schema_id not in schemas_used)
    unused = {s.spec_id for s in metadata.partition_specs} - {metadata.default_spec_id}
    manifests = manifests or _Manifests(table)
    for read, snapshot in enumerate(kept_snapshots):
        if not unused:
            break
        if max_lists is not None and read >= max_lists:
            return (), schemas
        unused -= {m.partition_spec_id for m in manifests.of(snapshot)}
    return tuple(sorted(unused)), schemas


def plan_expiry(
    table: Table, settings: ExpireSnapshotsSettings, now: datetime, *, driver_side: bool
) -> ExpiryPlan:
    """What an expiry at ``now`` would remove and delete, from metadata alone.

    Reads every manifest list and the manifests Iceberg's cleanup would read: the cost of
    the expiry's own planning, without its commit. ``driver_side`` says which way the
    expiry runs (see :func:`cleanup_strategy`): the two ways can differ on the files a
    kept snapshot deleted (the incremental way leaves them until that snapshot expires).
    """
    expiring = expiring_snapshots(table, settings, now)
    manifests = _Manifests(table)
    strategy = cleanup_strategy(table, expiring, driver_side=driver_side)
    doomed = _Doomed()
    expired = [s for s in table.metadata.snapshots if s.snapshot_id in expiring]
    if expiring:
        if strategy == "incremental":
            expired = _incremental_files(table, manifests, expiring, doomed)
        else:
            _reachable_files(table, manifests, expiring, doomed)
    doomed.manifest_lists.update(_sizes(table, [s.manifest_list for s in expired]))
    metadata = table.metadata
    stats = [*metadata.statistics, *metadata.partition_statistics]
    kept_stats = {s.statistics_path for s in stats if s.snapshot_id not in expiring}
    doomed.statistics_files.update(
        (s.statistics_path, s.file_size_in_bytes)
        for s in stats
        if s.snapshot_id in expiring and s.statistics_path not in kept_stats
    )
    specs: tuple[int, ...] = ()
    schemas: tuple[int, ...] = ()
    if settings.clean_expired_metadata:
        kept = {s.snapshot_id for s in metadata.snapshots} - expiring
        specs, schemas = unused_metadata(table, kept, manifests)
    return ExpiryPlan(
        expiring,
        strategy,
        doomed.data_files,
        doomed.delete_files,
        doomed.manifests,
        doomed.manifest_lists,
        doomed.statistics_files,
        specs,
        schemas,
    )


#: Manifest lists a plan reads at most to find a partition spec nothing uses any more.
PLAN_MAX_MANIFEST_LISTS = 50


def _metadata_ids(table: Table) -> tuple[set[int], set[int]]:
    return (
        {s.spec_id for s in table.metadata.partition_specs},
        {s.schema_id for s in table.metadata.schemas},
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
        if expiring_snapshots(ctx.table, rule, ctx.now):
            return None
        reason = (
            f"nothing to expire: no snapshot older than "
            f"{format_duration(rule.retention_threshold)} beyond the last "
            f"{rule.retain_last} and the branch and tag heads"
        )
        if rule.clean_expired_metadata:
            every = [s.snapshot_id for s in ctx.table.metadata.snapshots]
            specs, schemas = unused_metadata(ctx.table, every, max_lists=PLAN_MAX_MANIFEST_LISTS)
            if specs or schemas:
                return None  # the commit still drops the specs and schemas nothing uses
            reason += ", and no partition spec or schema unused"
        return reason

    def plan(self, ctx: OpContext) -> Plan:
        reason = self._nothing(ctx)
        if reason is not None and not wal_files_to_settle(ctx.table, ctx.config.wal_root, ctx.ref):
            return Outcome.skip(reason, wal_files_settled=0)
        return None  # expiry due, or WAL leftovers of a commit to settle first

    def run(self, ctx: OpContext) -> Outcome:
        rule = ctx.settings.expire_snapshots
        if ctx.dry_run:
            plan = plan_expiry(ctx.table, rule, ctx.now, driver_side=ctx.driver_side)
            return Outcome.skip(
                f"dry run: {len(plan.snapshot_ids)} of {ctx.before.snapshots} snapshots "
                f"would expire, deleting {plan.summary()}",
                **plan.output(),
            )
        # Expiry may drop a WAL commit's record: first settle any WAL files it still covers.
        settled = settle_committed(ctx.table, ctx.config.wal_root, ctx.ref)
        reason = self._nothing(ctx)
        if reason is not None:
            return Outcome.skip(reason, wal_files_settled=settled)
        older_than = ctx.now - rule.retention_threshold
        specs_before, schemas_before = _metadata_ids(ctx.table)
        if ctx.driver_side:
            out = self._on_driver(ctx, older_than)
        else:
            args = {
                "table": ctx.ref.procedure_argument(),
                "older_than": timestamp_literal(older_than),
                "retain_last": str(rule.retain_last),
                "clean_expired_metadata": str(rule.clean_expired_metadata).lower(),
            }
            called = call_procedure(ctx.spark(), ctx.catalog_name, "expire_snapshots", args)
            out = {**called.output(), "execution": "distributed"}
        specs_after, schemas_after = _metadata_ids(ctx.table.refresh())
        out["partition_specs_dropped"] = sorted(specs_before - specs_after)
        out["schemas_dropped"] = sorted(schemas_before - schemas_after)
        details = (
            f"expired snapshots older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
            f"(keeping the last {rule.retain_last}); deleted {out['deleted_data_files_count']} "
            f"data files, {out['deleted_manifest_files_count']} manifests, "
            f"{out['deleted_manifest_lists_count']} manifest lists"
        )
        if "bytes_freed" in out:
            details += f" ({format_bytes(out['bytes_freed'])} freed)"
        if out["partition_specs_dropped"] or out["schemas_dropped"]:
            details += (
                f"; dropped unused partition specs {out['partition_specs_dropped']} "
                f"and schemas {out['schemas_dropped']}"
            )
        if settled:
            details += f"; first deleted {settled} WAL files already committed"
        return Outcome("completed", details, {**out, "wal_files_settled": settled})

    @staticmethod
    def _on_driver(ctx: OpContext, older_than: datetime) -> dict[str, Any]:
        """Iceberg's ``ExpireSnapshots`` on the driver (it deletes the unreachable files
        itself). What it deletes is planned from the metadata it commits against, by the
        same rules (:func:`plan_expiry`); a delete that fails is left for orphan removal."""
        rule = ctx.settings.expire_snapshots
        cutoff_ms = int(older_than.timestamp() * 1000)

        def expire() -> ExpiryPlan:
            plan = plan_expiry(ctx.table.refresh(), rule, ctx.now, driver_side=True)
            expiry = ctx.java_table().expireSnapshots()
            expiry = expiry.expireOlderThan(cutoff_ms).retainLast(rule.retain_last)
            expiry.cleanExpiredMetadata(rule.clean_expired_metadata).commit()
            return plan

        called = committing(expire)
        plan = called.rows
        return {
            "deleted_data_files_count": len(plan.data_files),
            "deleted_delete_files_count": len(plan.delete_files),
            "deleted_manifest_files_count": len(plan.manifests),
            "deleted_manifest_lists_count": len(plan.manifest_lists),
            "deleted_statistics_files_count": len(plan.statistics_files),
            "snapshots_expired": len(plan.snapshot_ids),
            "files_freed": plan.files,
            "bytes_freed": plan.bytes,
            "cleanup": plan.cleanup,
            "commit_retries": called.retries,
            "procedure_s": round(called.seconds, 3),
            "execution": "driver",
        }
