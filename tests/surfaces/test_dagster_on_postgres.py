"""The production instance of docs/deploy.md: ``deploy/dagster.yaml`` with PostgreSQL storage.

A real PostgreSQL server on loopback; the instance is loaded from the shipped file
with its ``{env: ...}`` values pointed at that server, and ``maintenance_job`` runs on it.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from icegate_dagster.assets.partition_events import MAINTAINED_TABLE
from tests.dagster.conftest import run_maintenance
from tests.lakehouse import LakehouseFactory
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
    from icegate_dagster.partitions import iceberg_tables
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.runs import MAINTENANCE_TAG
    from icegate_dagster.sensors import table_health_sensor
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
