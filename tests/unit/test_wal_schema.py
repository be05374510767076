"""Which WAL files fit their table, judged from the Parquet footer alone (no JVM).

Real pyarrow schemas and Parquet files against a real pyiceberg table, created in a
SQLite ``SqlCatalog`` in a temporary folder.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyarrow import fs
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    StringType,
    StructType,
    TimestampType,
    TimestamptzType,
    TimeType,
    UUIDType,
)

from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.wal import list_wal_files, resolve_wal_root, schema_problem
from icegate_dagster.maintenance.wal.schema import inspect_files

#: One optional column per Iceberg type, and a required ``id`` every file must carry.
SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "i32", IntegerType()),
    NestedField(3, "i64", LongType()),
    NestedField(4, "f32", FloatType()),
    NestedField(5, "f64", DoubleType()),
    NestedField(6, "dec", DecimalType(12, 2)),
    NestedField(7, "day", DateType()),
    NestedField(8, "ts", TimestampType()),
    NestedField(9, "tstz", TimestamptzType()),
    NestedField(10, "text", StringType()),
    NestedField(11, "blob", BinaryType()),
    NestedField(12, "uid", UUIDType()),
    NestedField(13, "flag", BooleanType()),
    NestedField(14, "tags", ListType(15, StringType())),
    NestedField(16, "attrs", MapType(17, StringType(), 18, LongType())),
    NestedField(
        19,
        "point",
        StructType(NestedField(20, "x", IntegerType()), NestedField(21, "y", DoubleType())),
    ),
    NestedField(22, "at", TimeType()),
)


@pytest.fixture(scope="module")
def table(tmp_path_factory: pytest.TempPathFactory) -> Table:
    folder = tmp_path_factory.mktemp("catalog")
    catalog = SqlCatalog(
        "unit", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=folder.as_uri()
    )
    catalog.create_namespace("wal")
    return catalog.create_table("wal.events", schema=SCHEMA)


def _file(column: str, arrow_type: pa.DataType) -> pa.Schema:
    """A WAL file's schema: the required ``id`` and one more column."""
    return pa.schema([("id", pa.int64()), (column, arrow_type)])


ACCEPTED = [
    # Integers widen: any signed type that fits, and unsigned ones into a wider column.
    ("i32", pa.int8()),
    ("i32", pa.int16()),
    ("i32", pa.int32()),
    ("i32", pa.uint8()),
    ("i32", pa.uint16()),
    ("i64", pa.int8()),
    ("i64", pa.int32()),
    ("i64", pa.int64()),
    ("i64", pa.uint32()),
    ("f32", pa.float32()),
    ("f64", pa.float32()),
    ("f64", pa.float64()),
    # Decimals: the same scale, no more digits than the column.
    ("dec", pa.decimal128(12, 2)),
    ("dec", pa.decimal128(5, 2)),
    ("day", pa.date32()),
    ("day", pa.date64()),
    # Any timestamp unit, with or without a zone, into either timestamp type (the
    # conversions happen in Spark, see wal.frame).
    ("ts", pa.timestamp("us")),
    ("ts", pa.timestamp("ns")),
    ("ts", pa.timestamp("ms")),
    ("ts", pa.timestamp("s")),
    ("ts", pa.timestamp("us", tz="UTC")),
    ("ts", pa.timestamp("ns", tz="Asia/Tokyo")),
    ("tstz", pa.timestamp("us", tz="UTC")),
    ("tstz", pa.timestamp("ns", tz="UTC")),
    ("tstz", pa.timestamp("us")),
    ("tstz", pa.timestamp("ns")),
    ("text", pa.string()),
    ("text", pa.large_string()),
    ("text", pa.string_view()),
    ("text", pa.dictionary(pa.int32(), pa.string())),  # dictionary encoding is storage
    ("blob", pa.binary()),
    ("blob", pa.large_binary()),
    ("blob", pa.binary_view()),
    ("uid", pa.binary()),
    ("flag", pa.bool_()),
    ("tags", pa.list_(pa.string())),
    ("tags", pa.large_list(pa.large_string())),
    ("tags", pa.list_(pa.string(), 3)),  # fixed size
    ("attrs", pa.map_(pa.string(), pa.int64())),
    ("attrs", pa.map_(pa.string(), pa.int32())),  # the value widens
    ("point", pa.struct([("x", pa.int32()), ("y", pa.float64())])),
    ("point", pa.struct([("x", pa.int16()), ("y", pa.float32())])),
]


