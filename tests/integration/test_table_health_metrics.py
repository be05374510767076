"""collect_metrics on real tables: its counts are what Spark and Iceberg's own metadata
tables report, its deleted rows are what a reader no longer sees (and none once a rewrite
applied them), and ``status`` shows the score and the due operations (no JVM needed for
either)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from pyspark.sql import SparkSession

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance.health.score import assess_table, collect_metrics
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory

#: Files under this are small: every file these tests write (a few hundred bytes each).
SMALL = 10 * 1024**2


def _spark_table(lh: Lakehouse, name: str, version: int) -> tuple[SparkSession, str]:
    """``lakehouse.<name>``: merge-on-read, two partitions, three inserts of 100 rows, then
    a ``DELETE`` and an ``UPDATE`` of other rows (one position delete per data file)."""
    spark = get_spark(lh.config)
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    full = f"{lh.config.catalog.name}.lakehouse.{name}"
    spark.sql(
        f"CREATE TABLE {full} (id bigint, svc string) USING iceberg PARTITIONED BY (svc) "
        f"TBLPROPERTIES ('format-version'='{version}', 'write.delete.mode'='merge-on-read', "
        "'write.update.mode'='merge-on-read')"
    )
    for i in range(3):
        spark.sql(
            f"INSERT INTO {full} SELECT id, IF(id % 2 = 0, 'a', 'b') "
            f"FROM range({i * 100}, {i * 100 + 100})"
        )
    spark.sql(f"DELETE FROM {full} WHERE id % 10 = 0")
    spark.sql(f"UPDATE {full} SET id = id + 1000 WHERE id % 10 = 3")
    return spark, full


def _one(spark: SparkSession, sql: str) -> Any:
    return spark.sql(sql).collect()[0][0]


def _metadata_tables(spark: SparkSession, full: str) -> dict[str, Any]:
    """What Iceberg's own metadata tables say about the current snapshot."""
    files = f"{full}.files"
    return {
        "data_files": _one(spark, f"SELECT count(*) FROM {files} WHERE content = 0"),
        "small_files": _one(
            spark,
            f"SELECT count(*) FROM {files} WHERE content = 0 AND file_size_in_bytes < {SMALL}",
        ),
        "data_bytes": _one(spark, f"SELECT sum(file_size_in_bytes) FROM {files} WHERE content = 0"),
        "rows": _one(spark, f"SELECT sum(record_count) FROM {files} WHERE content = 0"),
        "partitions": _one(
            spark, f"SELECT count(DISTINCT partition) FROM {files} WHERE content = 0"
        ),
        "worst": _one(
            spark,
            f"SELECT max(n) FROM (SELECT count(*) AS n FROM {files} WHERE content = 0 "
            f"AND file_size_in_bytes < {SMALL} GROUP BY partition)",
        ),
        "position_files": _one(
            spark, f"SELECT count(*) FROM {files} WHERE content = 1 AND file_format <> 'PUFFIN'"
        ),
        "vectors": _one(
            spark, f"SELECT count(*) FROM {files} WHERE content = 1 AND file_format = 'PUFFIN'"
        ),
        "equality_files": _one(spark, f"SELECT count(*) FROM {files} WHERE content = 2"),
        "deleted_records": _one(
            spark, f"SELECT coalesce(sum(record_count), 0) FROM {files} WHERE content > 0"
        ),
        "manifests": _one(spark, f"SELECT count(*) FROM {full}.manifests"),
        "snapshots": _one(spark, f"SELECT count(*) FROM {full}.snapshots"),
        "live_rows": _one(spark, f"SELECT count(*) FROM {full}"),
    }


