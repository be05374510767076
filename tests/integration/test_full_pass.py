"""A full maintenance pass over a messy lakehouse, on real Spark and Iceberg."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.maintenance import OPERATIONS, Maintainer, TableResult
from icegate_dagster.spark.jvm_options import classes_archive
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, make_lakehouse

RETAIN_LAST = 2


@dataclass
class PassOutcome:
    lakehouse: Lakehouse
    rows_before: dict[str, Counter[tuple[Any, ...]]]
    internal_metadata_before: str
    results: dict[str, TableResult]
    run_id: str


@pytest.fixture(scope="module")
def full_pass(tmp_path_factory: pytest.TempPathFactory) -> PassOutcome:
    """Two small-file tables, a `_` table, an old orphan and a young file; one full pass."""
    lh = make_lakehouse(
        tmp_path_factory.mktemp("full_pass"),
        maintain={"expire_snapshots": {"retention_threshold": "1s", "retain_last": RETAIN_LAST}},
    )
    lh.add_table("lakehouse.logs", appends=8, services=("api", "web", "auth"))
    lh.add_table("lakehouse.orders", appends=6, services=("shop",))
    lh.add_table("lakehouse._internal", appends=6)
    lh.planted["old"] = lh.plant_file("lakehouse.logs", "old-orphan.parquet", timedelta(days=30))
    lh.planted["young"] = lh.plant_file("lakehouse.logs", "young.parquet", timedelta(hours=1))
    rows_before = {key: lh.rows(key) for key in ("lakehouse.logs", "lakehouse.orders")}
    internal_before = lh.table("lakehouse._internal").metadata_location
    time.sleep(1.2)  # every snapshot so far is now older than the 1s threshold
    maintainer = Maintainer(lh.config)
    results = maintainer.maintain(maintainer.discover())
    return PassOutcome(
        lh, rows_before, internal_before, {r.table: r for r in results}, maintainer.run_id
    )


def test_discovery_skips_underscore_tables(full_pass: PassOutcome) -> None:
    assert sorted(full_pass.results) == ["lakehouse.logs", "lakehouse.orders"]


def test_every_op_completed(full_pass: PassOutcome) -> None:
    for result in full_pass.results.values():
        # No wal.root and no TTL rule are configured, so neither WAL nor retention op;
        # statistics are opt-in.
        skipped = ("wal_compaction", "retention", "compute_table_stats")
        expected = [o for o in OPERATIONS.names() if o not in skipped]
        assert [op.operation for op in result.ops] == expected
    logs = full_pass.results["lakehouse.logs"]
    # No delete files: rewrite_position_delete_files is planned away.
    done = ["completed", "skipped", "completed", "completed"]
    assert [op.status for op in logs.ops] == [*done, "completed"], logs.as_dict()
    # orders has no file old enough to be an orphan: planned away, no Spark job.
    orders = full_pass.results["lakehouse.orders"]
    assert [op.status for op in orders.ops] == [*done, "skipped"], orders.as_dict()
    assert "no unreferenced file older than" in orders.ops[-1].details


def test_rows_are_identical_after_compaction(full_pass: PassOutcome) -> None:
    for key, before in full_pass.rows_before.items():
        assert full_pass.lakehouse.rows(key) == before
        assert sum(before.values()) > 0


def test_data_files_drop(full_pass: PassOutcome) -> None:
    logs = full_pass.results["lakehouse.logs"]
    assert logs.before is not None and logs.after is not None
    assert logs.before.data_files == 24
    assert logs.after.data_files == 3  # one per partition
    orders = full_pass.results["lakehouse.orders"]
    assert orders.after is not None and orders.after.data_files == 1
    # The metadata agrees with what is on disk: every referenced file exists.
    for key in ("lakehouse.logs", "lakehouse.orders"):
        for path in full_pass.lakehouse.data_file_paths(key):
            assert path.exists(), path


def test_snapshots_drop_to_retain_last(full_pass: PassOutcome) -> None:
    for key in ("lakehouse.logs", "lakehouse.orders"):
        result = full_pass.results[key]
        assert result.before is not None and result.before.snapshots >= 6
        assert len(full_pass.lakehouse.table(key).metadata.snapshots) == RETAIN_LAST


def test_old_orphan_removed_young_file_kept(full_pass: PassOutcome) -> None:
    assert not full_pass.lakehouse.planted["old"].exists()
    assert full_pass.lakehouse.planted["young"].exists()
    orphan_op = full_pass.results["lakehouse.logs"].op("remove_orphan_files")
    assert orphan_op is not None
    assert orphan_op.output["orphans_removed"] == 1
    assert [Path(p).name for p in orphan_op.output["orphan_files"]] == ["old-orphan.parquet"]


def test_underscore_table_untouched(full_pass: PassOutcome) -> None:
    table = full_pass.lakehouse.table("lakehouse._internal")
    assert table.metadata_location == full_pass.internal_metadata_before


def test_log_rows_per_table_and_op(full_pass: PassOutcome) -> None:
    rows = [r for r in full_pass.lakehouse.log_rows() if r["run_id"] == full_pass.run_id]
    assert len(rows) == 10
    assert {r["table_name"] for r in rows} == {"lakehouse.logs", "lakehouse.orders"}
    by_key = {(r["table_name"], r["operation"]): r for r in rows}
    for key, result in full_pass.results.items():
        for op in result.ops:
            row = by_key[(key, op.operation)]
            assert row["status"] == op.status
            assert op.before is not None and op.after is not None
            assert row["files_before"] == op.before.data_files
            assert row["files_after"] == op.after.data_files
            assert row["snapshots_before"] == op.before.snapshots
            assert row["snapshots_after"] == op.after.snapshots
            assert row["bytes_before"] == op.before.data_bytes
            assert row["duration_ms"] >= 0
            assert row["executed_at"].tzinfo is not None
    optimize_row = by_key[("lakehouse.logs", "optimize")]
    assert (optimize_row["files_before"], optimize_row["files_after"]) == (24, 3)


def test_one_spark_session_serves_every_lakehouse(full_pass: PassOutcome, tmp_path: Path) -> None:
    other = make_lakehouse(tmp_path / "other")
    assert get_spark(other.config) is get_spark(full_pass.lakehouse.config)


def test_the_pass_ran_in_a_serial_collected_driver_with_shared_classes(
    full_pass: PassOutcome,
) -> None:
    """What the driver JVM actually runs with, asked of the JVM itself: the serial collector
    of a small local driver, and the classes of setup's archive where it was made."""
    jvm = get_spark(full_pass.lakehouse.config).sparkContext._jvm
    assert jvm is not None
    management = jvm.java.lang.management.ManagementFactory
    collectors = {bean.getName() for bean in management.getGarbageCollectorMXBeans()}
    assert collectors == {"Copy", "MarkSweepCompact"}  # the serial collector's two
    diagnostics = management.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    archive = classes_archive()  # the running Spark line's
    if archive.is_file():  # setup makes it (CI always does)
        assert diagnostics.getVMOption("SharedArchiveFile").getValue() == str(archive)
        assert diagnostics.getVMOption("UseSharedSpaces").getValue() == "true"
