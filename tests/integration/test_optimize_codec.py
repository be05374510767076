"""Compaction writes the codec users expect: a table pyiceberg made sets no codec, and
Iceberg's Java writer would then fall back to gzip (3x slower, unlike pyiceberg's zstd).
It gets zstd at pyiceberg's level 1; a level the table sets itself stays."""

from __future__ import annotations

import pyarrow.parquet as pq

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.ops.optimize import CODEC_PROPERTY, LEVEL_PROPERTY
from tests.lakehouse import LakehouseFactory

TABLE = "lakehouse.logs"


def _codecs(paths: list[object]) -> set[str]:
    return {pq.ParquetFile(str(path)).metadata.row_group(0).column(0).compression for path in paths}


def test_a_table_without_a_codec_is_compacted_into_zstd(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=6, services=("api",))
    assert CODEC_PROPERTY not in lh.table(TABLE).properties
    rows = lh.rows(TABLE)

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["optimize"])

    [op] = result.ops
    assert op.status == "completed", op.details
    assert op.output["compression_codec_set"] == "zstd" and CODEC_PROPERTY in op.details
    assert op.output["compression_level_set"] == 1 and f"{LEVEL_PROPERTY}=1" in op.details
    properties = lh.table(TABLE).properties
    assert (properties[CODEC_PROPERTY], properties[LEVEL_PROPERTY]) == ("zstd", "1")
    assert _codecs(lh.data_file_paths(TABLE)) == {"ZSTD"}
    assert lh.rows(TABLE) == rows


def test_a_level_the_table_sets_itself_stays(lakehouse_factory: LakehouseFactory) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=6, services=("api",))
    lh.table(TABLE).transaction().set_properties({LEVEL_PROPERTY: "9"}).commit_transaction()
    rows = lh.rows_without_spark(TABLE)

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["optimize"])

    [op] = result.ops
    assert op.status == "completed", op.details
    assert "compression_level_set" not in op.output
    properties = lh.table(TABLE).properties
    assert (properties[CODEC_PROPERTY], properties[LEVEL_PROPERTY]) == ("zstd", "9")
    assert _codecs(lh.data_file_paths(TABLE)) == {"ZSTD"}
    assert lh.rows_without_spark(TABLE) == rows


def test_compression_codec_null_leaves_the_table_to_icebergs_fallback(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(maintain={"optimize": {"compression_codec": None}})
    lh.add_table(TABLE, appends=6, services=("api",))

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["optimize"])

    assert result.ops[0].status == "completed", result.ops[0].details
    assert CODEC_PROPERTY not in lh.table(TABLE).properties
    assert _codecs(lh.data_file_paths(TABLE)) == {"GZIP"}
