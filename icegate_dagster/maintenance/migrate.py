"""Schema migration of IceGate's tables: create them, or add the columns they lack.

IceGate stores OpenTelemetry-shaped data in four tables (``logs``, ``spans``,
``metrics``, ``events``) with flat columns, each partitioned by tenant and day and
sorted by time. This module creates those tables in a namespace, or evolves
existing ones by adding missing columns, through pyiceberg alone (no JVM).

Migration is additive and safe to re-run: a table that already has every column
is left without a new metadata commit, columns a user added are kept, and a
column whose type differs from IceGate's is never changed; that table fails
with a message naming the column and both types.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from typing import Any, Literal

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError, TableAlreadyExistsError
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.sorting import NullOrder, SortDirection, SortField, SortOrder
from pyiceberg.transforms import DayTransform, IdentityTransform
from pyiceberg.types import (
    DoubleType,
    IcebergType,
    IntegerType,
    ListType,
    LongType,
    MapType,
    NestedField,
    PrimitiveType,
    StringType,
    StructType,
    TimestamptzType,
)

from icegate_dagster.errors import (
    ConfigError,
    InvalidIdentifierError,
    SchemaConflictError,
    describe_error,
)
from icegate_dagster.maintenance.identifiers import TableRef

MigrationAction = Literal["created", "evolved", "unchanged", "failed"]

#: Where ``migrate`` puts the tables when neither ``--namespace`` nor ``namespaces`` says.
DEFAULT_NAMESPACE = "lakehouse"

#: IceGate's tables, in the order ``migrate`` handles them.
ICEGATE_TABLES: tuple[str, ...] = ("logs", "spans", "metrics", "events")

#: The column every table is partitioned by (identity) and the one partitioned by day
#: and sorted on.
TENANT_COLUMN = "tenant_id"
TIME_COLUMN = "timestamp"

# Namespaces migrate creates must be usable unquoted by every engine that queries
# IceGate, and a dot would make pyiceberg create a nested namespace instead.
_PLAIN_NAMESPACE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class MigrationResult:
    """What migration did to one table."""

    table: str
    action: MigrationAction
    added_columns: tuple[str, ...] = ()
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Created, evolved or unchanged: anything but a failure."""
        return self.action != "failed"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {
            "table": self.table,
            "action": self.action,
            "added_columns": list(self.added_columns),
            "error": self.error,
        }


class _StringMap:
    """Marker for a ``map<string, string>`` column, whose key and value need their own ids."""


_STRING_MAP = _StringMap()
_Column = tuple[str, PrimitiveType | _StringMap]

_COLUMNS: dict[str, tuple[_Column, ...]] = {
    "logs": (
        ("tenant_id", StringType()),
        ("timestamp", TimestamptzType()),
        ("observed_timestamp", TimestamptzType()),
        ("trace_id", StringType()),
        ("span_id", StringType()),
        ("severity_number", IntegerType()),
        ("severity_text", StringType()),
        ("body", StringType()),
        ("service_name", StringType()),
        ("attributes", _STRING_MAP),
        ("resource_attributes", _STRING_MAP),
    ),
    "spans": (
        ("tenant_id", StringType()),
        ("timestamp", TimestamptzType()),  # the span's start
        ("end_timestamp", TimestamptzType()),
        ("trace_id", StringType()),
        ("span_id", StringType()),
        ("parent_span_id", StringType()),
        ("name", StringType()),
        ("kind", StringType()),
        ("status_code", StringType()),
        ("status_message", StringType()),
        ("duration_ns", LongType()),
        ("service_name", StringType()),
        ("attributes", _STRING_MAP),
        ("resource_attributes", _STRING_MAP),
    ),
    "metrics": (
        ("tenant_id", StringType()),
        ("timestamp", TimestamptzType()),
        ("metric_name", StringType()),
        ("metric_type", StringType()),
        ("unit", StringType()),
        ("value", DoubleType()),
        ("service_name", StringType()),
        ("attributes", _STRING_MAP),
        ("resource_attributes", _STRING_MAP),
    ),
    "events": (
        ("tenant_id", StringType()),
        ("timestamp", TimestamptzType()),
        ("event_name", StringType()),
        ("trace_id", StringType()),
        ("span_id", StringType()),
        ("service_name", StringType()),
        ("body", StringType()),
        ("attributes", _STRING_MAP),
        ("resource_attributes", _STRING_MAP),
    ),
}


