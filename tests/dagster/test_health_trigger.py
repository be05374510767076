"""The health trigger on real tables and a temporary Dagster instance: ``table_health_sensor``
requests exactly the due tables with exactly their due operations, never a table with a run
in flight, within its budget, not more often than ``health.min_interval``, backing off
tables whose runs keep failing; ``lakehouse_health`` carries the totals; a maintenance run
records each table's ``health_score`` and its ``healthy`` check."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.lakehouse_health import (
    LAKEHOUSE_HEALTH,
    evaluate_health_trigger,
    lakehouse_health,
)
from icegate_dagster.assets.partition_events import MAINTAINED_TABLE
from icegate_dagster.definitions import defs
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.runs import (
    BATCH_JOB,
    HEALTH_SENSOR,
    STATE_TAG,
    TABLE_TAG,
    TRIGGER_TAG,
    BatchEntry,
    SensorRun,
    batch_entries,
    batch_run_config,
    trigger_history,
)
from icegate_dagster.sensors import table_health_sensor
from tests.dagster.conftest import BUSY, IDLE, OLD, health_lakehouse, resources_for
from tests.lakehouse import Lakehouse, LakehouseFactory, batch

#: A partition whose table is not in the catalog.
GHOST = "lakehouse.ghost"


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    return health_lakehouse(lakehouse_factory)


def _resource(lh: Lakehouse) -> LakehouseResource:
    return LakehouseResource(config_path=str(lh.config_path))


def _tick(lh: Lakehouse, instance: dg.DagsterInstance, cursor: str | None = None) -> Any:
    context = dg.build_sensor_context(
        instance=instance, resources={"lakehouse": _resource(lh)}, cursor=cursor
    )
    result = table_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def _health(result: dg.SensorResult) -> dict[str, Any]:
    """The tick's ``lakehouse_health`` materialization, its metadata as plain values."""
    [event] = [e for e in result.asset_events if e.asset_key == LAKEHOUSE_HEALTH]
    assert isinstance(event, dg.AssetMaterialization)
    return {key: value.value for key, value in event.metadata.items()}


def _entries(request: dg.RunRequest) -> list[BatchEntry]:
    run = dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
    return batch_entries(run)


def _by_table(result: dg.SensorResult) -> dict[str, tuple[dg.RunRequest, BatchEntry]]:
    """Each requested table, with its run request and its entry in that run."""
    return {
        entry.table: (request, entry)
        for request in result.run_requests or []
        for entry in _entries(request)
    }


def _tables(result: dg.SensorResult) -> set[str]:
    return set(_by_table(result))


def _decisions(lh: Lakehouse, instance: dg.DagsterInstance) -> dict[str, str]:
    tables = list(instance.get_dynamic_partitions(iceberg_tables.name))
    now = datetime.now(UTC)
    evaluation = evaluate_health_trigger(instance, _resource(lh), tables, now, seconds=None)
    return evaluation.selection.decisions()


def test_sensor_requests_the_due_tables_with_their_operations_and_a_run_records_health(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE, GHOST])

    first = _tick(lh, instance)

    requested = _by_table(first)
    assert set(requested) == {BUSY, OLD}  # not the healthy table, not the unreadable one
    assert requested[BUSY][1].operations == ("optimize",)
    assert requested[OLD][1].operations == ("expire_snapshots",)
    # Both in one run (one process, one Spark session), each with its own operations.
    [request] = first.run_requests
    assert request.job_name == BATCH_JOB and request.tags[TRIGGER_TAG] == HEALTH_SENSOR
    assert float(request.tags["icegate/need"]) > 0
    health = _health(first)
    assert health["tables"] == 4
    assert health["tables_assessed"] == 3
    assert health["tables_unreadable"] == 1
    assert health["tables_due"] == 2
    assert health["tables_requested"] == 2
    assert health["backlog_tables"] == 0
    assert health["small_files"] >= 12
    assert isinstance(health["mean_score"], float) and health["lowest_score"] < 100
    assert GHOST in health["unreadable_tables"]
    least = health["least_healthy"]
    assert least.index(BUSY) < least.index(OLD) < least.index(IDLE)
    assert "requested" in least and "holds 6 small files" in least

    # A tick while nothing changed asks again with the same run keys: no duplicate runs.
    again = _tick(lh, instance)
    assert sorted(r.run_key for r in again.run_requests) == sorted(
        r.run_key for r in first.run_requests
    )

    # The daemon launches BUSY's part of it: only optimize runs.
    idle_metadata = lh.table(IDLE).metadata_location
    rows_before = lh.rows_without_spark(BUSY)
    busy = requested[BUSY][1]
    result = defs.resolve_job_def(BATCH_JOB).execute_in_process(
        instance=instance,
        run_config=batch_run_config([busy]),
        tags={TRIGGER_TAG: HEALTH_SENSOR, TABLE_TAG: BUSY, STATE_TAG: busy.state or ""},
        resources=resources_for(lh),
    )
    assert result.success
    assert len(lh.table(BUSY).inspect.files()) == 2  # one file per partition
    assert lh.rows_without_spark(BUSY) == rows_before
    assert lh.table(IDLE).metadata_location == idle_metadata
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[BUSY]), limit=1
    ).records[0]
    assert record.asset_materialization is not None
    metadata = record.asset_materialization.metadata
    assert metadata["optimize_status"].value == "completed"
    assert "expire_snapshots_status" not in metadata
    assert isinstance(metadata["health_score"], dg.FloatMetadataValue)
    assert metadata["health_score"].value is not None and metadata["health_score"].value > 90
    assert metadata["due_operations"].value == "none"
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    healthy = checks["healthy"]
    assert healthy.passed is True and healthy.partition == BUSY
    assert healthy.metadata["health_score"].value == metadata["health_score"].value
    assert healthy.metadata["min_score"].value == 50.0
    assert "nothing due" in str(healthy.description)

    # BUSY is healthy now: only OLD is still requested.
    after = _tick(lh, instance)
    assert _tables(after) == {OLD}
    assert _health(after)["tables_due"] == 1

    # 6 more small appends: BUSY is due again, but was maintained moments ago.
    table = lh.table(BUSY)
    for i in range(6):
        table.append(batch(100_000 + i * 1000, ("api",)))
    decisions = _decisions(lh, instance)
    assert decisions[BUSY].startswith("waits: maintained ")
    assert "; next after " in decisions[BUSY]
    # Its own property shortens the interval (policy next to the data): requested again.
    with lh.table(BUSY).transaction() as transaction:
        transaction.set_properties({"icegate.health.min_interval": "1s"})
    time.sleep(1.1)
    soon = _tick(lh, instance)
    assert _tables(soon) == {BUSY, OLD}


