"""A full maintenance pass over a lakehouse whose catalog lives in a real PostgreSQL server.

The server runs on loopback for this module only. The config names the catalog
password only as ``${ICEGATE_TEST_PG_PASSWORD}``; pyiceberg, Spark's JDBC catalog
and the table leases all reach the same database with it. A second lakehouse in the same
server holds a merge-on-read table (Spark ``DELETE`` and ``UPDATE``) that one pass leaves
with no delete file and the same rows, then has its orphans collected and deleted later.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icegate_dagster.catalog import open_catalog
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer, TableRef, TableResult
from icegate_dagster.maintenance.health.checks import evaluate_health
from icegate_dagster.maintenance.leases.store import LEASE_TABLE
from icegate_dagster.maintenance.orphans.candidates import candidates_table, read_candidates
from icegate_dagster.maintenance.wal import WalStats
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, batch
from tests.surfaces.postgres_server import (
    PostgresServer,
    captured_output,
    make_postgres_lakehouse,
    postgres_server,
)

PASSWORD_ENV = "ICEGATE_TEST_PG_PASSWORD"
RETAIN_LAST = 2
TABLES = ("lakehouse.logs", "lakehouse.orders")


@dataclass
class PostgresPass:
    """The lakehouse, its server, and what one full pass did to it."""

    server: PostgresServer
    lakehouse: Lakehouse
    rows_before: dict[str, Counter[tuple[Any, ...]]]
    results: dict[str, TableResult]
    run_id: str
    output: str


@pytest.fixture(scope="module")
def pg_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server on 127.0.0.1 for this module; stopped and deleted afterwards."""
    with postgres_server() as server:
        yield server


