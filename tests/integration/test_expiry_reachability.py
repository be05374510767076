"""Issue 23, item 1: expiry deletes by reachability on every path, on the history shapes
where Iceberg 1.10.2's own driver-side cleanup (``RemoveSnapshots`` choosing
``IncrementalFileCleanup`` on a linear ``main``) deletes live files, and on the shapes
where 1.10.2 picks its reachable cleanup instead (kept as regression tests).

Each shape is built with Iceberg's Java table API on the driver (py4j), from real Parquet
files written by pyiceberg, and the project's ``expire_snapshots`` runs on it (the driver
path: commit with ``cleanExpiredFiles(false)``, then delete what only the expired
snapshots reach). Afterwards every file a retained snapshot references is on disk, and
every retained snapshot reads back the rows it had, through Spark and through DuckDB.
Where the shape reproduces the bug, an identical copy gets Iceberg's own
``expireSnapshots().commit()`` with its default cleanup: the control, evidence that the
fixture reproduces the bug on the pinned runtime (it fails once a runtime deletes no live
file there: then the pin moved, see docs/how-to/deploy.md).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from icegate_dagster.maintenance import Maintainer, TableRef, iceberg_java
from icegate_dagster.maintenance.ops.expire_snapshots import plan_expiry
from icegate_dagster.spark.session import get_spark
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, LakehouseFactory, batch

OURS = "lakehouse.ours"
ICEBERGS = "lakehouse.icebergs"
EXPIRY = {"expire_snapshots": {"retention_threshold": "1s", "retain_last": 1}}


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _java(lh: Lakehouse, key: str) -> Any:
    """Iceberg's Java ``Table`` of ``key`` on the Spark driver."""
    identifier = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    return iceberg_java.java_table(get_spark(lh.config), identifier, lh.config.catalog.name)


def _files(lh: Lakehouse, *files: Any) -> Any:
    """A ``java.util.HashSet`` of Java ``DataFile`` objects."""
    found = get_spark(lh.config)._jvm.java.util.HashSet()
    for file in files:
        found.add(file)
    return found


def _added(java_table: Any, service: str) -> Any:
    """The data file of ``service`` that the current snapshot added (Java ``DataFile``)."""
    snapshot = java_table.currentSnapshot()
    [file] = [
        f for f in snapshot.addedDataFiles(java_table.io()) if f"service={service}/" in f.location()
    ]
    return file


def _append(lh: Lakehouse, key: str, start: int) -> None:
    lh.table(key).append(batch(start, ("api", "web")))


def _partition_stats(lh: Lakehouse, key: str, snapshot_id: int) -> None:
    """Iceberg's ``compute_partition_stats`` for one snapshot: a partition statistics file
    registered in the table metadata."""
    get_spark(lh.config).sql(
        f"CALL {lh.config.catalog.name}.system.compute_partition_stats("
        f"table => '{key}', snapshot_id => {snapshot_id})"
    ).collect()


# --- the shapes ---------------------------------------------------------------------------


def removed_and_readded_in_one_commit(lh: Lakehouse, key: str) -> str:
    """apache/iceberg#17304: a ``RewriteFiles`` commit deletes file F and adds F back, so
    its manifests hold a ``DELETED`` and an ``ADDED`` entry for F; then one more append.
    Returns F's path."""
    lh.add_table(key, appends=1)
    java = _java(lh, key)
    f = _added(java, "api")
    _append(lh, key, 1000)
    java.refresh()
    java.newRewrite().rewriteFiles(_files(lh, f), _files(lh, f)).commit()
    _append(lh, key, 2000)
    return str(f.location())


def removed_then_readded_later(lh: Lakehouse, key: str) -> str:
    """File F deleted by one commit and appended again by a later one (the same path
    registered anew), on a linear ``main``; partition statistics of the first snapshot
    (which expires) and of the last (kept). Returns F's path."""
    lh.add_table(key, appends=1)
    java = _java(lh, key)
    f = _added(java, "api")
    _partition_stats(lh, key, java.currentSnapshot().snapshotId())
    _append(lh, key, 1000)
    java.refresh()
    java.newDelete().deleteFile(f).commit()
    _append(lh, key, 2000)
    java.refresh()
    java.newAppend().appendFile(f).commit()
    _append(lh, key, 3000)
    java.refresh()
    _partition_stats(lh, key, java.currentSnapshot().snapshotId())
    return str(f.location())


