"""The health sensor's check verdicts where Dagster shows them: on a real temporary Dagster
instance over a real lakehouse (pyiceberg, SQLite catalog, no JVM), each table's
``healthy``, ``small_files``, ``snapshot_count`` and ``wal_backlog`` verdicts reach the
checks' per-partition status (what each check's Partitions view shows), and are recorded
again only when one changes."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest
from dagster._core.event_api import PartitionKeyFilter

from icegate_dagster.assets.names import HEALTH_CHECKS_JOB, MAINTAINED_TABLE, iceberg_tables
from icegate_dagster.maintenance.health.checks import METADATA_CHECKS
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.healing import is_maintenance_run
from icegate_dagster.sensors.health_sensor import table_health_sensor
from tests.lakehouse import Lakehouse, LakehouseFactory

#: Four small files in each of two partitions: a score of 88.2, under the lakehouse's
#: ``min_score`` of 90, with nothing due (``optimize`` waits for 12 in a partition).
UNHEALTHY = ["lakehouse.u1", "lakehouse.u2", "lakehouse.u3"]
#: One file per partition: a score of 100.
HEALTHY = [f"lakehouse.h{i}" for i in range(5)]
#: Healthy, with more snapshots than its ``checks.max_snapshots``.
SNAPSHOTS = "lakehouse.snapshots"


def verdict_lakehouse(factory: LakehouseFactory) -> Lakehouse:
    lh = factory(
        maintain={
            "health": {"min_score": 90},
            "tables": {SNAPSHOTS: {"checks": {"max_snapshots": 1}}},
        }
    )
    for key in UNHEALTHY:
        lh.add_table(key, appends=4)
    for key in [*HEALTHY, SNAPSHOTS]:
        lh.add_table(key, appends=1)
    lh.table(SNAPSHOTS).append(lh.table(SNAPSHOTS).scan().to_arrow().slice(0, 0))
    return lh


def daemon_tick(
    instance: dg.DagsterInstance, lh: Lakehouse, cursor: str | None
) -> tuple[dg.SensorResult, str | None]:
    """One tick as the daemon runs it: partitions added, asset events stored, cursor kept."""
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
        cursor=cursor,
    )
    result = table_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result, result.cursor if result.cursor is not None else cursor


def check_statuses(instance: dg.DagsterInstance, check: str) -> dict[str, str]:
    """Each partition's status for ``check`` as its Partitions view shows it: the latest
    evaluation's, where it judges the partition's latest materialization."""
    key = dg.AssetCheckKey(MAINTAINED_TABLE, check)
    infos = instance.event_log_storage.get_asset_check_partition_info([key])
    return {
        info.partition_key: info.latest_execution_status.value
        for info in infos
        if info.partition_key is not None and info.is_current
    }


def evaluations(instance: dg.DagsterInstance) -> int:
    """Every check evaluation stored, of every check."""
    return sum(
        len(
            instance.event_log_storage.get_asset_check_execution_history(
                dg.AssetCheckKey(MAINTAINED_TABLE, name), limit=10_000
            )
        )
        for name in METADATA_CHECKS
    )


def _settle(instance: dg.DagsterInstance, lh: Lakehouse) -> tuple[str | None, list[Any]]:
    """Ticks until one records nothing new (at most 4); returns the cursor and results."""
    cursor, results = None, []
    for _ in range(4):
        before = evaluations(instance)
        result, cursor = daemon_tick(instance, lh, cursor)
        results.append(result)
        if evaluations(instance) == before and not result.asset_events:
            break
    return cursor, results


def test_healthy_check_fails_exactly_for_the_unhealthy_tables(
    instance: dg.DagsterInstance, lakehouse_factory: LakehouseFactory
) -> None:
    lh = verdict_lakehouse(lakehouse_factory)
    _, results = _settle(instance, lh)
    assert all(not r.run_requests for r in results)  # nothing due: the sensor records them

    healthy = check_statuses(instance, "healthy")
    assert healthy == {
        **{key: "FAILED" for key in UNHEALTHY},
        **{key: "SUCCEEDED" for key in [*HEALTHY, SNAPSHOTS]},
    }
    snapshot_count = check_statuses(instance, "snapshot_count")
    assert {k for k, v in snapshot_count.items() if v == "FAILED"} == {SNAPSHOTS}
    for check in ("small_files", "wal_backlog"):
        assert set(check_statuses(instance, check).values()) == {"SUCCEEDED"}, check
        assert len(check_statuses(instance, check)) == len(UNHEALTHY) + len(HEALTHY) + 1

    # A failed verdict says why, as a run's evaluation does.
    history = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(MAINTAINED_TABLE, "healthy"),
        limit=1,
        partition_filter=PartitionKeyFilter(key=UNHEALTHY[0]),
    )
    evaluation = history[0].evaluation
    assert evaluation is not None and not evaluation.passed
    assert evaluation.description is not None
    assert evaluation.description.startswith("score 88.2 (fails below 90)")
    assert evaluation.severity == dg.AssetCheckSeverity.WARN


def test_a_tick_with_nothing_changed_records_no_evaluation_and_no_run(
    instance: dg.DagsterInstance, lakehouse_factory: LakehouseFactory
) -> None:
    lh = verdict_lakehouse(lakehouse_factory)
    cursor, _ = _settle(instance, lh)
    stored, runs = evaluations(instance), len(instance.get_runs())
    assert stored == 4 * (len(UNHEALTHY) + len(HEALTHY) + 1)

    result, _ = daemon_tick(instance, lh, cursor)
    assert evaluations(instance) == stored
    assert len(instance.get_runs()) == runs
    assert not [e for e in result.asset_events if e.asset_key == MAINTAINED_TABLE]


def test_a_changed_verdict_is_recorded_again(
    instance: dg.DagsterInstance, lakehouse_factory: LakehouseFactory
) -> None:
    lh = verdict_lakehouse(lakehouse_factory)
    _settle(instance, lh)
    healed = UNHEALTHY[0]
    # An operator lowers the bar for one table: its verdict changes, the others' do not.
    raw = lh.config_path.read_text().replace(
        "tables:", f"tables:\n    {healed}:\n      health:\n        min_score: 50"
    )
    lh.config_path.write_text(raw)
    runs = {r.run_id for r in instance.get_runs()}
    before = evaluations(instance)
    _settle(instance, lh)

    assert check_statuses(instance, "healthy")[healed] == "SUCCEEDED"
    assert {k for k, v in check_statuses(instance, "healthy").items() if v == "FAILED"} == set(
        UNHEALTHY[1:]
    )
    assert evaluations(instance) == before + len(METADATA_CHECKS)
    new_runs = [r for r in instance.get_runs() if r.run_id not in runs]
    assert [r.job_name for r in new_runs] == [HEALTH_CHECKS_JOB]
    # A maintenance run to the healer: one whose process died is failed like any other.
    assert is_maintenance_run(new_runs[0]) and new_runs[0].is_success


def test_dagster_stores_one_run_less_evaluation_per_partition_and_check(
    instance: dg.DagsterInstance,
) -> None:
    """Why the verdicts are recorded in a run (``assets.partition_checks``): Dagster 1.13's
    unique index on (asset key, check, run id, partition) holds every run-less evaluation
    under the same empty run id, so a partition's second one cannot be stored. When a
    Dagster release lifts this, this test fails: record them run-less then."""
    instance.add_dynamic_partitions(iceberg_tables.name, [HEALTHY[0]])

    def report(passed: bool) -> None:
        instance.report_runless_asset_event(
            dg.AssetCheckEvaluation(
                asset_key=MAINTAINED_TABLE,
                check_name="healthy",
                passed=passed,
                partition=HEALTHY[0],
            )
        )

    report(True)
    with pytest.raises(Exception, match="UNIQUE constraint failed: asset_check_executions"):
        report(False)
    assert check_statuses(instance, "healthy") == {HEALTHY[0]: "SUCCEEDED"}
