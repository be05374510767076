"""Can a WAL file land in its table? Its Parquet footer against the table's Iceberg schema.

Pure pyarrow and pyiceberg, no JVM: a file is judged before Spark ever starts, and a file
that cannot be ingested is quarantined rather than failing the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icegate_dagster.maintenance.wal.files import WalFile

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.table import Table
    from pyiceberg.types import IcebergType


def _type_problem(arrow_type: pa.DataType, iceberg_type: IcebergType) -> str | None:
    """Why a WAL column of ``arrow_type`` cannot land in an Iceberg column, or None."""
    import pyarrow as pa
    from pyiceberg import types as t

    def ok(condition: bool) -> str | None:
        return None if condition else f"{arrow_type} cannot be written to {iceberg_type}"

    if pa.types.is_dictionary(arrow_type):  # dictionary encoding is storage, not type
        return _type_problem(arrow_type.value_type, iceberg_type)

    def fits(bits: int) -> bool:
        # An unsigned value needs a strictly wider signed column (Spark would wrap it).
        if pa.types.is_signed_integer(arrow_type):
            return bool(arrow_type.bit_width <= bits)
        return bool(pa.types.is_unsigned_integer(arrow_type) and arrow_type.bit_width < bits)

    if isinstance(iceberg_type, t.StringType):
        return ok(
            pa.types.is_string(arrow_type)
            or pa.types.is_large_string(arrow_type)
            or pa.types.is_string_view(arrow_type)
        )
    if isinstance(iceberg_type, t.BooleanType):
        return ok(pa.types.is_boolean(arrow_type))
    if isinstance(iceberg_type, t.IntegerType):
        return ok(fits(32))
    if isinstance(iceberg_type, t.LongType):
        return ok(fits(64))
    # float16 is left out: Spark 3.5 cannot read it.
    if isinstance(iceberg_type, t.FloatType):
        return ok(pa.types.is_float32(arrow_type))
    if isinstance(iceberg_type, t.DoubleType):
        return ok(pa.types.is_float32(arrow_type) or pa.types.is_float64(arrow_type))
    if isinstance(iceberg_type, t.DecimalType):
        return ok(
            pa.types.is_decimal(arrow_type)
            and arrow_type.scale == iceberg_type.scale
            and arrow_type.precision <= iceberg_type.precision
        )
    if isinstance(iceberg_type, t.DateType):
        return ok(pa.types.is_date(arrow_type))
    if isinstance(iceberg_type, (t.TimestampType, t.TimestamptzType)):
        return ok(pa.types.is_timestamp(arrow_type))
    if isinstance(iceberg_type, (t.BinaryType, t.FixedType, t.UUIDType)):
        return ok(
            pa.types.is_binary(arrow_type)
            or pa.types.is_large_binary(arrow_type)
            or pa.types.is_binary_view(arrow_type)
        )
    if isinstance(iceberg_type, t.ListType):
        if not (
            pa.types.is_list(arrow_type)
            or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type)
        ):
            return ok(False)
        return _type_problem(arrow_type.value_type, iceberg_type.element_type)
    if isinstance(iceberg_type, t.MapType):
        if not pa.types.is_map(arrow_type):
            return ok(False)
        return _type_problem(arrow_type.key_type, iceberg_type.key_type) or _type_problem(
            arrow_type.item_type, iceberg_type.value_type
        )
    if isinstance(iceberg_type, t.StructType):
        # Spark casts structs by position, so nested fields must match name for name.
        if not pa.types.is_struct(arrow_type):
            return ok(False)
        names = [arrow_type.field(i).name for i in range(arrow_type.num_fields)]
        if names != [f.name for f in iceberg_type.fields]:
            return f"struct fields {names} differ from {[f.name for f in iceberg_type.fields]}"
        for i, nested in enumerate(iceberg_type.fields):
            problem = _type_problem(arrow_type.field(i).type, nested.field_type)
            if problem:
                return f"{nested.name}: {problem}"
        return None
    return ok(False)


def schema_problem(file_schema: pa.Schema, table: Table) -> str | None:
    """Why a WAL file's schema cannot be ingested into ``table``, or None when it can.

    Every WAL column must exist in the table with a type that widens to the
    table's (a column the table lacks would be dropped silently: refused), and
    every required table column must be present.
    """
    iceberg_schema = table.schema()
    columns = {f.name: f for f in iceberg_schema.fields}
    for arrow_field in file_schema:
        target = columns.get(arrow_field.name)
        if target is None:
            return f"column {arrow_field.name!r} is not in the table"
        problem = _type_problem(arrow_field.type, target.field_type)
        if problem:
            return f"column {arrow_field.name!r}: {problem}"
    missing = [
        f.name for f in iceberg_schema.fields if f.required and f.name not in file_schema.names
    ]
    if missing:
        return f"required column(s) {', '.join(missing)} missing"
    return None


@dataclass(frozen=True)
class GoodFile:
    """A WAL file fit to ingest: its schema, row count and INT64-nanosecond columns."""

    file: WalFile
    schema: pa.Schema
    rows: int
    nanos: frozenset[str]


@dataclass
class Inspection:
    """The files fit to ingest, and the others with the reason each is refused."""

    good: list[GoodFile]
    bad: list[tuple[WalFile, str]]


def _read_footer(filesystem: Any, wal_file: WalFile, full_read: bool) -> tuple[Any, int, set[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    with filesystem.open_input_file(wal_file.path) as handle:
        parquet = pq.ParquetFile(handle)
        schema = parquet.schema_arrow
        # INT96 timestamps also look like timestamp[ns] to pyarrow, but Spark reads them
        # natively; only INT64 nanoseconds need the long path.
        physical = {
            parquet.schema.column(i).path: parquet.schema.column(i).physical_type
            for i in range(len(parquet.schema))
        }
        nanos = {
            f.name
            for f in schema
            if pa.types.is_timestamp(f.type)
            and f.type.unit == "ns"
            and physical.get(f.name) == "INT64"
        }
        if full_read:
            parquet.read()
        return schema, parquet.metadata.num_rows, nanos


def _flaky(exc: BaseException) -> bool:
    """An I/O error other than a missing file: worth one more read."""
    return isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError)


def inspect_files(
    filesystem: Any, files: list[WalFile], table: Table, full_read: bool
) -> Inspection:
    """Read each footer (or, with ``full_read``, every page) and check its schema.

    A file that is not Parquet goes to ``bad``; an I/O error is retried once
    before it counts (a flaky store must not quarantine a good file); a file
    that vanished is left out.
    """
    from tenacity import Retrying, retry_if_exception, stop_after_attempt

    result = Inspection([], [])
    for wal_file in files:
        reading = Retrying(
            stop=stop_after_attempt(2), retry=retry_if_exception(_flaky), reraise=True
        )
        try:
            schema, rows, nanos = reading(_read_footer, filesystem, wal_file, full_read)
        except FileNotFoundError:  # vanished
            continue
        except (ValueError, OSError) as exc:  # ArrowInvalid is a ValueError
            error = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            result.bad.append((wal_file, f"unreadable Parquet: {error}"))
            continue
        problem = schema_problem(schema, table)
        if problem:
            result.bad.append((wal_file, f"schema incompatible with the table: {problem}"))
        else:
            result.good.append(GoodFile(wal_file, schema, rows, frozenset(nanos)))
    return result