def test_a_table_with_a_run_in_flight_gets_no_request(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])
    job = defs.resolve_job_def("maintenance_job")
    queued = instance.create_run_for_job(
        job, tags={"dagster/partition": BUSY}, status=dg.DagsterRunStatus.NOT_STARTED
    )

    one = _tick(lh, instance)

    assert _tables(one) == {OLD}
    assert _decisions(lh, instance)[BUSY] == f"waits: run {queued.run_id} is not_started"

    # A batch run over both (the schedule's range tags): nothing to request, and why.
    batch_run = instance.create_run_for_job(
        job,
        tags={
            "dagster/asset_partition_range_start": BUSY,
            "dagster/asset_partition_range_end": OLD,
        },
        status=dg.DagsterRunStatus.STARTED,
    )
    none = _tick(lh, instance)
    assert not none.run_requests
    message = str(none.skip_reason.skip_message)
    assert "2 due tables wait, a run in flight" in message
    assert f"{OLD} (run {batch_run.run_id} is started)" in message
    assert f"{BUSY} (run {batch_run.run_id} is started)" in message  # the newest run
    assert _health(none)["tables_requested"] == 0

    # Once the runs are over, both are requested.
    instance.report_run_canceled(queued)
    instance.report_run_canceled(batch_run)
    assert _tables(_tick(lh, instance)) == {BUSY, OLD}


def test_the_budget_takes_the_neediest_and_names_the_backlog(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = health_lakehouse(lakehouse_factory, trigger={"max_tables": 1})
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])

    result = _tick(lh, instance)

    assert _tables(result) == {BUSY}  # 6 small files per partition: the neediest
    health = _health(result)
    assert health["tables_requested"] == 1
    assert health["backlog_tables"] == 1
    assert f"| {OLD} |" in health["least_healthy"]
    assert "maintain.trigger.max_tables 1 reached" in health["least_healthy"]
    assert "maintain.trigger.max_tables 1 reached" in _decisions(lh, instance)[OLD]


def test_a_table_whose_runs_keep_failing_backs_off_and_is_reported(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, IDLE])
    job = defs.resolve_job_def(BATCH_JOB)

    def ended(request: dg.RunRequest, status: dg.DagsterRunStatus) -> None:
        instance.create_run_for_job(
            job, run_config=request.run_config, tags=request.tags, status=status
        )

    [first] = _tick(lh, instance).run_requests
    assert first.run_key is not None and first.run_key.endswith(":0")

    # One failed attempt on this state: retried at once, under a new run key.
    ended(first, dg.DagsterRunStatus.FAILURE)
    retried = _tick(lh, instance)
    assert _tables(retried) == {BUSY}
    [retry] = retried.run_requests
    assert retry.tags[STATE_TAG] == first.tags[STATE_TAG]
    assert retry.run_key is not None and retry.run_key.endswith(":1")
    assert retry.run_key != first.run_key

    # Two in a row: it waits (1 minute after the last failure), reported, not retried.
    ended(retry, dg.DagsterRunStatus.FAILURE)
    waiting = _tick(lh, instance)
    assert not waiting.run_requests
    message = str(waiting.skip_reason.skip_message)
    assert f"backing off after failed runs: {BUSY} (its last 2 runs failed; next attempt after" in (
        message
    )
    assert "1 tables healthy" in message

    # A run that succeeded on this very state ends the failures; a second one on the same
    # state would change nothing, so none is requested until the table changes.
    ended(retry, dg.DagsterRunStatus.SUCCESS)
    settled = _tick(lh, instance)
    assert not settled.run_requests
    assert "unchanged since a run that succeeded on that state" in str(
        settled.skip_reason.skip_message
    )
    lh.table(BUSY).append(batch(500_000, ("api",)))
    [changed] = _tick(lh, instance).run_requests
    assert changed.tags[STATE_TAG] != first.tags[STATE_TAG]
    assert changed.run_key is not None and changed.run_key.endswith(":0")


