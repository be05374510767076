"""Every cutoff and every WAL timestamp means the same instant whatever the session time zone.

These run under ``spark.sql.session.timeZone = America/Los_Angeles`` on the suite's shared
Spark session (restored afterwards) and read results back with pyiceberg, which no Spark
setting can colour.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.schema import Schema
from pyiceberg.types import (
    DateType,
    IcebergType,
    LongType,
    NestedField,
    StringType,
    TimestampType,
    TimestamptzType,
)
from pyspark.sql import SparkSession

from icegate_dagster.config import ExpireSnapshotsSettings
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance import maintainer as maintainer_module
from icegate_dagster.maintenance.discovery import TableLocations
from icegate_dagster.maintenance.ops import OpContext
from icegate_dagster.maintenance.ops.expire_snapshots import ExpireSnapshots
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory

ZONE = "spark.sql.session.timeZone"
TABLE = "lakehouse.events"


@pytest.fixture
def pacific(lakehouse_factory: LakehouseFactory) -> Iterator[SparkSession]:
    """The shared session in America/Los_Angeles for the test, then back as it was."""
    spark = get_spark(lakehouse_factory().config)
    previous = spark.conf.get(ZONE)
    spark.conf.set(ZONE, "America/Los_Angeles")
    try:
        yield spark
    finally:
        spark.conf.set(ZONE, previous)


def _ids(lh: Lakehouse, key: str) -> set[int]:
    return set(lh.table(key).scan().to_arrow().column("id").to_pylist())


# -- orphan floor and snapshot expiry --------------------------------------------


@pytest.mark.parametrize(
    ("threshold", "young_age"),
    [("24h", timedelta(hours=20)), ("7d", timedelta(days=6, hours=20))],
)
def test_orphan_threshold_is_an_instant(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory, threshold: str, young_age: timedelta
) -> None:
    lh = lakehouse_factory(maintain={"remove_orphan_files": {"retention_threshold": threshold}})
    lh.add_table(TABLE, appends=2)
    young = lh.plant_file(TABLE, "young-orphan.parquet", young_age)
    old = lh.plant_file(TABLE, "old-orphan.parquet", timedelta(days=30))

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["remove_orphan_files"])

    op = result.op("remove_orphan_files")
    assert op is not None and op.status == "completed", result.as_dict()
    assert young.exists()
    assert not old.exists()
    assert op.output["orphans_removed"] == 1


def test_snapshot_expiry_cutoff_is_an_instant(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table(TABLE, appends=4)
    history = [s.snapshot_id for s in table.metadata.snapshots]
    # Every snapshot is seconds old: an hour's threshold expires none of them.
    rule = ExpireSnapshotsSettings(retention_threshold=timedelta(hours=1), retain_last=1)

    spark = get_spark(lh.config)  # registers this lakehouse's catalog in the session
    ref, maintainer = TableRef.parse(TABLE), Maintainer(lh.config, spark=lambda: spark)
    context = OpContext(
        ref=ref,
        table=table,
        before=maintainer.stats(ref),
        settings=maintainer.settings(ref).model_copy(update={"expire_snapshots": rule}),
        config=lh.config,
        now=datetime.now(UTC),
        spark=lambda: spark,
        locations=TableLocations(lambda: lh.catalog),
    )
    ExpireSnapshots().run(context)  # the procedure itself, past the plan from metadata

    assert [s.snapshot_id for s in lh.table(TABLE).metadata.snapshots] == history


# -- TTL retention ---------------------------------------------------------------


def _ttl_table(lh: Lakehouse, column_type: IcebergType, values: list[Any]) -> None:
    schema = Schema(
        NestedField(1, "id", LongType(), required=False),
        NestedField(2, "at", column_type, required=False),
    )
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    table = lh.catalog.create_table(TableRef.parse(TABLE).identifier, schema=schema)
    rows = {"id": list(range(len(values))), "at": values}
    table.append(pa.Table.from_pydict(rows, schema=schema.as_arrow()))


def _ttl(lh: Lakehouse) -> Any:
    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["retention"])
    op = result.op("retention")
    assert op is not None
    return op


RULE = {"retention": {TABLE: {"days": 30, "column": "at"}}}


@pytest.mark.parametrize("zoned", [True, False], ids=["timestamptz", "timestamp"])
def test_ttl_on_timestamps_deletes_exactly_the_rows_past_the_cutoff(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory, zoned: bool
) -> None:
    lh = lakehouse_factory(maintain=RULE)
    cutoff = datetime.now(UTC) - timedelta(days=30)
    stamps = [
        cutoff - timedelta(days=3),  # 0: gone
        cutoff - timedelta(hours=2),  # 1: gone
        cutoff + timedelta(hours=2),  # 2: kept
        cutoff + timedelta(days=3),  # 3: kept
    ]
    if not zoned:  # a timestamp without zone holds the UTC wall clock
        stamps = [s.replace(tzinfo=None) for s in stamps]
    _ttl_table(lh, TimestamptzType() if zoned else TimestampType(), [*stamps, None])

    op = _ttl(lh)

    assert op.status == "completed", op.as_dict()
    assert _ids(lh, TABLE) == {2, 3, 4}
    assert op.output["rows_deleted"] == 2


def test_ttl_on_a_date_deletes_only_days_that_ended_before_the_cutoff(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory
) -> None:
    lh = lakehouse_factory(maintain=RULE)
    cutoff_day = (datetime.now(UTC) - timedelta(days=30)).date()
    days = [
        cutoff_day - timedelta(days=3),  # 0: gone
        cutoff_day - timedelta(days=1),  # 1: gone (ended at the cutoff day's midnight UTC)
        cutoff_day,  # 2: kept, the day has not ended at the cutoff
        cutoff_day + timedelta(days=1),  # 3: kept
    ]
    _ttl_table(lh, DateType(), days)

    op = _ttl(lh)

    assert op.status == "completed", op.as_dict()
    assert _ids(lh, TABLE) == {2, 3}
    assert op.output["rows_deleted"] == 2


def test_ttl_on_a_wall_clock_inside_a_dst_gap(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cutoff's wall clock 02:30 does not exist in Los Angeles on 2026-03-08."""
    fixed = datetime(2026, 4, 7, 2, 30, tzinfo=UTC)  # cutoff: 2026-03-08 02:30 UTC

    class Frozen(datetime):
        @classmethod
        def now(cls, tz: Any = None) -> Any:
            return fixed.astimezone(tz) if tz is not None else fixed.replace(tzinfo=None)

    monkeypatch.setattr(maintainer_module, "datetime", Frozen)
    lh = lakehouse_factory(maintain=RULE)
    _ttl_table(
        lh,
        TimestampType(),
        [datetime(2026, 3, 8, 1, 59), datetime(2026, 3, 8, 2, 31), datetime(2026, 3, 8, 3, 10)],
    )

    op = _ttl(lh)

    assert op.status == "completed", op.as_dict()
    assert _ids(lh, TABLE) == {1, 2}


