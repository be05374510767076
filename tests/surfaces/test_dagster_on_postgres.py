"""The production instance of docs/how-to/deploy.md: ``deploy/dagster.yaml`` with PostgreSQL
storage.

A real PostgreSQL server on loopback; the instance is loaded from the shipped file
with its ``{env: ...}`` values pointed at that server, and ``maintenance_job`` runs on it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from icegate_dagster.assets.names import MAINTAINED_TABLE
from tests.dagster.conftest import run_maintenance
from tests.lakehouse import LakehouseFactory, batch
from tests.surfaces.postgres_server import PostgresServer, postgres_server
from tests.webserver import REPO

TABLES = ["lakehouse.logs", "lakehouse.spans"]


@pytest.fixture(scope="module")
def dagster_db() -> Iterator[PostgresServer]:
    with postgres_server(database="dagster", user="dagster") as server:
        yield server


@pytest.fixture
def production_home(
    dagster_db: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """``$DAGSTER_HOME`` holding ``deploy/dagster.yaml`` as shipped, its environment set."""
    home = tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster.yaml", home / "dagster.yaml")
    monkeypatch.setenv("DAGSTER_PG_HOST", dagster_db.host)
    monkeypatch.setenv("DAGSTER_PG_PORT", str(dagster_db.port))
    monkeypatch.setenv("DAGSTER_PG_DB", dagster_db.database)
    monkeypatch.setenv("DAGSTER_PG_USER", dagster_db.user)
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", dagster_db.password)
    return home


def test_maintenance_job_on_the_deploy_instance_stores_runs_in_postgres(
    lakehouse_factory: LakehouseFactory, production_home: Path, dagster_db: PostgresServer
) -> None:
    lakehouse = lakehouse_factory()
    for table in TABLES:
        lakehouse.add_table(table, appends=6)  # 12 small files in 2 partitions

    with dg.DagsterInstance.from_config(str(production_home)) as instance:
        assert type(instance.run_storage).__name__ == "PostgresRunStorage"
        result = run_maintenance(lakehouse, instance, TABLES)
        assert result.success
        run_id = result.run_id

    # A fresh instance from the same file reads the run and each table's record back.
    with dg.DagsterInstance.from_config(str(production_home)) as instance:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        for table in TABLES:
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[table]),
                limit=1,
            ).records
            materialization = records[0].asset_materialization
            assert materialization is not None
            assert materialization.metadata["files_before"].value == 12
            assert materialization.metadata["files_after"].value == 2

    # It is PostgreSQL that holds them, not a SQLite file beside dagster.yaml.
    assert dagster_db.query("SELECT status FROM runs WHERE run_id = %s", (run_id,)) == [
        ("SUCCESS",)
    ]
    stored = dagster_db.query(
        "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
        (run_id, "ASSET_MATERIALIZATION"),
    )
    assert stored[0][0] == len(TABLES) + 1  # each table, then maintenance_log
    assert not any(p.suffix == ".db" for p in production_home.rglob("*"))


def test_a_sensors_batch_run_on_the_deploy_instance_records_each_table_in_postgres(
    lakehouse_factory: LakehouseFactory, production_home: Path, dagster_db: PostgresServer
) -> None:
    """The health sensor's request, run on the production instance: one run, each table its
    own materialization and checks, stored in PostgreSQL; the run carries the tag the
    instance's limit on maintenance runs counts."""
    from icegate_dagster.assets.names import MAINTENANCE_TAG, iceberg_tables
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from tests.dagster.conftest import run_request

    tables = ["lakehouse.batch_a", "lakehouse.batch_b"]  # never maintained on this instance
    lakehouse = lakehouse_factory(maintain={"health": {"small_files": 5}})
    for table in tables:
        lakehouse.add_table(table, appends=6)

    with dg.DagsterInstance.from_config(str(production_home)) as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, tables)
        context = dg.build_sensor_context(
            instance=instance,
            resources={"lakehouse": LakehouseResource(config_path=str(lakehouse.config_path))},
        )
        tick = table_health_sensor(context)
        assert isinstance(tick, dg.SensorResult)
        [request] = tick.run_requests or []
        result = run_request(request, lakehouse, instance)
        assert result.success
        run = instance.get_run_by_id(result.run_id)
        assert run is not None and run.tags[MAINTENANCE_TAG] == "spark"

    stored = dagster_db.query(
        "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
        (result.run_id, "ASSET_MATERIALIZATION"),
    )
    assert stored[0][0] == len(tables) + 1  # each table, then maintenance_log
    checks = dagster_db.query(
        "SELECT count(*) FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
        (result.run_id, "ASSET_CHECK_EVALUATION"),
    )
    assert checks[0][0] == 6 * len(tables)


