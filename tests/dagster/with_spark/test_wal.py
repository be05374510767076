"""WAL in Dagster: the size sensor requests only tables over threshold, never while a run
covers the table, with a new run key for each new decision, backing off ingests that keep
failing (also inside runs that succeed); a run ingests the WAL and reports it as metadata
and in the ``wal_backlog`` check."""

import os
from datetime import timedelta
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.names import BATCH_JOB, MAINTAINED_TABLE, iceberg_tables
from icegate_dagster.assets.runs import BatchEntry, batch_entries
from icegate_dagster.definitions import defs
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.trigger.records import OperationAttempt, PassRecord
from icegate_dagster.maintenance.wal import (
    configured_wal_root,
    list_wal_files,
    quarantine,
    quarantined_files,
)
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.wal_sensor import BACKLOG_TAG, wal_size_sensor
from tests.dagster.conftest import resources_for, run_request
from tests.integration.test_wal_compaction import fill_wal, spark_rows
from tests.lakehouse import Lakehouse, LakehouseFactory

LOGS, SPANS = "lakehouse.logs", "lakehouse.spans"


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(
        maintain={"compaction": {"min_files": 4, "min_size_bytes": "1GB"}}, wal=True
    )
    lakehouse.add_table(LOGS, appends=2)
    lakehouse.add_table(SPANS, appends=2)
    return lakehouse


def _tick(lh: Lakehouse, instance: dg.DagsterInstance) -> Any:
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
    )
    return wal_size_sensor(context)


def _skip(result: Any) -> str:
    """Why a tick asked for nothing."""
    if isinstance(result, dg.SkipReason):
        return str(result.skip_message)
    assert isinstance(result, dg.SensorResult) and not result.run_requests, result
    return str(result.skip_reason.skip_message if result.skip_reason else "")


def _entries(request: dg.RunRequest) -> list[BatchEntry]:
    return batch_entries(
        dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
    )


def _tables(result: Any) -> list[str]:
    assert isinstance(result, dg.SensorResult)
    return [entry.table for request in result.run_requests or [] for entry in _entries(request)]


def _run(instance: dg.DagsterInstance, request: dg.RunRequest, status: dg.DagsterRunStatus) -> Any:
    """The run the daemon makes of a request (with its run key)."""
    return instance.create_run_for_job(
        defs.resolve_job_def(BATCH_JOB),
        run_config=request.run_config,
        tags={**request.tags, "dagster/run_key": request.run_key or ""},
        status=status,
    )


def test_sensor_requests_only_tables_over_threshold_and_a_new_key_for_each_decision(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS, SPANS])
    assert "no WAL over its thresholds" in _skip(_tick(lh, instance))

    fill_wal(lh, files=5)  # logs: over min_files
    lh.write_wal(SPANS, lh.table(SPANS).scan().to_arrow().slice(0, 3), "only-one.parquet")
    first = _tick(lh, instance)
    assert isinstance(first, dg.SensorResult)
    [request] = first.run_requests or []
    assert request.job_name == BATCH_JOB
    [entry] = _entries(request)
    assert entry.table == LOGS and entry.operations == ("wal_compaction",)
    assert request.tags[BACKLOG_TAG] == entry.state
    assert (request.run_key or "").startswith(f"wal:{LOGS}:1-")

    # More files while that run waits: nothing more is asked.
    queued = _run(instance, request, dg.DagsterRunStatus.NOT_STARTED)
    fill_wal(lh, files=7)
    assert queued.run_id in _skip(_tick(lh, instance))

    # The run failed before it recorded the table (its config named no operation it has):
    # counted as one failed ingest, retried at once under a new key.
    instance.report_run_canceled(queued)
    failed = defs.resolve_job_def(BATCH_JOB).execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "plan_batch": {
                    "config": {
                        "tables": [
                            {
                                "table": LOGS,
                                "operations": ["no_such_operation"],
                                "state": entry.state,
                            }
                        ]
                    }
                }
            }
        },
        tags=request.tags,
        resources=resources_for(lh),
        raise_on_error=False,
    )
    assert not failed.success
    retry = _tick(lh, instance)
    assert _tables(retry) == [LOGS]
    assert (retry.run_requests[0].run_key or "").startswith(f"wal:{LOGS}:2-")

    # Once the backlog is ingested (a CLI pass, remembered like a run), nothing is due; a
    # new backlog gets a new key.
    Maintainer(lh.config).maintain_table(TableRef.parse(LOGS), ["wal_compaction"])
    assert "no WAL over its thresholds" in _skip(_tick(lh, instance))
    for i in range(1, 5):
        lh.write_wal(LOGS, lh.table(LOGS).scan().to_arrow().slice(0, 2), f"z-{i}.parquet")
    later = _tick(lh, instance)
    assert _tables(later) == [LOGS]
    assert (later.run_requests[0].run_key or "").startswith(f"wal:{LOGS}:3-")


