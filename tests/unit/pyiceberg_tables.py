"""Real pyiceberg tables for unit tests: a SQLite ``SqlCatalog`` in a temporary folder, no JVM."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.types import LongType, NestedField

NAMESPACE = "unit"
SCHEMA = Schema(NestedField(1, "id", LongType(), required=False))
_EPOCH = datetime.fromtimestamp(0, UTC)


def sqlite_catalog(folder: Path) -> SqlCatalog:
    """A pyiceberg SQL catalog on SQLite with its warehouse, both under ``folder``."""
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    catalog = SqlCatalog(
        "unit", uri=f"sqlite:///{folder / 'catalog.db'}", warehouse=folder.as_uri()
    )
    catalog.create_namespace_if_not_exists(NAMESPACE)
    return catalog


def rows(*ids: int) -> pa.Table:
    """One append's worth of rows."""
    return pa.Table.from_pydict({"id": list(ids)}, schema=SCHEMA.as_arrow())


def create_table(
    catalog: SqlCatalog,
    name: str,
    appends: int = 0,
    properties: dict[str, str] | None = None,
) -> Table:
    """``unit.<name>`` with ``appends`` commits on main, one snapshot each, in time order.

    Appends are a few milliseconds apart, so every snapshot has its own timestamp.
    """
    table = catalog.create_table(f"{NAMESPACE}.{name}", schema=SCHEMA, properties=properties or {})
    for i in range(appends):
        table.append(rows(i))
        time.sleep(0.003)
    stamps = [s.timestamp_ms for s in table.metadata.snapshots]
    assert len(set(stamps)) == len(stamps) == appends, "snapshots must have distinct times"
    return table


def instant(timestamp_ms: int) -> datetime:
    """A snapshot's ``timestamp_ms`` as an exact UTC datetime (no float rounding)."""
    return _EPOCH + timedelta(milliseconds=timestamp_ms)