@pytest.mark.parametrize("version", [2, 3])
def test_counts_match_icebergs_metadata_tables_and_deletes_match_the_reader(
    lakehouse_factory: LakehouseFactory, version: int
) -> None:
    lh = lakehouse_factory()
    spark, full = _spark_table(lh, "orders", version)
    truth = _metadata_tables(spark, full)
    table = lh.table("lakehouse.orders")
    settings = lh.config.for_table("lakehouse.orders")

    m = collect_metrics(table, "lakehouse.orders", settings, datetime.now(UTC), cache=None)

    assert m.data_files == truth["data_files"] == 7  # 3 inserts x 2 partitions + the update's
    assert m.small_files == truth["small_files"] == 7
    assert m.data_bytes == truth["data_bytes"]
    assert m.rows == truth["rows"] == 330
    assert m.partitions == truth["partitions"] == 2
    assert m.worst_partition_small_files == truth["worst"] == 4
    assert m.worst_partition == "svc=b"
    assert m.position_delete_files == truth["position_files"]
    assert m.deletion_vectors == truth["vectors"]
    assert m.equality_delete_files == truth["equality_files"] == 0
    if version == 2:  # Parquet position delete files, one per data file touched
        assert (m.position_delete_files, m.deletion_vectors) == (6, 0)
    else:  # format v3: deletion vectors, Puffin blobs
        assert (m.position_delete_files, m.deletion_vectors) == (0, 6)
    # Every delete is live and the deletes do not overlap: the reader sees the rest.
    assert m.dangling_delete_files == 0
    assert m.deleted_rows == truth["deleted_records"] == 60
    assert m.rows - m.deleted_rows == truth["live_rows"] == 270
    assert m.manifests == truth["manifests"] == m.small_manifests
    assert m.snapshots == truth["snapshots"] == 5
    assert m.expirable_snapshots == 0
    assert m.last_rewrite_at is None  # never compacted

    health = assess_table(table, "lakehouse.orders", settings, datetime.now(UTC), cache=None)
    assert health.metrics == m
    expected = ("optimize", "rewrite_position_delete_files") if version == 2 else ("optimize",)
    assert health.due_operations == expected
    reason = health.reason("optimize")
    assert reason is not None and "deleting 60 of 330 rows" in reason
    assert 0 < health.score < 100

    # Iceberg's rewrite applies the deletes. It drops deletion vectors with their data
    # files, and delete files older than every data file; the rest stay, dangling.
    spark.sql(
        f"CALL {lh.config.catalog.name}.system.rewrite_data_files(table => 'lakehouse.orders', "
        "options => map('delete-file-threshold', '1', 'min-input-files', '1'))"
    )
    truth = _metadata_tables(spark, full)
    after = assess_table(
        lh.table("lakehouse.orders"), "lakehouse.orders", settings, datetime.now(UTC), cache=None
    )
    m = after.metrics
    assert m.position_delete_files == truth["position_files"] == (3 if version == 2 else 0)
    assert m.deletion_vectors == truth["vectors"] == 0
    assert m.dangling_position_deletes == m.position_delete_files  # their data files are gone
    assert m.deleted_rows == 0
    assert m.rows == truth["rows"] == truth["live_rows"] == 270  # nothing left to delete
    assert m.last_rewrite_at is not None
    assert after.penalties["deletes"] == 0.0
    # Nothing for optimize to apply; the delete rewrite would drop the dangling files.
    expected = ("rewrite_position_delete_files",) if version == 2 else ()
    assert after.due_operations == expected


def test_status_shows_score_and_due_operations_and_a_bad_property_fails_its_table_alone(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=8, services=("api", "web"))  # 8 small per partition
    lh.add_table("lakehouse.quiet", appends=1)
    lh.add_table("lakehouse.broken", appends=1)
    with lh.table("lakehouse.logs").transaction() as tx:  # policy next to the data
        tx.set_properties({"icegate.health.small_files": "8"})
    with lh.table("lakehouse.broken").transaction() as tx:
        tx.set_properties({"icegate.health.small_files": "lots"})
    config = ["--config", str(lh.config_path)]

    assert run_cli(["status", *config, "--json"]) == 1
    report = {row["table"]: row for row in json.loads(capsys.readouterr().out)}

    logs = report["lakehouse.logs"]["health"]
    assert logs["due_operations"] == ["optimize"]
    assert logs["thresholds"]["small_files"] == 8
    assert "holds 8 small files" in logs["due"][0]["reason"]
    assert logs["metrics"]["small_files"] == report["lakehouse.logs"]["stats"]["small_files"] == 16
    assert logs["score"] < 100
    quiet = report["lakehouse.quiet"]
    assert (quiet["health"]["score"], quiet["health"]["due_operations"]) == (100.0, [])
    assert quiet["error"] is None
    broken = report["lakehouse.broken"]
    assert broken["health"] is None and broken["stats"]["data_files"] == 2
    assert "icegate.health.small_files = 'lots'" in broken["error"]

    assert run_cli(["status", *config, "--table", "lakehouse.logs"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[-2:] == ["score", "due"]
    [line] = [line for line in text.splitlines() if line.startswith("lakehouse.logs")]
    assert line.split()[-1] == "optimize"
    assert line.split()[-2] == str(logs["score"]).removesuffix(".0")
