"""Issue 23, item 2: a full pass keeps row lineage on a format-version 3 table.

Iceberg v3 gives every row a ``_row_id`` and a ``_last_updated_sequence_number``; a rewrite
that moves rows must carry both over. Compaction
(``rewrite_data_files``, binpack or z-order, deletion vectors applied) does, expiry and
orphan removal change no row. The ``rewrite_manifests`` procedure of Iceberg 1.10.2 and
1.11.0 does not (apache/iceberg#16699, fixed in 1.12.0, which the project pins): a user's
own older runtime may still renumber, so the pass still skips the manifest rewrite on v3
tables, and the health trigger never finds it due there.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest

from icegate_dagster.maintenance import Maintainer, TableRef, iceberg_java
from icegate_dagster.maintenance.health.score import assess_table
from icegate_dagster.spark.session import get_spark
from tests.integration.test_delete_files import KEY, duckdb_rows, merge_on_read_table, statuses
from tests.lakehouse import Lakehouse, LakehouseFactory

MAINTAIN: dict[str, dict[str, Any]] = {
    "optimize": {"min_input_files": 2},
    "expire_snapshots": {"retention_threshold": "1s"},
    "compute_table_stats": {"enabled": True},
    "health": {"manifests": 2, "small_manifests": 2},
}


def lineage(lh: Lakehouse, name: str) -> list[tuple[Any, ...]]:
    """Every row with its lineage, as Spark reads the v3 metadata columns."""
    rows = get_spark(lh.config).sql(
        f"SELECT id, service, body, _row_id, _last_updated_sequence_number FROM {name}"
    )
    return sorted(tuple(r) for r in rows.collect())


@pytest.mark.parametrize("distributed", [True, False], ids=["procedures", "driver"])
def test_a_full_pass_keeps_row_lineage_on_a_format_v3_table(
    lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch, distributed: bool
) -> None:
    # On the driver path the compaction sorts (z-order) instead of bin-packing.
    zorder = {"strategy": "sort", "sort_order": "zorder(id, body)"}
    optimize = MAINTAIN["optimize"] if distributed else {**MAINTAIN["optimize"], **zorder}
    lh = lakehouse_factory(maintain={**MAINTAIN, "optimize": optimize})
    name = merge_on_read_table(lh, format_version=3, inserts=4)
    spark = get_spark(lh.config)
    spark.sql(f"DELETE FROM {name} WHERE id % 10 = 3")  # deletion vectors
    spark.sql(f"UPDATE {name} SET body = 'updated' WHERE id % 10 = 4")  # new sequence number
    if distributed:  # the path large tables take: Iceberg's procedures
        monkeypatch.setattr(iceberg_java, "DRIVER_SIDE_MAX_FILES", -1)
    ref = TableRef.parse(KEY)
    health = assess_table(lh.table(KEY), KEY, lh.config.for_table(KEY), datetime.now(UTC))
    assert health.metrics.format_version == 3
    assert health.metrics.manifests >= MAINTAIN["health"]["manifests"]
    assert "rewrite_manifests" not in health.due_operations, health.due
    before = lineage(lh, name)
    assert all(row[3] is not None and row[4] is not None for row in before)
    seen_by_duckdb = duckdb_rows(lh)
    time.sleep(1.2)  # every snapshot but the last is past the expiry threshold

    result = Maintainer(lh.config).maintain_table(ref)

    assert result.ok, statuses(result)
    done = {op.operation: op for op in result.ops}
    assert done["optimize"].status == "completed", statuses(result)
    assert done["expire_snapshots"].status == "completed", statuses(result)
    assert done["expire_snapshots"].output["execution"] == (
        "distributed" if distributed else "driver"
    )
    manifests = done["rewrite_manifests"]
    assert manifests.status == "skipped", statuses(result)
    assert "apache/iceberg#16699" in manifests.details and "format-version 3" in manifests.details
    assert lineage(lh, name) == before
    assert duckdb_rows(lh) == seen_by_duckdb
    assert spark.sql(f"SELECT count(*) FROM {name}.delete_files").first()[0] == 0
    # A dry run says the same, unplanned.
    [dry] = Maintainer(lh.config).maintain_table(ref, ["rewrite_manifests"], dry_run=True).ops
    assert dry.status == "skipped" and dry.details == manifests.details

    if distributed:  # the pinned runtime carries #16699's fix: the procedure keeps _row_id
        spark.sql(f"INSERT INTO {name} SELECT id, 'api', 'late' FROM range(1000, 1010)")
        kept = lineage(lh, name)
        [rewrote] = spark.sql(
            f"CALL {lh.config.catalog.name}.system.rewrite_manifests(table => 'lakehouse.orders')"
        ).collect()
        assert rewrote["rewritten_manifests_count"] > 1, rewrote  # the entries did move
        moved = lineage(lh, name)
        assert [row[:3] for row in moved] == [row[:3] for row in kept]  # the same rows...
        assert [row[3] for row in moved] == [row[3] for row in kept]  # ...not renumbered