def test_sensor_run_ingests_the_wal_and_records_it(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS, SPANS])
    before = spark_rows(lh, LOGS)
    expected = fill_wal(lh, files=5)
    (lh.wal_dir(LOGS) / "broken.parquet").write_bytes(b"not parquet at all")
    history_before = _main_history(lh.table(LOGS))
    [request] = _tick(lh, instance).run_requests

    result = run_request(request, lh, instance)

    assert result.success
    assert spark_rows(lh, LOGS) == before + expected
    assert lh.wal_files(LOGS) == []
    # Only the WAL step ran: one new commit on the main branch, no compaction or expiry.
    history = _main_history(lh.table(LOGS))
    assert history[1:] == history_before
    assert history[0].summary is not None and history[0].summary.get("icegate.wal-batch")
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[LOGS]), limit=1
    ).records[0]
    assert record.asset_materialization is not None
    metadata = record.asset_materialization.metadata
    assert metadata["wal_files_ingested"].value == 5
    assert metadata["wal_files_quarantined"].value == 1
    assert metadata["wal_compaction_status"].value == "completed"
    assert "optimize_status" not in metadata
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert checks["wal_backlog"].passed is False
    assert "1 files in quarantine" in str(checks["wal_backlog"].description)
    assert checks["rows_preserved"].passed is True
    log = [r for r in lh.log_rows() if r["operation"] == "wal_compaction"]
    assert "broken.parquet" in log[0]["details"]


def test_plan_refuses_an_unknown_operation_by_name(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS])
    result = defs.resolve_job_def("maintenance_job").execute_in_process(
        instance=instance,
        partition_key=LOGS,
        run_config={
            "ops": {"maintained_table": {"ops": {"plan": {"config": {"operations": ["vacuum"]}}}}}
        },
        resources=resources_for(lh),
        raise_on_error=False,
    )
    assert not result.success
    failure = result.failure_data_for_node("maintained_table.plan")
    assert failure is not None and "'vacuum' is not an operation" in str(failure.user_failure_data)


def _main_history(table: Any) -> list[Any]:
    """The main branch's snapshots, newest first (the WAL's staging snapshot is not one)."""
    history, snapshot = [], table.current_snapshot()
    while snapshot is not None:
        history.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    return history


def test_sensor_leaves_a_table_to_a_queued_batch_run_that_covers_it(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """The schedule's batch run (range tags, no ``dagster/partition``) ingests the WAL too."""
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS, SPANS])
    fill_wal(lh, files=5)
    job = defs.resolve_job_def("maintenance_job")
    batch = instance.create_run_for_job(
        job,
        tags={
            "dagster/asset_partition_range_start": LOGS,
            "dagster/asset_partition_range_end": SPANS,
        },
        status=dg.DagsterRunStatus.NOT_STARTED,
    )

    covered = _skip(_tick(lh, instance))

    assert LOGS in covered and batch.run_id in covered

    # Once that run is over, the backlog gets its own run again.
    instance.report_run_canceled(batch)
    again = _tick(lh, instance)
    assert _tables(again) == [LOGS]


