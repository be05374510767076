"""The REST catalog surface, for real: SeaweedFS's Iceberg REST catalog and S3 on loopback.

Tables are made with pyiceberg in the REST catalog. Everything on the pyiceberg
side works with no JVM: discovery, ``icegate-maintain status`` (with each table's
health score and due operations), the discovery sensor, the WAL sensor, the health
sensor with its ``lakehouse_health`` event, and the expiry dry run (its bytes are the
S3 objects' sizes). Without an S3 client on Spark's class path (a ``spark.conf`` that
brings its own Iceberg runtime and no AWS bundle) a ``run`` fails each operation that
needs Spark with one clear line naming the jar to add, changes no table, loses no WAL
file, and still logs every outcome; with set-up's bundle Spark maintains these tables
(``test_s3_tables.py``). The access keys appear in no output.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
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

from icegate_dagster.assets.names import (
    BATCH_JOB,
    HEALTH_SENSOR,
    ICEBERG_TABLES,
    LAKEHOUSE_HEALTH,
    MAINTAINED_TABLE,
    TRIGGER_TAG,
    iceberg_tables,
)
from icegate_dagster.assets.runs import BatchEntry, batch_entries, batch_run_config
from icegate_dagster.config import IcegateConfig, config_from_dict, load_config
from icegate_dagster.config.secrets import config_secrets
from icegate_dagster.errors import SparkStartError
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.log.writer import read_log
from icegate_dagster.maintenance.ops.expire_snapshots import plan_expiry
from icegate_dagster.maintenance.orphans.listing import iceberg_orphans, orphan_candidates
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.discovery_sensor import iceberg_table_discovery
from icegate_dagster.sensors.health_sensor import table_health_sensor
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from icegate_dagster.spark.conf import build_spark_conf
from icegate_dagster.spark.jars import (
    POSTGRES_JDBC_JAR,
    SQLITE_JDBC_JAR,
    aws_bundle_jar,
    iceberg_runtime_jar,
    s3_jars,
)
from icegate_dagster.spark.secret_settings import split_secret_conf
from tests.lakehouse import SCHEMA, SPEC, batch
from tests.lease_holder import beating_in_another_process, held_by_another_process
from tests.surfaces.seaweedfs_server import REGION, SeaweedServer, seaweedfs_fixture  # noqa: F401

#: Each table and how many appends (one data file and one snapshot each) it gets.
TABLES = {"lakehouse.logs": 3, "lakehouse.orders": 2, "lakehouse.spans": 4}
#: SeaweedFS (like AWS S3 Tables) refuses table names starting with "_": the log table
#: lives in a namespace of its own, outside ``namespaces``.
LOG_TABLE = "icegate_meta.maintenance_log"
BACKLOG, BELOW = "lakehouse.logs", "lakehouse.spans"
#: A table of its own namespace (outside ``namespaces``, so no other test sees it).
EXPIRING = "expiry.events"
MIN_WAL_FILES = 3
#: ``maintain.health.small_files``: spans (4 small files in its one partition) is due for
#: optimize, orders (2) is not; logs (3) is due by its own table property (policy next to
#: the data, read through the REST catalog).
HEALTH_SMALL_FILES = 4
TABLE_PROPERTIES = {BACKLOG: {"icegate.health.small_files": "3"}}
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

    def cli(self, *args: str, config: Path | None = None) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        proc = subprocess.run(
            [str(CLI), *args, "--config", str(config or self.config_path)],
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
        table = catalog.create_table(
            TableRef.parse(key).identifier,
            SCHEMA,
            partition_spec=SPEC,
            properties=TABLE_PROPERTIES.get(key, {}),
        )
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
            "health": {"small_files": HEALTH_SMALL_FILES},
        },
    }
    config_path = root / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert seaweedfs.access_key not in config_path.read_text()
    # The keys reach icegate only through the environment (${VAR}), as
    # docs/reference/configuration.md documents.
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
        row = _status_row(proc.stdout, key)
        # data files, small, deletes, snapshots, manifests, rows
        assert [int(row[c]) for c in ("files", "small", "deletes")] == [appends, appends, 0]
        assert [int(row[c]) for c in ("snapshots", "manifests", "rows")] == [
            appends,
            appends,
            appends * 5,
        ]
        assert 0 < float(row["score"]) < 100, proc.stdout  # small files cost points

    proc = rest.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    stats = {entry["table"]: entry["stats"] for entry in json.loads(proc.stdout)}
    assert sorted(stats) == sorted(TABLES)
    for key, appends in TABLES.items():
        assert stats[key]["data_files"] == appends
        assert stats[key]["snapshots"] == appends


def _status_row(text: str, key: str) -> dict[str, str]:
    """One table's row of ``status``: its columns by name."""
    row = re.search(
        rf"^{re.escape(key)}\s+(?P<files>\d+)\s+(?P<small>\d+)\s+(?P<deletes>\d+)\s+"
        r"[\d.]+ [KMG]?B\s+(?P<snapshots>\d+)\s+(?P<manifests>\d+)\s+(?P<rows>\d+)\s+"
        r"(?P<score>[\d.]+)\s+(?P<due>\S.*?)\s*$",
        text,
        re.MULTILINE,
    )
    assert row, text
    return row.groupdict()


