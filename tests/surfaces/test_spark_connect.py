"""Runs as thin clients of a Spark Connect server with Iceberg (``spark.remote``): a full
pass by the CLI and a sensor's batch run of the code location maintain the lakehouse as a
local Spark does, with no JVM in their own processes; the run's catalog and its secret
reach the server as session settings only; a lease lost mid-work interrupts the table's
work on the server (its operation tag) and nothing of it commits.

One server for the test session (``spark_connect`` in conftest.py); the CLI and the batch
run are processes of their own (:mod:`tests.surfaces.connect_client`), whose whole process
tree is watched for a JVM.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy import update

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from icegate_dagster.errors import SparkStartError
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.leases.holder import TableLeasing
from icegate_dagster.maintenance.leases.store import LeaseLostError, check_lease
from icegate_dagster.maintenance.ops.procedures import call_procedure
from icegate_dagster.spark.conf import ICEBERG_EXTENSIONS
from icegate_dagster.spark.remote import (
    check_catalog,
    is_remote,
    session_settings,
    set_session_settings,
)
from icegate_dagster.spark.session import get_spark, stop_spark
from tests.dagster.conftest import BUSY, IDLE, OLD, health_lakehouse
from tests.integration.test_shared_locations import (
    EVENTS,
    INNER,
    MONTH,
    _back_date,
    _op,
    _pyarrow_file,
    _referenced,
)
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, batch, make_lakehouse
from tests.servers import process_tree
from tests.surfaces.spark_connect_server import ConnectServer, TreeWatch, spark_connect_server

TABLES = ("lakehouse.logs", "lakehouse.orders")
ROOT = Path(__file__).resolve().parents[2]


def remote_lakehouse(
    root: Path, server: ConnectServer, secret: str, **maintain: Any
) -> Lakehouse:
    """A lakehouse whose config says ``spark.remote`` (and nothing else about Spark), its
    catalog holding a secret the server must never log."""
    lh = make_lakehouse(root, maintain=maintain)
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["spark"] = {"remote": server.url}
    # A credential beside a warehouse on local disk: passed to the catalog, unused.
    raw["catalog"]["s3.secret-access-key"] = secret
    lh.config_path.write_text(yaml.safe_dump(raw))
    lh.config = load_config(lh.config_path)
    return lh


@dataclass
class ClientRun:
    """A process of :mod:`tests.surfaces.connect_client`: its exit, output, report and the
    processes seen below it."""

    completed: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    seen: TreeWatch
    seconds: float


def run_client(kind: str, args: list[str], cwd: Path) -> ClientRun:
    report_path = cwd / f"{kind}-report.json"
    env = {
        **os.environ,
        "ICEGATE_TEST_REPORT": str(report_path),
        "PYTHONPATH": str(ROOT),
    }
    started = time.monotonic()
    process = subprocess.Popen(  # noqa: S603
        [sys.executable, "-m", "tests.surfaces.connect_client", kind, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )
    with TreeWatch(process.pid) as watch:
        stdout, stderr = process.communicate(timeout=600)
    seconds = time.monotonic() - started
    completed = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    assert report_path.is_file(), f"exit {process.returncode}\n{stdout[-3000:]}\n{stderr[-4000:]}"
    report: dict[str, Any] = json.loads(report_path.read_text())
    return ClientRun(completed, report, watch, seconds)


@dataclass
class ConnectPass:
    lakehouse: Lakehouse
    server: ConnectServer
    secret: str
    rows_before: dict[str, Counter[tuple[Any, ...]]]
    files_before: dict[str, int]
    snapshots_before: dict[str, set[int]]
    data_paths_before: dict[str, set[Path]]
    run: ClientRun
    pass_report: dict[str, Any]


@pytest.fixture(scope="module")
def connect_pass(
    spark_connect: ConnectServer, tmp_path_factory: pytest.TempPathFactory
) -> ConnectPass:
    """`icegate-maintain run` with ``spark.remote``: two small-file tables, an old orphan
    and a young file, as the local full pass has them."""
    secret = "s3cret-" + secrets.token_hex(12)
    lh = remote_lakehouse(
        tmp_path_factory.mktemp("connect_pass"),
        spark_connect,
        secret,
        expire_snapshots={"retention_threshold": "1s", "retain_last": 1},
    )
    lh.add_table("lakehouse.logs", appends=6, services=("api", "web"))
    lh.add_table("lakehouse.orders", appends=5, services=("shop",))
    lh.planted["old"] = lh.plant_file("lakehouse.logs", "old-orphan.parquet", timedelta(days=30))
    lh.planted["young"] = lh.plant_file("lakehouse.logs", "young.parquet", timedelta(hours=1))
    rows_before = {key: lh.rows_without_spark(key) for key in TABLES}
    files_before = {key: len(lh.table(key).inspect.files()) for key in TABLES}
    snapshots_before = {
        key: {s.snapshot_id for s in lh.table(key).metadata.snapshots} for key in TABLES
    }
    data_paths_before = {key: set(lh.data_file_paths(key)) for key in TABLES}
    time.sleep(1.2)  # every snapshot so far is now older than the 1s threshold
    run = run_client("cli", ["run", "--config", str(lh.config_path), "--json"], lh.root)
    completed = run.completed
    assert completed.returncode == 0, (
        f"exit {completed.returncode}\n{completed.stdout[-3000:]}\n{completed.stderr[-4000:]}"
    )
    report: dict[str, Any] = json.loads(completed.stdout)
    return ConnectPass(
        lh,
        spark_connect,
        secret,
        rows_before,
        files_before,
        snapshots_before,
        data_paths_before,
        run,
        report,
    )


def test_the_pass_runs_every_operation_on_the_server(connect_pass: ConnectPass) -> None:
    tables = {t["table"]: t for t in connect_pass.pass_report["tables"]}
    assert sorted(tables) == list(TABLES)
    ops = {op["operation"]: op for op in tables["lakehouse.logs"]["ops"]}
    assert [(name, op["status"]) for name, op in ops.items()] == [
        ("optimize", "completed"),
        ("rewrite_position_delete_files", "skipped"),  # no delete files
        ("rewrite_manifests", "completed"),
        ("expire_snapshots", "completed"),
        ("remove_orphan_files", "completed"),
    ], tables["lakehouse.logs"]
    # Small tables: a local driver would use Iceberg's Java API; here the manifests'
    # procedure ran, and expiry ran in the client (pyiceberg: no Spark job for a few
    # metadata files; what it deleted: the test below).
    assert ops["rewrite_manifests"]["output"]["execution"] == "distributed"
    assert ops["expire_snapshots"]["output"]["execution"] == "client"
    assert all(op["status"] != "failed" for t in tables.values() for op in t["ops"])


def test_rows_identical_files_compacted_snapshots_expired(connect_pass: ConnectPass) -> None:
    lh = connect_pass.lakehouse
    assert connect_pass.files_before == {"lakehouse.logs": 12, "lakehouse.orders": 5}
    assert len(lh.table("lakehouse.logs").inspect.files()) == 2  # one per partition
    assert len(lh.table("lakehouse.orders").inspect.files()) == 1
    for key, before in connect_pass.rows_before.items():
        assert sum(before.values()) > 0
        assert lh.rows_without_spark(key) == before  # same rows, as multisets
        for path in lh.data_file_paths(key):
            assert path.exists(), path
        snapshots = lh.table(key).metadata.snapshots
        assert not {s.snapshot_id for s in snapshots} & connect_pass.snapshots_before[key]
        assert 1 <= len(snapshots) <= 2


def test_expiry_deleted_what_only_the_expired_snapshots_reached(
    connect_pass: ConnectPass,
) -> None:
    """The data files compaction replaced and the expired snapshots' manifest lists are
    gone from storage; every file the table reads is there."""
    lh = connect_pass.lakehouse
    for key, before in connect_pass.data_paths_before.items():
        live = set(lh.data_file_paths(key))
        replaced = before - live
        assert replaced, key  # compaction replaced them: expiry had files to delete
        assert [p for p in replaced if p.exists()] == [], key
        assert all(p.exists() for p in live), key
        table = lh.table(key)
        kept_lists = {Path(s.manifest_list).name for s in table.metadata.snapshots}
        metadata = Path(table.location().removeprefix("file://").removeprefix("file:"))
        assert {p.name for p in (metadata / "metadata").glob("snap-*.avro")} == kept_lists, key


def test_old_orphan_removed_young_file_kept(connect_pass: ConnectPass) -> None:
    assert not connect_pass.lakehouse.planted["old"].exists()
    assert connect_pass.lakehouse.planted["young"].exists()


def test_log_rows_written(connect_pass: ConnectPass) -> None:
    run_id = connect_pass.pass_report["run_id"]
    rows = [r for r in connect_pass.lakehouse.log_rows() if r["run_id"] == run_id]
    assert len(rows) == 10  # 5 ops x 2 tables
    by_key = {(r["table_name"], r["operation"]): r for r in rows}
    optimize = by_key[("lakehouse.logs", "optimize")]
    assert (optimize["status"], optimize["files_before"], optimize["files_after"]) == (
        "completed",
        12,
        2,
    )


def test_no_jvm_in_the_clis_process_tree(connect_pass: ConnectPass) -> None:
    run = connect_pass.run
    assert run.seen.seen, "the CLI's process was never sampled"
    assert run.seen.javas() == []
    assert run.report["jvm_gateway"] is False


def test_the_catalog_secret_reached_the_server_only_as_a_session_setting(
    connect_pass: ConnectPass,
) -> None:
    server = connect_pass.server
    log = server.log_text()
    assert "Table loaded by catalog" in log  # the run's catalog was used there...
    assert connect_pass.secret not in log  # ...its secret never logged
    for pid in process_tree(server.pid):
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            assert connect_pass.secret.encode() not in cmdline.read()
    for line in connect_pass.run.seen.seen.values():
        assert connect_pass.secret not in line


def test_a_sensors_batch_run_maintains_its_tables_through_connect(
    spark_connect: ConnectServer, tmp_path: Path
) -> None:
    """`table_health_sensor`'s tick and the `maintenance_batch_job` run it asks for, in a
    process of their own, as the daemon would launch them (see test_batch_runs.py)."""

    def factory(**kwargs: Any) -> Lakehouse:
        root = tmp_path / "lakehouse"
        return remote_lakehouse(root, spark_connect, "unused", **kwargs["maintain"])

    lh = health_lakehouse(factory)
    idle_metadata = lh.table(IDLE).metadata_location
    busy_rows, old_rows = lh.rows_without_spark(BUSY), lh.rows_without_spark(OLD)
    old_snapshots = len(lh.table(OLD).snapshots())

    run = run_client("batch", [str(lh.config_path)], tmp_path)

    report = run.report
    assert report["job"] == "maintenance_batch_job" and report["tables_tag"] == "2"
    assert report["success"] is True, run.completed.stderr[-4000:]
    assert len(lh.table(BUSY).inspect.files()) == 2
    assert len(lh.table(OLD).snapshots()) < old_snapshots
    assert lh.rows_without_spark(BUSY) == busy_rows
    assert lh.rows_without_spark(OLD) == old_rows
    assert lh.table(IDLE).metadata_location == idle_metadata
    run_id = report["run_id"]
    assert report["materialized_by"] == {BUSY: run_id, OLD: run_id, IDLE: None}
    assert run.seen.javas() == [] and report["jvm_gateway"] is False


def test_a_lost_lease_interrupts_the_tables_work_on_the_server_and_nothing_commits(
    spark_connect: ConnectServer, tmp_path: Path
) -> None:
    """The holder tags its thread's operations with the lease's token; a takeover noticed
    by the renewal interrupts that tag on the server: a query that would run for minutes
    ends at once, and the commit that follows is refused."""
    secret = "s3cret-" + secrets.token_hex(12)
    lh = remote_lakehouse(tmp_path / "lakehouse", spark_connect, secret, locks={"lease": "15s"})
    key = "lakehouse.logs"
    lh.add_table(key, appends=6)
    snapshots = [s.snapshot_id for s in lh.table(key).metadata.snapshots]
    maintainer = Maintainer(lh.config)
    spark = maintainer.spark  # the pass's session, as its operations get it
    try:
        assert is_remote(spark)
        catalog_secret = f"spark.sql.catalog.{lh.config.catalog.name}.s3.secret-access-key"
        assert spark.conf.get(catalog_secret) == secret  # a setting of this session
        leasing: TableLeasing = maintainer.leasing
        locks = leasing.locks
        assert locks is not None
        outcome: dict[str, Any] = {}
        with leasing.hold(key):
            check_lease()  # as before a commit: tags this thread's operations
            assert spark.getTags() != set()

            def take_over() -> None:
                time.sleep(2)  # the query below is running by now
                with locks.engine.begin() as conn:
                    conn.execute(
                        update(locks.table)
                        .where(locks.table.c.table_name == key)
                        .values(token="thief", holder="thief-host:7:other-run")
                    )

            thief = threading.Thread(target=take_over)
            thief.start()
            started = time.monotonic()
            try:  # minutes of work for two cores, unless interrupted
                spark.range(0, 10**13, 1, 2).selectExpr("sum(id * id % 7)").collect()
                outcome["query"] = "finished"
            except Exception as exc:
                outcome["query"] = f"{type(exc).__name__}: {exc}"
            outcome["seconds"] = time.monotonic() - started
            thief.join()
            try:
                args = {"table": "'lakehouse.logs'"}
                call_procedure(spark, lh.config.catalog.name, "rewrite_data_files", args)
                outcome["commit"] = "committed"
            except LeaseLostError as exc:
                outcome["commit"] = str(exc)
        assert outcome["query"] != "finished"
        assert "OPERATION_CANCELED" in outcome["query"] or "interrupt" in outcome["query"].lower()
        assert outcome["seconds"] < 120, outcome  # liveness bound: ended by the interrupt
        assert "taken over by thief-host:7:other-run" in outcome["commit"]
        assert [s.snapshot_id for s in lh.table(key).metadata.snapshots] == snapshots
        assert secret not in spark_connect.log_text()
    finally:
        stop_spark()


def test_a_catalog_the_server_cannot_load_is_refused_at_connect_naming_it_and_why(
    tmp_path: Path, spark_connect: ConnectServer
) -> None:
    """Whether the run's catalog loads on the server is checked at connect time, before
    any table is touched: here its database does not answer."""
    lh = remote_lakehouse(tmp_path / "lakehouse", spark_connect, "unused")
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["catalog"]["uri"] = "postgresql+psycopg2://nobody@127.0.0.1:1/none"
    lh.config_path.write_text(yaml.safe_dump(raw))
    config = load_config(lh.config_path)
    try:
        with pytest.raises(SparkStartError) as raised:
            get_spark(config)
        message = str(raised.value)
        assert spark_connect.url in message and repr(config.catalog.name) in message
        assert "Failed to connect: jdbc:postgresql://127.0.0.1:1/none" in message, message
        assert "docs/how-to/deploy.md#spark-as-a-service" in message
    finally:
        stop_spark()


def test_a_server_without_iceberg_is_refused_at_connect_naming_what_to_set_there(
    tmp_path: Path,
) -> None:
    """A bare Spark Connect server (no Iceberg runtime, no extensions): connecting says
    which setting the server lacks and how to give it; its catalog check names the
    runtime. One more small server, for this test only."""
    with spark_connect_server(tmp_path / "bare", iceberg=False) as bare:
        lh = remote_lakehouse(tmp_path / "lakehouse", bare, "unused")
        try:
            with pytest.raises(SparkStartError) as raised:
                get_spark(lh.config)
            message = str(raised.value)
            assert f"the Spark Connect server at {bare.url!r} runs without Iceberg's SQL " in (
                message
            )
            assert f"--conf spark.sql.extensions={ICEBERG_EXTENSIONS}" in message
            # Past that check, the catalog's own: the runtime is missing.
            from pyspark.sql.connect.session import SparkSession as RemoteSession

            session = RemoteSession.builder.remote(bare.url).create()
            try:
                set_session_settings(session, session_settings(lh.config, {}))
                with pytest.raises(SparkStartError) as missing:
                    check_catalog(session, lh.config.catalog.name, bare.url)
                assert "the Iceberg Spark runtime is not on its class path" in str(missing.value)
                assert "iceberg-spark-runtime-3.5_2.12:1.12.0" in str(missing.value)
            finally:
                session.stop()
        finally:
            stop_spark()


def test_tables_sharing_a_folder_keep_each_others_files_when_expiry_and_orphans_run_on_connect(
    spark_connect: ConnectServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Expiry of a table whose folder holds another table's (so Iceberg's own cleanup may
    not delete) commits through pyiceberg and deletes through the table's pyiceberg FileIO,
    consulting the inner table; orphan removal keeps what the other table reads."""
    lh = remote_lakehouse(
        tmp_path / "lakehouse",
        spark_connect,
        "unused",
        expire_snapshots={"retention_threshold": "1s", "retain_last": 1},
        remove_orphan_files={"retention_threshold": "24h"},
    )
    events = lh.add_table(EVENTS, appends=3)
    inner = lh.catalog.create_table(
        ("lakehouse", "inner"),
        schema=SCHEMA,
        partition_spec=SPEC,
        location=f"{events.location()}/inner",
    )
    inner.append(batch(10_000, ("web",)))
    shared = _pyarrow_file(lh.data_dir(EVENTS) / "service=api", "shared.parquet", 20_000)
    events.add_files([f"file://{shared}"])
    lh.table(INNER).add_files([f"file://{shared}"])
    lh.table(EVENTS).overwrite(batch(30_000, ("api", "web")))  # events no longer reads it
    time.sleep(1.1)
    rows = {key: lh.rows_without_spark(key) for key in (EVENTS, INNER)}
    snapshots = len(lh.table(EVENTS).metadata.snapshots)
    before = _referenced(lh, EVENTS, INNER)
    config = ["--config", str(lh.config_path), "--json"]
    try:
        assert run_cli(["expire", "--table", EVENTS, *config]) == 0
        expired = _op(json.loads(capsys.readouterr().out), EVENTS, "expire_snapshots")
        assert expired["status"] == "completed", expired
        assert expired["output"]["execution"] == "client"  # no Java table API here
        assert expired["output"]["tables_consulted"] == [INNER]
        assert len(lh.table(EVENTS).metadata.snapshots) < snapshots
        after = _referenced(lh, EVENTS, INNER)
        assert [p for p in after if not p.exists()] == []
        gone = before - after
        assert any(p.suffix == ".parquet" for p in gone)  # events' overwritten files...
        assert not [p for p in gone if p.exists() and not p.name.endswith(".metadata.json")]
        assert shared.exists()  # ...but not the one the inner table reads

        _back_date(lh, EVENTS)
        _back_date(lh, INNER)
        orphan = lh.plant_file(EVENTS, "failed-write.parquet", MONTH)
        assert run_cli(["orphans", "--table", EVENTS, *config]) == 0
        removed = _op(json.loads(capsys.readouterr().out), EVENTS, "remove_orphan_files")
        assert removed["status"] == "completed", removed
        assert removed["output"]["tables_consulted"] == [INNER]
        assert [Path(p).name for p in removed["output"]["orphan_files"]] == [orphan.name]
        assert not orphan.exists() and shared.exists()
        assert [p for p in _referenced(lh, EVENTS, INNER) if not p.exists()] == []
        for key, expected in rows.items():
            assert lh.rows_without_spark(key) == expected, key
    finally:
        stop_spark()


