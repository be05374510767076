"""Schema migration of IceGate's tables, on a real catalog with Spark writing the data."""

from __future__ import annotations

from collections import Counter
from datetime import date

import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table.sorting import SortDirection
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import NestedField, StringType, TimestamptzType
from pyspark.sql import functions as F

from icegate_dagster.errors import InvalidIdentifierError
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.migrate import (
    ICEGATE_TABLES,
    MigrationResult,
    icegate_schema,
    migrate,
    migrate_table,
)
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory

NS = "lakehouse"


def by_table(results: list[MigrationResult]) -> dict[str, MigrationResult]:
    return {r.table.removeprefix(f"{NS}."): r for r in results}


def metadata_locations(lh: Lakehouse) -> dict[str, str]:
    return {t: lh.table(f"{NS}.{t}").metadata_location for t in ICEGATE_TABLES}


def spark_name(lh: Lakehouse, table: str) -> str:
    return TableRef(NS, table).spark_identifier(lh.config.catalog.name)


def test_empty_catalog_gets_all_four_tables_and_a_rerun_commits_nothing(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()

    results = migrate(lh.catalog, NS)

    assert [(r.table, r.action, r.error) for r in results] == [
        (f"{NS}.{t}", "created", None) for t in ICEGATE_TABLES
    ]
    for table in ICEGATE_TABLES:
        created = by_table(results)[table]
        target = icegate_schema(table)
        assert created.added_columns == tuple(f.name for f in target.fields)
        loaded = lh.table(f"{NS}.{table}")
        assert loaded.schema().as_struct() == target.as_struct()  # same names, types and ids
        schema = loaded.schema()
        assert [
            (f.name, f.transform, schema.find_column_name(f.source_id))
            for f in loaded.spec().fields
        ] == [
            ("tenant_id", IdentityTransform(), "tenant_id"),
            ("timestamp_day", DayTransform(), "timestamp"),
        ]
        order = loaded.sort_order()
        assert [(schema.find_column_name(f.source_id), f.direction) for f in order.fields] == [
            ("timestamp", SortDirection.ASC)
        ]

    before = metadata_locations(lh)
    again = migrate(lh.catalog, NS)
    assert [(r.action, r.added_columns) for r in again] == [("unchanged", ())] * 4
    assert metadata_locations(lh) == before  # no new metadata commit


def test_older_logs_table_gains_missing_columns_and_keeps_rows_and_user_column(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.catalog.create_namespace(NS)
    old = Schema(
        NestedField(1, "tenant_id", StringType(), required=False),
        NestedField(2, "timestamp", TimestamptzType(), required=False),
        NestedField(3, "body", StringType(), required=False),
        NestedField(4, "region", StringType(), required=False),  # the user's own column
    )
    lh.catalog.create_table((NS, "logs"), schema=old)
    spark = get_spark(lh.config)
    spark.sql(
        f"INSERT INTO {spark_name(lh, 'logs')} VALUES "
        "('acme', TIMESTAMP '2026-01-01 10:00:00', 'hello', 'eu'), "
        "('globex', TIMESTAMP '2026-01-02 11:00:00', 'world', 'us')"
    )

    results = by_table(migrate(lh.catalog, NS))

    logs = results["logs"]
    assert logs.action == "evolved", logs.as_dict()
    expected_added = (
        "observed_timestamp",
        "trace_id",
        "span_id",
        "severity_number",
        "severity_text",
        "service_name",
        "attributes",
        "resource_attributes",
    )
    assert logs.added_columns == expected_added
    assert [results[t].action for t in ("spans", "metrics", "events")] == ["created"] * 3
    columns = [f.name for f in lh.table(f"{NS}.logs").schema().fields]
    assert columns == ["tenant_id", "timestamp", "body", "region", *expected_added]

    rows = (
        spark.read.table(spark_name(lh, "logs"))
        .select("tenant_id", "body", "region", "severity_number", "service_name", "attributes")
        .collect()
    )
    assert Counter(tuple(r) for r in rows) == Counter(
        [
            ("acme", "hello", "eu", None, None, None),
            ("globex", "world", "us", None, None, None),
        ]
    )

    before = metadata_locations(lh)
    again = migrate(lh.catalog, NS)
    assert [r.action for r in again] == ["unchanged"] * 4
    assert metadata_locations(lh) == before


def test_spark_writes_into_a_migrated_table_partitioned_by_tenant_and_day(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    assert all(r.ok for r in migrate(lh.catalog, NS))
    spark = get_spark(lh.config)

    name = spark_name(lh, "logs")
    given = spark.sql(
        "SELECT * FROM VALUES "
        "('acme', TIMESTAMP '2026-01-01 10:00:00', 'a', map('http.method', 'GET')), "
        "('acme', TIMESTAMP '2026-01-01 23:59:59', 'b', map()), "
        "('acme', TIMESTAMP '2026-01-02 00:00:00', 'c', NULL), "
        "('globex', TIMESTAMP '2026-01-01 12:00:00', 'd', NULL) "
        "AS v(tenant_id, timestamp, body, attributes)"
    )
    # A writer filling a few columns: Iceberg wants them all, so the rest are typed NULLs.
    given.select(
        *(
            given[c.name] if c.name in given.columns else F.lit(None).cast(c.dataType).alias(c.name)
            for c in spark.table(name).schema
        )
    ).writeTo(name).append()

    table = lh.table(f"{NS}.logs")
    files = table.inspect.files().to_pylist()
    per_partition = Counter(
        (f["partition"]["tenant_id"], f["partition"]["timestamp_day"]) for f in files
    )
    rows_per_partition: Counter[tuple[str, date]] = Counter()
    for f in files:
        key = (f["partition"]["tenant_id"], f["partition"]["timestamp_day"])
        rows_per_partition[key] += f["record_count"]
        # Spark laid the file out in the table's partition folders.
        assert f"tenant_id={key[0]}/timestamp_day={key[1].isoformat()}/" in f["file_path"]
    assert rows_per_partition == {
        ("acme", date(2026, 1, 1)): 2,
        ("acme", date(2026, 1, 2)): 1,
        ("globex", date(2026, 1, 1)): 1,
    }
    assert set(per_partition.values()) == {1}  # one file per tenant and day
    read = spark.table(name).select("body", "attributes").collect()
    assert sorted(((r.body, r.attributes) for r in read), key=lambda r: r[0]) == [
        ("a", {"http.method": "GET"}),
        ("b", {}),
        ("c", None),
        ("d", None),
    ]


def test_incompatible_column_type_fails_only_that_table(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.catalog.create_namespace(NS)
    spans_schema = Schema(
        NestedField(1, "tenant_id", StringType(), required=False),
        NestedField(2, "timestamp", StringType(), required=False),
    )
    spans = lh.catalog.create_table(
        (NS, "spans"),
        schema=spans_schema,
        partition_spec=PartitionSpec(
            PartitionField(source_id=1, field_id=1000, transform=IdentityTransform(), name="t")
        ),
    )

    results = by_table(migrate(lh.catalog, NS))

    failed = results["spans"]
    assert failed.action == "failed" and not failed.ok
    assert failed.added_columns == ()
    assert failed.error is not None and "\n" not in failed.error
    assert failed.error.startswith(f"{NS}.spans: ")
    assert "'timestamp'" in failed.error
    assert "string" in failed.error and "timestamptz" in failed.error
    assert failed.as_dict()["error"] == failed.error
    assert [results[t].action for t in ("logs", "metrics", "events")] == ["created"] * 3
    # The conflicting table was not touched at all.
    assert lh.table(f"{NS}.spans").metadata_location == spans.metadata_location


@pytest.mark.parametrize("namespace", ["x; DROP TABLE y", "a.b", "", "ns\n"])
def test_hostile_namespace_is_refused_before_anything_is_created(
    lakehouse_factory: LakehouseFactory, namespace: str
) -> None:
    lh = lakehouse_factory()

    with pytest.raises(InvalidIdentifierError, match="namespace"):
        migrate(lh.catalog, namespace)
    with pytest.raises(InvalidIdentifierError, match="namespace"):
        migrate_table(lh.catalog, namespace, "logs")

    assert lh.catalog.list_namespaces() == []
