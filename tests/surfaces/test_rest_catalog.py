"""The REST catalog surface, for real: SeaweedFS's Iceberg REST catalog and S3 on loopback.

Tables are made with pyiceberg in the REST catalog. Everything on the pyiceberg
side works with no JVM: discovery, ``icegate-maintain status``, the discovery
sensor and the WAL sensor. Spark here has no S3 support (no AWS bundle), so a
``run`` fails each operation that needs Spark with one clear line naming the
jar to add, changes no table, loses no WAL file, and still logs every outcome.
The access keys appear in no output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml
from pyiceberg.catalog import Catalog, load_catalog

from icegate_dagster.config import IcegateConfig, config_from_dict, load_config
from icegate_dagster.errors import SparkStartError
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.log import read_log
from icegate_dagster.maintenance.orphans import orphan_candidates
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors import iceberg_table_discovery, wal_size_sensor
from icegate_dagster.spark_session import build_spark_conf, iceberg_runtime_jar
from tests.lakehouse import SCHEMA, SPEC, batch
from tests.lease_holder import held_by_another_process
from tests.surfaces.seaweedfs_server import SeaweedServer, seaweedfs_fixture  # noqa: F401

#: Each table and how many appends (one data file and one snapshot each) it gets.
TABLES = {"lakehouse.logs": 3, "lakehouse.orders": 2, "lakehouse.spans": 4}
#: SeaweedFS (like AWS S3 Tables) refuses table names starting with "_": the log table
#: lives in a namespace of its own, outside ``namespaces``.
LOG_TABLE = "icegate_meta.maintenance_log"
BACKLOG, BELOW = "lakehouse.logs", "lakehouse.spans"
MIN_WAL_FILES = 3
CLI = Path(sys.executable).parent / "icegate-maintain"
REPO = Path(__file__).resolve().parents[2]


def _bundle_version() -> str:
    """The Iceberg version of the runtime jar we ship (``...-3.5_2.12-1.10.2.jar``)."""
    match = re.search(r"-(\d+\.\d+\.\d+)\.jar$", iceberg_runtime_jar().name)
    assert match, iceberg_runtime_jar().name
    return match.group(1)


AWS_BUNDLE = f"org.apache.iceberg:iceberg-aws-bundle:{_bundle_version()}"


@dataclass
class RestLakehouse:
    """Tables in the REST catalog, an ``icegate.yaml`` naming it, and every output seen."""

    server: SeaweedServer
    root: Path
    config_path: Path
    catalog: Catalog
    outputs: list[str] = field(default_factory=list)

    @property
    def config(self) -> IcegateConfig:
        return load_config(self.config_path)

    def cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        proc = subprocess.run(
            [str(CLI), *args, "--config", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=self.root,
            env=env,
        )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def state(self, key: str) -> tuple[str, list[int], Counter[tuple[Any, ...]]]:
        """Metadata file, snapshot ids and rows (a multiset) of a table, via pyiceberg."""
        table = self.catalog.load_table(TableRef.parse(key).identifier)
        rows = Counter(tuple(r.values()) for r in table.scan().to_arrow().to_pylist())
        return table.metadata_location, [s.snapshot_id for s in table.metadata.snapshots], rows

    def wal_dir(self, key: str) -> Path:
        ref = TableRef.parse(key)
        path = self.root / "wal" / ref.namespace / ref.name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def fill_wal(self, key: str, files: int) -> list[str]:
        """Up to ``files`` WAL files waiting for ``key`` (written only once)."""
        folder = self.wal_dir(key)
        for i in range(files):
            target = folder / f"wal-{i:03d}.parquet"
            if not target.exists():
                pq.write_table(batch(90_000 + 10 * i, ("api",), rows_per_service=2), target)
        return sorted(p.name for p in folder.glob("*.parquet"))

    def assert_no_secrets(self) -> None:
        for text in self.outputs:
            for value in self.server.secrets:
                assert value not in text, "a key leaked into the output"


@pytest.fixture(scope="module")
def rest(
    seaweedfs: SeaweedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RestLakehouse]:
    root = tmp_path_factory.mktemp("rest_lakehouse")
    catalog = load_catalog("icegate_rest", **seaweedfs.catalog_properties())
    catalog.create_namespace_if_not_exists("lakehouse")
    for key, appends in TABLES.items():
        table = catalog.create_table(TableRef.parse(key).identifier, SCHEMA, partition_spec=SPEC)
        for i in range(appends):
            table.append(batch(i * 100, ("api",)))
    raw = {
        "catalog": seaweedfs.catalog_block("icegate_rest"),
        "namespaces": ["lakehouse"],
        "wal": {"root": "wal"},
        "spark": {"master": "local[1]"},
        "maintain": {
            "log_table": LOG_TABLE,
            # The lease store every maintainer of this deployment shares (a REST catalog
            # has no SQL database of its own); a second process below holds a table there.
            "locks": {"uri": f"sqlite:///{root / 'shared' / 'leases.db'}"},
            "lock_wait": "1s",
            "compaction": {"min_files": MIN_WAL_FILES},
            # Small files in every table: optimize has work to do, so it needs Spark.
            "optimize": {"min_input_files": 2},
        },
    }
    config_path = root / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert seaweedfs.access_key not in config_path.read_text()
    # The keys reach icegate only through the environment, as README documents (${VAR}).
    saved = {name: os.environ.get(name) for name in seaweedfs.env()}
    os.environ.update(seaweedfs.env())
    lakehouse = RestLakehouse(seaweedfs, root, config_path, catalog)
    try:
        yield lakehouse
    finally:
        lakehouse.assert_no_secrets()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_discovery_lists_the_rest_tables_and_leases_in_the_shared_store(
    rest: RestLakehouse,
) -> None:
    maintainer = Maintainer(rest.config)
    assert [ref.key for ref in maintainer.discover()] == sorted(TABLES)
    # No SQL database behind a REST catalog: the leases live in maintain.locks.uri.
    locks = maintainer.leasing.locks
    assert locks is not None
    assert locks.engine.url.database == str(rest.root / "shared" / "leases.db")

    proc = rest.cli("discover", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == sorted(TABLES)


def test_status_prints_each_table_with_its_files_and_snapshots(rest: RestLakehouse) -> None:
    proc = rest.cli("status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for key, appends in TABLES.items():
        # table, data files, small, bytes, snapshots, manifests, rows
        row = re.search(
            rf"^{re.escape(key)}\s+(\d+)\s+(\d+)\s+[\d.]+ [KMG]?B\s+(\d+)\s+(\d+)\s+(\d+)",
            proc.stdout,
            re.MULTILINE,
        )
        assert row, proc.stdout
        assert [int(n) for n in row.groups()] == [appends, appends, appends, appends, appends * 5]

    proc = rest.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = {entry["table"]: entry["stats"] for entry in json.loads(proc.stdout)}
    assert sorted(stats) == sorted(TABLES)
    for key, appends in TABLES.items():
        assert stats[key]["data_files"] == appends
        assert stats[key]["snapshots"] == appends


def _sensor_context(rest: RestLakehouse, instance: dg.DagsterInstance) -> Any:
    return dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(rest.config_path))},
    )


def test_discovery_sensor_adds_a_partition_per_rest_table(rest: RestLakehouse) -> None:
    instance = dg.DagsterInstance.ephemeral()
    result = iceberg_table_discovery(_sensor_context(rest, instance))
    assert isinstance(result, dg.SensorResult)
    [request] = result.dynamic_partitions_requests or []
    assert isinstance(request, dg.AddDynamicPartitionsRequest)
    assert sorted(request.partition_keys) == sorted(TABLES)
    instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))

    again = iceberg_table_discovery(_sensor_context(rest, instance))
    assert isinstance(again, dg.SkipReason)
    assert f"the {len(TABLES)} tables of catalog 'icegate_rest'" in str(again.skip_message)
    rest.outputs.append(str(again.skip_message))


def test_wal_sensor_requests_a_run_only_for_the_table_with_a_backlog(rest: RestLakehouse) -> None:
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(iceberg_tables.name, sorted(TABLES))
    rest.fill_wal(BELOW, files=1)  # below min_files: never a run

    idle = wal_size_sensor(_sensor_context(rest, instance))
    assert isinstance(idle, dg.SkipReason)
    assert "no WAL over its thresholds" in str(idle.skip_message)
    rest.outputs.append(str(idle.skip_message))

    rest.fill_wal(BACKLOG, files=MIN_WAL_FILES)
    due = wal_size_sensor(_sensor_context(rest, instance))
    assert isinstance(due, dg.SensorResult)
    [request] = due.run_requests or []
    assert request.partition_key == BACKLOG
    assert request.run_config["ops"]["maintained_table"]["ops"]["plan"]["config"] == {
        "operations": ["wal_compaction"]
    }
    rest.outputs.append(json.dumps(request.run_config) + json.dumps(request.tags))


def test_run_fails_each_table_cleanly_naming_the_aws_bundle(rest: RestLakehouse) -> None:
    wal_before = rest.fill_wal(BACKLOG, files=MIN_WAL_FILES)
    before = {key: rest.state(key) for key in TABLES}

    proc = rest.cli("run")

    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "Traceback" not in out and "at org.apache" not in out and "Py4J" not in out, out
    assert f"add {AWS_BUNDLE} to spark.conf spark.jars.packages" in out, out
    for key in TABLES:
        # Every Spark operation of every table failed on its own line, with the reason.
        failed = [
            line
            for line in proc.stdout.splitlines()
            if line.startswith(f"{key} ") and ": failed (" in line
        ]
        assert failed and all(AWS_BUNDLE in line for line in failed), out
        assert any(re.match(rf"{re.escape(key)}\s.*FAILED", line) for line in out.splitlines())
    # The WAL step of the backlog needed Spark too: it failed, and kept every file.
    assert re.search(rf"^{re.escape(BACKLOG)} wal_compaction: failed .*{AWS_BUNDLE}", out, re.M)

    assert {key: rest.state(key) for key in TABLES} == before
    assert sorted(p.name for p in rest.wal_dir(BACKLOG).glob("*.parquet")) == wal_before
    assert not (rest.wal_dir(BACKLOG) / "_quarantine").exists()

    # Every outcome still reached the log table (appended without Spark).
    rows = [r for r in read_log(rest.catalog, TableRef.parse(LOG_TABLE)) if r["status"] == "failed"]
    assert {r["table_name"] for r in rows} == set(TABLES)
    assert {"wal_compaction", "optimize", "rewrite_manifests"} <= {r["operation"] for r in rows}
    assert all(AWS_BUNDLE in r["details"] for r in rows)
    rest.outputs += [json.dumps(r, default=str) for r in rows]
    rest.assert_no_secrets()


def test_spark_settings_refuse_s3_without_an_aws_bundle(tmp_path: Path) -> None:
    """The check runs before any JVM: what counts as S3, and what counts as S3 support."""

    def conf(catalog: dict[str, str], spark_conf: dict[str, str] | None = None) -> Any:
        raw = {"catalog": {"name": "c", **catalog}, "spark": {"conf": spark_conf or {}}}
        return build_spark_conf(config_from_dict(raw, tmp_path))

    rest_s3 = {"type": "rest", "uri": "http://127.0.0.1:1", "warehouse": "s3://wh"}
    for catalog, reason in [
        (rest_s3, "its warehouse is s3://wh"),
        ({"type": "rest", "uri": "http://x", "s3.endpoint": "http://y"}, "it sets s3.endpoint"),
        (
            {"type": "rest", "uri": "http://x", "io-impl": "org.apache.iceberg.aws.s3.S3FileIO"},
            "its io-impl is org.apache.iceberg.aws.s3.S3FileIO",
        ),
        ({"uri": "sqlite:///c.db", "warehouse": "s3a://bucket/wh"}, "its warehouse is s3a://"),
    ]:
        with pytest.raises(SparkStartError, match=re.escape(reason)) as refused:
            conf(catalog)
        assert str(refused.value).endswith(
            f"add {AWS_BUNDLE} to spark.conf spark.jars.packages (or its jar to spark.jars)"
        )

    assert conf(rest_s3, {"spark.jars.packages": AWS_BUNDLE})["spark.jars.packages"] == AWS_BUNDLE
    conf(rest_s3, {"spark.jars.packages": "org.apache.hadoop:hadoop-aws:3.3.4"})
    # A user's own runtime decides the bundle's version.
    user_runtime = {
        "spark.jars.packages": "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.1"
    }
    with pytest.raises(SparkStartError, match="iceberg-aws-bundle:1.9.1 to spark.conf"):
        conf(rest_s3, user_runtime)
    # Files on local disk need nothing more.
    conf({"uri": "sqlite:///c.db", "warehouse": "wh"})
    # The Spark catalog gets S3FileIO's name for the region.
    settings = conf({**rest_s3, "s3.region": "eu-west-1"}, {"spark.jars.packages": AWS_BUNDLE})
    assert settings["spark.sql.catalog.c.client.region"] == "eu-west-1"


def test_orphan_planning_lists_the_table_folder_through_the_catalogs_s3(
    rest: RestLakehouse,
) -> None:
    """The listing goes to the catalog's own S3 endpoint with its keys (not AWS's)."""
    table = rest.catalog.load_table(TableRef.parse("lakehouse.orders").identifier)
    stray = f"{table.location()}/data/stray-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(stray).create() as out:
        out.write(b"PAR1 not referenced by any snapshot PAR1")
    try:
        # A cut-off in the future makes every object "old": only the stray one is unreferenced.
        candidates = orphan_candidates(table, datetime.now(UTC) + timedelta(hours=1))
    finally:
        table.io.delete(stray)
    assert candidates == [stray.split("://", 1)[1]]


def test_a_second_process_holding_a_rest_table_makes_a_run_skip_it_naming_the_holder(
    rest: RestLakehouse,
) -> None:
    """One maintainer per table on a REST catalog: the lease lives in the shared store."""
    key = "lakehouse.orders"
    before = rest.state(key)
    with held_by_another_process(rest.config_path, key) as pid:
        proc = rest.cli("run", "--table", key, "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [report] = json.loads(proc.stdout)["tables"]
    assert {op["status"] for op in report["ops"]} == {"skipped"}
    # The operations with work asked for the lease and name its holder; the others were
    # planned away from metadata without asking.
    asked = {op["operation"] for op in report["ops"] if f":{pid}:other-run" in op["details"]}
    assert {"optimize", "rewrite_manifests"} <= asked, report["ops"]
    assert rest.state(key) == before
    # The skips reached the log table too (appended without Spark).
    skipped = [
        r
        for r in read_log(rest.catalog, TableRef.parse(LOG_TABLE))
        if r["table_name"] == key and r["status"] == "skipped"
    ]
    assert {r["operation"] for r in skipped} >= {"optimize", "rewrite_manifests"}
    rest.assert_no_secrets()
