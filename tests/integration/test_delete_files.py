"""Delete files (merge-on-read): a pass leaves none behind and every row as it was.

Spark SQL writes them as users do (``DELETE``/``UPDATE``/``MERGE`` on tables set to
merge-on-read): format v2 gives position delete files, format v3 deletion vectors
(Puffin). ``optimize`` applies them by rewriting the data files they delete from,
``rewrite_position_delete_files`` drops the ones left dangling, and ``rows_preserved``
compares the rows a reader sees, which applying deletes does not change.
"""

from __future__ import annotations

from typing import Any

from icegate_dagster.maintenance import Maintainer, TableRef, TableResult
from icegate_dagster.maintenance.health.checks import CheckOutcome, evaluate_health
from icegate_dagster.maintenance.wal import WalStats
from icegate_dagster.spark.session import get_spark
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import Lakehouse, LakehouseFactory

KEY = "lakehouse.orders"
ROWS_PER_INSERT = 100


def merge_on_read_table(lh: Lakehouse, format_version: int, inserts: int) -> str:
    """``KEY`` made by Spark, partitioned by service, written merge-on-read, fed by
    ``inserts`` commits of ``ROWS_PER_INSERT`` rows (one file per service each)."""
    spark = get_spark(lh.config)
    ref = TableRef.parse(KEY)
    lh.catalog.create_namespace_if_not_exists(ref.namespace)
    name = ref.spark_identifier(lh.config.catalog.name)
    spark.sql(
        f"CREATE TABLE {name} (id BIGINT, service STRING, body STRING) USING iceberg "
        "PARTITIONED BY (service) TBLPROPERTIES ("
        f"'format-version'='{format_version}', 'write.delete.mode'='merge-on-read', "
        "'write.update.mode'='merge-on-read', 'write.merge.mode'='merge-on-read')"
    )
    for i in range(inserts):
        start, end = i * ROWS_PER_INSERT, (i + 1) * ROWS_PER_INSERT
        spark.sql(
            f"INSERT INTO {name} SELECT id, IF(id % 2 = 0, 'api', 'web'), "
            f"concat('row ', id) FROM range({start}, {end})"
        )
    return name


def read_rows(lh: Lakehouse, name: str) -> list[tuple[Any, ...]]:
    """Every row as a reader sees it (deletes applied), in id order, read by Spark."""
    rows = get_spark(lh.config).sql(f"SELECT * FROM {name} ORDER BY id, body").collect()
    return [tuple(row) for row in rows]


def delete_files(lh: Lakehouse, name: str) -> list[tuple[str, str | None]]:
    """The current snapshot's delete files (format, data file referenced), from Iceberg's
    own ``delete_files`` metadata table."""
    rows = get_spark(lh.config).sql(
        f"SELECT file_format, referenced_data_file FROM {name}.delete_files"
    )
    return [(row[0], row[1]) for row in rows.collect()]


def duckdb_rows(lh: Lakehouse) -> list[tuple[Any, ...]]:
    """The table's rows read by DuckDB's iceberg extension: a reader that shares no code
    with Spark or pyiceberg (it applies position deletes and deletion vectors itself)."""
    con = duckdb_iceberg()
    metadata = lh.table(KEY).metadata_location
    return [
        tuple(row)
        for row in con.execute(
            "SELECT id, service, body FROM iceberg_scan(?) ORDER BY id, body", [metadata]
        ).fetchall()
    ]


def rows_preserved(lh: Lakehouse, result: TableResult) -> CheckOutcome:
    checks = evaluate_health(result, lh.config.for_table(KEY), WalStats(0, 0))
    [check] = [c for c in checks if c.name == "rows_preserved"]
    return check


def statuses(result: TableResult) -> dict[str, str]:
    return {op.operation: f"{op.status}: {op.details}" for op in result.ops}


