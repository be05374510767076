"""Spark maintains Iceberg tables whose files live in S3: SeaweedFS on loopback, behind its
Iceberg REST catalog, and under a SQL (SQLite) catalog whose warehouse is ``s3://``.

Tables are written by pyiceberg, never by this project. A cold ``icegate-maintain run``
(the real CLI, its own process and JVM) compacts, rewrites manifests, expires snapshots
deleting their S3 objects and removes an orphan object older than the 24 h floor (the
server is given an old one through its filer's metadata, :func:`plant_old_object`) while
a young one stays. The rows read back the same through Spark, pyiceberg and DuckDB
(``httpfs``). The keys and the REST credential reach Spark after its JVM starts: no command
line on the machine shows them while the run goes, nor its output or the log table.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pyiceberg.catalog import Catalog, load_catalog
from pyiceberg.table import Table

from icegate_dagster.config import load_config
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.log.writer import read_log
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import SCHEMA, SPEC, batch
from tests.ps_sampler import PsSampler
from tests.surfaces.seaweedfs_server import (  # noqa: F401
    ACCESS_KEY_ENV,
    REGION,
    SECRET_KEY_ENV,
    SeaweedServer,
    plant_old_object,
    seaweedfs_fixture,
)

CLI = Path(sys.executable).parent / "icegate-maintain"
#: Namespaces of their own: test_rest_catalog.py may share the server.
NAMESPACE = "shop"
ORDERS = f"{NAMESPACE}.orders"
LOG_TABLE = "shop_meta.maintenance_log"  # SeaweedFS refuses table names starting with "_"
APPENDS = 30
#: Older than the 24 h floor of remove_orphan_files, by days.
OLD_S = 3 * 24 * 3600
Row = tuple[Any, ...]


@dataclass
class S3Lake:
    """A catalog over the server's S3, an ``icegate.yaml`` naming it, and what a run printed."""

    server: SeaweedServer
    root: Path
    config_path: Path
    catalog: Catalog

    def table(self, key: str) -> Table:
        return self.catalog.load_table(TableRef.parse(key).identifier)

    def rows(self, key: str) -> Counter[Row]:
        """The table's rows as pyiceberg reads them (a multiset)."""
        return Counter(tuple(r.values()) for r in self.table(key).scan().to_arrow().to_pylist())

    def cold_run(self, *args: str) -> tuple[subprocess.CompletedProcess[str], PsSampler]:
        """``icegate-maintain run`` in its own process, every command line sampled meanwhile."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        with PsSampler() as ps:
            done = subprocess.run(  # noqa: S603
                [str(CLI), "run", "--json", "--config", str(self.config_path), *args],
                capture_output=True,
                text=True,
                timeout=300,
                cwd=self.root,
                env=env,
                check=False,
            )
        return done, ps


def _s3(server: SeaweedServer) -> Any:
    """The server's S3 through pyarrow's own client (not a table's FileIO)."""
    from pyarrow import fs

    return fs.S3FileSystem(
        access_key=server.access_key,
        secret_key=server.secret_key,
        endpoint_override=server.s3_endpoint.removeprefix("http://"),
        scheme="http",
        region=REGION,
        allow_bucket_creation=True,
    )


def _exists(server: SeaweedServer, uri: str) -> bool:
    return bool(_s3(server).get_file_info(uri.split("://", 1)[1]).is_file)


def _objects(server: SeaweedServer, folder_uri: str) -> set[str]:
    """Every object under ``folder_uri``, as ``s3://`` URIs."""
    from pyarrow import fs

    infos = _s3(server).get_file_info(
        fs.FileSelector(folder_uri.split("://", 1)[1], recursive=True)
    )
    return {f"s3://{info.path}" for info in infos if info.is_file}


@pytest.fixture
def keys_in_environment(seaweedfs: SeaweedServer) -> Iterator[None]:
    """The keys reach icegate only through the environment (``${VAR}`` in the file)."""
    saved = {name: os.environ.get(name) for name in seaweedfs.env()}
    os.environ.update(seaweedfs.env())
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _maintain_block(log_table: str | None, root: Path) -> dict[str, Any]:
    block: dict[str, Any] = {
        "locks": {"uri": f"sqlite:///{root / 'leases.db'}"},
        # Every small file is worth compacting, every snapshot but the current one expires.
        "optimize": {"min_input_files": 2},
        "expire_snapshots": {"retention_threshold": "1s", "retain_last": 1},
        "remove_orphan_files": {"retention_threshold": "24h"},  # Iceberg's floor
    }
    if log_table:
        block["log_table"] = log_table
    return block


def _write_config(root: Path, catalog: dict[str, str], namespace: str, log: str | None) -> Path:
    raw = {
        "catalog": catalog,
        "namespaces": [namespace],
        "wal": {"root": "wal"},  # a local WAL root, empty: the tables are S3's
        "spark": {"master": "local[1]"},
        "maintain": _maintain_block(log, root),
    }
    path = root / "icegate.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _create_table(catalog: Catalog, key: str, appends: int) -> None:
    """``key`` written by pyiceberg: ``appends`` small appends, a file and a snapshot each."""
    table = catalog.create_table(TableRef.parse(key).identifier, SCHEMA, partition_spec=SPEC)
    for i in range(appends):
        table.append(batch(i * 10, ("api",), rows_per_service=3))


def _plant_orphans(lake: S3Lake, key: str) -> tuple[str, str]:
    """An unreferenced object in ``key``'s data folder older than the 24 h floor (through the
    filer), and a young one (through S3)."""
    server = lake.server
    data = f"{lake.table(key).location()}/data"
    old = f"{data}/old-orphan-{secrets.token_hex(4)}.parquet"
    plant_old_object(server, server.table_bucket, old.split("/", 3)[3], b"PAR1 old PAR1", OLD_S)
    young = f"{data}/young-orphan-{secrets.token_hex(4)}.parquet"
    with _s3(server).open_output_stream(young.split("://", 1)[1]) as out:
        out.write(b"PAR1 young PAR1")
    assert _exists(server, old) and _exists(server, young)
    return old, young


@pytest.fixture
def rest_lake(seaweedfs: SeaweedServer, keys_in_environment: None, tmp_path: Path) -> S3Lake:
    """The REST catalog's namespace for these tests, and an ``icegate.yaml`` naming it."""
    catalog = load_catalog("s3_rest", **seaweedfs.catalog_properties())
    catalog.create_namespace_if_not_exists(NAMESPACE)
    config_path = _write_config(tmp_path, seaweedfs.catalog_block("s3_rest"), NAMESPACE, LOG_TABLE)
    assert seaweedfs.access_key not in config_path.read_text()
    return S3Lake(seaweedfs, tmp_path, config_path, catalog)


def _op(report: dict[str, Any], operation: str) -> dict[str, Any]:
    ops: list[dict[str, Any]] = [op for op in report["ops"] if op["operation"] == operation]
    [op] = ops
    return op


#: Spark reads a table in a fresh interpreter: this process's JVM may have started (for an
#: earlier test) without the S3 jars, and a JVM's class path is fixed at its start.
_READ_WITH_SPARK = """
import json, sys
from icegate_dagster.config import load_config
from icegate_dagster.spark.session import get_spark
config = load_config(sys.argv[1])
rows = get_spark(config).table(f"{config.catalog.name}.{sys.argv[2]}").collect()
print(json.dumps([[r["id"], r["service"], r["body"]] for r in rows]))
"""


def _spark_rows(lake: S3Lake, key: str) -> Counter[Row]:
    """The table's rows as Spark reads them, through the catalog ``icegate.yaml`` names."""
    ref = TableRef.parse(key)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _READ_WITH_SPARK,
            str(lake.config_path),
            f"{ref.namespace}.{ref.name}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return Counter(tuple(row) for row in json.loads(done.stdout.splitlines()[-1]))


def _duckdb_rows(lake: S3Lake, key: str) -> Counter[Row]:
    server = lake.server
    con = duckdb_iceberg(
        s3={
            "endpoint": server.s3_endpoint,
            "key_id": server.access_key,
            "secret": server.secret_key,
            "region": REGION,
        }
    )
    metadata = lake.table(key).metadata_location
    rows = con.execute(f"SELECT id, service, body FROM iceberg_scan('{metadata}')").fetchall()
    return Counter(rows)


def _no_secret_anywhere(
    lake: S3Lake, done: subprocess.CompletedProcess[str], ps: PsSampler, log_rows: list[Any]
) -> None:
    server = lake.server
    credential = f"{server.access_key}:{server.secret_key}"
    spark_lines = [line for line in ps.lines if "SparkSubmit" in line or "spark-submit" in line]
    assert spark_lines, "no sample caught the Spark JVM's command line"
    assert any(
        f"spark.sql.catalog.{load_config(lake.config_path).catalog.name}" in line
        for line in spark_lines
    )
    log_text = json.dumps(log_rows, default=str)
    for secret in (credential, server.access_key, server.secret_key):
        assert not [line for line in ps.lines if secret in line], "a key is on a command line"
        assert secret not in done.stdout + done.stderr, "a key is in the run's output"
        assert secret not in log_text, "a key is in the log table"


def test_a_cold_run_maintains_an_s3_table_behind_the_rest_catalog(rest_lake: S3Lake) -> None:
    lake, server = rest_lake, rest_lake.server
    _create_table(lake.catalog, ORDERS, APPENDS)
    table = lake.table(ORDERS)
    location = table.location()
    data_files = set(table.inspect.files()["file_path"].to_pylist())
    assert len(data_files) == APPENDS
    appended = {s.snapshot_id for s in table.metadata.snapshots}
    rows = lake.rows(ORDERS)
    old_orphan, young_orphan = _plant_orphans(lake, ORDERS)
    time.sleep(1.2)  # every appended snapshot passes the 1 s threshold

    done, ps = lake.cold_run()

    assert done.returncode == 0, done.stdout + done.stderr
    [report] = json.loads(done.stdout)["tables"]
    assert report["table"] == ORDERS
    statuses = {op["operation"]: op["status"] for op in report["ops"]}
    for operation in ("optimize", "rewrite_manifests", "expire_snapshots", "remove_orphan_files"):
        assert statuses[operation] == "completed", report["ops"]
    # Compacted: one data file instead of thirty, in one manifest.
    table = lake.table(ORDERS)
    now_files = set(table.inspect.files()["file_path"].to_pylist())
    assert len(now_files) == 1 and not now_files & data_files
    head = table.current_snapshot()
    assert head is not None and len(head.manifests(table.io)) == 1
    # Expired with their files: no appended snapshot is left, and none of its data files
    # is on S3 any more.
    assert not appended & {s.snapshot_id for s in table.metadata.snapshots}
    assert [uri for uri in data_files if _exists(server, uri)] == []
    # The old orphan went, the young one stayed: the data folder holds the live file and it.
    assert _op(report, "remove_orphan_files")["output"]["orphans_removed"] == 1
    assert not _exists(server, old_orphan)
    assert _objects(server, f"{location}/data") == now_files | {young_orphan}
    # The same rows, read by three readers that share no code.
    assert lake.rows(ORDERS) == rows
    expected = Counter((r[0], r[1], r[3]) for r in rows.elements())
    assert _duckdb_rows(lake, ORDERS) == expected
    assert _spark_rows(lake, ORDERS) == expected
    # Every outcome reached the log table; no key anywhere.
    log_rows = read_log(lake.catalog, TableRef.parse(LOG_TABLE))
    logged = {(r["operation"], r["status"]) for r in log_rows if r["table_name"] == ORDERS}
    assert {("optimize", "completed"), ("expire_snapshots", "completed")} <= logged
    _no_secret_anywhere(lake, done, ps, log_rows)


def test_icebergs_orphan_procedure_lists_s3_through_the_tables_file_io(
    rest_lake: S3Lake,
) -> None:
    """A table with more manifests than the driver reads (here: any) asks Iceberg's
    ``remove_orphan_files``, which lists S3 through S3FileIO: Spark has no Hadoop file
    system for ``s3://``."""
    # A namespace of its own: the cold run above maintains every table of NAMESPACE.
    namespace = f"{NAMESPACE}_orphans"
    key = f"{namespace}.returns"
    folder = rest_lake.root / namespace
    folder.mkdir()
    block = rest_lake.server.catalog_block("s3_rest")
    lake = S3Lake(
        rest_lake.server,
        folder,
        _write_config(folder, block, namespace, LOG_TABLE),
        rest_lake.catalog,
    )
    lake.catalog.create_namespace_if_not_exists(namespace)
    _create_table(lake.catalog, key, appends=3)
    old, young = _plant_orphans(lake, key)
    rows = lake.rows(key)
    # Iceberg's procedure decides (no table is small enough for the driver's walk), in a
    # fresh interpreter: its JVM starts with the S3 jars.
    args = ["orphans", "--config", str(lake.config_path), "--table", key, "--json"]
    cli = (
        "import sys; from icegate_dagster.maintenance.orphans import listing; "
        "listing.MAX_MANIFESTS = 0; from icegate_dagster.cli.dispatch import run_cli; "
        "sys.exit(run_cli(sys.argv[1:]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", cli, *args], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    [done] = json.loads(proc.stdout)["tables"][0]["ops"]

    assert done["status"] == "completed", done
    assert "procedure_s" in done["output"], done  # Iceberg's procedure decided
    assert done["output"]["orphan_files"] == [old]
    assert not _exists(lake.server, old) and _exists(lake.server, young)
    assert lake.rows(key) == rows


def test_a_cold_run_maintains_a_sql_catalogs_table_in_s3(
    seaweedfs: SeaweedServer, keys_in_environment: None, tmp_path: Path
) -> None:
    """A SQLite catalog whose warehouse is an ordinary bucket of the same server."""
    bucket = f"warehouse-{secrets.token_hex(4)}"
    _s3(seaweedfs).create_dir(bucket)
    s3 = {
        key: value
        for key, value in seaweedfs.catalog_block("s3_sql").items()
        if key.startswith("s3.")
    }
    block = {
        "name": "s3_sql",
        "uri": f"sqlite:///{tmp_path / 'catalog.db'}",
        "warehouse": f"s3://{bucket}/warehouse",
        **s3,
    }
    config_path = _write_config(tmp_path, block, "lakehouse", None)
    properties = {**block, **{k: os.path.expandvars(v) for k, v in s3.items()}}
    catalog = load_catalog(properties.pop("name"), **properties)
    catalog.create_namespace("lakehouse")
    table = catalog.create_table(("lakehouse", "events"), SCHEMA, partition_spec=SPEC)
    for i in range(8):
        table.append(batch(i * 10, ("api",)))
    lake = S3Lake(seaweedfs, tmp_path, config_path, catalog)
    data_files = set(lake.table("lakehouse.events").inspect.files()["file_path"].to_pylist())
    assert len(data_files) == 8 and all(p.startswith(f"s3://{bucket}/") for p in data_files)
    rows = lake.rows("lakehouse.events")
    time.sleep(1.2)

    done, ps = lake.cold_run()

    assert done.returncode == 0, done.stdout + done.stderr
    [report] = json.loads(done.stdout)["tables"]
    assert _op(report, "optimize")["status"] == "completed", report["ops"]
    assert _op(report, "expire_snapshots")["status"] == "completed", report["ops"]
    table = lake.table("lakehouse.events")
    now_files = set(table.inspect.files()["file_path"].to_pylist())
    assert len(now_files) == 1 and not now_files & data_files
    assert len(table.metadata.snapshots) < 8
    assert [uri for uri in data_files if _exists(seaweedfs, uri)] == []
    assert lake.rows("lakehouse.events") == rows
    _no_secret_anywhere(
        lake, done, ps, read_log(catalog, TableRef.parse("lakehouse._maintenance_log"))
    )