@pytest.fixture(scope="module")
def pg_pass(
    pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PostgresPass]:
    """Two small-file tables, an old orphan and a young file; one full pass, output captured."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PASSWORD_ENV, pg_server.password)
        lh = make_postgres_lakehouse(
            tmp_path_factory.mktemp("pg_lakehouse"),
            pg_server,
            PASSWORD_ENV,
            maintain={
                "expire_snapshots": {"retention_threshold": "1s", "retain_last": RETAIN_LAST}
            },
        )
        try:
            lh.add_table("lakehouse.logs", appends=8, services=("api", "web", "auth"))
            lh.add_table("lakehouse.orders", appends=6, services=("shop",))
            lh.planted["old"] = lh.plant_file(
                "lakehouse.logs", "old-orphan.parquet", timedelta(days=30)
            )
            lh.planted["young"] = lh.plant_file(
                "lakehouse.logs", "young.parquet", timedelta(hours=1)
            )
            rows_before = {key: lh.rows_without_spark(key) for key in TABLES}
            time.sleep(1.2)  # every snapshot so far is now older than the 1s threshold
            with captured_output() as output:
                maintainer = Maintainer(lh.config)
                results = maintainer.maintain(maintainer.discover())
            yield PostgresPass(
                pg_server,
                lh,
                rows_before,
                {r.table: r for r in results},
                maintainer.run_id,
                "\n".join(output),
            )
        finally:
            engine = getattr(lh.catalog, "engine", None)
            if engine is not None:
                engine.dispose()


def test_config_names_the_password_only_through_the_environment(pg_pass: PostgresPass) -> None:
    text = pg_pass.lakehouse.config_path.read_text()
    assert "${" + PASSWORD_ENV + "}" in text
    assert pg_pass.server.password not in text
    assert pg_pass.lakehouse.config.catalog.properties["uri"].startswith("postgresql+psycopg2://")


def test_every_op_completed(pg_pass: PostgresPass) -> None:
    assert sorted(pg_pass.results) == list(TABLES)
    logs = pg_pass.results["lakehouse.logs"]
    assert [(op.operation, op.status) for op in logs.ops] == [
        ("optimize", "completed"),
        ("rewrite_position_delete_files", "skipped"),  # no delete files
        ("rewrite_manifests", "completed"),
        ("expire_snapshots", "completed"),
        ("remove_orphan_files", "completed"),
    ], logs.as_dict()
    orders = pg_pass.results["lakehouse.orders"]
    assert all(op.ok for op in orders.ops), orders.as_dict()
    assert all(r.error is None for r in pg_pass.results.values())


def test_data_files_drop_and_rows_are_identical(pg_pass: PostgresPass) -> None:
    lh = pg_pass.lakehouse
    assert len(lh.table("lakehouse.logs").inspect.files()) == 3  # was 24: one per partition
    assert len(lh.table("lakehouse.orders").inspect.files()) == 1  # was 6
    logs = pg_pass.results["lakehouse.logs"]
    assert logs.before is not None and logs.before.data_files == 24
    for key, before in pg_pass.rows_before.items():
        assert sum(before.values()) > 0
        assert lh.rows_without_spark(key) == before  # same rows, as multisets
        for path in lh.data_file_paths(key):
            assert path.exists(), path


def test_snapshots_expired(pg_pass: PostgresPass) -> None:
    for key in TABLES:
        result = pg_pass.results[key]
        assert result.before is not None and result.before.snapshots >= 6
        assert len(pg_pass.lakehouse.table(key).metadata.snapshots) == RETAIN_LAST


def test_old_orphan_removed_young_file_kept(pg_pass: PostgresPass) -> None:
    assert not pg_pass.lakehouse.planted["old"].exists()
    assert pg_pass.lakehouse.planted["young"].exists()
    orphan_op = pg_pass.results["lakehouse.logs"].op("remove_orphan_files")
    assert orphan_op is not None
    assert [Path(p).name for p in orphan_op.output["orphan_files"]] == ["old-orphan.parquet"]


def test_log_rows_landed_in_the_postgres_catalog(pg_pass: PostgresPass) -> None:
    rows = [r for r in pg_pass.lakehouse.log_rows() if r["run_id"] == pg_pass.run_id]
    assert len(rows) == 10  # 5 ops x 2 tables
    by_key = {(r["table_name"], r["operation"]): r for r in rows}
    optimize = by_key[("lakehouse.logs", "optimize")]
    assert (optimize["status"], optimize["files_before"], optimize["files_after"]) == (
        "completed",
        24,
        3,
    )
    assert by_key[("lakehouse.logs", "remove_orphan_files")]["status"] == "completed"
    # The log table, like the maintained ones, is registered in the PostgreSQL database.
    registered = pg_pass.server.query(
        "SELECT table_namespace, table_name FROM iceberg_tables WHERE catalog_name = %s",
        (pg_pass.lakehouse.config.catalog.name,),
    )
    assert sorted(registered) == [
        ("lakehouse", "_maintenance_log"),
        ("lakehouse", "logs"),
        ("lakehouse", "orders"),
    ]


def test_lease_table_lives_in_the_postgres_database(pg_pass: PostgresPass) -> None:
    columns = pg_pass.server.query(
        "SELECT column_name FROM information_schema.columns WHERE table_name = %s "
        "ORDER BY ordinal_position",
        (LEASE_TABLE,),
    )
    assert [c for (c,) in columns] == [
        "table_name",
        "token",
        "holder",
        "acquired_at",
        "expires_at",
    ]
    # Every lease taken during the pass was given back.
    assert pg_pass.server.query(f"SELECT table_name, holder FROM {LEASE_TABLE}") == []


def test_password_reaches_no_output_and_no_log_row(
    pg_pass: PostgresPass, capfd: pytest.CaptureFixture[str]
) -> None:
    config = ["--config", str(pg_pass.lakehouse.config_path)]
    # A second pass through the CLI: safe to re-run, and its output is checked too.
    assert run_cli(["run", *config]) == 0
    assert run_cli(["status", *config, "--json"]) == 0
    captured = capfd.readouterr()
    assert "lakehouse.logs" in captured.out
    haystacks = {
        "output of the pass": pg_pass.output,
        "cli output": captured.out + captured.err,
        "results": json.dumps([r.as_dict() for r in pg_pass.results.values()], default=str),
        "log table": json.dumps(pg_pass.lakehouse.log_rows(), default=str),
    }
    assert len(haystacks["log table"]) > 1000
    for where, text in haystacks.items():
        assert pg_pass.server.password not in text, f"the catalog password leaked into the {where}"


def test_missing_password_variable_fails_clearly(
    pg_pass: PostgresPass, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(PASSWORD_ENV)
    assert run_cli(["status", "--config", str(pg_pass.lakehouse.config_path)]) == 2
    assert f"${{{PASSWORD_ENV}}}, which is not set" in capsys.readouterr().err


# --- delete files and deferred orphan deletion on the PostgreSQL catalog -----------------

MOR_TABLE = "lakehouse.events"
MONTH = timedelta(days=30)


@dataclass
class MergeOnReadPass:
    """A merge-on-read table after Spark's ``DELETE`` and ``UPDATE``, and one pass over it."""

    server: PostgresServer
    lakehouse: Lakehouse
    delete_files_before: int
    #: The rows a reader must see, derived from what pyiceberg wrote (no engine involved).
    rows_expected: Counter[tuple[Any, ...]]
    #: The rows Spark read before the pass (deletes applied on read).
    spark_rows_before: Counter[tuple[Any, ...]]
    records_before: int
    result: TableResult