def test_a_small_tables_expiry_takes_the_procedure_when_a_tag_past_its_age_must_go(
    spark_connect: ConnectServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A small table expires in the client on Connect only where pyiceberg's expiry leaves
    nothing of Iceberg's undone: a tag past its ``max-ref-age-ms`` is dropped by Iceberg's
    procedure, so such a table takes the procedure, and the tag and the snapshots go."""
    lh = remote_lakehouse(
        tmp_path / "lakehouse",
        spark_connect,
        "unused",
        expire_snapshots={"retention_threshold": "1s", "retain_last": 1},
    )
    table = lh.add_table(EVENTS, appends=3)
    rows = lh.rows_without_spark(EVENTS)
    first = table.metadata.snapshots[0].snapshot_id
    table.manage_snapshots().create_tag(first, "audit", max_ref_age_ms=1000).commit()
    assert "audit" in lh.table(EVENTS).metadata.refs
    time.sleep(1.2)  # the tag, and every snapshot, older than their limits
    config = ["--config", str(lh.config_path), "--json"]
    try:
        assert run_cli(["expire", "--table", EVENTS, *config]) == 0
        expired = _op(json.loads(capsys.readouterr().out), EVENTS, "expire_snapshots")
    finally:
        stop_spark()
    assert expired["status"] == "completed", expired
    assert expired["output"]["execution"] == "distributed"
    after = lh.table(EVENTS).metadata
    assert set(after.refs) == {"main"}  # the tag past its age is gone
    assert [s.snapshot_id for s in after.snapshots] == [after.current_snapshot_id]
    assert lh.rows_without_spark(EVENTS) == rows


def test_a_format_v3_tables_expiry_takes_the_procedure_on_connect(
    spark_connect: ConnectServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """pyiceberg writes no format-version 3 metadata: a small v3 table on Connect expires
    through Iceberg's procedure on the server, never by a pyiceberg commit that would fail."""
    lh = remote_lakehouse(
        tmp_path / "lakehouse",
        spark_connect,
        "unused",
        expire_snapshots={"retention_threshold": "1s", "retain_last": 1},
    )
    lh.add_table(EVENTS, appends=3)
    rows = lh.rows_without_spark(EVENTS)
    config = ["--config", str(lh.config_path), "--json"]
    try:
        get_spark(lh.config).sql(
            f"ALTER TABLE {lh.config.catalog.name}.{EVENTS} "
            "SET TBLPROPERTIES ('format-version'='3')"
        )
        assert lh.table(EVENTS).format_version == 3
        time.sleep(1.2)  # every snapshot older than the threshold
        assert run_cli(["expire", "--table", EVENTS, *config]) == 0
        expired = _op(json.loads(capsys.readouterr().out), EVENTS, "expire_snapshots")
    finally:
        stop_spark()
    assert expired["status"] == "completed", expired
    assert expired["output"]["execution"] == "distributed"
    after = lh.table(EVENTS).metadata
    assert after.format_version == 3
    assert [s.snapshot_id for s in after.snapshots] == [after.current_snapshot_id]
    assert lh.rows_without_spark(EVENTS) == rows


def test_readmes_demo_on_connect_maintains_the_lakehouse_with_no_jvm_of_its_own(
    spark_connect: ConnectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's first command with ``$SPARK_REMOTE`` set and nothing else changed: every
    table compacted, each WAL row ingested once and no WAL file left, the old orphan gone
    and the file of a write in progress kept; no JVM below the demo's process."""
    monkeypatch.setenv("SPARK_REMOTE", spark_connect.url)
    monkeypatch.delenv("ICEGATE_CONFIG", raising=False)
    monkeypatch.delenv("DAGSTER_HOME", raising=False)

    run = run_client("cli", ["demo"], tmp_path)

    assert run.completed.returncode == 0, run.completed.stdout + run.completed.stderr[-3000:]
    assert run.report["jvm_gateway"] is False
    assert run.seen.javas() == [], run.seen.javas()
    lines = {
        line.split()[0]: line
        for line in run.completed.stdout.splitlines()
        if line.startswith("lakehouse.") and "->" in line
    }
    # Compacted, and the WAL's rows added to the tables' (12,000 + 24 files x 200 rows).
    assert "300 -> 5" in lines["lakehouse.logs"] and "12000 -> 16800" in lines["lakehouse.logs"]
    assert "160 -> 4" in lines["lakehouse.spans"] and "6400 -> 8320" in lines["lakehouse.spans"]
    assert "80 -> 1" in lines["lakehouse.orders"]
    assert all(line.rstrip().endswith("ok") for line in lines.values()), lines
    wal = tmp_path / ".icegate" / "wal"
    assert [p for p in wal.rglob("*.parquet")] == []  # ingested, none quarantined
    data = next((tmp_path / ".icegate" / "warehouse").glob("lakehouse*/logs/data"))
    assert not (data / "00000-failed-write-orphan.parquet").exists()
    assert (data / "00000-write-in-progress.parquet").exists()


def test_stopping_a_remote_session_gives_the_process_back_to_local_spark(
    spark_connect: ConnectServer, tmp_path: Path
) -> None:
    """PySpark's functions follow a process-wide Connect flag: set while a run's remote
    session lives, unset once it stops, so a local session started later in the same
    process (the next test, a notebook) works."""
    lh = remote_lakehouse(tmp_path / "lakehouse", spark_connect, "unused")
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
    try:
        from pyspark.sql import functions as F

        spark = get_spark(lh.config)
        assert os.environ["SPARK_CONNECT_MODE_ENABLED"] == "1"
        assert spark.range(3).select(F.col("id") * 2).collect()[-1][0] == 4
    finally:
        stop_spark()
    assert "SPARK_CONNECT_MODE_ENABLED" not in os.environ
