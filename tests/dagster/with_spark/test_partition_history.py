"""Every table's real state in Dagster, whoever maintained it.

* The health sensor records each table's health when it changes, never per tick: run-less
  observations with the health keys a run's materialization carries, and an assessment
  (a materialization) of a healthy table no one maintained, so it is not "Missing".
* A CLI pass with a Dagster instance configured records each table as a run does.
* Every check evaluation of a run or CLI pass names the materialization it judges, so the
  checks' Partitions tabs (read here through the webserver's GraphQL, as the UI reads
  them) show each table Passed or Failed, not Missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.names import (
    ASSESSMENT_SOURCE,
    CLI_PASS_JOB,
    CLI_RUN_TAG,
    CLI_SOURCE,
    LAKEHOUSE_HEALTH,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    iceberg_tables,
)
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance.health.checks import CHECK_NAMES
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import (
    BUSY,
    IDLE,
    OLD,
    health_lakehouse,
    health_tick,
    launch,
    run_maintenance,
    run_request,
)
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.webserver import graphql, make_dagster_home, running_webserver

MIN_SCORE = 70.0  # BUSY (6 small files a partition, due at 5) scores 60: unhealthy
BUSY2 = "lakehouse.busy2"
#: 3 small files a partition: not due (5), scoring about 80, healthy under MIN_SCORE.
MID = "lakehouse.mid"
STATUS_QUERY = """
{ assetNodes(assetKeys: [{path: ["maintained_table"]}]) {
    assetPartitionStatuses {
      ... on DefaultPartitionStatuses { materializedPartitions unmaterializedPartitions }
    }
    assetChecksOrError { ... on AssetChecks { checks {
      name
      partitionStatuses { ... on AssetCheckDefaultPartitionStatuses {
        succeededPartitions failedPartitions
      } }
    } } }
} }
"""


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    return health_lakehouse(
        lakehouse_factory,
        health={"small_files": 5, "expirable_snapshots": 1, "min_score": MIN_SCORE},
        trigger={"max_tables": 1},
    )


def _resource(lh: Lakehouse) -> LakehouseResource:
    return LakehouseResource(config_path=str(lh.config_path))


def _per_table(result: dg.SensorResult) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for event in result.asset_events:
        if event.asset_key == MAINTAINED_TABLE:
            assert event.partition not in found, "one event per table and tick"
            found[event.partition] = event
    return found


def _values(event: Any) -> dict[str, Any]:
    return {key: value.value for key, value in event.metadata.items()}


def _page(instance: dg.DagsterInstance, key: str) -> dict[str, Any]:
    """What the partition's page shows first: the newer of its latest materialization and
    latest observation, as metadata values."""
    where = dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key])
    records = [
        *instance.fetch_materializations(where, limit=1).records,
        *instance.fetch_observations(where, limit=1).records,
    ]
    newest = max(records, key=lambda r: r.storage_id)
    return _values(newest.asset_event)


def test_health_is_recorded_per_table_when_it_changes_and_never_per_tick(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    lh.add_table(BUSY2, appends=6)  # as unhealthy as BUSY, after it in the budget's order
    lh.add_table(MID, appends=3)
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, BUSY2, IDLE, MID, OLD])
    resource = _resource(lh)

    first, cursor = health_tick(instance, resource, None)

    # The budget (max_tables 1) requests BUSY: its run will record it. Every other table,
    # never maintained, gets an assessment of its partition, its state now, unhealthy or
    # not, so none is "Missing" and each page says how healthy it is.
    assert [t["table"] for r in first.run_requests or [] for t in _tables(r)] == [BUSY]
    events = _per_table(first)
    assert set(events) == {BUSY2, IDLE, MID, OLD}
    for key, event in events.items():
        assert isinstance(event, dg.AssetMaterialization)
        assert event.tags[SOURCE_TAG] == ASSESSMENT_SOURCE
        values = _values(event)
        assert values["files_after"] == len(lh.table(key).inspect.files())
        assert values["recorded_by"].startswith("table_health_sensor, from Iceberg metadata")
        assert values["healthy"] == (values["health_score"] >= MIN_SCORE)
    busy, idle = _values(events[BUSY2]), _values(events[IDLE])
    assert busy["healthy"] is False and busy["due_operations"] == "optimize"
    assert "6 small files" in busy["why"] and busy["health_score"] < MIN_SCORE
    assert idle["healthy"] is True and idle["due_operations"] == "none"
    status = instance.get_status_by_partition(
        MAINTAINED_TABLE, [BUSY2, IDLE, MID, OLD], iceberg_tables
    )
    assert status is not None and None not in status.values()

    # The daemon queues BUSY's run. Nothing changed: nothing is recorded, per table or for
    # the lakehouse. (An assessment is not maintenance: BUSY2 waited for the budget, not
    # for min_interval, and its turn comes now.)
    [busy_request] = first.run_requests or []
    busy_run = launch(instance, busy_request)
    second, cursor = health_tick(instance, resource, cursor)
    assert second.asset_events == []
    [busy2_request] = second.run_requests or []
    assert [t["table"] for t in _tables(busy2_request)] == [BUSY2]
    launch(instance, busy2_request)

    # MID's own threshold rises above its score: exactly one event, an observation of its
    # new verdict, which its page now shows first. (OLD's turn comes: its run is queued.)
    with lh.table(MID).transaction() as change:
        change.set_properties({"icegate.health.min_score": "90"})
    third, cursor = health_tick(instance, resource, cursor)
    [(key, changed)] = _per_table(third).items()
    assert key == MID and isinstance(changed, dg.AssetObservation)
    assert _page(instance, MID)["healthy"] is False
    assert "fails below 90" in (changed.description or "")
    assert [e for e in third.asset_events if e.asset_key == LAKEHOUSE_HEALTH]
    [old_request] = third.run_requests or []
    assert [t["table"] for t in _tables(old_request)] == [OLD]
    launch(instance, old_request)

    # The run maintains BUSY and records its health: the sensor repeats none of it, and
    # BUSY's page shows the run's verdict. (BUSY2, whose run waits, gets nothing either.)
    instance.report_run_canceled(busy_run)  # executed here in its stead
    assert run_request(busy_request, lh, instance).success
    fourth, cursor = health_tick(instance, resource, cursor)
    assert _per_table(fourth) == {}
    assert not fourth.run_requests
    assert _page(instance, BUSY)["healthy"] is True


def _tables(request: dg.RunRequest) -> list[dict[str, Any]]:
    config: Any = request.run_config
    return list(config["ops"]["plan_batch"]["config"]["tables"])


def test_a_cli_pass_is_recorded_in_the_configured_instance_as_a_run_records_it(
    lh: Lakehouse,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    home = make_dagster_home(tmp_path / "home")
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    files_before = len(lh.table(BUSY).inspect.files())

    code = run_cli(["run", "--config", str(lh.config_path), "--table", BUSY])

    assert code == 0
    out = capsys.readouterr().out
    assert "recorded 1 tables as materializations of maintained_table" in out
    with dg.DagsterInstance.from_config(str(home)) as instance:
        # Not discovered yet: the CLI made the table a partition to record it under.
        assert list(instance.get_dynamic_partitions(iceberg_tables.name)) == [BUSY]
        [record] = instance.fetch_materializations(MAINTAINED_TABLE, limit=10).records
        materialization = record.asset_materialization
        assert materialization is not None and record.partition_key == BUSY
        run = instance.get_run_by_id(record.run_id)
        assert run is not None and run.job_name == CLI_PASS_JOB
        assert run.status == dg.DagsterRunStatus.SUCCESS
        assert run.tags[SOURCE_TAG] == CLI_SOURCE
        cli_run_id = run.tags[CLI_RUN_TAG]
        assert materialization.tags == {SOURCE_TAG: CLI_SOURCE, CLI_RUN_TAG: cli_run_id}
        metadata = _values(materialization)
        assert metadata["files_before"] == files_before
        assert metadata["files_after"] == len(lh.table(BUSY).inspect.files()) < files_before
        assert metadata["optimize_status"] == "completed"
        assert metadata["healthy"] is True
        assert metadata["recorded_by"] == f"icegate-maintain, run {cli_run_id}"
        # The log rows carry the same run id.
        assert {r["run_id"] for r in lh.log_rows()} == {cli_run_id}

    # A second pass records again (a new run); a dry run records nothing.
    assert run_cli(["optimize", "--config", str(lh.config_path), "--table", BUSY]) == 0
    assert run_cli(["run", "--config", str(lh.config_path), "--table", IDLE, "--dry-run"]) == 0
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(MAINTAINED_TABLE, limit=10).records
        assert [r.partition_key for r in records] == [BUSY, BUSY]
        assert len({r.run_id for r in records}) == 2
    # A --dagster-home that is not a folder is refused before anything runs; a
    # $DAGSTER_HOME that is not one gets a warning, and the pass runs unrecorded.
    missing = tmp_path / "no-such-home"
    args = ["run", "--config", str(lh.config_path), "--table", IDLE]
    capsys.readouterr()
    assert run_cli([*args, "--dagster-home", str(missing)]) == 2
    assert f"--dagster-home = '{missing}': not a folder" in capsys.readouterr().err
    assert {r["table_name"] for r in lh.log_rows()} == {BUSY}
    monkeypatch.setenv("DAGSTER_HOME", str(missing))
    assert run_cli(args) == 0
    warned = capsys.readouterr().err
    assert f"$DAGSTER_HOME = '{missing}': not a folder" in warned
    assert "the pass is not recorded" in warned
    assert {r["table_name"] for r in lh.log_rows()} == {BUSY, IDLE}


def _statuses(port: int) -> tuple[dict[str, list[str]], dict[str, dict[str, list[str]]]]:
    [node] = graphql(port, STATUS_QUERY)["assetNodes"]
    checks = {
        check["name"]: check["partitionStatuses"] for check in node["assetChecksOrError"]["checks"]
    }
    return node["assetPartitionStatuses"], checks


def test_the_ui_shows_every_check_of_every_table_however_it_was_maintained(
    lh: Lakehouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of maintained_table over two tables (a range, as the schedule's) and a CLI
    pass: the UI counts each check on each of them Passed or Failed, none Missing; the
    healthy table no one maintained is materialized (assessed), its checks not judged."""
    home = make_dagster_home(tmp_path / "home")
    extra = "lakehouse.extra"
    lh.add_table(extra, appends=6)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert run_maintenance(lh, instance, [BUSY, OLD]).success
        instance.add_dynamic_partitions(iceberg_tables.name, [IDLE, extra])
        monkeypatch.setenv("DAGSTER_HOME", str(home))
        assert run_cli(["optimize", "--config", str(lh.config_path), "--table", extra]) == 0
        monkeypatch.delenv("DAGSTER_HOME")
        health_tick(instance, _resource(lh), None)  # IDLE: an assessment
    with running_webserver(home, lh.config_path, tmp_path / "webserver.log") as (port, _):
        partitions, checks = _statuses(port)
    everything = {BUSY, OLD, IDLE, extra}
    assert set(partitions["materializedPartitions"]) == everything
    assert partitions["unmaterializedPartitions"] == []
    maintained = {BUSY, OLD, extra}
    for name in CHECK_NAMES:
        judged = set(checks[name]["succeededPartitions"]) | set(checks[name]["failedPartitions"])
        assert judged == maintained, (name, checks[name])
    assert set(checks["ops_succeeded"]["succeededPartitions"]) == maintained
    assert set(checks["rows_preserved"]["succeededPartitions"]) == maintained