def _delete_files(lh: Lakehouse, key: str) -> int:
    """Delete files of the current snapshot, from Iceberg's own ``delete_files`` table (Spark)."""
    name = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    [row] = get_spark(lh.config).sql(f"SELECT count(*) FROM {name}.delete_files").collect()
    return int(row[0])


@pytest.fixture(scope="module")
def pg_mor(
    pg_server: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[MergeOnReadPass]:
    """A second lakehouse (its own catalog name) in the same server: a table written by
    pyiceberg, switched to merge-on-read, then ``DELETE``d and ``UPDATE``d by Spark SQL."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv(PASSWORD_ENV, pg_server.password)
        lh = make_postgres_lakehouse(tmp_path_factory.mktemp("pg_mor"), pg_server, PASSWORD_ENV)
        try:
            lh.add_table(MOR_TABLE, appends=6, services=("api", "web"))
            written = lh.rows_without_spark(MOR_TABLE)
            name = TableRef.parse(MOR_TABLE).spark_identifier(lh.config.catalog.name)
            spark = get_spark(lh.config)
            spark.sql(
                f"ALTER TABLE {name} SET TBLPROPERTIES ('write.delete.mode'='merge-on-read', "
                "'write.update.mode'='merge-on-read')"
            )
            spark.sql(f"DELETE FROM {name} WHERE id % 5 = 0")
            spark.sql(f"UPDATE {name} SET body = 'updated' WHERE id % 7 = 3")
            # What a reader must see, derived from what was written (no engine involved).
            expected: Counter[tuple[Any, ...]] = Counter()
            for (row_id, service, stamp, body), count in written.items():
                if row_id % 5 != 0:
                    updated = (row_id, service, stamp, "updated" if row_id % 7 == 3 else body)
                    expected[updated] += count
            ref = TableRef.parse(MOR_TABLE)
            maintainer = Maintainer(lh.config)
            before = maintainer.stats(ref)
            deletes = _delete_files(lh, MOR_TABLE)
            # pyiceberg applies the position deletes on read too.
            assert lh.rows_without_spark(MOR_TABLE) == expected
            spark_rows = lh.rows(MOR_TABLE)
            assert sum(spark_rows.values()) == sum(expected.values())
            result = maintainer.maintain_table(ref)
            yield MergeOnReadPass(pg_server, lh, deletes, expected, spark_rows, before.rows, result)
        finally:
            engine = getattr(lh.catalog, "engine", None)
            if engine is not None:
                engine.dispose()


def test_a_merge_on_read_table_ends_with_no_delete_file_and_the_same_rows(
    pg_mor: MergeOnReadPass,
) -> None:
    lh, result = pg_mor.lakehouse, pg_mor.result
    assert pg_mor.delete_files_before > 0  # Spark wrote position delete files
    statuses = {op.operation: f"{op.status}: {op.details}" for op in result.ops}
    assert result.ok, statuses
    assert statuses["optimize"].startswith("completed"), statuses
    assert _delete_files(lh, MOR_TABLE) == 0
    assert Maintainer(lh.config).stats(TableRef.parse(MOR_TABLE)).delete_files == 0
    # The same rows, as multisets: what Spark read before the pass, and what pyiceberg
    # reads equals the rows derived from what was written.
    assert lh.rows(MOR_TABLE) == pg_mor.spark_rows_before
    assert lh.rows_without_spark(MOR_TABLE) == pg_mor.rows_expected
    # rows_preserved compares live rows: the deleted records it dropped are not a loss.
    checks = evaluate_health(result, lh.config.for_table(MOR_TABLE), WalStats(0, 0))
    [check] = [c for c in checks if c.name == "rows_preserved"]
    live = sum(pg_mor.rows_expected.values())
    assert check.passed, check.description
    assert check.metadata["rows_before"] == check.metadata["rows_after"] == live
    assert pg_mor.records_before > live  # the data files held the deleted rows too


def test_collected_orphans_are_deleted_later_on_the_postgres_catalog(
    pg_mor: MergeOnReadPass, capsys: pytest.CaptureFixture[str]
) -> None:
    """``orphans --collect`` then ``--delete-collected``: the candidates table and the lease
    live in PostgreSQL. The old orphan goes; a candidate registered in between stays."""
    lh = pg_mor.lakehouse
    data = Path(lh.table(MOR_TABLE).location().removeprefix("file://")) / "data"
    old = lh.plant_file(MOR_TABLE, "old-orphan.parquet", MONTH)
    registered = data / "service=api" / "registered-later.parquet"
    pq.write_table(batch(90_000, ("api",)).drop_columns(["service"]), registered)
    stamp = time.time() - MONTH.total_seconds()
    os.utime(registered, (stamp, stamp))
    young = lh.plant_file(MOR_TABLE, "young.parquet", timedelta(hours=1))

    def orphans(flag: str) -> dict[str, Any]:
        config = ["--config", str(lh.config_path), "--table", MOR_TABLE, "--json"]
        code = run_cli(["orphans", flag, *config])  # the fixture set the password variable
        out = capsys.readouterr().out
        assert code == 0, out
        [table] = json.loads(out)["tables"]
        assert isinstance(table, dict)
        return table

    collected = orphans("--collect")
    sizes = {Path(c["path"]).name: c["size_bytes"] for c in collected["candidates"]}
    assert sizes == {
        "old-orphan.parquet": old.stat().st_size,
        "registered-later.parquet": registered.stat().st_size,
    }
    assert old.exists() and registered.exists()  # collecting deletes nothing
    lh.table(MOR_TABLE).add_files([f"file:{registered}"])
    rows = lh.rows_without_spark(MOR_TABLE)

    done = orphans("--delete-collected")

    assert [Path(f["path"]).name for f in done["deleted"]] == ["old-orphan.parquet"]
    assert {Path(k["path"]).name: k["reason"] for k in done["kept"]} == {
        "registered-later.parquet": "referenced"
    }
    assert not old.exists()
    assert registered.exists() and young.exists()
    assert lh.rows_without_spark(MOR_TABLE) == rows
    assert all(path.exists() for path in lh.data_file_paths(MOR_TABLE))
    # The candidates table is registered in the PostgreSQL database, like the tables.
    where = candidates_table(lh.config)
    statuses = {
        Path(r["path"]).name: r["status"] for r in read_candidates(lh.catalog, where, MOR_TABLE)
    }
    assert statuses == {"old-orphan.parquet": "deleted", "registered-later.parquet": "referenced"}
    registered_tables = pg_mor.server.query(
        "SELECT table_namespace, table_name FROM iceberg_tables WHERE catalog_name = %s",
        (lh.config.catalog.name,),
    )
    assert (where.namespace, where.name) in registered_tables
    assert pg_mor.server.query(f"SELECT table_name, holder FROM {LEASE_TABLE}") == []


def test_run_heartbeats_live_in_the_postgres_database_and_a_dead_run_is_failed(
    pg_pass: PostgresPass,
) -> None:
    """Self-healing with the lease store in the catalog's PostgreSQL: a run whose heartbeat
    another process keeps stays ``STARTED``; once that process is killed, the health
    sensor (on the same host) fails the run at its next tick, saying why."""
    import dagster as dg
    import yaml

    from icegate_dagster.assets.names import BATCH_JOB, HEALTH_SENSOR, ICEBERG_TABLES, TRIGGER_TAG
    from icegate_dagster.assets.runs import BatchEntry, batch_run_config
    from icegate_dagster.definitions import defs
    from icegate_dagster.maintenance.leases.store import HEARTBEAT_TABLE
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from tests.lease_holder import beating_in_another_process

    lh = pg_pass.lakehouse
    raw = yaml.safe_load(lh.config_path.read_text())  # ${ICEGATE_TEST_PG_PASSWORD} kept
    raw.setdefault("maintain", {}).setdefault("locks", {})["lease"] = "15s"  # the shortest
    config = lh.config_path.with_name("icegate-short-lease.yaml")
    config.write_text(yaml.safe_dump(raw))
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(ICEBERG_TABLES, list(TABLES))
    run = instance.create_run_for_job(
        defs.resolve_job_def(BATCH_JOB),
        run_config=batch_run_config([BatchEntry("lakehouse.orders", ("optimize",), "s")]),
        tags={TRIGGER_TAG: HEALTH_SENSOR},
        status=dg.DagsterRunStatus.STARTED,
    )

    def tick() -> dg.DagsterRunStatus:
        context = dg.build_sensor_context(
            instance=instance, resources={"lakehouse": LakehouseResource(config_path=str(config))}
        )
        table_health_sensor(context)
        current = instance.get_run_by_id(run.run_id)
        assert current is not None
        return current.status

    with beating_in_another_process(config, run.run_id) as worker:
        time.sleep(4)
        assert (run.run_id,) in pg_pass.server.query(f"SELECT run_id FROM {HEARTBEAT_TABLE}")
        assert tick() == dg.DagsterRunStatus.STARTED
        worker.kill()
        worker.wait()
        assert tick() == dg.DagsterRunStatus.FAILURE  # its process, on this host, is gone

    [event] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    assert event.dagster_event is not None
    assert f"process {worker.pid} on " in str(event.dagster_event.message)
    assert "no longer exists" in str(event.dagster_event.message)
    assert pg_pass.server.password not in str(event.dagster_event.message)


def test_a_password_given_as_a_query_parameter_reaches_no_command_line(
    pg_server: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``?password=`` in the catalog's URI (psycopg2 and PostgreSQL's JDBC driver both read
    it there): pyiceberg, the leases and Spark's JDBC catalog, whose URL is held back from
    spark-submit and set on the running session, all log in with it; a real
    ``icegate-maintain run`` maintains the table, and the password is on no command line,
    in no output and in no log row."""
    from tests.ps_sampler import PsSampler

    monkeypatch.setenv(PASSWORD_ENV, pg_server.password)
    server = pg_server
    uri = (
        f"postgresql+psycopg2://{server.user}@{server.host}:{server.port}/{server.database}"
        f"?password=${{{PASSWORD_ENV}}}"
    )
    raw = {
        "catalog": {
            "name": f"test_pgq_{uuid.uuid4().hex[:8]}",
            "uri": uri,
            "warehouse": (tmp_path / "warehouse").as_uri(),
        },
        "spark": {"master": "local[2]"},
    }
    config_path = tmp_path / "icegate.yaml"
    config_path.write_text(json.dumps(raw))
    config = load_config(config_path)
    lh = Lakehouse(tmp_path, config_path, config, open_catalog(config.catalog))
    try:
        lh.add_table("lakehouse.logs", appends=6)
        env = {k: v for k, v in os.environ.items() if k != "PYSPARK_SUBMIT_ARGS"}
        with PsSampler() as ps:
            done = subprocess.run(  # noqa: S603
                [
                    str(Path(sys.executable).parent / "icegate-maintain"),
                    "run",
                    "--config",
                    str(config_path),
                ],
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=180,
                check=False,
            )
        assert done.returncode == 0, done.stdout + done.stderr
        rows = lh.log_rows()
    finally:
        engine = getattr(lh.catalog, "engine", None)
        if engine is not None:
            engine.dispose()
    statuses = {row["operation"]: row["status"] for row in rows}
    assert statuses["optimize"] == "completed", rows  # Spark's JDBC catalog logged in
    spark_lines = [line for line in ps.lines if "SparkSubmit" in line]
    assert any(f"spark.sql.catalog.{config.catalog.name}" in line for line in spark_lines)
    assert not [line for line in ps.lines if server.password in line]
    assert server.password not in done.stdout + done.stderr
    assert server.password not in json.dumps(rows, default=str)
