"""Run every benchmark and print both sides, their ratio and the target.

Usage: ``./scripts/bench.sh [NAME ...]`` (names: full_pass, overhead, sensor, query,
batching, throughput). Data is generated under a temporary folder; nothing here is
part of the test suite.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, load_config
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.spark_session import get_spark


@dataclass
class Figure:
    """One benchmark's outcome."""

    name: str
    ours: float
    baseline: float
    unit: str
    target: str
    met: bool | None  # None: shown for reference, no target
    note: str = ""

    def line(self) -> str:
        ratio = self.ours / self.baseline if self.baseline else float("nan")
        verdict = "" if self.met is None else ("MET" if self.met else "NOT MET")
        return (
            f"{self.name:<22} ours {self.ours:>9.3f} {self.unit:<4} "
            f"baseline {self.baseline:>9.3f} {self.unit:<4} ratio {ratio:>6.2f}  "
            f"target {self.target:<14} {verdict}  {self.note}"
        )


def _tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class PeakMemory:
    """Peak resident memory of a process tree (Python driver + its JVM), sampled 5x a second."""

    def __init__(self, pid: int | None = None) -> None:
        import os
        import threading

        self.pid = pid or os.getpid()
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak_kb = max(self.peak_kb, sum(_rss_kb(p) for p in _tree(self.pid)))
            self._stop.wait(0.2)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def mb(self) -> float:
        return self.peak_kb / 1024


# -- lakehouses ----------------------------------------------------------------------------

SCHEMA_FIELDS = [
    ("id", pa.int64()),
    ("tenant_id", pa.string()),
    ("timestamp", pa.timestamp("us", tz="UTC")),
    ("body", pa.string()),
]


def rows(start: int, count: int, tenant: str) -> pa.Table:
    base = datetime(2026, 11, 1, tzinfo=UTC)
    return pa.Table.from_pydict(
        {
            "id": list(range(start, start + count)),
            "tenant_id": [tenant] * count,
            "timestamp": [base + timedelta(seconds=i) for i in range(start, start + count)],
            "body": [f"log line {i} " + "x" * 40 for i in range(start, start + count)],
        },
        schema=pa.schema(SCHEMA_FIELDS),
    )


def make_lakehouse(root: Path, name: str, maintain: dict[str, Any] | None = None) -> IcegateConfig:
    """A SQLite catalog and warehouse under ``root``, with a config file."""
    root.mkdir(parents=True, exist_ok=True)
    raw = {
        "catalog": {
            "name": name,
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": (root / "warehouse").as_uri(),
        },
        "spark": {"master": "local[*]"},
        "wal": {"root": (root / "wal").as_uri()},
        "maintain": maintain or {},
    }
    path = root / "icegate.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_config(path)


def small_file_tables(
    config: IcegateConfig, tables: int, files: int, rows_per_file: int
) -> list[str]:
    """``tables`` tables fed by ``files`` appends of one small file each (pyiceberg)."""
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("bench")
    schema = pa.schema(SCHEMA_FIELDS)
    keys = []
    for t in range(tables):
        table = catalog.create_table(("bench", f"t{t:03d}"), schema=schema)
        for f in range(files):
            table.append(rows(f * rows_per_file, rows_per_file, "acme"))
        keys.append(f"bench.t{t:03d}")
    return keys


# -- benchmarks -------------------------------------------------------------------------------


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = action()
    return time.perf_counter() - started, result


