"""The sensors' batch runs on real tables and a temporary Dagster instance: tables scattered
through the partition list share one run (one Spark session), each doing only its own due
operations and recorded as its own partition of ``maintained_table``, with its metadata,
its check evaluations and its log rows; the healthy table between them is left alone."""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.maintenance_log import MAINTENANCE_LOG
from icegate_dagster.assets.names import BATCH_JOB, MAINTAINED_TABLE, TABLES_TAG, iceberg_tables
from icegate_dagster.assets.runs import batch_entries
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.health_sensor import table_health_sensor
from tests.dagster.conftest import (
    BUSY,
    IDLE,
    OLD,
    discovery_tick,
    health_lakehouse,
    run_request,
)
from tests.lakehouse import Lakehouse, LakehouseFactory


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    return health_lakehouse(lakehouse_factory)


def _tick(lh: Lakehouse, instance: dg.DagsterInstance) -> dg.SensorResult:
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
    )
    result = table_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    return result


def _latest(instance: dg.DagsterInstance, key: str) -> Any:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]), limit=1
    ).records
    return records[0] if records else None


def test_scattered_due_tables_share_one_run_each_doing_its_own_operations(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    # BUSY and OLD are not neighbours in the partition list: no range covers only them.
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, IDLE, OLD])
    idle_metadata = lh.table(IDLE).metadata_location
    busy_rows, old_rows = lh.rows_without_spark(BUSY), lh.rows_without_spark(OLD)
    old_snapshots = len(lh.table(OLD).snapshots())

    [request] = _tick(lh, instance).run_requests
    assert request.job_name == BATCH_JOB and request.tags[TABLES_TAG] == "2"
    run = dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
    planned = {entry.table: entry.operations for entry in batch_entries(run)}
    assert planned == {BUSY: ("optimize",), OLD: ("expire_snapshots",)}

    result = run_request(request, lh, instance)

    assert result.success
    # The work: BUSY compacted, OLD expired, rows unchanged, IDLE untouched.
    assert len(lh.table(BUSY).inspect.files()) == 2
    assert len(lh.table(OLD).snapshots()) < old_snapshots
    assert lh.rows_without_spark(BUSY) == busy_rows
    assert lh.rows_without_spark(OLD) == old_rows
    assert lh.table(IDLE).metadata_location == idle_metadata

    # One materialization per table, by this run, with only its own operations.
    busy, old = _latest(instance, BUSY), _latest(instance, OLD)
    assert busy.run_id == old.run_id == result.run_id
    assert _latest(instance, IDLE) is None
    busy_meta = busy.asset_materialization.metadata
    old_meta = old.asset_materialization.metadata
    assert busy_meta["optimize_status"].value == "completed"
    assert "expire_snapshots_status" not in busy_meta
    assert old_meta["expire_snapshots_status"].value == "completed"
    assert "optimize_status" not in old_meta
    assert busy_meta["files_before"].value == 12 and busy_meta["files_after"].value == 2
    assert busy_meta["health_score"].value > 90
    status = instance.get_status_by_partition(MAINTAINED_TABLE, [BUSY, IDLE, OLD], iceberg_tables)
    assert status is not None
    assert {key: value is not None for key, value in status.items()} == {
        BUSY: True,
        IDLE: False,
        OLD: True,
    }

    # Each table's checks, each with its partition.
    checks = [(e.partition, e.check_name, e.passed) for e in result.get_asset_check_evaluations()]
    for key in (BUSY, OLD):
        mine = {name: passed for partition, name, passed in checks if partition == key}
        assert mine["ops_succeeded"] is True and mine["rows_preserved"] is True
        assert mine["healthy"] is True
    assert {partition for partition, _, _ in checks} == {BUSY, OLD}

    # Log rows of this run: each table its own operation; maintenance_log recorded.
    rows = [r for r in lh.log_rows() if r["run_id"] == result.run_id]
    assert {(r["table_name"], r["operation"]) for r in rows} == {
        (BUSY, "optimize"),
        (OLD, "expire_snapshots"),
    }
    log_event = instance.fetch_materializations(MAINTENANCE_LOG, limit=1).records[0]
    assert log_event.run_id == result.run_id
    assert log_event.asset_materialization.metadata["rows_this_run"].value == 2

    # Both are healthy now: the next tick requests nothing.
    after = _tick(lh, instance)
    assert not after.run_requests


def test_a_batch_with_a_table_dropped_before_its_run_maintains_the_others(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, IDLE, OLD])
    [request] = _tick(lh, instance).run_requests
    queued = instance.create_run_for_job(
        defs.resolve_job_def(BATCH_JOB),
        run_config=request.run_config,
        tags=request.tags,
        status=dg.DagsterRunStatus.NOT_STARTED,
    )
    lh.catalog.drop_table(("lakehouse", "old"))
    # The dropped table stays a partition while an unfinished batch run names it.
    resource = LakehouseResource(config_path=str(lh.config_path))
    kept = discovery_tick(instance, resource)
    assert isinstance(kept, dg.SkipReason)
    assert OLD in str(kept.skip_message) and queued.run_id in str(kept.skip_message)
    assert OLD in instance.get_dynamic_partitions(iceberg_tables.name)
    instance.report_run_canceled(queued)

    result = run_request(request, lh, instance)

    assert result.success  # the run goes on; the dropped table fails alone
    assert len(lh.table(BUSY).inspect.files()) == 2
    old = _latest(instance, OLD).asset_materialization.metadata
    assert old["ops_failed"].value == 1
    assert "does not exist" in str(old["error"].value) or "NoSuchTable" in str(old["error"].value)
    failed = [r for r in lh.log_rows() if r["table_name"] == OLD and r["run_id"] == result.run_id]
    assert [(r["operation"], r["status"]) for r in failed] == [("expire_snapshots", "failed")]
