"""Lakehouses for the benchmarks, built in the parent with pyiceberg and pyarrow (no JVM).

Every side of a comparison gets its own lakehouse: its own folder, SQLite catalog and
catalog name. A :class:`Template` is built once and restored before each measured
process (deleted, then copied back to the same absolute path, which the catalog's
metadata locations name), so every repetition starts from the same untouched state and
no building is ever timed.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import yaml

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

    from icegate_dagster.config import IcegateConfig

NAMESPACE = "bench"

SCHEMA_FIELDS = [
    ("id", pa.int64()),
    ("tenant_id", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("body", pa.string()),
]


def arrow_schema() -> pa.Schema:
    return pa.schema(SCHEMA_FIELDS)


def rows(start: int, count: int, tenant: str = "acme") -> pa.Table:
    """``count`` log rows with ids from ``start``."""
    base = datetime(2026, 11, 1, tzinfo=UTC)
    ids = range(start, start + count)
    return pa.Table.from_pydict(
        {
            "id": list(ids),
            "tenant_id": [tenant] * count,
            "timestamp": [base + timedelta(seconds=i) for i in ids],
            "body": [f"log line {i} " + "x" * 40 for i in ids],
        },
        schema=arrow_schema(),
    )


@dataclass(frozen=True)
class Lakehouse:
    """A SQLite catalog, warehouse, WAL root and ``icegate.yaml`` under ``root``."""

    root: Path
    name: str

    @property
    def config_path(self) -> Path:
        return self.root / "icegate.yaml"

    @property
    def wal_root(self) -> Path:
        return self.root / "wal"

    @cached_property
    def config(self) -> IcegateConfig:
        from icegate_dagster.config import load_config

        return load_config(self.config_path)

    def catalog(self) -> Catalog:
        from icegate_dagster.catalog import open_catalog

        return open_catalog(self.config.catalog)


def make_lakehouse(
    root: Path,
    name: str,
    *,
    wal: bool = True,
    maintain: dict[str, Any] | None = None,
) -> Lakehouse:
    """Write the config of a new lakehouse under ``root`` (the catalog is created on use).

    ``wal``: set ``wal.root`` (an empty folder unless WAL files are written there)."""
    root.mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {
        "catalog": {
            "name": name,
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": (root / "warehouse").as_uri(),
        },
        "spark": {"master": "local[*]"},
        "maintain": maintain or {},
    }
    if wal:
        (root / "wal").mkdir(exist_ok=True)
        raw["wal"] = {"root": (root / "wal").as_uri()}
    (root / "icegate.yaml").write_text(yaml.safe_dump(raw))
    return Lakehouse(root, name)


def small_file_tables(lake: Lakehouse, tables: int, files: int, rows_per_file: int) -> list[str]:
    """``tables`` tables fed by ``files`` appends of one small file each: as many data
    files and snapshots."""
    catalog = lake.catalog()
    catalog.create_namespace_if_not_exists(NAMESPACE)
    keys = []
    for t in range(tables):
        table = catalog.create_table((NAMESPACE, f"t{t:04d}"), schema=arrow_schema())
        for f in range(files):
            table.append(rows(f * rows_per_file, rows_per_file))
        keys.append(f"{NAMESPACE}.t{t:04d}")
    return keys


def healthy_tables(lake: Lakehouse, tables: int, rows_per_table: int = 200) -> list[str]:
    """``tables`` healthy tables: one data file and one snapshot each."""
    return small_file_tables(lake, tables, 1, rows_per_table)


def empty_tables(lake: Lakehouse, tables: int) -> list[str]:
    """``tables`` tables with no snapshot at all."""
    catalog = lake.catalog()
    catalog.create_namespace_if_not_exists(NAMESPACE)
    keys = []
    for t in range(tables):
        catalog.create_table((NAMESPACE, f"t{t:04d}"), schema=arrow_schema())
        keys.append(f"{NAMESPACE}.t{t:04d}")
    return keys


def wal_files(lake: Lakehouse, key: str, files: int, rows_per_file: int) -> Path:
    """``files`` WAL Parquet files for table ``key``, the table's schema, written whole
    (temporary name, then renamed) under ``<wal.root>/<namespace>/<table>/``."""
    import pyarrow.parquet as pq

    namespace, table = key.split(".", 1)
    folder = lake.wal_root / namespace / table
    folder.mkdir(parents=True, exist_ok=True)
    for f in range(files):
        tmp = folder / f".wal-{f:05d}.parquet"
        pq.write_table(rows(1_000_000 + f * rows_per_file, rows_per_file, "wal"), tmp)
        tmp.rename(folder / f"wal-{f:05d}.parquet")
    return folder


def data_files(lake: Lakehouse, key: str) -> list[tuple[str, int]]:
    """The current data files of ``key``: local path and size in bytes."""
    namespace, table = key.split(".", 1)
    files = lake.catalog().load_table((namespace, table)).inspect.files()
    paths = [p.removeprefix("file:") for p in files.column("file_path").to_pylist()]
    return list(zip(paths, files.column("file_size_in_bytes").to_pylist(), strict=True))


def log_rows(lake: Lakehouse, run_id: str) -> int:
    """How many rows of the maintenance log carry ``run_id`` (0 if there is no log)."""
    from pyiceberg.expressions import EqualTo

    namespace, table = lake.config.log_table.split(".", 1)
    catalog = lake.catalog()
    if not catalog.table_exists((namespace, table)):
        return 0
    scan = catalog.load_table((namespace, table)).scan(row_filter=EqualTo("run_id", run_id))
    return int(scan.to_arrow().num_rows)


class Template:
    """A lakehouse built once, restored at the same path before each use.

    ``build`` makes the lakehouse under ``root`` (it is given ``root``); its result (for
    example the table keys) is kept as :attr:`value`. The built folder is copied aside;
    :meth:`restore` puts a fresh copy back (file times kept), untimed.
    """

    def __init__(self, root: Path, build: Callable[[Path], Any]) -> None:
        self.root = root
        self._copy = root.with_name(root.name + ".template")
        self.value = build(root)
        shutil.copytree(root, self._copy, symlinks=True)

    def restore(self) -> Path:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.copytree(self._copy, self.root, symlinks=True)
        return self.root

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self._copy, ignore_errors=True)
