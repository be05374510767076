"""Builds real temporary lakehouses (SQLite catalog + file warehouse) for the tests."""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml
from pyiceberg.catalog import Catalog
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.transforms import IdentityTransform
from pyiceberg.types import LongType, NestedField, StringType, TimestamptzType

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, load_config
from icegate_dagster.maintenance import TableRef
from icegate_dagster.spark.session import get_spark

_catalog_names = itertools.count(1)

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=False),
    NestedField(2, "service", StringType(), required=False),
    NestedField(3, "timestamp", TimestamptzType(), required=False),
    NestedField(4, "body", StringType(), required=False),
)
SPEC = PartitionSpec(
    PartitionField(source_id=2, field_id=1000, transform=IdentityTransform(), name="service")
)


def batch(start: int, services: tuple[str, ...], rows_per_service: int = 5) -> pa.Table:
    """One append's worth of rows: one file per service value."""
    ids, svcs, stamps, bodies = [], [], [], []
    n = start
    for service in services:
        for _ in range(rows_per_service):
            ids.append(n)
            svcs.append(service)
            stamps.append(datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=n))
            bodies.append(f"row {n}")
            n += 1
    return pa.Table.from_pydict(
        {"id": ids, "service": svcs, "timestamp": stamps, "body": bodies},
        schema=SCHEMA.as_arrow(),
    )


@dataclass
class Lakehouse:
    """A temporary lakehouse: its folder, config file, catalog and helpers to inspect it."""

    root: Path
    config_path: Path
    config: IcegateConfig
    catalog: Catalog
    planted: dict[str, Path] = field(default_factory=dict)

    def table(self, key: str) -> Table:
        return self.catalog.load_table(TableRef.parse(key).identifier)

    def add_table(
        self, key: str, appends: int = 8, services: tuple[str, ...] = ("api", "web")
    ) -> Table:
        """A table fed by ``appends`` small commits, one file per service each."""
        ref = TableRef.parse(key)
        self.catalog.create_namespace_if_not_exists(ref.namespace)
        table = self.catalog.create_table(ref.identifier, schema=SCHEMA, partition_spec=SPEC)
        for i in range(appends):
            table.append(batch(i * 1000, services))
        return table

    def add_table_inside(self, outer: str, key: str, *, age: timedelta | None = None) -> Table:
        """A table whose folder lies inside ``outer``'s, with one small commit; its data
        files are made ``age`` old (so only being referenced keeps them from orphan removal)."""
        ref = TableRef.parse(key)
        location = f"{self.table(outer).location()}/{ref.name}"
        table = self.catalog.create_table(
            ref.identifier, schema=SCHEMA, partition_spec=SPEC, location=location
        )
        table.append(batch(0, ("api",)))
        if age is not None:
            stamp = time.time() - age.total_seconds()
            for path in self.data_file_paths(key):
                os.utime(path, (stamp, stamp))
        return table

    def data_dir(self, key: str) -> Path:
        return Path(self.table(key).location().removeprefix("file://")) / "data"

    def plant_file(self, key: str, name: str, age: timedelta) -> Path:
        """An unreferenced file in the table's data folder, back-dated by ``age``."""
        path = self.data_dir(key) / name
        path.write_bytes(b"PAR1" + os.urandom(512) + b"PAR1")
        stamp = time.time() - age.total_seconds()
        os.utime(path, (stamp, stamp))
        return path

    def rows(self, key: str) -> Counter[tuple[Any, ...]]:
        """The table's rows as a multiset, read through Spark."""
        spark = get_spark(self.config)
        frame = spark.read.table(TableRef.parse(key).spark_identifier(self.config.catalog.name))
        return Counter(tuple(r) for r in frame.collect())

    def rows_without_spark(self, key: str) -> Counter[tuple[Any, ...]]:
        """The table's rows as a multiset, read with pyiceberg (no JVM in this process)."""
        return Counter(tuple(r.values()) for r in self.table(key).scan().to_arrow().to_pylist())

    def log_rows(self) -> list[dict[str, Any]]:
        """Every row of the maintenance log, via pyiceberg."""
        table = self.catalog.load_table(TableRef.parse(self.config.log_table).identifier)
        return table.scan().to_arrow().to_pylist()

    def wal_dir(self, key: str) -> Path:
        """``<wal.root>/<namespace>/<table>`` of ``key`` (created)."""
        ref = TableRef.parse(key)
        path = self.root / "wal" / ref.namespace / ref.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def write_wal(self, key: str, rows: pa.Table, name: str) -> Path:
        """One WAL Parquet file for ``key``, written the way an ingester would (tmp, rename)."""
        import pyarrow.parquet as pq

        target = self.wal_dir(key) / name
        tmp = target.with_suffix(".tmp")
        pq.write_table(rows, tmp)
        tmp.rename(target)
        return target

    def wal_files(self, key: str) -> list[str]:
        return sorted(p.name for p in self.wal_dir(key).glob("*.parquet"))

    def data_file_paths(self, key: str) -> list[Path]:
        files = self.table(key).inspect.files().column("file_path").to_pylist()
        return [Path(p.removeprefix("file://").removeprefix("file:")) for p in files]


def make_lakehouse(
    root: Path, maintain: dict[str, Any] | None = None, wal: bool = False
) -> Lakehouse:
    """A lakehouse under ``root`` with a config file whose catalog name is unique in the process.

    Each lakehouse gets its own catalog name because the suite shares one Spark
    session, and Spark keeps a catalog per name.
    """
    root.mkdir(parents=True, exist_ok=True)
    name = f"test_lh{next(_catalog_names)}"
    raw = {
        "catalog": {
            "name": name,
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": (root / "warehouse").as_uri(),
        },
        "spark": {"master": "local[2]"},
        "maintain": maintain or {},
    }
    if wal:
        raw["wal"] = {"root": (root / "wal").as_uri()}
    config_path = root / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    return Lakehouse(root, config_path, config, open_catalog(config.catalog))


#: The ``lakehouse_factory`` fixture: ``lakehouse_factory(maintain={...})``.
LakehouseFactory = Callable[..., Lakehouse]
