"""``expire_snapshots``: drop snapshots past the retention threshold, and the files only
they referenced, keeping the last ``retain_last`` and every branch and tag head.

With ``clean_expired_metadata`` the same commit drops the partition specs and schemas no
remaining snapshot uses. A dry run says, from metadata alone, which files would then be
deleted and how many bytes that frees (:func:`plan_expiry`).

Files are deleted **by reachability on every path**: what the expired snapshots reach and
the table as committed does not. The Spark procedure does so itself
(``ExpireSnapshotsSparkAction``). On the driver, Iceberg 1.10's ``RemoveSnapshots`` would
pick an *incremental* cleanup on a linear history, which deletes live files (a file
removed and re-added in one commit, apache/iceberg#17304, or re-added by a later commit:
both reproduced on 1.10.2, ``tests/integration/test_expiry_reachability.py``); so the
driver commits with ``cleanExpiredFiles(false)`` and deletes the difference itself
(:func:`unreachable_files`), through the table's Java FileIO under the lease. The dry run
computes the same difference against the snapshots it would keep. ``delete_files: false``
commits the metadata only and leaves the freed files to ``remove_orphan_files``.

Tables whose locations overlap (a table registered on another's metadata, a folder inside
another's) share files: a file in that difference is still kept while any of them
references it (:mod:`~icegate_dagster.maintenance.sharing`). The procedure cannot consult
them, so such a table expires on the driver whatever its size; when they cannot be read,
the expiry commits and deletes nothing, failing with why.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from icegate_dagster.catalog import PYICEBERG_MAX_FORMAT_VERSION
from icegate_dagster.config import format_bytes, format_duration
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.discovery import normalize_location
from icegate_dagster.maintenance.ops.base import OpContext, Operation, Plan
from icegate_dagster.maintenance.ops.file_deletes import delete_files, delete_files_without_spark
from icegate_dagster.maintenance.ops.procedures import (
    call_procedure,
    committing,
    timestamp_literal,
)
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.maintenance.sharing import (
    NO_SHARED_FILES,
    SharedFiles,
    shared_files,
    table_sharing,
)
from icegate_dagster.maintenance.wal import (
    configured_wal_root,
    settle_committed,
    wal_files_to_settle,
)

if TYPE_CHECKING:
    from pyiceberg.manifest import ManifestEntry, ManifestFile
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

    from icegate_dagster.config import ExpireSnapshotsSettings


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

    def size(self, path: str) -> int:
        """The size of one of the files."""
        return next(kind[path] for kind in self._kinds() if path in kind)

    def drop_shared(self, shared: SharedFiles) -> dict[str, str]:
        """Leave out every file another table sharing the location still references;
        what was left out: path -> that table."""
        kept: dict[str, str] = {}
        for kind in self._kinds():
            for path in list(kind):
                owner = shared.owner(path)
                if owner is not None:
                    kept[path] = owner
                    del kind[path]
        return kept


@dataclass
class ExpiryPlan(_Doomed):
    """What an expiry would do, read from metadata (no JVM): the files it then deletes
    (path -> bytes, by kind), the snapshots it removes, and with ``clean_expired_metadata``
    the partition specs and schemas it drops."""

    snapshot_ids: frozenset[int] = frozenset()
    unused_specs: tuple[int, ...] = ()
    unused_schemas: tuple[int, ...] = ()
    #: The tables sharing the location that were consulted, and how many files only the
    #: expired snapshots reach that they still reference (kept).
    tables_consulted: tuple[str, ...] = ()
    files_kept_shared: int = 0

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
        if self.tables_consulted:
            text += (
                f"; consulted {', '.join(self.tables_consulted)} (sharing the location): "
                f"{self.files_kept_shared} files they still reference kept"
            )
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
            "partition_specs_dropped": list(self.unused_specs),
            "schemas_dropped": list(self.unused_schemas),
            "tables_consulted": list(self.tables_consulted),
            "files_kept_shared": self.files_kept_shared,
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


def _may_list_live(manifest: ManifestFile) -> bool:
    """Whether a manifest may list a live file: its list records how many it added and
    carried over; an unknown count (optional in format v1) may be anything."""
    return manifest.added_files_count != 0 or manifest.existing_files_count != 0


def _reachable_diff(
    manifests: _Manifests, expired: Sequence[Snapshot], kept: Sequence[Snapshot], doomed: _Doomed
) -> None:
    """The Spark action's diff (Iceberg's ``ReachableFileCleanup``): the manifests only
    expired snapshots list, and the files live in those (added or existing) that no kept
    manifest lists live. A file is live when *any* kept snapshot's manifests list it
    live, whatever other entries say of it: a manifest a kept snapshot shares with an
    expired one counts, and so does an ``ADDED`` entry beside a ``DELETED`` one for the same
    path (a file removed and re-added in one commit, apache/iceberg#17304). Paths are
    compared in one spelling (``file:/x`` = ``file:///x``). An expired manifest whose list
    records no added or existing file is not read for candidates: it lists no live file
    (a miscount there only leaves files to orphan removal)."""
    kept_manifests = {normalize_location(m.manifest_path): m for s in kept for m in manifests.of(s)}
    gone: dict[str, ManifestFile] = {}
    for snapshot in expired:
        for manifest in manifests.of(snapshot):
            key = normalize_location(manifest.manifest_path)
            if key not in kept_manifests:
                gone.setdefault(key, manifest)
    doomed.manifests.update((m.manifest_path, m.manifest_length) for m in gone.values())
    candidates = _Doomed()
    for manifest in gone.values():
        if _may_list_live(manifest):
            candidates.add_content(manifests.live(manifest))
    if candidates.data_files or candidates.delete_files:
        # Every kept manifest is read, whatever its list says of it: a miscount must not
        # make a live file look unreachable.
        live = {
            normalize_location(entry.data_file.file_path)
            for manifest in kept_manifests.values()
            for entry in manifests.live(manifest)
        }
        for kind in (candidates.data_files, candidates.delete_files):
            for path in [p for p in kind if normalize_location(p) in live]:
                del kind[path]
    doomed.data_files.update(candidates.data_files)
    doomed.delete_files.update(candidates.delete_files)


def _statistics(table: Table) -> list[Any]:
    return [*table.metadata.statistics, *table.metadata.partition_statistics]


def unreachable_files(
    before: Table,
    expired: Sequence[Snapshot],
    kept: Sequence[Snapshot],
    kept_statistics: Iterable[str],
    manifests: _Manifests | None = None,
) -> _Doomed:
    """The files an expiry of ``expired`` (snapshots of ``before``) frees when ``kept`` are
    the snapshots left: what only expired snapshots reach (manifest lists, manifests, the
    live data and delete files in those, statistics files) and no kept one does."""
    manifests = manifests or _Manifests(before)
    doomed = _Doomed()
    if expired:
        _reachable_diff(manifests, expired, kept, doomed)
    doomed.manifest_lists.update(_sizes(before, [s.manifest_list for s in expired]))
    ids = {s.snapshot_id for s in expired}
    still_used = {normalize_location(path) for path in kept_statistics}
    doomed.statistics_files.update(
        (s.statistics_path, s.file_size_in_bytes)
        for s in _statistics(before)
        if s.snapshot_id in ids and normalize_location(s.statistics_path) not in still_used
    )
    return doomed


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
    table: Table,
    settings: ExpireSnapshotsSettings,
    now: datetime,
    shared: SharedFiles = NO_SHARED_FILES,
) -> ExpiryPlan:
    """What an expiry at ``now`` would remove and delete, from metadata alone: the same
    reachability diff the expiry runs after its commit (:func:`unreachable_files`), against
    the snapshots it would keep, less the files the tables sharing the location reference
    (``shared``). Reads every manifest list and the manifests that diff reads, without
    the commit."""
    expiring = expiring_snapshots(table, settings, now)
    manifests = _Manifests(table)
    metadata = table.metadata
    expired = [s for s in metadata.snapshots if s.snapshot_id in expiring]
    kept = [s for s in metadata.snapshots if s.snapshot_id not in expiring]
    kept_statistics = {
        s.statistics_path for s in _statistics(table) if s.snapshot_id not in expiring
    }
    doomed = unreachable_files(table, expired, kept, kept_statistics, manifests)
    kept_shared = doomed.drop_shared(shared)
    specs: tuple[int, ...] = ()
    schemas: tuple[int, ...] = ()
    if settings.clean_expired_metadata:
        specs, schemas = unused_metadata(table, {s.snapshot_id for s in kept}, manifests)
    return ExpiryPlan(
        doomed.data_files,
        doomed.delete_files,
        doomed.manifests,
        doomed.manifest_lists,
        doomed.statistics_files,
        snapshot_ids=expiring,
        unused_specs=specs,
        unused_schemas=schemas,
        tables_consulted=shared.tables,
        files_kept_shared=len(kept_shared),
    )


#: Manifest lists a plan reads at most to find a partition spec nothing uses any more.
PLAN_MAX_MANIFEST_LISTS = 50


def _metadata_ids(table: Table) -> tuple[set[int], set[int]]:
    return (
        {s.spec_id for s in table.metadata.partition_specs},
        {s.schema_id for s in table.metadata.schemas},
    )


class ExpireSnapshots(Operation):
    """Old snapshots expired, and the files only they reached deleted (unless
    ``delete_files`` is off)."""

    name = "expire_snapshots"
    description = "Expire old snapshots with Iceberg's expire_snapshots (Spark)."
    settings_block = "expire_snapshots"
    cli_command = "expire"
    dry_run_help = (
        "say how many snapshots would expire and, from metadata, how many files (data, delete, "
        "manifests, manifest lists, statistics) and bytes the expiry would then delete, by "
        "reachability (output bytes_to_free, files_to_free and per kind); change nothing"
    )
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
        wal_root = configured_wal_root(ctx.config)
        if reason is not None and not wal_files_to_settle(ctx.table, wal_root, ctx.ref):
            return Outcome.skip(reason, wal_files_settled=0)
        return None  # expiry due, or WAL leftovers of a commit to settle first

    def run(self, ctx: OpContext) -> Outcome:
        rule = ctx.settings.expire_snapshots
        if ctx.dry_run:
            return self._dry_run(ctx)
        # Expiry may drop a WAL commit's record: first settle any WAL files it still covers.
        settled = settle_committed(ctx.table, configured_wal_root(ctx.config), ctx.ref)
        reason = self._nothing(ctx)
        if reason is not None:
            return Outcome.skip(reason, wal_files_settled=settled)
        older_than = ctx.now - rule.retention_threshold
        specs_before, schemas_before = _metadata_ids(ctx.table)
        # The procedure deletes by its own diff, blind to other tables: a table whose
        # location overlaps another's (or may: one cannot be read) deletes on the driver.
        if ctx.driver_side or _client_side(ctx) or not rule.delete_files or _may_share(ctx):
            out = self._on_driver(ctx, older_than)
        else:
            args = {
                "table": ctx.ref.procedure_argument(),
                "older_than": timestamp_literal(older_than),
                "retain_last": str(rule.retain_last),
                "clean_expired_metadata": str(rule.clean_expired_metadata).lower(),
            }
            called = call_procedure(ctx.spark(), ctx.catalog_name, "expire_snapshots", args)
            out = {**called.output(), "execution": "distributed", "tables_consulted": []}
        specs_after, schemas_after = _metadata_ids(ctx.table.refresh())
        out["partition_specs_dropped"] = sorted(specs_before - specs_after)
        out["schemas_dropped"] = sorted(schemas_before - schemas_after)
        details = (
            f"expired snapshots older than {older_than:%Y-%m-%d %H:%M:%S} UTC "
            f"(keeping the last {rule.retain_last}); "
        )
        if out.get("cleanup_error"):
            details += (
                "deleted no file: the metadata that tells which files only the expired "
                f"snapshots reach could not be read ({out['cleanup_error']}); "
                "remove_orphan_files frees them"
            )
        elif out.get("sharing_error"):
            details += (
                "deleted no file: whether another table sharing this location still reads "
                f"them cannot be established ({out['sharing_error']})"
            )
        elif rule.delete_files:
            details += (
                f"deleted {out['deleted_data_files_count']} data files, "
                f"{out['deleted_manifest_files_count']} manifests, "
                f"{out['deleted_manifest_lists_count']} manifest lists"
            )
            if "bytes_freed" in out:
                # Exact figures too: the exporter sums them from the log's details.
                details += (
                    f" ({format_bytes(out['bytes_freed'])} freed: {out['files_freed']} files, "
                    f"{out['bytes_freed']} bytes)"
                )
            if out.get("lease_lost"):
                details += (
                    f"; stopped deleting, the table's lease is lost ({out['lease_lost']}): "
                    f"{out['delete_failure_count']} files are left for remove_orphan_files"
                )
            elif out.get("delete_failure_count"):
                details += (
                    f"; {out['delete_failure_count']} files could not be deleted "
                    "(left for remove_orphan_files)"
                )
        else:
            details += "deleted no file (delete_files: false): remove_orphan_files frees them"
        if out.get("tables_consulted"):
            details += (
                f"; consulted {', '.join(out['tables_consulted'])} (sharing this location): "
                f"kept {out.get('files_kept_shared', 0)} files they still reference"
            )
        if out["partition_specs_dropped"] or out["schemas_dropped"]:
            details += (
                f"; dropped unused partition specs {out['partition_specs_dropped']} "
                f"and schemas {out['schemas_dropped']}"
            )
        if settled:
            details += f"; first deleted {settled} WAL files already committed"
        # Committed either way: a lost lease or unreadable metadata left the deletes undone.
        output = {**out, "wal_files_settled": settled}
        if out.get("lease_lost") or out.get("cleanup_error") or out.get("sharing_error"):
            return Outcome("failed", details, output)
        return Outcome("completed", details, output)

    def _dry_run(self, ctx: OpContext) -> Outcome:
        """What an expiry would expire and delete, the sharing tables consulted."""
        rule = ctx.settings.expire_snapshots
        shared, error = NO_SHARED_FILES, None
        if rule.delete_files:
            try:
                shared = shared_files(
                    ctx.locations, ctx.ref.key, ctx.table.location(), clean=_cleaner(ctx)
                )
            except Exception as exc:  # it would delete nothing: say why
                error = _describe(ctx, exc)
        plan = plan_expiry(ctx.table, rule, ctx.now, shared)
        verb = "deleting" if rule.delete_files else "leaving to remove_orphan_files"
        figures: dict[str, Any] = {**plan.output(), "files_deleted": rule.delete_files}
        if error is not None:
            figures.update({key: 0 for key in figures if key.endswith("_to_free")})
            figures["sharing_error"] = error
            return Outcome.skip(
                f"dry run: {len(plan.snapshot_ids)} of {ctx.before.snapshots} snapshots would "
                f"expire, deleting no file: {error}",
                **figures,
            )
        return Outcome.skip(
            f"dry run: {len(plan.snapshot_ids)} of {ctx.before.snapshots} snapshots "
            f"would expire, {verb} {plan.summary()}",
            **figures,
        )

    @staticmethod
    def _on_driver(ctx: OpContext, older_than: datetime) -> dict[str, Any]:
        """Iceberg's ``ExpireSnapshots`` on the driver, committed with
        ``cleanExpiredFiles(false)``; then, unless ``delete_files`` is off, the files the
        expired snapshots reach and the committed table does not, nor any table sharing its
        location (:func:`~..sharing.shared_files`), are deleted here through the table's own
        FileIO (:func:`unreachable_files`, :func:`~.file_deletes.delete_files`). A delete that
        fails is left for orphan removal; when the sharing tables cannot be read, nothing is
        deleted."""
        rule = ctx.settings.expire_snapshots
        cutoff_ms = int(older_than.timestamp() * 1000)
        on_connect = ctx.on_connect
        version = ctx.table.metadata.format_version
        if on_connect and version > PYICEBERG_MAX_FORMAT_VERSION:
            raise OperationError(
                f"{ctx.ref.key} is a format-version {version} table whose expiry must "
                "delete its own files (it may share its folder, or delete_files is false): "
                "that needs Iceberg's Java API, which a Spark Connect client has not (and "
                "pyiceberg writes no such metadata); expire it with a local Spark session"
            )

        def expire() -> tuple[Table, Any]:
            # Loaded before the commit: every snapshot the commit can remove is in it (one
            # committed in between is younger than the cut-off, so kept).
            before = _fresh(ctx.table)
            if on_connect:  # no Java table API: the same metadata-only commit, by pyiceberg
                _expire_without_deletes(before, rule, ctx.now)
                return before, None
            java = ctx.java_table()
            expiry = java.expireSnapshots().expireOlderThan(cutoff_ms)
            expiry = expiry.retainLast(rule.retain_last)
            expiry = expiry.cleanExpiredMetadata(rule.clean_expired_metadata)
            expiry.cleanExpiredFiles(False).commit()
            return before, java

        called = committing(expire)
        before, java = called.rows
        # Loaded after the commit: what the table references now, whatever else committed
        # since, is kept; the expired snapshots are the ones it no longer has.
        after = _fresh(ctx.table)
        kept_ids = {s.snapshot_id for s in after.metadata.snapshots}
        expired = [s for s in before.metadata.snapshots if s.snapshot_id not in kept_ids]
        out: dict[str, Any] = {
            "snapshots_expired": len(expired),
            "commit_retries": called.retries,
            "procedure_s": round(called.seconds, 3),
            # On Spark Connect: committed and deleted by this process (pyiceberg).
            "execution": "client" if on_connect else "driver",
            "files_deleted": rule.delete_files,
            "tables_consulted": [],
        }
        nothing = {
            **{f"deleted_{kind}_count": 0 for kind in _KINDS.values()},
            "files_freed": 0,
            "bytes_freed": 0,
        }
        if not rule.delete_files:
            return {**out, **nothing}
        started = time.perf_counter()
        try:
            doomed = unreachable_files(
                before,
                expired,
                after.metadata.snapshots,
                {s.statistics_path for s in _statistics(after)},
            )
        except Exception as exc:  # unreadable metadata: nothing is proved unreachable
            return {**out, **nothing, "cleanup_error": _describe(ctx, exc)}
        # Read after the commit, right before deleting: what they reference now is kept.
        try:
            shared = shared_files(ctx.locations, ctx.ref.key, after.location(), clean=_cleaner(ctx))
        except Exception as exc:  # another table may still read them: delete nothing
            return {**out, **nothing, "sharing_error": _describe(ctx, exc)}
        kept_shared = doomed.drop_shared(shared)
        out["tables_consulted"] = list(shared.tables)
        out["files_kept_shared"] = len(kept_shared)
        if kept_shared:
            out["kept_shared_sample"] = dict(list(kept_shared.items())[:20])
        paths = [path for attribute in _KINDS for path in getattr(doomed, attribute)]
        deletion = (
            delete_files_without_spark(ctx, paths)
            if java is None  # Spark Connect: the table's pyiceberg FileIO
            else delete_files(ctx, java.io(), paths)
        )
        failed = deletion.failed
        for attribute, kind in _KINDS.items():
            files = getattr(doomed, attribute)
            out[f"deleted_{kind}_count"] = sum(1 for path in files if path not in failed)
        out["files_freed"] = doomed.files - len(failed)
        out["bytes_freed"] = doomed.bytes - sum(doomed.size(path) for path in failed)
        out["delete_s"] = round(time.perf_counter() - started, 3)
        if failed:
            out["delete_failures"] = dict(list(failed.items())[:20])  # a sample: why
            out["delete_failure_count"] = len(failed)
        if deletion.lease_lost is not None:
            out["lease_lost"] = deletion.lease_lost
        return out


def _expire_without_deletes(before: Table, rule: ExpireSnapshotsSettings, now: datetime) -> None:
    """Expire, with pyiceberg, the snapshots Iceberg's ``ExpireSnapshots`` would expire at
    ``now`` (:func:`expiring_snapshots`), deleting no file: what the driver's
    ``cleanExpiredFiles(false)`` commits, for Spark Connect. Branch and tag heads stay; a
    ref past its age and unused specs and schemas are left for the next local expiry."""
    table = _fresh(before)
    protected = {ref.snapshot_id for ref in table.metadata.refs.values()}
    doomed = sorted(expiring_snapshots(table, rule, now) - protected)
    if doomed:
        table.maintenance.expire_snapshots().by_ids(doomed).commit()


def _client_side(ctx: OpContext) -> bool:
    """On Spark Connect, whether a small table expires here, by pyiceberg (the metadata
    commit, then the deletes through its FileIO: output ``execution: client``) rather than
    by Iceberg's procedure, a Spark job on the server for a few metadata files. Only when
    that leaves nothing of the procedure's undone: the table has no ref but ``main`` (the
    procedure also drops branches and tags past their age), and no partition spec or
    schema that ``clean_expired_metadata`` could drop (it has one of each, or the setting
    is off)."""
    if not (ctx.small and ctx.on_connect):
        return False
    metadata = ctx.table.metadata
    if metadata.format_version > PYICEBERG_MAX_FORMAT_VERSION:  # pyiceberg cannot commit it
        return False
    if set(metadata.refs) - {"main"}:
        return False
    rule = ctx.settings.expire_snapshots
    single = len(metadata.partition_specs) == 1 and len(metadata.schemas) == 1
    return single or not rule.clean_expired_metadata


def _may_share(ctx: OpContext) -> bool:
    """Whether another table may reference this table's files: its location overlaps
    another's, or a table's location (or the catalog's listing) cannot be read."""
    try:
        sharing = table_sharing(ctx.locations, ctx.ref.key, ctx.table)
    except Exception:  # cannot tell: the driver's path, which then deletes nothing
        return True
    return sharing.shared or bool(sharing.unknown)


#: ``_Doomed`` attribute -> the kind in output keys (``deleted_<kind>_count``), as the
#: procedure names its own figures.
_KINDS = {
    "data_files": "data_files",
    "delete_files": "delete_files",
    "manifests": "manifest_files",
    "manifest_lists": "manifest_lists",
    "statistics_files": "statistics_files",
}


def _cleaner(ctx: OpContext) -> Callable[[str], str]:
    return lambda text: scrub(text, ctx.config)


def _describe(ctx: OpContext, exc: BaseException) -> str:
    """One line for an error, secrets masked: these lines go to the op's output."""
    return describe_error(exc, _cleaner(ctx))


def _fresh(table: Table) -> Table:
    """The table as the catalog has it now, as a new object (``refresh`` updates in place)."""
    return table.catalog.load_table(table.name())