def bench_full_pass(work: Path) -> list[Figure]:
    """12 tables x 25 small files: ``run`` vs. the three procedures called by hand."""
    ours_cfg = make_lakehouse(work / "ours", "bench_ours")
    hand_cfg = make_lakehouse(work / "hand", "bench_hand")
    ours_keys = small_file_tables(ours_cfg, 12, 25, 200)
    hand_keys = small_file_tables(hand_cfg, 12, 25, 200)
    spark = get_spark(ours_cfg)
    get_spark(hand_cfg)  # registers the second catalog in the same session
    # Warm up the JVM and both catalogs, so neither side pays the start.
    spark.sql(
        f"SELECT count(*) FROM {TableRef.parse(ours_keys[0]).spark_identifier('bench_ours')}"
    ).collect()
    spark.sql(
        f"SELECT count(*) FROM {TableRef.parse(hand_keys[0]).spark_identifier('bench_hand')}"
    ).collect()

    def by_hand() -> None:
        older = (datetime.now(UTC) - timedelta(days=7)).strftime("%Y-%m-%d %H:%M:%S")
        orphans = (datetime.now(UTC) - timedelta(days=7)).strftime("%Y-%m-%d %H:%M:%S")
        for key in hand_keys:
            arg = TableRef.parse(key).procedure_argument()
            spark.sql(f"CALL bench_hand.system.rewrite_data_files(table => {arg})").collect()
            spark.sql(
                f"CALL bench_hand.system.expire_snapshots(table => {arg}, "
                f"older_than => TIMESTAMP '{older}', retain_last => 1)"
            ).collect()
            spark.sql(
                f"CALL bench_hand.system.remove_orphan_files(table => {arg}, "
                f"older_than => TIMESTAMP '{orphans}')"
            ).collect()

    maintainer = Maintainer(ours_cfg, spark=lambda: spark)
    hand_s, _ = timed(by_hand)
    with PeakMemory() as memory:
        ours_s, results = timed(lambda: maintainer.maintain([TableRef.parse(k) for k in ours_keys]))
    assert all(r.ok for r in results), [r.as_dict() for r in results if not r.ok]

    # Overhead is measured one table at a time, on a third copy, so that time spent in
    # Spark procedures is not overlapped by other tables'.
    seq_cfg = make_lakehouse(work / "sequential", "bench_seq")
    seq_keys = small_file_tables(seq_cfg, 12, 25, 200)
    get_spark(seq_cfg)
    sequential = Maintainer(seq_cfg, spark=lambda: spark)
    seq_s, seq_results = timed(
        lambda: sequential.maintain([TableRef.parse(k) for k in seq_keys], parallel=1)
    )
    procedure_s = sum(float(op.output.get("procedure_s", 0.0)) for r in seq_results for op in r.ops)
    overhead = (seq_s - procedure_s) / len(seq_keys)
    return [
        Figure(
            "full_pass",
            ours_s,
            hand_s,
            "s",
            "<= 0.5x",
            ours_s <= 0.5 * hand_s,
            f"12 tables x 25 files, 4 at a time; driver peak RSS {memory.mb:.0f} MB (Python + JVM)",
        ),
        Figure(
            "per_table_overhead",
            overhead,
            0.3,
            "s",
            "<= 0.3 s",
            overhead <= 0.3,
            f"one table at a time: {seq_s:.1f}s minus Spark procedures {procedure_s:.1f}s, / 12",
        ),
    ]


def bench_sensor(work: Path) -> list[Figure]:
    """Discovery + WAL sizing over 1,000 tables, no JVM."""
    import dagster as dg

    from icegate_dagster.partitions import iceberg_tables
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors import iceberg_table_discovery, wal_size_sensor

    config = make_lakehouse(work / "sensor", "bench_sensor")
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("bench")
    schema = pa.schema(SCHEMA_FIELDS)
    wal_root = work / "sensor" / "wal" / "bench"
    keys = []
    for t in range(1000):
        catalog.create_table(("bench", f"t{t:04d}"), schema=schema)
        folder = wal_root / f"t{t:04d}"
        folder.mkdir(parents=True)
        for f in range(3):
            (folder / f"{f}.parquet").write_bytes(b"x" * 100)
        keys.append(f"bench.t{t:04d}")
    resource_ = LakehouseResource(config_path=str(work / "sensor" / "icegate.yaml"))
    with dg.instance_for_test() as instance:
        discovery_s, _ = timed(
            lambda: iceberg_table_discovery(
                dg.build_sensor_context(instance=instance, resources={"lakehouse": resource_})
            )
        )
        instance.add_dynamic_partitions(iceberg_tables.name, keys)
        wal_s, _ = timed(
            lambda: wal_size_sensor(
                dg.build_sensor_context(instance=instance, resources={"lakehouse": resource_})
            )
        )
    tick = discovery_s + wal_s
    return [
        Figure(
            "sensor_tick_1000",
            tick,
            1.0,
            "s",
            "<= 1 s",
            tick <= 1.0,
            f"discovery {discovery_s:.2f}s + WAL sizing {wal_s:.2f}s",
        ),
    ]