def test_sensor_backs_off_an_ingest_that_keeps_failing_inside_successful_runs(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """The run succeeds, its wal_compaction on the table fails (as the run's record keeps it
    in the trigger's memory): the second failure in a row backs off, with the error. An
    ingest skipped because another maintainer held the table is no failure."""
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS, SPANS])
    fill_wal(lh, files=5)
    memory = Maintainer(lh.config).memory
    assert memory is not None

    def ingest(status: str, **how: Any) -> None:
        [request] = _tick(lh, instance).run_requests
        memory.record_pass(
            PassRecord(
                LOGS,
                "run",
                (OperationAttempt("wal_compaction", status, **how),),
                requested=("wal_compaction",),
            ),
            backoff=timedelta(minutes=1),
            backoff_max=timedelta(hours=1),
        )

    ingest("skipped", held_elsewhere=True, error="held by another maintainer")
    ingest("failed", error="Py4JJavaError: staging branch vanished")
    ingest("failed", error="Py4JJavaError: staging branch vanished")

    message = _skip(_tick(lh, instance))
    assert f"{LOGS} (wal_compaction failed 2 times in a row; next attempt after" in message
    assert "staging branch vanished" in message


def test_backlogs_due_at_one_tick_share_one_run_and_each_is_ingested(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [LOGS, SPANS])
    logs_before, spans_before = spark_rows(lh, LOGS), spark_rows(lh, SPANS)
    expected_logs = fill_wal(lh, files=5)
    spans_rows = lh.table(SPANS).scan().to_arrow().slice(0, 3)
    for i in range(4):
        lh.write_wal(SPANS, spans_rows, f"s-{i}.parquet")

    result = _tick(lh, instance)
    [request] = result.run_requests
    assert sorted(_tables(result)) == [LOGS, SPANS]
    assert BACKLOG_TAG not in request.tags  # each backlog is its table's state in the config

    run = run_request(request, lh, instance)

    assert run.success
    assert lh.wal_files(LOGS) == [] and lh.wal_files(SPANS) == []
    assert spark_rows(lh, LOGS) == logs_before + expected_logs
    assert sum(spark_rows(lh, SPANS).values()) == sum(spans_before.values()) + 4 * 3
    for key, files in ((LOGS, 5), (SPANS, 4)):
        record = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]), limit=1
        ).records[0]
        assert record.run_id == run.run_id
        metadata = record.asset_materialization.metadata  # type: ignore[union-attr]
        assert metadata["wal_files_ingested"].value == files
        assert "optimize_status" not in metadata
    assert "no WAL over its thresholds" in _skip(_tick(lh, instance))


def test_quarantined_files_are_kept_and_the_sensor_names_them_with_their_age(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """``_quarantine`` only grows: a quarantined file holds rows no table has, so nothing
    deletes it; each tick of the sensor names the tables with quarantined files, how many,
    and since when, until a person moves them back or deletes them."""
    assert lh.config.wal_root is not None
    ref = TableRef.parse(LOGS)
    rows = lh.table(LOGS).scan().to_arrow().slice(0, 2)
    for name in ("bad-1.parquet", "bad-2.parquet"):
        lh.write_wal(LOGS, rows, name)
    wal_root = configured_wal_root(lh.config)
    for wal_file in list_wal_files(wal_root, ref):
        moved = quarantine(wal_root, ref, wal_file, "a column the table lacks")
        os.utime(moved, (1_780_000_000, 1_780_000_000))  # 2026-05-28T20:26:40Z

    for _tick_number in range(2):
        reason = _skip(_tick(lh, instance))
        assert "2 WAL files in quarantine need a person" in reason
        assert f"{LOGS} (2 files, since 2026-05-28T20:26:40+00:00)" in reason
    assert quarantined_files(wal_root, ref) == ["bad-1.parquet", "bad-2.parquet"]
    # A table with none is not named.
    assert SPANS not in reason