@pytest.mark.parametrize(("column", "arrow_type"), ACCEPTED, ids=lambda v: str(v))
def test_types_that_widen_to_the_column_are_accepted(
    table: Table, column: str, arrow_type: pa.DataType
) -> None:
    assert schema_problem(_file(column, arrow_type), table) is None


REFUSED = [
    # Narrowing, and unsigned values a same-width signed column would wrap.
    ("i32", pa.int64(), "int64 cannot be written to int"),
    ("i32", pa.uint32(), "uint32 cannot be written to int"),
    ("i64", pa.uint64(), "uint64 cannot be written to long"),
    ("i64", pa.float64(), "double cannot be written to long"),
    ("i64", pa.string(), "string cannot be written to long"),
    ("f32", pa.float64(), "double cannot be written to float"),
    ("f32", pa.float16(), "halffloat cannot be written to float"),  # Spark cannot read it
    ("f64", pa.int64(), "int64 cannot be written to double"),
    # Decimals: more digits, or another scale.
    ("dec", pa.decimal128(13, 2), "decimal128(13, 2) cannot be written to decimal(12, 2)"),
    ("dec", pa.decimal128(12, 3), "decimal128(12, 3) cannot be written to decimal(12, 2)"),
    ("dec", pa.float64(), "double cannot be written to decimal(12, 2)"),
    ("day", pa.timestamp("us"), "timestamp[us] cannot be written to date"),
    ("ts", pa.string(), "string cannot be written to timestamp"),
    ("ts", pa.int64(), "int64 cannot be written to timestamp"),
    ("ts", pa.date32(), "date32[day] cannot be written to timestamp"),
    ("tstz", pa.int64(), "int64 cannot be written to timestamptz"),
    # Strings and bytes do not mix.
    ("text", pa.binary(), "binary cannot be written to string"),
    ("text", pa.int32(), "int32 cannot be written to string"),
    ("text", pa.dictionary(pa.int32(), pa.int64()), "int64 cannot be written to string"),
    ("blob", pa.string(), "string cannot be written to binary"),
    ("uid", pa.string(), "string cannot be written to uuid"),
    ("flag", pa.int8(), "int8 cannot be written to boolean"),
    # Nested types: the container, then what it holds.
    ("tags", pa.string(), "string cannot be written to list<string>"),
    ("tags", pa.list_(pa.int64()), "int64 cannot be written to string"),
    ("attrs", pa.map_(pa.string(), pa.uint64()), "uint64 cannot be written to long"),
    ("attrs", pa.map_(pa.int32(), pa.int64()), "int32 cannot be written to string"),
    ("attrs", pa.struct([("k", pa.string())]), "cannot be written to map<string, long>"),
    # Spark casts structs by position: the nested names must match, in order.
    (
        "point",
        pa.struct([("y", pa.float64()), ("x", pa.int32())]),
        "struct fields ['y', 'x'] differ from ['x', 'y']",
    ),
    ("point", pa.struct([("x", pa.int32())]), "struct fields ['x'] differ from ['x', 'y']"),
    ("point", pa.struct([("x", pa.int64()), ("y", pa.float64())]), "x: int64 cannot be"),
    # An Iceberg type without a rule takes nothing.
    ("at", pa.time64("us"), "time64[us] cannot be written to time"),
]


@pytest.mark.parametrize(("column", "arrow_type", "why"), REFUSED, ids=lambda v: str(v))
def test_types_that_do_not_fit_the_column_are_refused(
    table: Table, column: str, arrow_type: pa.DataType, why: str
) -> None:
    problem = schema_problem(_file(column, arrow_type), table)
    assert problem is not None
    assert problem.startswith(f"column {column!r}: "), problem
    assert why in problem


def test_a_column_the_table_lacks_is_refused(table: Table) -> None:
    """It would be dropped silently."""
    problem = schema_problem(_file("extra", pa.string()), table)
    assert problem == "column 'extra' is not in the table"


def test_a_missing_required_column_is_refused_a_missing_optional_one_is_not(
    table: Table,
) -> None:
    assert schema_problem(pa.schema([("text", pa.string())]), table) == (
        "required column(s) id missing"
    )
    assert schema_problem(pa.schema([("id", pa.int64())]), table) is None