def test_merge_on_read_delete_update_and_merge_leave_no_delete_file_and_the_same_rows(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    name = merge_on_read_table(lh, format_version=2, inserts=2)
    spark = get_spark(lh.config)
    spark.sql(f"DELETE FROM {name} WHERE id % 10 = 3")
    spark.sql(f"UPDATE {name} SET body = 'updated' WHERE id % 10 = 4")
    spark.sql(
        f"MERGE INTO {name} t USING (SELECT id, IF(id % 2 = 0, 'api', 'web') AS service, "
        "'merged' AS body FROM range(0, 230, 7)) s ON t.id = s.id "
        "WHEN MATCHED THEN UPDATE SET t.body = s.body WHEN NOT MATCHED THEN INSERT *"
    )
    written = delete_files(lh, name)
    assert written and {fmt for fmt, _ in written} == {"PARQUET"}, written  # position deletes
    maintainer = Maintainer(lh.config)
    ref = TableRef.parse(KEY)
    assert maintainer.stats(ref).position_delete_files == len(written)
    expected = read_rows(lh, name)

    result = maintainer.maintain_table(ref)

    assert result.ok, statuses(result)
    assert result.op("optimize").status == "completed", statuses(result)  # type: ignore[union-attr]
    assert delete_files(lh, name) == []
    assert read_rows(lh, name) == expected
    check = rows_preserved(lh, result)
    assert check.passed, check.description
    # Live rows, not records: the data files held the deleted rows too before the pass.
    assert check.metadata["rows_before"] == check.metadata["rows_after"] == len(expected)
    assert result.before is not None and result.before.rows > len(expected)
    assert result.after is not None and result.after.rows == len(expected)


def test_dangling_position_deletes_are_dropped_and_live_ones_keep_deleting(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    name = merge_on_read_table(lh, format_version=2, inserts=2)
    spark = get_spark(lh.config)
    spark.sql(f"DELETE FROM {name} WHERE id % 10 IN (3, 4)")  # odd ids: web; even: api
    # Another engine compacts one partition: its deletes are applied, but its delete files
    # stay in the snapshot (as new as the rewritten files, so no sequence rule drops them).
    spark.sql(
        f"CALL {lh.config.catalog.name}.system.rewrite_data_files(table => 'lakehouse.orders', "
        "where => \"service = 'api'\", options => map('rewrite-all', 'true'))"
    )
    written = delete_files(lh, name)
    assert len(written) == 4, written  # one per data file touched
    maintainer = Maintainer(lh.config)
    ref = TableRef.parse(KEY)
    before = maintainer.stats(ref)
    assert (before.position_delete_files, before.dangling_delete_files) == (4, 2)
    expected = read_rows(lh, name)
    assert not [row for row in expected if row[0] % 10 in (3, 4)]

    result = maintainer.maintain_table(ref, ["rewrite_position_delete_files"])

    assert result.ok, statuses(result)
    op = result.op("rewrite_position_delete_files")
    assert op is not None and op.status == "completed", statuses(result)
    assert op.output["rewritten_delete_files_count"] == 4
    # Web's two rewritten as they were: Spark keeps one delete file per data file.
    assert op.output["added_delete_files_count"] == 2
    after = maintainer.stats(ref)
    assert (after.position_delete_files, after.dangling_delete_files) == (2, 0)
    assert read_rows(lh, name) == expected  # the live deletes still delete
    check = rows_preserved(lh, result)
    assert check.passed, check.description
    assert check.metadata["rows_before"] == check.metadata["rows_after"] == len(expected)


def test_format_v3_deletion_vectors_are_merged_at_commit_then_applied(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    name = merge_on_read_table(lh, format_version=3, inserts=2)
    spark = get_spark(lh.config)
    spark.sql(f"DELETE FROM {name} WHERE id % 10 = 3")
    spark.sql(f"DELETE FROM {name} WHERE id % 10 = 5")  # the same data files again
    spark.sql(f"UPDATE {name} SET body = 'updated' WHERE id % 10 = 4")
    vectors = delete_files(lh, name)
    assert vectors and {fmt for fmt, _ in vectors} == {"PUFFIN"}, vectors
    # Iceberg 1.10 merges a data file's deletion vectors at commit: one per data file.
    referenced = [data_file for _, data_file in vectors]
    assert len(set(referenced)) == len(referenced) == 4, referenced
    maintainer = Maintainer(lh.config)
    ref = TableRef.parse(KEY)
    before = maintainer.stats(ref)
    assert (before.deletion_vectors, before.position_delete_files) == (4, 0)
    expected = read_rows(lh, name)
    assert duckdb_rows(lh) == expected  # an independent reader applies the vectors alike

    result = maintainer.maintain_table(ref)

    assert result.ok, statuses(result)
    assert delete_files(lh, name) == []
    assert read_rows(lh, name) == expected
    assert duckdb_rows(lh) == expected
    # Nothing for it: v3 keeps no position delete files, and optimize applied the vectors.
    op = result.op("rewrite_position_delete_files")
    assert op is not None and op.status == "skipped", statuses(result)
    check = rows_preserved(lh, result)
    assert check.passed, check.description
    assert check.metadata["rows_after"] == len(expected)


def test_above_the_file_threshold_optimize_picks_files_by_their_deleted_share(
    lakehouse_factory: LakehouseFactory,
) -> None:
    # No file is small and no file has 100 delete files: only the ratio picks files.
    lh = lakehouse_factory(
        maintain={
            "optimize": {
                "file_size_threshold": 1,
                "delete_file_threshold": 100,
                "delete_ratio_threshold": 0.3,
            }
        }
    )
    name = merge_on_read_table(lh, format_version=3, inserts=2)
    spark = get_spark(lh.config)
    spark.sql(f"DELETE FROM {name} WHERE service = 'api' AND id % 100 < 70")  # 35 of 50
    spark.sql(f"DELETE FROM {name} WHERE service = 'web' AND id % 100 < 10")  # 5 of 50
    assert len(delete_files(lh, name)) == 4
    expected = read_rows(lh, name)
    ref = TableRef.parse(KEY)

    result = Maintainer(lh.config).maintain_table(ref, ["optimize"])

    op = result.op("optimize")
    assert op is not None and op.status == "completed", statuses(result)
    assert op.output["rewritten_data_files_count"] == 2  # api's two files, 70 % deleted
    left = delete_files(lh, name)
    assert len(left) == 2 and all("service=web" in str(data_file) for _, data_file in left)
    assert read_rows(lh, name) == expected
    check = rows_preserved(lh, result)  # counted by Spark: vectors are left after
    assert check.passed, check.description
    assert check.metadata["rows_before"] == check.metadata["rows_after"] == len(expected)
