"""The health model: score and due operations on hand-built metrics (pure, no JVM), the
thresholds a table's properties override, and the per-version cache on a pyiceberg table."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from pyiceberg.table import Table

from icegate_dagster.config import TableSettings, config_from_dict
from icegate_dagster.errors import ConfigError
from icegate_dagster.maintenance.health import manifest_walk
from icegate_dagster.maintenance.health.manifest_walk import WalkCache, WalkRules
from icegate_dagster.maintenance.health.score import (
    WEIGHTS,
    HealthMetrics,
    PartitionFragments,
    TableHealth,
    assess,
    collect_metrics,
    thresholds_for,
)
from icegate_dagster.maintenance.health.stats import StatsCache
from tests.unit.pyiceberg_tables import create_table, rows, sqlite_catalog

KB, MB = 1024, 1024**2
DEFAULTS = TableSettings()
NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def metrics(**figures: Any) -> HealthMetrics:
    """A compacted, idle, tiny table (four partitions, one 1 MB file each), then ``figures``."""
    values: dict[str, Any] = {
        "table": "lake.t",
        "data_files": 4,
        "data_bytes": 4 * MB,
        "rows": 4000,
        "partitions": 4,
        "small_files": 4,  # tiny: every file is under 10 MB, one per partition
        "small_bytes": 4 * MB,
        "worst_partition_small_files": 1,
        "position_delete_files": 0,
        "equality_delete_files": 0,
        "deletion_vectors": 0,
        "deleted_rows": 0,
        "manifests": 1,
        "small_manifests": 1,
        "snapshots": 1,
        "expirable_snapshots": 0,
        "oldest_snapshot_at": NOW - timedelta(days=30),
        "last_rewrite_at": NOW - timedelta(days=30),
    }
    return HealthMetrics(**(values | figures))


def fragments(*small_files: int, size: int = 100 * KB) -> dict[str, Any]:
    """Figures of a table whose fragmented partitions hold these small files."""
    parts = tuple(
        PartitionFragments(f"day=2026-11-{i + 1:02d}", 0, n, n, n * size)
        for i, n in enumerate(small_files)
    )
    return {
        "data_files": sum(small_files),
        "small_files": sum(small_files),
        "small_bytes": sum(p.small_bytes for p in parts),
        "data_bytes": sum(p.small_bytes for p in parts),
        "partitions": len(parts),
        "worst_partition_small_files": max(small_files),
        "worst_partition": parts[small_files.index(max(small_files))].partition,
        "fragmented_partitions": parts,
    }


def judge(m: HealthMetrics, settings: TableSettings = DEFAULTS) -> TableHealth:
    return assess(m, settings, settings.health)


def settings_with(**blocks: dict[str, Any]) -> TableSettings:
    return TableSettings.model_validate(blocks)


def test_a_healthy_idle_table_scores_100_and_nothing_is_due() -> None:
    health = judge(metrics())
    assert health.score == 100.0
    assert health.need == 0.0
    assert health.due == ()
    assert health.work_bytes == 0
    assert all(points == 0 for points in health.penalties.values())
    # However long ago it was last maintained.
    assert judge(metrics(last_rewrite_at=None, oldest_snapshot_at=None)).due == ()


def test_fifty_small_files_in_one_partition_make_optimize_due_naming_them() -> None:
    health = judge(metrics(**fragments(50)))
    assert health.due_operations == ("optimize",)
    reason = health.reason("optimize")
    assert reason is not None
    assert "partition day=2026-11-01 holds 50 small files (under 10.0 MB); due at 12" in reason
    assert health.penalties["small_files"] == WEIGHTS["small_files"] == 40.0
    assert health.score == 60.0
    assert health.work_bytes == 50 * 100 * KB  # the small files optimize would rewrite


def test_small_files_below_the_threshold_cost_points_but_nothing_is_due() -> None:
    health = judge(metrics(**fragments(11)))
    assert health.due == ()
    assert health.penalties["small_files"] == round(40 * 10 / 11, 1) == 36.4
    # One small file beside big ones: no rewrite can improve that partition.
    assert judge(metrics(worst_partition_small_files=1, small_files=1)).score == 100.0


def test_one_fragmented_day_is_not_averaged_away_by_a_year_of_compacted_days() -> None:
    # 365 days of one small file each (no rewrite improves them), and today with 50.
    year = metrics(**fragments(50) | {"data_files": 415, "partitions": 366, "small_files": 415})
    assert judge(year).penalties["small_files"] == 40.0
    # Partitions weigh by their small files: 12 (full pressure) and 2 (1/11 of it).
    mixed = judge(metrics(**fragments(12, 2)))
    assert mixed.penalties["small_files"] == round(40 * (12 * 1 + 2 * (1 / 11)) / 14, 1) == 34.8


def test_optimize_waits_for_as_many_small_files_as_its_rewrite_needs() -> None:
    # min_input_files above health.small_files: due only where the rewrite picks files.
    settings = settings_with(optimize={"min_input_files": 20})
    assert judge(metrics(**fragments(15)), settings).due == ()
    reason = judge(metrics(**fragments(20)), settings).reason("optimize")
    assert reason is not None and reason.endswith("due at 20")


def test_live_position_deletes_make_optimize_and_the_delete_rewrite_due() -> None:
    m = metrics(
        data_files=10,
        rows=1000,
        position_delete_files=3,
        deleted_rows=30,
        delete_rewrite_files=3,
        max_partition_position_deletes=3,
        delete_affected_bytes=3 * MB,
        position_delete_bytes=6 * KB,
    )
    health = judge(m)
    assert health.due_operations == ("optimize", "rewrite_position_delete_files")
    optimize = health.reason("optimize")
    assert optimize is not None
    assert "3 delete files apply to live data" in optimize
    assert "deleting 30 of 1000 rows" in optimize and "due at 1" in optimize
    positions = health.reason("rewrite_position_delete_files")
    assert positions == (
        "a partition holds 3 of 3 position delete files (deletion vectors apart); due at 2"
    )
    # Deletes pressure: the larger of 3 % deleted / 30 % and 3 delete files per 10 data files.
    assert health.penalties["deletes"] == 30 * 0.3 == 9.0
    assert health.work_bytes == 3 * MB + 6 * KB


def test_one_position_delete_file_per_partition_leaves_the_delete_rewrite_alone() -> None:
    # rewrite_position_delete_files needs min_input_files (2) in one partition.
    m = metrics(position_delete_files=2, deleted_rows=5, max_partition_position_deletes=1)
    assert judge(m).due_operations == ("optimize",)


def test_equality_deletes_weigh_four_position_files() -> None:
    health = judge(metrics(data_files=10, rows=1000, equality_delete_files=1, deleted_rows=1))
    assert health.penalties["deletes"] == 30 * 4 / 10 == 12.0
    assert health.due_operations == ("optimize",)


def test_a_large_share_of_deleted_rows_costs_the_whole_deletes_weight() -> None:
    m = metrics(data_files=100, rows=1000, deletion_vectors=2, deleted_rows=300)
    health = judge(m)
    assert health.penalties["deletes"] == 30.0  # 30 % deleted: optimize's ratio threshold
    assert health.due_operations == ("optimize",)  # vectors: no position file to rewrite


def test_dangling_deletes_delete_nothing_and_only_the_delete_rewrite_drops_them() -> None:
    m = metrics(
        position_delete_files=3,
        dangling_position_deletes=3,
        equality_delete_files=1,
        dangling_equality_deletes=1,
        max_partition_position_deletes=1,
        delete_rewrite_files=0,
    )
    health = judge(m)
    assert health.penalties["deletes"] == 0.0
    assert health.due_operations == ("rewrite_position_delete_files",)
    assert health.reason("rewrite_position_delete_files") == (
        "3 position deletes are dangling (their data files are gone); due at 1"
    )


def test_deletes_the_rewrite_would_not_pick_do_not_make_optimize_due() -> None:
    # Iceberg picks a data file at delete_file_threshold deletes or delete_ratio_threshold.
    settings = settings_with(optimize={"delete_file_threshold": 3})
    m = metrics(position_delete_files=1, deleted_rows=1, delete_rewrite_files=0)
    assert "optimize" not in judge(m, settings).due_operations


def test_manifests_due_by_count_or_by_small_ones() -> None:
    assert judge(metrics(manifests=99, small_manifests=0)).due == ()
    by_count = judge(metrics(manifests=100, small_manifests=0))
    assert by_count.reason("rewrite_manifests") == (
        "100 manifests, about 1 after a rewrite; due at 100"
    )
    assert by_count.penalties["manifests"] == 10.0
    by_small = judge(metrics(manifests=60, small_manifests=50))
    assert by_small.reason("rewrite_manifests") == (
        "50 of 60 manifests are small (under 75% of the manifest target size), about 1 "
        "after a rewrite; due at 50"
    )
    assert by_small.work_bytes == 0  # metadata only


def test_manifests_a_rewrite_cannot_reduce_are_never_due() -> None:
    # 120 manifests already at their target size: a rewrite would leave about as many.
    full = judge(metrics(manifests=120, small_manifests=0, manifests_after_rewrite=110))
    assert full.due == () and full.penalties["manifests"] == 10.0
    # 60 small manifests of an older partition spec, which Iceberg's procedure leaves.
    old_spec = metrics(
        manifests=61, small_manifests=60, rewritable_small_manifests=1, manifests_after_rewrite=61
    )
    assert judge(old_spec).due == ()
    # Half the threshold reducible is enough.
    half = judge(metrics(manifests=100, small_manifests=0, manifests_after_rewrite=50))
    assert half.due_operations == ("rewrite_manifests",)


def test_no_manifest_rewrite_is_due_where_rows_carry_lineage() -> None:
    # Format version 3: rewrite_manifests is skipped there (Iceberg 1.10.2 would renumber
    # _row_id), so the trigger must never ask for it, however many manifests pile up.
    crowded = {"manifests": 500, "small_manifests": 500}
    assert judge(metrics(**crowded, format_version=2)).due_operations == ("rewrite_manifests",)
    v3 = judge(metrics(**crowded, format_version=3))
    assert v3.due == ()
    assert v3.penalties["manifests"] == WEIGHTS["manifests"]  # the score still says so
    # Other operations stay due on v3 tables.
    both = judge(metrics(**crowded, **fragments(13), format_version=3))
    assert both.due_operations == ("optimize",)


def test_expirable_snapshots_make_expiry_due() -> None:
    health = judge(metrics(snapshots=30, expirable_snapshots=10))
    assert health.due_operations == ("expire_snapshots",)
    assert health.reason("expire_snapshots") == (
        "10 of 30 snapshots can expire (older than 7d, beyond the last 1 and the branch "
        "and tag heads); due at 10"
    )
    assert round(health.penalties["snapshots"], 1) == 3.3  # a third is dead weight
    # A few expirable snapshots cost points but make no run: the daily pass expires them.
    few = judge(metrics(snapshots=10, expirable_snapshots=3))
    assert few.due == () and few.penalties["snapshots"] == 3.0
    # A steady writer with a long history always has some just past retention: at least
    # a tenth of its snapshots must be expirable before it gets a run for them.
    steady = judge(metrics(snapshots=10_000, expirable_snapshots=50))
    assert steady.due == ()
    assert judge(metrics(snapshots=10_000, expirable_snapshots=1000)).due_operations == (
        "expire_snapshots",
    )
    lowered = settings_with(health={"expirable_snapshots": 3})
    assert judge(metrics(snapshots=10, expirable_snapshots=3), lowered).due_operations == (
        "expire_snapshots",
    )
    # Many young snapshots cost points by count alone (alert level max_snapshots), none due.
    many = judge(metrics(snapshots=100, expirable_snapshots=0))
    assert many.due == () and many.penalties["snapshots"] == 10.0


def test_wal_backlog_makes_compaction_due_first() -> None:
    nine = judge(metrics(wal_files=9, wal_bytes=9 * KB))
    assert nine.due == () and nine.penalties["wal"] == 9.0
    health = judge(metrics(wal_files=10, wal_bytes=10 * KB, **fragments(12)))
    assert health.due_operations == ("wal_compaction", "optimize")
    assert health.reason("wal_compaction") == (
        "10 WAL files (10.0 KB) waiting; due at 10 files or 100.0 MB"
    )
    assert health.work_bytes == 10 * KB + 12 * 100 * KB


def test_penalties_sum_to_what_the_score_lost() -> None:
    m = metrics(
        wal_files=3,
        manifests=40,
        small_manifests=40,
        snapshots=30,
        expirable_snapshots=6,
        position_delete_files=1,
        deleted_rows=10,
        **fragments(7, 3),
    )
    health = judge(m)
    assert 0 < health.score < 100
    assert sum(health.penalties.values()) == pytest.approx(100 - health.score)
    assert set(health.penalties) == set(WEIGHTS)
    worst = metrics(
        wal_files=100,
        manifests=500,
        snapshots=500,
        expirable_snapshots=400,
        equality_delete_files=5,
        deleted_rows=4000,
        **fragments(500),
    )
    assert judge(worst).score == 0.0


def test_hand_built_metrics_without_partitions_read_the_worst_one() -> None:
    # Metrics built with the draft's fields only: the worst partition stands for them all.
    health = judge(metrics(small_files=30, small_bytes=3 * MB, worst_partition_small_files=30))
    assert health.due_operations == ("optimize",)
    assert health.penalties["small_files"] == 40.0
    assert health.work_bytes == 3 * MB


def test_table_properties_override_the_configured_thresholds() -> None:
    properties = {
        "icegate.health.small_files": "30",
        "icegate.health.min_interval": "5m",
        "icegate.health.min_score": "45.5",
        "write.format.default": "parquet",  # not ours: ignored
    }
    thresholds = thresholds_for(DEFAULTS, properties)
    assert thresholds.small_files == 30
    assert thresholds.min_interval == timedelta(minutes=5)
    assert thresholds.min_score == 45.5
    assert thresholds.delete_files == DEFAULTS.health.delete_files  # the rest as configured
    health = assess(metrics(**fragments(20)), DEFAULTS, thresholds)
    assert health.due == ()
    assert health.thresholds["small_files"] == 30 and health.thresholds["min_interval"] == "5m"
    assert thresholds_for(DEFAULTS, {}) is DEFAULTS.health


def test_thresholds_come_from_icegate_yaml_too(tmp_path: Path) -> None:
    raw = {"maintain": {"health": {"small_files": 20, "small_manifests": 10}}}
    settings = config_from_dict(raw, tmp_path).defaults
    assert settings.health.small_files == 20
    assert thresholds_for(settings, {"icegate.health.manifests": "40"}).small_files == 20
    with pytest.raises(ConfigError, match=r"maintain\.health\.small_files = 1"):
        config_from_dict({"maintain": {"health": {"small_files": 1}}}, tmp_path)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (
            "icegate.health.small_files",
            "many",
            "invalid table property icegate.health.small_files = 'many': "
            "Input should be a valid integer",
        ),
        (
            "icegate.health.small_files",
            "1",
            "invalid table property icegate.health.small_files = '1': "
            "Input should be greater than or equal to 2",
        ),
        (
            "icegate.health.min_interval",
            "soon",
            "invalid table property icegate.health.min_interval = 'soon': "
            "must be a duration such as 30s, 15m, 12h or 7d",
        ),
        (
            "icegate.health.smallfiles",
            "3",
            "invalid table property icegate.health.smallfiles = '3': unknown key (allowed: "
            "icegate.health.small_files, icegate.health.delete_files",
        ),
    ],
)
def test_a_bad_table_property_names_itself_and_its_value(
    name: str, value: str, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        thresholds_for(DEFAULTS, {name: value})
    assert str(info.value).startswith(message)
    assert info.value.exit_code == 2


def test_as_dict_is_plain_json() -> None:
    health = judge(metrics(**fragments(13)))
    document = json.loads(json.dumps(health.as_dict()))
    assert document["score"] == health.score
    assert document["due_operations"] == ["optimize"]
    assert document["due"][0]["reason"] == health.reason("optimize")
    assert document["metrics"]["last_rewrite_at"] == (NOW - timedelta(days=30)).isoformat()
    assert document["metrics"]["fragmented_partitions"][0]["small_files"] == 13


def test_one_manifest_walk_per_table_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """collect_metrics and the table's stats on a real pyiceberg table (no JVM): one
    manifest walk per metadata file, read by both."""
    walks: list[str] = []
    real_walk = manifest_walk.walk

    def counted(table: Table, rules: WalkRules) -> manifest_walk.ManifestWalk:
        walks.append(table.metadata_location)
        return real_walk(table, rules)

    monkeypatch.setattr(manifest_walk, "walk", counted)
    table = create_table(sqlite_catalog(tmp_path / "lake"), "events", appends=3)
    cache = WalkCache()
    stats = StatsCache(cache)
    rule = DEFAULTS.optimize
    first = collect_metrics(table, "unit.events", DEFAULTS, NOW, cache=cache)
    assert (first.data_files, first.small_files, first.snapshots) == (3, 3, 3)
    assert first.worst_partition == "(unpartitioned)"
    counts = stats.get("unit.events", table, rule.file_size_threshold, rule.min_input_files)
    assert (counts.data_files, counts.small_files, counts.snapshots) == (3, 3, 3)
    walked = cache.walk("unit.events", table, WalkRules.of(DEFAULTS))
    assert len(walks) == 1
    table.append(rows(99))
    after = collect_metrics(table, "unit.events", DEFAULTS, NOW, cache=cache)
    assert (after.data_files, after.small_files, after.snapshots) == (4, 4, 4)
    assert cache.walk("unit.events", table, WalkRules.of(DEFAULTS)) is not walked
    assert len(walks) == 2
    # Time moves on, the metadata does not: expiry figures are computed afresh.
    later = collect_metrics(table, "unit.events", DEFAULTS, NOW + timedelta(days=3650), cache=cache)
    assert later.expirable_snapshots == 3
    lowered = settings_with(health={"expirable_snapshots": 3})
    assert judge(later, lowered).due_operations == ("expire_snapshots",)
    assert len(walks) == 2
    assert first.format_version == 2
    # Where gc.enabled=false expiry is skipped: it is never due there.
    table.transaction().set_properties({"gc.enabled": "false"}).commit_transaction()
    no_gc = collect_metrics(table, "unit.events", DEFAULTS, NOW + timedelta(days=3650))
    assert no_gc.expirable_snapshots == 0 and judge(no_gc, lowered).due == ()