def test_the_first_problem_is_named(table: Table) -> None:
    file_schema = pa.schema([("id", pa.int64()), ("i32", pa.int64()), ("text", pa.binary())])
    assert schema_problem(file_schema, table) == "column 'i32': int64 cannot be written to int"


# -- footers read from real files ---------------------------------------------------

REF = TableRef("wal", "events")


def _write(folder: Path, name: str, data: pa.Table, **options: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(data, folder / name, **options)


def _rows(**columns: pa.Array) -> pa.Table:
    return pa.table({"id": pa.array([1, 2, 3], pa.int64()), **columns})


def test_footers_sort_files_into_good_and_bad(tmp_path: Path, table: Table) -> None:
    folder = tmp_path / "wal" / "events"
    stamps = pa.array([1, 2, 3], pa.int64())
    _write(folder, "a-good.parquet", _rows(text=pa.array(["x", "y", "z"])))
    _write(folder, "b-nanos.parquet", _rows(ts=stamps.cast(pa.timestamp("ns"))))
    _write(
        folder,
        "c-int96.parquet",
        _rows(ts=stamps.cast(pa.timestamp("ns"))),
        use_deprecated_int96_timestamps=True,
    )
    _write(folder, "d-wide.parquet", _rows(i32=pa.array([1, 2, 3], pa.int64())))
    (folder / "e-junk.parquet").write_bytes(b"not parquet at all")
    files = sorted(list_wal_files(resolve_wal_root(tmp_path.as_uri()), REF), key=lambda f: f.name)

    inspected = inspect_files(fs.LocalFileSystem(), files, table, full_read=False)

    good = {g.file.name: g for g in inspected.good}
    assert sorted(good) == ["a-good.parquet", "b-nanos.parquet", "c-int96.parquet"]
    assert all(g.rows == 3 for g in good.values())
    # Only INT64 nanoseconds need Spark's long path; INT96 is read natively.
    assert good["b-nanos.parquet"].nanos == frozenset({"ts"})
    assert good["c-int96.parquet"].nanos == frozenset()
    assert good["a-good.parquet"].schema.names == ["id", "text"]
    bad = {f.name: reason for f, reason in inspected.bad}
    assert sorted(bad) == ["d-wide.parquet", "e-junk.parquet"]
    assert bad["d-wide.parquet"] == (
        "schema incompatible with the table: column 'i32': int64 cannot be written to int"
    )
    assert bad["e-junk.parquet"].startswith("unreadable Parquet: ")


def test_a_vanished_file_is_left_out(tmp_path: Path, table: Table) -> None:
    folder = tmp_path / "wal" / "events"
    _write(folder, "gone.parquet", _rows())
    files = list_wal_files(resolve_wal_root(tmp_path.as_uri()), REF)
    (folder / "gone.parquet").unlink()

    inspected = inspect_files(fs.LocalFileSystem(), files, table, full_read=False)

    assert inspected.good == [] and inspected.bad == []


class _FlakyStore:
    """The local file system, whose first ``failures`` opens fail with an I/O error."""

    def __init__(self, failures: int) -> None:
        self.local = fs.LocalFileSystem()
        self.failures = failures
        self.opens = 0

    def open_input_file(self, path: str) -> Any:
        self.opens += 1
        if self.opens <= self.failures:
            raise OSError(f"connection reset while reading {path} (try {self.opens})")
        return self.local.open_input_file(path)


def test_an_io_error_is_retried_once_before_the_file_counts_as_bad(
    tmp_path: Path, table: Table
) -> None:
    _write(tmp_path / "wal" / "events", "a.parquet", _rows(day=pa.array([date(2026, 1, 1)] * 3)))
    files = list_wal_files(resolve_wal_root(tmp_path.as_uri()), REF)

    once = _FlakyStore(failures=1)
    inspected = inspect_files(once, files, table, full_read=True)
    assert [g.file.name for g in inspected.good] == ["a.parquet"] and once.opens == 2

    twice = _FlakyStore(failures=2)
    inspected = inspect_files(twice, files, table, full_read=False)
    assert inspected.good == [] and twice.opens == 2
    assert [reason for _f, reason in inspected.bad] == [
        f"unreadable Parquet: connection reset while reading {files[0].path} (try 2)"
    ]