def _sensor_context(
    rest: RestLakehouse,
    instance: dg.DagsterInstance,
    config: Path | None = None,
    cursor: str | None = None,
) -> Any:
    return dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(config or rest.config_path))},
        cursor=cursor,
    )


def _entries(request: dg.RunRequest) -> list[BatchEntry]:
    """The tables of a sensor's run, each with its operations (from the run config)."""
    return batch_entries(
        dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
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
    # A trigger memory of its own: the request this test makes never reaches a Dagster
    # instance, and an open request keeps its table from being asked for again (by either
    # sensor) until its run is made; the health sensor's test below starts afresh.
    raw = yaml.safe_load(rest.config_path.read_text())
    locks = raw["maintain"].setdefault("locks", {})
    locks["uri"] = f"sqlite:///{rest.root / 'wal-sensor-memory.db'}"
    config = rest.root / "wal-sensor.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))

    idle = wal_size_sensor(_sensor_context(rest, instance, config))
    assert isinstance(idle, dg.SensorResult) and idle.skip_reason is not None
    assert not idle.run_requests
    assert "no WAL over its thresholds" in str(idle.skip_reason.skip_message)
    rest.outputs.append(str(idle.skip_reason.skip_message))

    rest.fill_wal(BACKLOG, files=MIN_WAL_FILES)
    due = wal_size_sensor(_sensor_context(rest, instance, config))
    assert isinstance(due, dg.SensorResult)
    [request] = due.run_requests or []
    [entry] = _entries(request)
    assert entry.table == BACKLOG and entry.operations == ("wal_compaction",)
    rest.outputs.append(json.dumps(request.run_config) + json.dumps(request.tags))


#: Each table's score and due operations once BACKLOG's WAL reached min_files (BELOW has
#: one WAL file), by the documented formula: points lost are 40 x small-file pressure
#: (``(s - 1) / (small_files - 1)`` for a partition of ``s`` small files), 10 x WAL files
#: over ``min_files``, 10 x ``(m - 1) / 49`` for ``m`` small manifests and 10 x
#: ``(n - 1) / 99`` for ``n`` snapshots (each rounded to 0.1).
EXPECTED_HEALTH: dict[str, tuple[float, list[str]]] = {
    BACKLOG: (49.4, ["wal_compaction", "optimize"]),  # 100 - (40 + 10 + 0.4 + 0.2)
    BELOW: (55.8, ["optimize"]),  # 100 - (40 + 3.3 + 0.6 + 0.3)
    "lakehouse.orders": (86.4, []),  # 100 - (13.3 + 0.2 + 0.1): 2 small files, not due
}


def _health_state(rest: RestLakehouse) -> None:
    """BACKLOG's WAL over its threshold, one WAL file for BELOW (as the WAL test leaves them)."""
    rest.fill_wal(BACKLOG, files=MIN_WAL_FILES)
    rest.fill_wal(BELOW, files=1)


def test_status_shows_each_rest_tables_score_and_due_operations(rest: RestLakehouse) -> None:
    _health_state(rest)

    proc = rest.cli("status")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    short = {"wal_compaction": "wal", "optimize": "optimize"}
    for key, (score, due) in EXPECTED_HEALTH.items():
        row = _status_row(proc.stdout, key)
        assert float(row["score"]) == score, proc.stdout
        assert row["due"] == (", ".join(short[op] for op in due) or "-"), proc.stdout

    proc = rest.cli("status", "--json")
    assert proc.returncode == 0, proc.stderr
    healths = {entry["table"]: entry["health"] for entry in json.loads(proc.stdout)}
    assert sorted(healths) == sorted(TABLES)
    for key, (score, due) in EXPECTED_HEALTH.items():
        health = healths[key]
        assert (health["score"], health["due_operations"]) == (score, due), health
        assert health["score"] == round(100 - sum(health["penalties"].values()), 1)
        assert health["metrics"]["small_files"] == TABLES[key]
        assert health["metrics"]["delete_files"] == 0
    # The table's own property beat maintain.health, and the reasons name the figures.
    assert healths[BACKLOG]["thresholds"]["small_files"] == 3
    assert healths[BELOW]["thresholds"]["small_files"] == HEALTH_SMALL_FILES
    assert healths[BACKLOG]["penalties"]["small_files"] == 40.0
    assert healths[BACKLOG]["penalties"]["wal"] == 10.0
    [optimize] = [d for d in healths[BELOW]["due"] if d["operation"] == "optimize"]
    assert "holds 4 small files" in optimize["reason"] and "due at 4" in optimize["reason"]
    [wal] = [d for d in healths[BACKLOG]["due"] if d["operation"] == "wal_compaction"]
    assert wal["reason"].startswith(f"{MIN_WAL_FILES} WAL files"), wal


def test_health_sensor_requests_the_due_rest_tables_and_records_lakehouse_health(
    rest: RestLakehouse,
) -> None:
    _health_state(rest)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(ICEBERG_TABLES, sorted(TABLES))
    before = {key: rest.state(key)[0] for key in TABLES}

    result = table_health_sensor(_sensor_context(rest, instance))

    assert isinstance(result, dg.SensorResult)
    requests = result.run_requests or []
    # Exactly the tables with due work, neediest first, in one run, each with exactly its
    # own operations.
    [request] = requests
    entries = _entries(request)
    assert [e.table for e in entries] == [BACKLOG, BELOW]
    for entry in entries:
        assert list(entry.operations or ()) == EXPECTED_HEALTH[entry.table][1]
    assert request.job_name == BATCH_JOB and request.tags[TRIGGER_TAG] == HEALTH_SENSOR
    [event] = [e for e in result.asset_events if e.asset_key == LAKEHOUSE_HEALTH]
    assert isinstance(event, dg.AssetMaterialization)
    health = {key: value.value for key, value in event.metadata.items()}
    # No table was maintained yet. The two requested now are left to their run; the third
    # gets an assessment of its partition, its figures and score read from the REST
    # catalog's metadata.
    [assessment] = [e for e in result.asset_events if e.asset_key == MAINTAINED_TABLE]
    assert isinstance(assessment, dg.AssetMaterialization)
    assert assessment.partition == "lakehouse.orders"
    values = {key: value.value for key, value in assessment.metadata.items()}
    assert values["health_score"] == EXPECTED_HEALTH["lakehouse.orders"][0]
    assert values["healthy"] is True and values["due_operations"] == "none"
    assert values["small_files_after"] == TABLES["lakehouse.orders"]
    assert health["tables"] == health["tables_assessed"] == len(TABLES)
    assert health["tables_unreadable"] == 0
    assert health["tables_due"] == health["tables_requested"] == 2
    assert health["backlog_tables"] == 0
    assert health["unhealthy_tables"] == 1  # logs, under the default min_score 50
    assert health["lowest_score"] == EXPECTED_HEALTH[BACKLOG][0]
    assert health["small_files"] == sum(TABLES.values())
    assert health["wal_files"] == MIN_WAL_FILES + 1
    assert health["due_by_operation"] == {"optimize": 2, "wal_compaction": 1}
    least = str(health["least_healthy"])
    assert least.index(BACKLOG) < least.index(BELOW) < least.index("lakehouse.orders")
    # Deciding read metadata only: no table changed.
    assert {key: rest.state(key)[0] for key in TABLES} == before

    # The daemon stores the tick's events and cursor and queues the run: the next tick
    # asks for nothing (the tables are in flight) and records nothing again. Every table
    # has its look, kept in the trigger's memory: none is read again before
    # maintain.trigger.recheck, a REST catalog not saying what changed.
    for stored in result.asset_events:
        instance.report_runless_asset_event(stored)
    queued = instance.create_run_for_job(
        _batch_job(),
        run_config=request.run_config,
        tags=request.tags,
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    again = table_health_sensor(_sensor_context(rest, instance, cursor=result.cursor))
    assert isinstance(again, dg.SensorResult)
    assert not again.run_requests
    assert f"run {queued.run_id} is not_started" in str(again.skip_reason)
    assert [e for e in again.asset_events if e.asset_key == MAINTAINED_TABLE] == []
    rest.outputs += [
        json.dumps([r.run_config for r in requests]),
        json.dumps([r.tags for r in requests]),
        json.dumps({k: str(v) for k, v in health.items()}),
    ]


def _s3(server: SeaweedServer) -> Any:
    """The server's S3 through pyarrow's own client (not the table's FileIO)."""
    from pyarrow import fs

    return fs.S3FileSystem(
        access_key=server.access_key,
        secret_key=server.secret_key,
        endpoint_override=server.s3_endpoint.removeprefix("http://"),
        scheme="http",
        region=REGION,
    )


def test_expiry_dry_run_reports_the_bytes_the_s3_objects_take(rest: RestLakehouse) -> None:
    """Three appends then an overwrite: expiring every snapshot but the current one would
    delete the three replaced data files, their manifests and the expired manifest lists.
    The dry run plans it from metadata (no JVM), and its sizes are those S3 reports."""
    ref = TableRef.parse(EXPIRING)
    rest.catalog.create_namespace_if_not_exists(ref.namespace)
    table = rest.catalog.create_table(ref.identifier, SCHEMA, partition_spec=SPEC)
    for i in range(3):
        table.append(batch(i * 100, ("api",)))
    replaced = set(table.inspect.files()["file_path"].to_pylist())
    table.overwrite(batch(1_000, ("api",)))
    table = rest.catalog.load_table(ref.identifier)
    head = table.current_snapshot()
    assert head is not None
    expired_lists = {s.manifest_list for s in table.metadata.snapshots if s != head}
    raw = yaml.safe_load(rest.config_path.read_text())
    raw["namespaces"] = [ref.namespace]
    raw["maintain"]["tables"] = {EXPIRING: {"expire_snapshots": {"retention_threshold": "1s"}}}
    config_path = rest.root / "expiry.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    time.sleep(1.2)  # every snapshot but the current one passes the 1 s threshold

    proc = rest.cli("expire", "--dry-run", "--json", "--table", EXPIRING, config=config_path)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    [report] = json.loads(proc.stdout)["tables"]
    [op] = report["ops"]
    assert op["operation"] == "expire_snapshots" and op["status"] == "skipped", op
    assert op["details"].startswith("dry run: "), op
    planned = op["output"]
    settings = load_config(config_path).for_table(EXPIRING).expire_snapshots
    plan = plan_expiry(table, settings, datetime.now(UTC))
    doomed = {
        **plan.data_files,
        **plan.delete_files,
        **plan.manifests,
        **plan.manifest_lists,
        **plan.statistics_files,
    }
    assert set(plan.data_files) == replaced
    assert set(plan.manifest_lists) == expired_lists
    assert (planned["files_to_free"], planned["bytes_to_free"]) == (len(doomed), plan.bytes)
    assert planned["snapshots_expiring"] == len(table.metadata.snapshots) - 1
    # Each object as S3 itself reports it (a HEAD per object).
    s3 = _s3(rest.server)
    infos = s3.get_file_info([path.split("://", 1)[1] for path in doomed])
    assert all(info.is_file for info in infos), [i for i in infos if not i.is_file]
    assert {f"s3://{info.path}": info.size for info in infos} == doomed
    assert planned["bytes_to_free"] == sum(info.size for info in infos) > 0
    # The dry run deleted nothing, and the current snapshot needs none of it.
    assert rest.catalog.load_table(ref.identifier).metadata_location == table.metadata_location
    assert not set(doomed) & set(table.inspect.files()["file_path"].to_pylist())
    assert head.manifest_list not in doomed
    rest.outputs += [proc.stdout, proc.stderr]


def test_run_fails_each_table_cleanly_naming_the_aws_bundle(rest: RestLakehouse) -> None:
    """A class path without an S3 client: the user's own Iceberg runtime, no AWS bundle."""
    wal_before = rest.fill_wal(BACKLOG, files=MIN_WAL_FILES)
    before = {key: rest.state(key) for key in TABLES}
    raw = yaml.safe_load(rest.config_path.read_text())
    raw["spark"]["conf"] = {"spark.jars": str(iceberg_runtime_jar())}
    config = rest.root / "no-aws-bundle.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))

    proc = rest.cli("run", config=config)

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

    jdbc_drivers = [str(j) for j in (SQLITE_JDBC_JAR, POSTGRES_JDBC_JAR) if j.is_file()]
    # A user's own runtime brings its own S3 jars (of its version): without them, refused.
    user_runtime = {
        "spark.jars.packages": "org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.9.1"
    }
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
            conf(catalog, user_runtime)
        assert "(spark.conf brings its own Iceberg runtime and no S3 jar)" in str(refused.value)
        assert str(refused.value).endswith(
            "add org.apache.iceberg:iceberg-aws-bundle:1.9.1 to spark.conf spark.jars.packages "
            "(or its jar to spark.jars)"
        )
    bundle = aws_bundle_jar()
    assert bundle is not None, "set-up's iceberg-aws-bundle jar is missing"
    with_bundle = conf(rest_s3, {**user_runtime, "spark.jars": str(bundle)})
    # (Hadoop's S3A and its SDK join too: Spark's own reads of s3:// WAL files need them.)
    s3a = [str(j) for j in s3_jars() if j != bundle]
    assert with_bundle["spark.jars"].split(",") == [str(bundle), *s3a, *jdbc_drivers]
    # Hadoop's S3A serves a user's own io-impl, never S3FileIO (it needs the AWS SDK v2).
    runtime = user_runtime["spark.jars.packages"]
    hadoop_aws = {"spark.jars.packages": f"{runtime},org.apache.hadoop:hadoop-aws:3.3.4"}
    with pytest.raises(SparkStartError, match="no S3 jar"):
        conf(rest_s3, hadoop_aws)
    conf({**rest_s3, "io-impl": "org.apache.iceberg.hadoop.HadoopFileIO"}, hadoop_aws)

    # Our runtime: set-up's AWS bundle joins the class path, and the catalog gets S3FileIO.
    settings = conf({**rest_s3, "s3.endpoint": "http://127.0.0.1:2", "s3.region": "eu-west-1"})
    assert str(bundle) in settings["spark.jars"].split(",")
    assert settings["spark.sql.catalog.c.io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    # pyiceberg's s3.region is client.region to Iceberg's Java S3 client; an endpoint of
    # an S3-compatible store is read path-style, as pyiceberg does.
    assert settings["spark.sql.catalog.c.client.region"] == "eu-west-1"
    assert settings["spark.sql.catalog.c.s3.path-style-access"] == "true"
    assert settings["spark.sql.catalog.c.s3.endpoint"] == "http://127.0.0.1:2"
    # A store named by its endpoint alone gets a region (the SDK would look for one).
    plain = conf({**rest_s3, "s3.endpoint": "http://127.0.0.1:2"})
    assert plain["spark.sql.catalog.c.client.region"] == "us-east-1"
    # The user's own settings win.
    own = conf(
        {
            **rest_s3,
            "s3.endpoint": "http://e",
            "s3.path-style-access": "false",
            "client.region": "ap-south-1",
            "io-impl": "com.example.IO",
        }
    )
    assert (
        own["spark.sql.catalog.c.s3.path-style-access"],
        own["spark.sql.catalog.c.client.region"],
        own["spark.sql.catalog.c.io-impl"],
    ) == ("false", "ap-south-1", "com.example.IO")
    # Files on local disk need nothing more: no bundle, no S3FileIO.
    local = conf({"uri": "sqlite:///c.db", "warehouse": "wh"})
    assert "iceberg-aws-bundle" not in local["spark.jars"]
    assert "spark.sql.catalog.c.io-impl" not in local


def test_s3_keys_and_the_rest_credential_reach_spark_only_after_it_starts(
    tmp_path: Path,
) -> None:
    """What ``spark-submit`` gets on its command line, and what is set on the session."""
    raw = {
        "catalog": {
            "name": "c",
            "type": "rest",
            "uri": "http://127.0.0.1:1",
            "warehouse": "s3://wh",
            "credential": "AKIDEXAMPLE:rest-SECRET-3f1c",
            "token": "bearer-SECRET-77de",
            "s3.endpoint": "http://127.0.0.1:2",
            "s3.access-key-id": "AKIDEXAMPLE",
            "s3.secret-access-key": "s3-SECRET-a8b0",
            "s3.session-token": "session-SECRET-19e2",
        }
    }
    config = config_from_dict(raw, tmp_path)
    split = split_secret_conf(build_spark_conf(config), config_secrets(config))
    prefix = "spark.sql.catalog.c."
    held = {"credential", "token", "s3.access-key-id", "s3.secret-access-key", "s3.session-token"}
    assert {key.removeprefix(prefix) for key in split.runtime} == held
    assert split.launch == {}
    public = json.dumps(split.public)
    for secret in (
        "AKIDEXAMPLE",
        "rest-SECRET-3f1c",
        "bearer-SECRET-77de",
        "s3-SECRET-a8b0",
        "session-SECRET-19e2",
    ):
        assert secret not in public
    assert split.public[prefix + "io-impl"] == "org.apache.iceberg.aws.s3.S3FileIO"
    assert split.public[prefix + "s3.endpoint"] == "http://127.0.0.1:2"


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
        # Iceberg's answer worked out without Spark, as the URI Iceberg reports.
        orphans = iceberg_orphans(table, datetime.now(UTC) + timedelta(hours=1))
    finally:
        table.io.delete(stray)
    assert candidates == [stray.split("://", 1)[1]]
    assert orphans == [stray]


def test_deferred_orphan_collection_on_s3_never_collects_a_young_object(
    rest: RestLakehouse,
) -> None:
    """``orphans --collect`` lists the table's S3 folder without Spark; an unreferenced
    object younger than the floor (S3 objects cannot be back-dated: every one here is) is
    not a candidate, and ``--delete-collected`` then deletes nothing."""
    key = "lakehouse.orders"
    table = rest.catalog.load_table(TableRef.parse(key).identifier)
    stray = f"{table.location()}/data/stray-{uuid.uuid4().hex}.parquet"
    with table.io.new_output(stray).create() as out:
        out.write(b"PAR1 written a moment ago PAR1")
    before = rest.state(key)
    try:
        collected = rest.cli("orphans", "--collect", "--table", key, "--json")
        deleted = rest.cli("orphans", "--delete-collected", "--table", key, "--json")
        assert table.io.new_input(stray).exists()
    finally:
        table.io.delete(stray)
    assert collected.returncode == 0, collected.stdout + collected.stderr
    document = json.loads(collected.stdout)
    # SeaweedFS refuses names starting with "_": the candidates table avoids one too.
    assert document["candidates_table"] == "icegate_meta.orphan_candidates"
    [report] = document["tables"]
    assert (report["status"], report["candidates"]) == ("completed", []), report
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
    [result] = json.loads(deleted.stdout)["tables"]
    assert result["deleted"] == [], result
    assert rest.state(key) == before


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


def test_a_run_whose_worker_died_is_failed_from_the_rest_deployments_lease_store(
    rest: RestLakehouse,
) -> None:
    """Self-healing on a REST catalog: run heartbeats live in the shared lease store (its
    SQLite file here); a run whose heartbeat another process keeps stays, and once that
    process is killed the health sensor (on the same host) fails the run at its next tick,
    saying why, and asks again."""
    raw = yaml.safe_load(rest.config_path.read_text())
    raw["maintain"]["locks"]["lease"] = "15s"  # the shortest allowed
    # The module's earlier passes maintained these tables moments ago (the trigger's memory
    # is the deployment's): a short interval lets the healed tick ask for them again.
    raw["maintain"].setdefault("health", {})["min_interval"] = "1s"
    config = rest.root / "icegate-short-lease.yaml"
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    _health_state(rest)
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(ICEBERG_TABLES, sorted(TABLES))
    run = instance.create_run_for_job(
        _batch_job(),
        run_config=batch_run_config([BatchEntry(BELOW, ("optimize",), "s")]),
        tags={TRIGGER_TAG: HEALTH_SENSOR},
        status=dg.DagsterRunStatus.STARTED,
    )

    with beating_in_another_process(config, run.run_id) as worker:
        time.sleep(4)
        alive = table_health_sensor(_sensor_context(rest, instance, config))
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED  # type: ignore[union-attr]
        assert BELOW not in [e.table for r in alive.run_requests or [] for e in _entries(r)]
        worker.kill()
        worker.wait()
        healed = table_health_sensor(_sensor_context(rest, instance, config))

    failed = instance.get_run_by_id(run.run_id)
    assert failed is not None and failed.status == dg.DagsterRunStatus.FAILURE
    [event] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert "worker is gone" in str(event.dagster_event.message if event.dagster_event else "")
    requested = [e.table for r in healed.run_requests or [] for e in _entries(r)]
    assert BELOW in requested, healed.skip_reason
    rest.assert_no_secrets()


def _batch_job() -> dg.JobDefinition:
    from icegate_dagster.definitions import defs

    return defs.resolve_job_def(BATCH_JOB)
