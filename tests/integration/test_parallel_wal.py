"""Tables maintained side by side in one Spark session share no per-table session setting."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.spark.conf import NANOS_AS_LONG, build_spark_conf
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory

TABLES = [f"lakehouse.feed{i}" for i in range(4)]
FILES = 6
ROWS = 40
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
BASE_NS = int(datetime(2026, 11, 20, tzinfo=UTC).timestamp()) * 10**9


def _nanosecond_file(table: int, file: int) -> tuple[pa.Table, Counter[tuple[Any, ...]]]:
    """A WAL file with INT64 nanosecond timestamps (naive or zoned), and its rows as they
    should land: nanoseconds floored to microseconds, naive values read as UTC."""
    first = table * 100_000 + file * 1_000
    ids = list(range(first, first + ROWS))
    stamps = [BASE_NS + i * 1_000_000_007 + 999 for i in ids]  # sub-microsecond digits
    service = ("api", "web")[file % 2]
    kind = pa.timestamp("ns", tz="UTC" if file % 2 else None)
    frame = pa.Table.from_pydict(
        {
            "id": pa.array(ids, pa.int64()),
            "service": [service] * ROWS,
            "timestamp": pa.array(stamps, pa.int64()).cast(kind),
            "body": [f"row {i}" for i in ids],
        }
    )
    rows = Counter(
        (i, service, EPOCH + timedelta(microseconds=ns // 1000), f"row {i}")
        for i, ns in zip(ids, stamps, strict=True)
    )
    return frame, rows


def _rows(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    return Counter(
        (r["id"], r["service"], r["timestamp"], r["body"])
        for r in lh.table(key).scan().to_arrow().to_pylist()
    )


def test_wal_tables_ingested_side_by_side_keep_every_nanosecond_row(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(
        maintain={"parallel_tables": 4, "compaction": {"min_files": 1}}, wal=True
    )
    expected: dict[str, Counter[tuple[Any, ...]]] = {}
    for t, key in enumerate(TABLES):
        lh.add_table(key, appends=1)
        before = _rows(lh, key)
        for f in range(FILES):
            frame, rows = _nanosecond_file(t, f)
            lh.write_wal(key, frame, f"wal-{f:03d}.parquet")
            before += rows
        expected[key] = before

    results = Maintainer(lh.config).maintain(
        [TableRef.parse(k) for k in TABLES], ["wal_compaction"]
    )

    for result in results:
        op = result.op("wal_compaction")
        assert op is not None and op.status == "completed", op.details if op else result.as_dict()
        assert op.output["quarantined"] == [], op.output
        assert op.output["wal_files_ingested"] == FILES
    for key in TABLES:
        assert _rows(lh, key) == expected[key], key
        assert lh.wal_files(key) == []
    # The flag is the session's, set once when it started: never switched off per table.
    assert build_spark_conf(lh.config)[NANOS_AS_LONG] == "true"
    assert get_spark(lh.config).conf.get(NANOS_AS_LONG) == "true"
