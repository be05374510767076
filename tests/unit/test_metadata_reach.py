"""What a table version's metadata reaches: one walk gives the live and the full answer,
read once per metadata file (real pyiceberg tables, no JVM)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

import pytest

from icegate_dagster.maintenance.discovery import REACH_CACHE, ReachCache, metadata_reach
from tests.unit.pyiceberg_tables import create_table, sqlite_catalog


def _local(uri: str) -> Path:
    return Path(urlparse(uri).path)


def test_deleted_entries_are_reached_but_not_live(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    table = create_table(catalog, "t", appends=3)
    files_before = {t.file.file_path for t in table.scan().plan_files()}
    table.delete("id = 0")  # the file holding id 0 leaves the live set
    table = catalog.load_table(table.name())
    # Only the delete's own manifest still names that file now (as DELETED).
    current = table.current_snapshot()
    assert current is not None
    older = [
        s.snapshot_id for s in table.metadata.snapshots if s.snapshot_id != current.snapshot_id
    ]
    table.maintenance.expire_snapshots().by_ids(older).commit()
    table = catalog.load_table(table.name())
    live = {t.file.file_path for t in table.scan().plan_files()}

    everything = metadata_reach(table, live_only=False)
    live_reach = metadata_reach(table, live_only=True)

    assert everything is not None and live_reach is not None
    gone = {p for p in everything - live_reach if p.endswith(".parquet")}
    assert len(gone) == 1 and gone == files_before - live
    assert live <= live_reach
    # Every snapshot's manifest list, and the current metadata file, are reached.
    assert {s.manifest_list for s in table.metadata.snapshots} <= live_reach
    assert table.metadata_location in live_reach


def test_one_table_version_is_walked_once(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    table = create_table(catalog, "t", appends=2)
    REACH_CACHE.clear()
    first = metadata_reach(table, live_only=True)
    assert first is not None
    # A manifest that vanished after the walk is not read again: metadata files never
    # change, so the answer for this version stands (a missing file can only keep more).
    manifest = table.current_snapshot().manifests(table.io)[0].manifest_path  # type: ignore[union-attr]
    _local(manifest).rename(_local(manifest).with_suffix(".moved"))
    assert metadata_reach(table, live_only=True) == first
    assert metadata_reach(table, live_only=False) is not None
    _local(manifest).with_suffix(".moved").rename(_local(manifest))

    # A new version is walked afresh and reaches the new commit's files.
    table.append(create_table(catalog, "rows_source", appends=1).scan().to_arrow())
    table = catalog.load_table(table.name())
    newer = metadata_reach(table, live_only=True)
    assert newer is not None and first < newer
    assert table.current_snapshot().manifest_list in newer  # type: ignore[union-attr]


def test_manifest_limit_is_kept_from_the_cache(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    table = create_table(catalog, "t", appends=3)
    REACH_CACHE.clear()
    assert metadata_reach(table, live_only=True, max_manifests=2) is None
    assert metadata_reach(table, live_only=True, max_manifests=2) is None
    # No limit: the whole walk, though a limited walk of this version was seen first.
    unlimited = metadata_reach(table, live_only=True)
    assert unlimited is not None
    manifests = {m.manifest_path for m in table.current_snapshot().manifests(table.io)}  # type: ignore[union-attr]
    assert len(manifests) == 3 and manifests <= unlimited
    assert metadata_reach(table, live_only=True, max_manifests=2) is None
    assert metadata_reach(table, live_only=False, max_manifests=3) is not None


def test_the_cache_keeps_the_latest_walks_within_its_paths(tmp_path: Path) -> None:
    catalog = sqlite_catalog(tmp_path)
    first, second = (create_table(catalog, name, appends=2) for name in ("a", "b"))
    one_walk = len(metadata_reach(first, live_only=False) or ())
    cache = ReachCache(max_paths=one_walk + 2)  # room for one walk, not two
    cache.get(first, None)
    cache.get(second, None)  # the older walk goes
    manifest = first.current_snapshot().manifests(first.io)[0].manifest_path  # type: ignore[union-attr]
    _local(manifest).unlink()
    with pytest.raises(FileNotFoundError):  # read again, and the file is gone
        cache.get(first, None)
    kept = cache.get(second, None).everything  # still held: nothing read
    assert kept is not None and second.metadata_location in kept