def icegate_schema(table: str) -> Schema:
    """The target schema of one IceGate table (``logs``, ``spans``, ``metrics``, ``events``).

    Every column is optional. Ids follow Iceberg's layout (top-level columns first,
    then nested ids), the same ids ``create_table`` assigns.
    """
    columns = _COLUMNS.get(table)
    if columns is None:
        raise ConfigError(
            f"table {table!r}: not an IceGate table; expected one of {', '.join(ICEGATE_TABLES)}"
        )
    nested_ids = itertools.count(len(columns) + 1)
    fields = [
        NestedField(
            field_id=top_id,
            name=name,
            field_type=_string_map(nested_ids) if isinstance(kind, _StringMap) else kind,
            required=False,
        )
        for top_id, (name, kind) in enumerate(columns, start=1)
    ]
    return Schema(*fields)


def _string_map(ids: itertools.count[int]) -> MapType:
    return MapType(
        key_id=next(ids),
        key_type=StringType(),
        value_id=next(ids),
        value_type=StringType(),
        value_required=False,
    )


def _partition_spec(schema: Schema) -> PartitionSpec:
    # Tenants are queried separately and by time range: one folder per tenant and day.
    return PartitionSpec(
        PartitionField(
            source_id=schema.find_field(TENANT_COLUMN).field_id,
            field_id=1000,
            transform=IdentityTransform(),
            name=TENANT_COLUMN,
        ),
        PartitionField(
            source_id=schema.find_field(TIME_COLUMN).field_id,
            field_id=1001,
            transform=DayTransform(),
            name=f"{TIME_COLUMN}_day",
        ),
    )


def _sort_order(schema: Schema) -> SortOrder:
    return SortOrder(
        SortField(
            source_id=schema.find_field(TIME_COLUMN).field_id,
            transform=IdentityTransform(),
            direction=SortDirection.ASC,
            null_order=NullOrder.NULLS_FIRST,
        )
    )


def _validated_ref(namespace: str, table: str) -> TableRef:
    """The table's ref; refuses names migrate must not create and tables not IceGate's."""
    ref = TableRef(namespace, table)  # empty, control characters, too long
    if not _PLAIN_NAMESPACE.match(namespace):
        raise InvalidIdentifierError(
            f"namespace {namespace!r}: migrate creates only plain namespaces "
            "(letters, digits and _, not starting with a digit)"
        )
    icegate_schema(table)  # refuses tables that are not IceGate's
    return ref


def migrate_table(catalog: Catalog, namespace: str, table: str) -> MigrationResult:
    """Create one IceGate table in ``namespace``, or add the columns it lacks.

    A new table gets the full schema, partitioned by ``identity(tenant_id)`` and
    ``day(timestamp)`` and sorted by ``timestamp``. An existing table only gets its
    missing columns (one schema commit); its partition spec, sort order, properties
    and any extra columns are left as they are, and nothing is committed when no
    column is missing. A column with a different type fails the table, unchanged.

    The namespace must exist. Bad names raise ``InvalidIdentifierError`` or
    ``ConfigError`` before anything is touched; any other problem becomes a
    ``failed`` result with a one-line error naming the table.
    """
    ref = _validated_ref(namespace, table)
    try:
        return _migrate(catalog, ref)
    except Exception as exc:  # one table's failure is reported, never raised
        return MigrationResult(ref.key, "failed", error=_one_line(ref, exc))


def migrate(catalog: Catalog, namespace: str) -> list[MigrationResult]:
    """Create or evolve all four IceGate tables in ``namespace``, one at a time.

    The namespace is created when missing. Each table is migrated on its own: a
    failure on one is a ``failed`` result and the others still run. Re-running is
    a no-op that reports every table ``unchanged``. See ``migrate_table``.
    """
    refs = [_validated_ref(namespace, table) for table in ICEGATE_TABLES]
    try:
        catalog.create_namespace_if_not_exists(namespace)
    except Exception as exc:
        # Without the namespace no table can be created: report each, try none.
        error = f"cannot create namespace {namespace!r}: {describe_error(exc)}"
        return [MigrationResult(ref.key, "failed", error=_one_line(ref, error)) for ref in refs]
    return [migrate_table(catalog, namespace, ref.name) for ref in refs]