def test_cli_passes_and_the_health_sensors_records_on_the_deploy_instance(
    lakehouse_factory: LakehouseFactory,
    production_home: Path,
    dagster_db: PostgresServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two CLI passes over one table, recorded in PostgreSQL as two runs whose check
    evaluations each judge that pass's materialization; then the health sensor's ticks,
    stored as the daemon stores them, record a table's change of health once."""
    from icegate_dagster.assets.names import CLI_PASS_JOB, iceberg_tables
    from icegate_dagster.cli.dispatch import run_cli
    from icegate_dagster.resources import LakehouseResource
    from tests.dagster.conftest import health_tick

    table, idle = "lakehouse.cli_pg", "lakehouse.idle_pg"
    lakehouse = lakehouse_factory()
    lakehouse.add_table(table, appends=6)
    lakehouse.add_table(idle, appends=1)
    monkeypatch.setenv("DAGSTER_HOME", str(production_home))
    for command in ("run", "optimize"):
        assert run_cli([command, "--config", str(lakehouse.config_path), "--table", table]) == 0

    runs = dagster_db.query(
        "SELECT run_id, status FROM runs WHERE pipeline_name = %s ORDER BY create_timestamp",
        (CLI_PASS_JOB,),
    )
    assert [status for _, status in runs] == ["SUCCESS", "SUCCESS"]
    for run_id, _ in runs:
        [(materialization_id,)] = dagster_db.query(
            "SELECT id FROM event_logs WHERE run_id = %s AND dagster_event_type = %s",
            (run_id, "ASSET_MATERIALIZATION"),
        )
        judged = dagster_db.query(
            "SELECT check_name, execution_status, materialization_event_storage_id "
            "FROM asset_check_executions WHERE run_id = %s AND partition = %s",
            (run_id, table),
        )
        assert len(judged) == 6
        assert {target for _, _, target in judged} == {materialization_id}
        assert {status for _, status, _ in judged} == {"SUCCEEDED"}

    resource = LakehouseResource(config_path=str(lakehouse.config_path))
    with dg.DagsterInstance.from_config(str(production_home)) as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, [idle])
        # (Earlier tests' tables share this database, as partitions of other lakehouses.)
        first, cursor = health_tick(instance, resource, None)
        [assessed] = [e for e in first.asset_events if e.partition == idle]
        assert isinstance(assessed, dg.AssetMaterialization)
        assert [e for e in first.asset_events if e.partition == table] == []  # the CLI's
        with lakehouse.table(idle).transaction() as change:
            change.set_properties({"icegate.health.min_score": "100"})  # a new threshold...
        lakehouse.table(idle).append(batch(50_000, ("api", "web")))  # ...a second file fails
        second, cursor = health_tick(instance, resource, cursor)
        third, cursor = health_tick(instance, resource, cursor)
    changed = [e for e in second.asset_events if e.partition == idle]
    assert len(changed) == 1 and isinstance(changed[0], dg.AssetObservation)
    assert [e for e in third.asset_events if e.partition in (idle, table)] == []
    observed = dagster_db.query(
        "SELECT count(*) FROM event_logs WHERE dagster_event_type = %s AND partition = %s",
        ("ASSET_OBSERVATION", idle),
    )
    assert observed[0][0] == 1
