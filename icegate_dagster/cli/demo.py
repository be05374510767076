"""``demo``: the demo lakehouse (small files, many snapshots, an orphan and a WAL backlog)
built and maintained.

``build_demo_lakehouse`` makes the embedded lakehouse in ``./.icegate`` look
like a busy one left unmaintained: observability tables fed by many small
appends, an ordinary table, a back-dated orphan from a failed write, a fresh
unreferenced file that must survive, and an ingest simulator's WAL files
waiting for ``logs`` and ``spans``; :func:`run_demo` then runs a full pass over it.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from icegate_dagster.cli.passes import dagster_instance, emit_results, record_in_dagster
from icegate_dagster.config import IcegateConfig, config_from_dict, embedded_default_dict
from icegate_dagster.errors import IcegateError
from icegate_dagster.maintenance import OPERATIONS, Maintainer

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

DEMO_MARKER = ".icegate-demo"
DEMO_NAMESPACE = "lakehouse"
#: The demo's snapshots are seconds old; treat anything older than a second as old.
DEMO_OVERRIDES = {"expire_snapshots": {"retention_threshold": "1s", "retain_last": 1}}


@dataclass(frozen=True)
class DemoTable:
    """How one demo table is fed: ``appends`` commits, one file per partition value each,
    then ``wal_files`` WAL files left waiting by the ingest simulator."""

    name: str
    appends: int
    partitions: tuple[str, ...]
    rows_per_file: int
    wal_files: int = 0


DEMO_TABLES = (
    DemoTable("logs", 60, ("api", "auth", "billing", "search", "web"), 40, wal_files=24),
    DemoTable("spans", 40, ("tenant-a", "tenant-b", "tenant-c", "tenant-d"), 40, wal_files=12),
    DemoTable("orders", 80, ("",), 25),
)


def _schema(table: str) -> Any:
    from pyiceberg.schema import Schema
    from pyiceberg.types import DoubleType, LongType, NestedField, StringType, TimestamptzType

    fields: list[tuple[str, Any]]
    if table == "logs":
        fields = [("service", StringType()), ("severity", StringType()), ("body", StringType())]
    elif table == "spans":
        fields = [("tenant_id", StringType()), ("name", StringType()), ("duration_ms", LongType())]
    else:
        fields = [("customer", StringType()), ("status", StringType()), ("amount", DoubleType())]
    columns = [("timestamp", TimestamptzType()), ("id", LongType()), *fields]
    return Schema(
        *(NestedField(i, name, kind, required=False) for i, (name, kind) in enumerate(columns, 1))
    )


def _partition_column(table: DemoTable) -> str | None:
    return {"logs": "service", "spans": "tenant_id"}.get(table.name)


def _create(catalog: Catalog, table: DemoTable) -> Any:
    from pyiceberg.partitioning import PartitionField, PartitionSpec
    from pyiceberg.transforms import IdentityTransform

    schema = _schema(table.name)
    column = _partition_column(table)
    spec = PartitionSpec()
    if column is not None:
        source = schema.find_field(column).field_id
        spec = PartitionSpec(
            PartitionField(
                source_id=source, field_id=1000, transform=IdentityTransform(), name=column
            )
        )
    return catalog.create_table((DEMO_NAMESPACE, table.name), schema=schema, partition_spec=spec)


def _batch(table: DemoTable, commit: int, rng: random.Random) -> Any:
    import pyarrow as pa

    base = datetime(2026, 11, 1, tzinfo=UTC) + timedelta(minutes=commit)
    n = table.rows_per_file
    columns: dict[str, list[object]] = {"timestamp": [], "id": []}
    for p_index, part in enumerate(table.partitions):
        for i in range(n):
            columns["timestamp"].append(base + timedelta(seconds=i))
            columns["id"].append((commit * len(table.partitions) + p_index) * n + i)
            if table.name == "logs":
                columns.setdefault("service", []).append(part)
                columns.setdefault("severity", []).append(rng.choice(["INFO", "WARN", "ERROR"]))
                columns.setdefault("body", []).append(f"request {rng.randrange(10**6)} handled")
            elif table.name == "spans":
                columns.setdefault("tenant_id", []).append(part)
                columns.setdefault("name", []).append(
                    rng.choice(["GET /", "POST /pay", "db.query"])
                )
                columns.setdefault("duration_ms", []).append(rng.randrange(1, 900))
            else:
                columns.setdefault("customer", []).append(f"c{rng.randrange(500)}")
                columns.setdefault("status", []).append(rng.choice(["new", "paid", "shipped"]))
                columns.setdefault("amount", []).append(round(rng.uniform(1, 500), 2))
    schema = _schema(table.name).as_arrow()
    return pa.Table.from_pydict(columns, schema=schema)


def simulate_ingest(wal_root: Path, table: DemoTable, rng: random.Random) -> list[Path]:
    """Write ``table.wal_files`` WAL files the way IceGate's ingest does (tmp name, rename)."""
    import pyarrow.parquet as pq

    folder = wal_root / DEMO_NAMESPACE / table.name
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(table.wal_files):
        target = folder / f"{i:06d}-ingest.parquet"
        tmp = target.with_suffix(".tmp")
        pq.write_table(_batch(table, table.appends + i, rng), tmp)
        tmp.rename(target)
        written.append(target)
    return written