def _migrate(catalog: Catalog, ref: TableRef) -> MigrationResult:
    target = icegate_schema(ref.name)
    try:
        existing = catalog.load_table(ref.identifier)
    except NoSuchTableError:
        try:
            catalog.create_table(
                ref.identifier,
                schema=target,
                partition_spec=_partition_spec(target),
                sort_order=_sort_order(target),
                # What Iceberg's Java writers (Spark ingest, compaction) use; without it
                # they fall back to gzip, while pyiceberg and the ingest write zstd.
                properties={"write.parquet.compression-codec": "zstd"},
            )
        except TableAlreadyExistsError:
            # Another migrate created it since we looked: evolve what it made instead.
            existing = catalog.load_table(ref.identifier)
        else:
            return MigrationResult(ref.key, "created", tuple(f.name for f in target.fields))
    return _evolve(existing, ref, target)


def _evolve(table: Table, ref: TableRef, target: Schema) -> MigrationResult:
    missing = _missing_columns(table.schema().as_struct(), target.as_struct(), (), ref)
    if not missing:
        # No update_schema() at all, so an unchanged table can never get a commit.
        return MigrationResult(ref.key, "unchanged")
    # One commit for every column; it asserts the schema we compared against is
    # still current, so a concurrent schema change fails this table, not corrupts it.
    with table.update_schema() as update:
        for path, field in missing:
            update.add_column(path, field.field_type, doc=field.doc, required=False)
    return MigrationResult(ref.key, "evolved", tuple(".".join(path) for path, _ in missing))


def _missing_columns(
    existing: StructType, target: StructType, parent: tuple[str, ...], ref: TableRef
) -> list[tuple[tuple[str, ...], NestedField]]:
    """Target columns absent from ``existing`` (recursing into structs), in target order.

    Raises SchemaConflictError for a column present with another type.
    """
    missing: list[tuple[tuple[str, ...], NestedField]] = []
    by_name = {f.name: f for f in existing.fields}
    by_folded = {f.name.lower(): f for f in existing.fields}
    for wanted in target.fields:
        path = (*parent, wanted.name)
        dotted = ".".join(path)
        current = by_name.get(wanted.name)
        if current is None:
            clash = by_folded.get(wanted.name.lower())
            if clash is not None:
                # Spark resolves names case-insensitively: both would be ambiguous.
                raise SchemaConflictError(
                    f"{ref.key}: column {'.'.join((*parent, clash.name))!r} differs only in "
                    f"case from the expected column {dotted!r}; not changed"
                )
            missing.append((path, wanted))
        elif isinstance(current.field_type, StructType) and isinstance(
            wanted.field_type, StructType
        ):
            missing += _missing_columns(current.field_type, wanted.field_type, path, ref)
        elif not _same_type(current.field_type, wanted.field_type):
            raise SchemaConflictError(
                f"{ref.key}: column {dotted!r} has type {_type_text(current.field_type)} "
                f"but IceGate expects {_type_text(wanted.field_type)}; not changed"
            )
    return missing


def _same_type(a: IcebergType, b: IcebergType) -> bool:
    """Equal types, ignoring field ids, docs and nullability (which Iceberg keeps per field)."""
    if isinstance(a, StructType) and isinstance(b, StructType):
        left = {f.name: f.field_type for f in a.fields}
        right = {f.name: f.field_type for f in b.fields}
        return left.keys() == right.keys() and all(_same_type(left[n], right[n]) for n in left)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return _same_type(a.key_type, b.key_type) and _same_type(a.value_type, b.value_type)
    if isinstance(a, ListType) and isinstance(b, ListType):
        return _same_type(a.element_type, b.element_type)
    # Promotions (int to long, float to double) count as different: migrate only adds.
    return isinstance(a, PrimitiveType) and isinstance(b, PrimitiveType) and a == b


def _type_text(kind: IcebergType) -> str:
    """A type as Iceberg writes it, without field ids (``map<string, string>``)."""
    if isinstance(kind, StructType):
        return (
            "struct<"
            + ", ".join(f"{f.name}: {_type_text(f.field_type)}" for f in kind.fields)
            + ">"
        )
    if isinstance(kind, MapType):
        return f"map<{_type_text(kind.key_type)}, {_type_text(kind.value_type)}>"
    if isinstance(kind, ListType):
        return f"list<{_type_text(kind.element_type)}>"
    return str(kind)


def _one_line(ref: TableRef, error: BaseException | str) -> str:
    text = error if isinstance(error, str) else describe_error(error)
    # Results are read one per line: each must say which table it is about.
    return text if text.startswith(f"{ref.key}:") else f"{ref.key}: {text}"


def target_namespace(configured: tuple[str, ...] | None, requested: str | None = None) -> str:
    """The namespace to migrate: ``requested``, else the first configured, else ``lakehouse``."""
    if requested:
        return requested
    return configured[0] if configured else DEFAULT_NAMESPACE