def bench_query(work: Path) -> list[Figure]:
    """A full scan and a filtered query on a 2,000-file table, before vs. after maintenance."""
    config = make_lakehouse(work / "query", "bench_query")
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("bench")
    catalog.create_table(("bench", "wide"), schema=pa.schema(SCHEMA_FIELDS))
    spark = get_spark(config)
    name = TableRef.parse("bench.wide").spark_identifier("bench_query")
    frame = spark.range(200_000).selectExpr(
        "id",
        "'acme' AS tenant_id",
        "timestamp_seconds(1793491200 + id) AS timestamp",
        "concat('log line ', id, ' ', repeat('x', 40)) AS body",
    )
    frame.repartition(2000).writeTo(name).append()  # one commit, 2,000 small files

    def queries() -> float:
        started = time.perf_counter()
        for _ in range(3):
            spark.sql(f"SELECT count(*), max(length(body)) FROM {name}").collect()
            spark.sql(f"SELECT count(*) FROM {name} WHERE id BETWEEN 1000 AND 2000").collect()
        return (time.perf_counter() - started) / 3

    before = queries()
    result = Maintainer(config, spark=lambda: spark).maintain_table(TableRef.parse("bench.wide"))
    assert result.ok, result.as_dict()
    after = queries()
    files = result.after.data_files if result.after else -1
    return [
        Figure(
            "query_after_vs_before",
            after,
            before,
            "s",
            "<= 0.1x",
            after <= 0.1 * before,
            f"2,000 files -> {files}; full scan + filtered query",
        ),
    ]


BATCH_RUN = """
import sys
import dagster as dg
from icegate_dagster.definitions import defs
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource, SparkResource
config, keys = sys.argv[1], sys.argv[2].split(",")
instance = dg.DagsterInstance.ephemeral()
instance.add_dynamic_partitions(iceberg_tables.name, keys)
tags = {
    "dagster/asset_partition_range_start": keys[0],
    "dagster/asset_partition_range_end": keys[-1],
}
result = defs.resolve_job_def("maintenance_job").execute_in_process(
    instance=instance,
    partition_key=keys[0] if len(keys) == 1 else None,
    tags=None if len(keys) == 1 else tags,
    resources={"lakehouse": LakehouseResource(config_path=config), "spark": SparkResource()},
)
sys.exit(0 if result.success else 1)
"""


def _dagster_run(config: Path, keys: list[str]) -> tuple[float, float]:
    """One Dagster run (its own process, as a run launcher makes it) over ``keys``."""
    import subprocess

    started = time.perf_counter()
    proc = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", BATCH_RUN, str(config), ",".join(keys)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    with PeakMemory(proc.pid) as memory:
        code = proc.wait()
    if code != 0:
        raise RuntimeError(f"the Dagster run over {keys[0]}..{keys[-1]} failed (exit {code})")
    return time.perf_counter() - started, memory.mb


def bench_batching(work: Path) -> list[Figure]:
    """20 tables in one multi-partition Dagster run vs. one run (one process) per table."""
    batch_cfg = make_lakehouse(work / "batch", "bench_batch")
    single_cfg = make_lakehouse(work / "single", "bench_single")
    batch_keys = small_file_tables(batch_cfg, 20, 8, 100)
    single_keys = small_file_tables(single_cfg, 20, 8, 100)
    batch_s, batch_mb = _dagster_run(work / "batch" / "icegate.yaml", batch_keys)
    single_s = 0.0
    single_mb = 0.0
    for key in single_keys:
        seconds, mb = _dagster_run(work / "single" / "icegate.yaml", [key])
        single_s += seconds
        single_mb = max(single_mb, mb)
    speedup = single_s / batch_s
    return [
        Figure(
            "batching_20_tables",
            batch_s,
            single_s,
            "s",
            ">= 5x faster",
            speedup >= 5,
            f"{speedup:.1f}x; peak RSS: one run {batch_mb:.0f} MB, per-table runs "
            f"{single_mb:.0f} MB",
        ),
    ]