def test_ttl_on_another_type_fails_naming_the_column_and_type(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory
) -> None:
    lh = lakehouse_factory(maintain=RULE)
    _ttl_table(lh, StringType(), ["2020-01-01", "2999-01-01"])

    op = _ttl(lh)

    assert op.status == "failed"
    assert "'at'" in (op.error or op.details) and "string" in (op.error or op.details)
    assert _ids(lh, TABLE) == {0, 1}


# -- WAL ingest ------------------------------------------------------------------

WAL_SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "instant", TimestamptzType(), required=False),
    NestedField(3, "wall", TimestampType(), required=False),
)
NOON = datetime(2026, 11, 20, 12, 0, 0, 123456)
#: 2026-11-01 01:30 happens twice in Los Angeles (08:30 and 09:30 UTC).
FALL_BACK = [datetime(2026, 11, 1, 8, 30, 0, 5), datetime(2026, 11, 1, 9, 30, 0, 5)]


def _wal_file(start: int, unit: str, tz: str | None, wall_clocks: list[datetime]) -> pa.Table:
    """Rows whose two columns both hold ``wall_clocks`` (as UTC instants when ``tz``)."""
    kind = pa.timestamp(unit, tz=tz)
    values = [w.replace(tzinfo=UTC) if tz else w for w in wall_clocks]
    if unit == "ns":  # pyarrow cannot take a datetime's nanoseconds: add some
        nanos = [
            int(v.replace(tzinfo=UTC).timestamp()) * 10**9 + v.microsecond * 1000 + 999
            for v in values
        ]
        column = pa.array(nanos, pa.int64()).cast(kind)
    else:
        column = pa.array(values, kind)
    ids = list(range(start, start + len(values)))
    return pa.Table.from_arrays(
        [pa.array(ids, pa.int64()), column, column], ["id", "instant", "wall"]
    )


@pytest.mark.parametrize("unit", ["us", "ns"])
def test_wal_timestamps_land_as_utc_instants_and_wall_clocks(
    pacific: SparkSession, lakehouse_factory: LakehouseFactory, unit: str
) -> None:
    lh = lakehouse_factory(maintain={"compaction": {"min_files": 1}}, wal=True)
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    lh.catalog.create_table(TableRef.parse(TABLE).identifier, schema=WAL_SCHEMA)
    clocks = [NOON, *FALL_BACK]
    lh.write_wal(TABLE, _wal_file(0, unit, None, clocks), "naive.parquet")
    lh.write_wal(TABLE, _wal_file(10, unit, "UTC", clocks), "zoned-utc.parquet")
    lh.write_wal(TABLE, _wal_file(20, unit, "Asia/Tokyo", clocks), "zoned-tokyo.parquet")

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])

    op = result.op("wal_compaction")
    assert op is not None and op.status == "completed", result.as_dict()
    assert op.output["quarantined"] == []
    landed = sorted(
        (r["id"], r["instant"], r["wall"]) for r in lh.table(TABLE).scan().to_arrow().to_pylist()
    )
    expected = sorted(
        (start + i, clock.replace(tzinfo=UTC), clock)
        for start in (0, 10, 20)
        for i, clock in enumerate(clocks)
    )
    assert landed == expected
