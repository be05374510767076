"""WAL ingest is exactly-once without relying on locks, and its record outlives any expiry.

The lease and the WAL folder's ``flock`` normally keep two ingesters of one table
apart; here both are bypassed, as happens when a lease is lost or the WAL lives on
object storage where ``flock`` means nothing. Correctness must then come from the
commit itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.identifiers import quote_identifier
from icegate_dagster.maintenance.leases.holder import TableLeasing
from icegate_dagster.maintenance.wal import BATCH_PROPERTY, FILES_PROPERTY, WalRoot, compaction
from icegate_dagster.spark.session import get_spark
from tests.integration.test_wal_compaction import TABLE, WAL_RULES, fill_wal, spark_rows
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, LakehouseFactory


@pytest.fixture
def unguarded(monkeypatch: pytest.MonkeyPatch) -> None:
    """No lease and no WAL flock: two ingesters may reach the same files."""

    @contextlib.contextmanager
    def no_flock(wal_root: WalRoot, ref: TableRef) -> Iterator[None]:
        yield None

    monkeypatch.setattr(TableLeasing, "locks", property(lambda self: None))
    monkeypatch.setattr(compaction, "wal_folder_lock", no_flock)


def _ingest_together(lh: Lakehouse) -> list[Any]:
    """Two ingesters of one table, released together at the commit point."""
    at_commit = threading.Barrier(2, timeout=60)
    released: set[int] = set()

    def hook(point: str) -> None:
        # Each ingester's first commit attempt only: a refused attempt is retried alone.
        if point == "before_commit" and threading.get_ident() not in released:
            released.add(threading.get_ident())
            at_commit.wait()

    results: list[Any] = []

    def ingest() -> None:
        maintainer = Maintainer(lh.config, fault_hook=hook)
        results.append(maintainer.run_op(TableRef.parse(TABLE), "wal_compaction"))

    threads = [threading.Thread(target=ingest) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return results


@pytest.mark.parametrize("existing_snapshots", [2, 0], ids=["table-with-data", "empty-table"])
def test_two_ingesters_released_together_at_the_commit_append_every_row_once(
    lakehouse_factory: LakehouseFactory, unguarded: None, existing_snapshots: int
) -> None:
    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    if existing_snapshots:
        lh.add_table(TABLE, appends=existing_snapshots)
    else:
        lh.catalog.create_namespace_if_not_exists("lakehouse")
        identifier = TableRef.parse(TABLE).identifier
        lh.catalog.create_table(identifier, schema=SCHEMA, partition_spec=SPEC)
    before = spark_rows(lh, TABLE)
    expected = before + fill_wal(lh, files=6)

    results = _ingest_together(lh)

    assert sorted(r.status for r in results) == ["completed", "skipped"], [
        (r.status, r.details) for r in results
    ]
    loser = next(r for r in results if r.status == "skipped")
    assert "another ingester committed 6 of these 6 WAL files first" in loser.details
    assert spark_rows(lh, TABLE) == expected  # every row exactly once
    assert lh.wal_files(TABLE) == []
    # No staging branch is left behind.
    assert set(lh.table(TABLE).metadata.refs) == {"main"}


def test_the_wal_record_survives_expiry_by_another_engine_after_a_crash(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lh.add_table(TABLE, appends=2)
    expected = spark_rows(lh, TABLE) + fill_wal(lh, files=5)

    def crash(point: str) -> None:
        if point == "after_commit":
            raise RuntimeError("killed right after the WAL commit")

    ref = TableRef.parse(TABLE)
    crashed = Maintainer(lh.config, fault_hook=crash).run_op(ref, "wal_compaction")
    assert crashed.status == "failed"
    assert len(lh.wal_files(TABLE)) == 5  # committed, not yet deleted

    # Another engine runs on the table: a new commit, then a plain expiry that drops the
    # WAL commit's snapshot (and with it the snapshot summary that recorded the batch).
    from tests.lakehouse import batch

    lh.table(TABLE).append(batch(900_000, ("api",)))
    expected += Counter(
        (r["id"], r["service"], r["timestamp"].replace(tzinfo=None), r["body"])
        for r in batch(900_000, ("api",)).to_pylist()
    )
    spark = get_spark(lh.config)
    catalog = quote_identifier(lh.config.catalog.name)
    spark.sql(
        f"CALL {catalog}.system.expire_snapshots(table => 'lakehouse.logs', "
        "older_than => TIMESTAMP '2999-01-01 00:00:00+00:00', retain_last => 1)"
    ).collect()
    snapshots = lh.table(TABLE).metadata.snapshots
    assert len(snapshots) == 1, [(s.snapshot_id, s.summary) for s in snapshots]
    assert all(s.summary is None or s.summary.get(FILES_PROPERTY) is None for s in snapshots), (
        "the WAL commit's snapshot should be gone"
    )

    rerun = Maintainer(lh.config).run_op(ref, "wal_compaction")

    assert rerun.status == "completed", rerun.details
    assert "deleted 5 WAL files an earlier commit already holds" in rerun.details
    assert spark_rows(lh, TABLE) == expected  # nothing ingested twice
    assert lh.wal_files(TABLE) == []


@pytest.mark.parametrize("where", ["main", "another-branch"])
def test_a_commit_landing_between_the_check_and_the_publish_is_retried_not_failed(
    lakehouse_factory: LakehouseFactory, where: str
) -> None:
    """Another writer commits right after the publish read the table (a plain append to
    main, or a write to another branch that only moves the table's sequence number): the
    publish is refused by the catalog, checks the WAL record again and lands once."""
    from tests.lakehouse import batch

    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lh.add_table(TABLE, appends=2)
    expected = spark_rows(lh, TABLE) + fill_wal(lh, files=4)
    theirs = batch(800_000, ("api",))
    interrupted: list[str] = []

    def writer_commits_first(point: str) -> None:
        if point == "before_commit" and not interrupted:
            interrupted.append(point)
            lh.table(TABLE).append(theirs, branch="main" if where == "main" else "audit")

    ref = TableRef.parse(TABLE)
    outcome = Maintainer(lh.config, fault_hook=writer_commits_first).run_op(ref, "wal_compaction")

    assert interrupted
    assert outcome.status == "completed", outcome.details
    if where == "main":
        expected += Counter(
            (r["id"], r["service"], r["timestamp"].replace(tzinfo=None), r["body"])
            for r in theirs.to_pylist()
        )
    assert spark_rows(lh, TABLE) == expected
    assert lh.wal_files(TABLE) == []
    current = lh.table(TABLE).current_snapshot()
    assert current is not None and current.summary is not None
    assert current.summary[BATCH_PROPERTY] == outcome.output["batch_id"]