def bench_throughput(work: Path) -> list[Figure]:
    """``optimize`` on ~1 GB of small files vs. pyarrow reading and rewriting the same files."""
    import os

    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    gigabytes = float(os.environ.get("ICEGATE_BENCH_GB", "1"))
    config = make_lakehouse(
        work / "lake", "bench_tp", maintain={"optimize": {"file_size_threshold": "64MB"}}
    )
    catalog = open_catalog(config.catalog)
    catalog.create_namespace_if_not_exists("bench")
    catalog.create_table(("bench", "big"), schema=pa.schema(SCHEMA_FIELDS))
    spark = get_spark(config)
    name = TableRef.parse("bench.big").spark_identifier("bench_tp")
    rows_needed = int(gigabytes * 1024**3 / 60)  # ~60 bytes a row once compressed
    frame = spark.range(rows_needed).selectExpr(
        "id",
        "concat('tenant-', id % 50) AS tenant_id",
        "timestamp_seconds(1793491200 + id) AS timestamp",
        "concat('took ', id % 997, ' ms; ', sha2(cast(id AS string), 256)) AS body",
    )
    frame.repartition(400).writeTo(name).append()
    table = catalog.load_table(("bench", "big"))
    files = table.inspect.files()
    paths = [p.removeprefix("file:") for p in files.column("file_path").to_pylist()]
    size = sum(files.column("file_size_in_bytes").to_pylist())

    def with_pyarrow(level: int | None) -> None:
        out = work / f"pyarrow-out-{level}"
        out.mkdir()
        dataset = ds.dataset(paths, format="parquet")
        with pq.ParquetWriter(
            out / "compacted.parquet", dataset.schema, compression="zstd", compression_level=level
        ) as writer:
            for batch in dataset.to_batches():
                writer.write_batch(batch)

    # The same work as Iceberg's writer: zstd at parquet-java's default level 3 (Iceberg
    # sets no level). pyarrow's own default is level 1, which is cheaper: shown for reference.
    arrow_s, _ = timed(lambda: with_pyarrow(3))
    arrow_default_s, _ = timed(lambda: with_pyarrow(None))
    maintainer = Maintainer(config, spark=lambda: spark)
    spark_s, result = timed(
        lambda: maintainer.maintain_table(TableRef.parse("bench.big"), ["optimize"])
    )
    assert result.ok and result.after is not None, result.as_dict()
    ours_bps, arrow_bps = size / spark_s, size / arrow_s
    return [
        Figure(
            "compaction_MB_per_s",
            ours_bps / 1024**2,
            arrow_bps / 1024**2,
            "MB/s",
            ">= 0.7x",
            ours_bps >= 0.7 * arrow_bps,
            f"{size / 1024**3:.2f} GB in {len(paths)} files -> {result.after.data_files}; "
            f"baseline zstd level 3, as Iceberg writes",
        ),
        Figure(
            "compaction_vs_pyarrow_default_level",
            ours_bps / 1024**2,
            size / arrow_default_s / 1024**2,
            "MB/s",
            "(reference)",
            None,
            "pyarrow at its default zstd level 1: less compression work than the table's files",
        ),
    ]


BENCHMARKS: dict[str, Callable[[Path], list[Figure]]] = {
    "full_pass": bench_full_pass,
    "sensor": bench_sensor,
    "query": bench_query,
    "batching": bench_batching,
    "throughput": bench_throughput,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("names", nargs="*", help=f"some of: {', '.join(BENCHMARKS)}")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    names = args.names or list(BENCHMARKS)
    work = Path(tempfile.mkdtemp(prefix="icegate-bench-"))
    figures: list[Figure] = []
    failed = False
    try:
        for name in names:
            print(f"running {name} ...", flush=True)
            started = time.perf_counter()
            try:
                found = BENCHMARKS[name](work / name)
            except Exception as exc:  # one broken benchmark must not hide the others' figures
                print(f"  {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
                failed = True
                continue
            for figure in found:
                print("  " + figure.line(), flush=True)
            figures += found
            print(f"  done in {time.perf_counter() - started:.0f}s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print("\nsummary (ratio = ours / baseline)")
    for figure in figures:
        print(figure.line())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