def branches_tags_and_cherry_picks(lh: Lakehouse, key: str) -> str:
    """A history that is not one line: a tag on the first snapshot; an append rolled back
    (its snapshot left off ``main``); a branch ``audit`` on which file F is removed and
    re-added in one commit and another file deleted; a staged (WAP) snapshot re-adding the
    rolled-back files, cherry-picked onto ``main`` after ``main`` moved on (a new snapshot
    with ``source-snapshot-id``); then one more append. Returns F's path."""
    lh.add_table(key, appends=1)
    java = _java(lh, key)
    first = java.currentSnapshot().snapshotId()
    f, web = _added(java, "api"), _added(java, "web")
    java.manageSnapshots().createTag("v1", first).commit()
    _append(lh, key, 1000)
    java.refresh()
    rolled_back = java.currentSnapshot()
    back_files = list(rolled_back.addedDataFiles(java.io()))
    java.manageSnapshots().rollbackTo(first).commit()
    _append(lh, key, 2000)
    java.refresh()
    java.manageSnapshots().createBranch("audit", java.currentSnapshot().snapshotId()).commit()
    java.newRewrite().rewriteFiles(_files(lh, f), _files(lh, f)).toBranch("audit").commit()
    java.newDelete().deleteFile(web).toBranch("audit").commit()
    known = {s.snapshotId() for s in java.snapshots()}
    staged = java.newAppend()
    for file in back_files:
        staged = staged.appendFile(file)
    staged.stageOnly().commit()
    java.refresh()
    [wap] = [s.snapshotId() for s in java.snapshots() if s.snapshotId() not in known]
    _append(lh, key, 3000)  # main moves on: the pick below is no fast-forward
    java.refresh()
    java.manageSnapshots().cherrypick(wap).commit()
    _append(lh, key, 4000)
    return str(f.location())


def a_missing_parent_snapshot(lh: Lakehouse, key: str) -> str:
    """apache/amoro#4231's shape: ``main``'s history broken by a snapshot expired by id
    without cleanup, below a commit that merged every manifest (pyiceberg's merge append),
    so the first snapshot's file F lives on as an ``EXISTING`` entry of the merged
    manifest. Returns F's path."""
    ref = TableRef.parse(key)
    lh.catalog.create_namespace_if_not_exists(ref.namespace)
    merging = {"commit.manifest-merge.enabled": "true", "commit.manifest.min-count-to-merge": "3"}
    lh.catalog.create_table(ref.identifier, schema=SCHEMA, partition_spec=SPEC, properties=merging)
    _append(lh, key, 0)
    java = _java(lh, key)
    f = _added(java, "api")
    _append(lh, key, 1000)
    java.refresh()
    parent = java.currentSnapshot().snapshotId()
    _append(lh, key, 2000)  # the third manifest: all three merged into one
    java.refresh()
    java.expireSnapshots().expireSnapshotId(parent).cleanExpiredFiles(False).commit()
    _append(lh, key, 3000)
    return str(f.location())


Shape = Callable[[Lakehouse, str], str]


# --- what is on disk, what reads back -------------------------------------------------------


def _on_disk(lh: Lakehouse, key: str) -> dict[Path, int]:
    """Every file under the table's folder (Hadoop's ``.crc`` side files apart)."""
    root = _local(lh.table(key).location())
    return {
        path: path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and not path.name.endswith(".crc")
    }


def _statistics(lh: Lakehouse, key: str) -> dict[Path, int]:
    """The table's statistics and partition statistics files, and their snapshots."""
    metadata = lh.table(key).metadata
    return {
        _local(s.statistics_path): s.snapshot_id
        for s in [*metadata.statistics, *metadata.partition_statistics]
    }


def _referenced(lh: Lakehouse, key: str) -> set[Path]:
    """Every file a snapshot the table keeps references: manifest lists, manifests, the
    data and delete files they list live, and statistics files."""
    table = lh.table(key)
    found: set[Path] = set(_statistics(lh, key))
    for snapshot in table.metadata.snapshots:
        found.add(_local(snapshot.manifest_list))
        for manifest in snapshot.manifests(table.io):
            found.add(_local(manifest.manifest_path))
            found.update(
                _local(e.data_file.file_path) for e in manifest.fetch_manifest_entry(table.io)
            )
    return found


def _snapshot_rows(lh: Lakehouse, key: str) -> dict[int, Counter[tuple[Any, ...]]]:
    """Each snapshot's rows (id, service, body) as a multiset, read by Spark."""
    spark = get_spark(lh.config)
    name = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    return {
        s.snapshot_id: Counter(
            tuple(r)
            for r in spark.sql(
                f"SELECT id, service, body FROM {name} VERSION AS OF {s.snapshot_id}"
            ).collect()
        )
        for s in lh.table(key).metadata.snapshots
    }


def _duckdb_rows(lh: Lakehouse, key: str, snapshot_id: int) -> Counter[tuple[Any, ...]]:
    """One snapshot's rows read by DuckDB's iceberg extension (no Spark, no pyiceberg)."""
    query = "SELECT id, service, body FROM iceberg_scan(?, snapshot_from_id => ?)"
    rows = duckdb_iceberg().execute(query, [lh.table(key).metadata_location, snapshot_id])
    return Counter(tuple(r) for r in rows.fetchall())


def _icebergs_own_expiry(lh: Lakehouse, key: str) -> None:
    """The old driver path: Iceberg's ``expireSnapshots()`` with its default cleanup, and
    the same retention as the project's expiry (older than 1 s, keeping the last one)."""
    cutoff_ms = int(time.time() * 1000) - 1000
    _java(lh, key).expireSnapshots().expireOlderThan(cutoff_ms).retainLast(1).commit()