def test_a_failed_batch_counts_against_each_of_its_tables(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])
    job = defs.resolve_job_def(BATCH_JOB)
    for _ in range(2):  # the same two-table batch failed twice in a row
        [request] = _tick(lh, instance).run_requests
        assert len(_entries(request)) == 2
        instance.create_run_for_job(
            job,
            run_config=request.run_config,
            tags=request.tags,
            status=dg.DagsterRunStatus.FAILURE,
        )

    waiting = _tick(lh, instance)

    assert not waiting.run_requests
    message = str(waiting.skip_reason.skip_message)
    assert (
        f"{BUSY} (its last 2 runs failed" in message and f"{OLD} (its last 2 runs failed" in message
    )


def test_a_healthy_lakehouse_gets_no_run_and_its_health_is_still_recorded(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory()
    lh.add_table(IDLE, appends=1)
    lh.add_table("lakehouse.idle2", appends=1)
    instance.add_dynamic_partitions(iceberg_tables.name, [IDLE, "lakehouse.idle2"])

    result = _tick(lh, instance)

    assert not result.run_requests
    assert result.skip_reason.skip_message == "2 tables healthy, none due"
    health = _health(result)
    assert health["tables"] == 2 and health["unhealthy_tables"] == 0
    assert health["mean_score"] == 100.0 and health["tables_due"] == 0


def test_an_evaluation_out_of_time_resumes_at_the_next_table(
    lh: Lakehouse, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    import icegate_dagster.sensors as sensors

    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, IDLE, OLD])
    monkeypatch.setattr(sensors, "ASSESS_SECONDS", 0.0)  # one table per evaluation

    seen, cursor = [], None
    for _ in range(4):
        result = _tick(lh, instance, cursor)
        health = _health(result)
        assert health["tables"] == 3 and health["tables_assessed"] == 1
        seen.append(health["least_healthy"].splitlines()[2].split(" | ")[0].lstrip("| "))
        cursor = result.cursor
    # Round robin in name order, wrapping around.
    assert seen == [BUSY, IDLE, OLD, BUSY]


def test_materializing_lakehouse_health_assesses_every_table_now(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])

    result = dg.materialize([lakehouse_health], instance=instance, resources=resources_for(lh))

    assert result.success
    [materialization] = result.asset_materializations_for_node("lakehouse_health")
    metadata = {key: value.value for key, value in materialization.metadata.items()}
    assert metadata["tables"] == 3 and metadata["tables_assessed"] == 3
    assert metadata["tables_due"] == 2 and metadata["tables_requested"] == 2
    assert metadata["due_by_operation"] == {"expire_snapshots": 1, "optimize": 1}
    assert metadata["least_healthy"].splitlines()[2].startswith(f"| {BUSY} |")
    recorded = instance.fetch_materializations(LAKEHOUSE_HEALTH, limit=1).records
    assert recorded and recorded[0].run_id == result.run_id


def _run_record(run_id: str, status: dg.DagsterRunStatus, state: str, end: float) -> SensorRun:
    run = dg.DagsterRun(job_name=BATCH_JOB, run_id=run_id, status=status)
    stamp = datetime.fromtimestamp(end, UTC)
    record = dg.RunRecord(
        storage_id=1,
        dagster_run=run,
        create_timestamp=stamp,
        update_timestamp=stamp,
        start_time=end - 5,
        end_time=end,
    )
    return SensorRun(record, state)


def test_a_run_another_maintainer_kept_from_its_table_settles_nothing() -> None:
    done = [_run_record("r1", dg.DagsterRunStatus.SUCCESS, "s1", 100.0)]
    assert trigger_history(done, {}, "s1")[2] == "run r1 already succeeded on this table state"
    # Its operations were skipped (the table was held elsewhere): the work may still be due.
    failures, attempts, settled = trigger_history(done, {}, "s1", frozenset({"r1"}))
    assert (failures, attempts, settled) == (None, 1, None)
    # Two failures in a row, newest first: counted, with the newest end.
    failed = [
        _run_record("r3", dg.DagsterRunStatus.FAILURE, "s1", 300.0),
        _run_record("r2", dg.DagsterRunStatus.SUCCESS, "s1", 200.0),
        *done,
    ]
    counted, _, _ = trigger_history(failed, {"r2": 1}, "s1")
    assert counted == (2, datetime.fromtimestamp(300.0, UTC))