def _prepare_root(root: Path) -> None:
    if root.exists() and any(root.iterdir()) and not (root / DEMO_MARKER).exists():
        raise IcegateError(
            f"{root} holds a lakehouse the demo did not create; the demo rebuilds its folder "
            "from scratch, so it refuses to touch this one (use --root to pick another folder)"
        )
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    (root / DEMO_MARKER).write_text("built by icegate-maintain demo; rebuilt on every demo run\n")


def _plant_leftover_files(catalog: Catalog) -> list[Path]:
    """An old orphan from a failed write (must go) and a fresh unreferenced file (must stay)."""
    table = catalog.load_table((DEMO_NAMESPACE, "logs"))
    data_dir = Path(table.location().removeprefix("file://")) / "data"
    planted = []
    for name, age in (
        ("00000-failed-write-orphan.parquet", timedelta(days=30)),
        ("00000-write-in-progress.parquet", timedelta(hours=1)),
    ):
        path = data_dir / name
        path.write_bytes(b"PAR1" + os.urandom(2048) + b"PAR1")
        stamp = time.time() - age.total_seconds()
        os.utime(path, (stamp, stamp))
        planted.append(path)
    return planted


def build_demo_lakehouse(root: Path) -> IcegateConfig:
    """(Re)build the demo lakehouse under ``root``; return the config that maintains it."""
    from icegate_dagster.catalog import open_catalog

    root = root.resolve()
    _prepare_root(root)
    config = config_from_dict(
        embedded_default_dict(root), root.parent, source=f"demo lakehouse in {root}"
    )
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists(DEMO_NAMESPACE)
    rng = random.Random(7)
    for spec in DEMO_TABLES:
        table = _create(catalog, spec)
        for commit in range(spec.appends):
            table.append(_batch(spec, commit, rng))
        simulate_ingest(root / "wal", spec, rng)
    _plant_leftover_files(catalog)
    return config.with_overrides(**DEMO_OVERRIDES)


def run_demo(args: argparse.Namespace) -> int:
    """``demo``: rebuild the demo lakehouse in ``--root`` and run a full pass over it."""
    if not args.json:
        print(f"building the demo lakehouse in {Path(args.root).resolve()} ...", flush=True)
    instance = dagster_instance(args)
    config: IcegateConfig = build_demo_lakehouse(Path(args.root))
    maintainer = Maintainer(config)
    if not args.json:
        names = [op.name for op in OPERATIONS if op.applies(config, config.defaults)]
        print(f"maintaining it ({', '.join(names)}) ...", flush=True)
    results = maintainer.maintain(maintainer.discover())
    history = record_in_dagster(instance, maintainer, results)
    code = emit_results(results, args.json, maintainer.run_id, history)
    if not args.json:
        print(f"\nlog rows appended to {config.log_table} (run_id {maintainer.run_id})")
    return code