@pytest.mark.parametrize(
    ("shape", "icebergs_own_deletes_it"),
    [
        (removed_and_readded_in_one_commit, True),
        (removed_then_readded_later, True),
        # Iceberg 1.10 picks its reachable cleanup here (snapshots off main): no live file
        # goes. Kept as a regression test of the project's own cleanup.
        (branches_tags_and_cherry_picks, False),
        # Iceberg 1.10.0 fixed the strategy choice here (apache/iceberg#13568): reachable.
        (a_missing_parent_snapshot, False),
    ],
    ids=["readded-in-one-commit", "readded-later", "branches-tags-cherry-picks", "no-parent"],
)
def test_expiry_never_deletes_a_file_a_retained_snapshot_references(
    lakehouse_factory: LakehouseFactory, shape: Shape, icebergs_own_deletes_it: bool
) -> None:
    lh = lakehouse_factory(maintain=EXPIRY)
    reused = _local(shape(lh, OURS))
    kept_rows = _snapshot_rows(lh, OURS)
    if icebergs_own_deletes_it:
        reused_control = _local(shape(lh, ICEBERGS))
    time.sleep(1.2)  # every snapshot is now older than the threshold
    statistics = _statistics(lh, OURS)
    plan = plan_expiry(
        lh.table(OURS), lh.config.for_table(OURS).expire_snapshots, datetime.now(UTC)
    )
    before = _on_disk(lh, OURS)

    result = Maintainer(lh.config).maintain_table(TableRef.parse(OURS), ["expire_snapshots"])

    assert result.ok, [(o.status, o.details, o.output) for o in result.ops]
    [op] = result.ops
    assert op.status == "completed" and op.output["execution"] == "driver", op
    assert op.output["snapshots_expired"] == len(plan.snapshot_ids) > 0
    after = _on_disk(lh, OURS)
    referenced = _referenced(lh, OURS)
    assert reused in referenced and reused.exists()
    assert not sorted(p for p in referenced if not p.exists())  # nothing live deleted
    vanished = {p: size for p, size in before.items() if p not in after}
    assert vanished, "the expiry freed nothing: the shape tests nothing"
    # The dry run said exactly this, and the op's figures agree.
    assert (plan.files, plan.bytes) == (len(vanished), sum(vanished.values()))
    assert (op.output["files_freed"], op.output["bytes_freed"]) == (plan.files, plan.bytes)
    # Statistics files go with their snapshots, and only with them.
    retained = {s.snapshot_id for s in lh.table(OURS).metadata.snapshots}
    assert {p: p.exists() for p in statistics} == {p: s in retained for p, s in statistics.items()}
    # Deleted through Iceberg's Hadoop FileIO: no checksum file outlives its file.
    crc = [p for p in _local(lh.table(OURS).location()).rglob(".*.crc")]
    assert not [p for p in crc if not p.with_name(p.name[1:-4]).exists()]
    assert _snapshot_rows(lh, OURS) == {s: kept_rows[s] for s in retained}
    for snapshot_id in retained:
        assert _duckdb_rows(lh, OURS, snapshot_id) == kept_rows[snapshot_id], snapshot_id

    if icebergs_own_deletes_it:  # the control: the old driver path on an identical copy
        _icebergs_own_expiry(lh, ICEBERGS)
        missing = sorted(p for p in _referenced(lh, ICEBERGS) if not p.exists())
        assert missing == [reused_control], missing
        assert os.path.basename(reused_control).endswith(".parquet")


def test_a_lease_lost_after_the_commit_stops_the_deletes_and_fails_the_expiry(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(maintain=EXPIRY)
    lh.add_table(OURS, appends=4)
    locks = Maintainer(lh.config).leasing.locks
    assert locks is not None
    time.sleep(1.2)
    before = _on_disk(lh, OURS)
    plan = plan_expiry(
        lh.table(OURS), lh.config.for_table(OURS).expire_snapshots, datetime.now(UTC)
    )

    def take_over(point: str) -> None:
        committed = len(lh.table(OURS).metadata.snapshots) == 1
        if point == "before_commit" and committed:  # the expiry committed: now the deletes
            with locks.engine.begin() as conn:
                conn.execute(
                    update(locks.table)
                    .where(locks.table.c.table_name == OURS)
                    .values(token="thief", holder="thief-host:7:other-run")
                )

    result = Maintainer(lh.config, fault_hook=take_over).maintain_table(
        TableRef.parse(OURS), ["expire_snapshots"]
    )

    [op] = result.ops
    assert op.status == "failed", op
    assert "stopped deleting, the table's lease is lost" in op.details, op.details
    assert "thief-host:7:other-run" in op.output["lease_lost"]
    assert op.output["snapshots_expired"] == 3 and op.output["files_freed"] == 0
    assert op.output["delete_failure_count"] == plan.files > 0
    assert len(lh.table(OURS).metadata.snapshots) == 1  # the commit stands
    assert before.keys() <= _on_disk(lh, OURS).keys()  # no file deleted without the lease
