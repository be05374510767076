"""Issue 12 in the code location: GC-off tables pass ``ops_succeeded``; one table's WAL
failure or drop never loses the batch's reports; dropped tables do not break backfills."""

from __future__ import annotations

import time
from datetime import timedelta

import dagster as dg

from icegate_dagster.assets.names import MAINTAINED_TABLE, iceberg_tables
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import discovery_tick, resources_for, run_maintenance
from tests.lakehouse import LakehouseFactory

TABLE = "lakehouse.logs"


def _checks(
    result: dg.ExecuteInProcessResult,
) -> dict[tuple[str | None, str], dg.AssetCheckEvaluation]:
    return {(e.partition, e.check_name): e for e in result.get_asset_check_evaluations()}


def _materialization(instance: dg.DagsterInstance, key: str) -> dg.AssetMaterialization | None:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]), limit=1
    ).records
    return records[0].asset_materialization if records else None


def test_gc_disabled_table_passes_ops_succeeded(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory(maintain={"expire_snapshots": {"retention_threshold": "1s"}})
    table = lh.add_table(TABLE, appends=6)
    with table.transaction() as t:
        t.set_properties({"gc.enabled": "false"})
    orphan = lh.plant_file(TABLE, "shared-file.parquet", timedelta(days=30))
    time.sleep(1.5)

    result = run_maintenance(lh, instance, [TABLE])

    assert result.success
    checks = _checks(result)
    assert checks[(TABLE, "ops_succeeded")].passed, checks[(TABLE, "ops_succeeded")].description
    metadata = _materialization(instance, TABLE)
    assert metadata is not None
    assert metadata.metadata["expire_snapshots_status"].value == "skipped"
    assert metadata.metadata["remove_orphan_files_status"].value == "skipped"
    assert metadata.metadata["optimize_status"].value == "completed"
    assert orphan.exists()


def test_one_unlistable_wal_does_not_lose_the_batch(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory(wal=True)
    lh.add_table("lakehouse.bad", appends=2)
    lh.add_table(TABLE, appends=2)
    bad_wal = lh.wal_dir("lakehouse.bad")
    bad_wal.rmdir()
    bad_wal.write_text("a file where the WAL folder should be")  # listing it fails

    result = run_maintenance(lh, instance, ["lakehouse.bad", TABLE])

    assert result.success
    checks = _checks(result)
    bad = checks[("lakehouse.bad", "wal_backlog")]
    assert bad.passed is False
    assert "lakehouse.bad" in str(bad.description) and "directory" in str(bad.description)
    assert checks[(TABLE, "wal_backlog")].passed is True
    assert checks[(TABLE, "ops_succeeded")].passed is True
    bad_materialization = _materialization(instance, "lakehouse.bad")
    assert bad_materialization is not None
    assert "directory" in str(bad_materialization.metadata["wal_error"].value)
    good = _materialization(instance, TABLE)
    assert good is not None and good.metadata["files_after"].value == 4  # below min_input_files


def test_dropped_table_in_a_batch_logs_a_failed_row_per_operation(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.gone", appends=1)
    lh.add_table(TABLE, appends=2)
    lh.catalog.drop_table(("lakehouse", "gone"))

    result = run_maintenance(lh, instance, ["lakehouse.gone", TABLE])

    assert result.success
    rows = [r for r in lh.log_rows() if r["run_id"] == result.run_id]
    gone = sorted(
        (r["operation"], r["status"]) for r in rows if r["table_name"] == "lakehouse.gone"
    )
    assert gone == sorted(
        (op, "failed")
        for op in (
            "optimize",
            "rewrite_position_delete_files",
            "rewrite_manifests",
            "expire_snapshots",
            "remove_orphan_files",
        )
    )
    assert all(
        "does not exist" in r["details"] for r in rows if r["table_name"] == "lakehouse.gone"
    )
    assert _checks(result)[("lakehouse.gone", "ops_succeeded")].passed is False
    assert _checks(result)[(TABLE, "ops_succeeded")].passed is True


def test_backfill_batch_whose_first_table_was_dropped_still_maintains_the_others(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory()
    keys = ["lakehouse.a_first", "lakehouse.b_middle", "lakehouse.c_last"]
    for key in keys:
        lh.add_table(key, appends=2)
    resource = LakehouseResource(config_path=str(lh.config_path))
    discovery_tick(instance, resource)
    assert list(instance.get_dynamic_partitions(iceberg_tables.name)) == keys
    # A backfill batch is queued (as the daemon makes it: a range over the partitions) ...
    job = defs.resolve_job_def("maintenance_job")
    range_tags = {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
    }
    # (A QUEUED run needs a code location origin; NOT_STARTED is as unfinished.)
    queued = instance.create_run_for_job(
        job, tags=range_tags, status=dg.DagsterRunStatus.NOT_STARTED
    )
    # ... then its first and last tables are dropped and the discovery sensor ticks.
    lh.catalog.drop_table(("lakehouse", "a_first"))
    lh.catalog.drop_table(("lakehouse", "c_last"))
    deferred = discovery_tick(instance, resource)

    assert isinstance(deferred, dg.SkipReason)
    message = str(deferred.skip_message)
    assert "lakehouse.a_first" in message and "lakehouse.c_last" in message
    assert queued.run_id in message
    assert list(instance.get_dynamic_partitions(iceberg_tables.name)) == keys

    # The batch runs: the live table is maintained, the dropped ones are logged as failed.
    result = job.execute_in_process(instance=instance, tags=range_tags, resources=resources_for(lh))
    assert result.success
    rows = [r for r in lh.log_rows() if r["run_id"] == result.run_id]
    assert {r["status"] for r in rows if r["table_name"] == "lakehouse.b_middle"} <= {
        "completed",
        "skipped",
    }
    assert {r["status"] for r in rows if r["table_name"] != "lakehouse.b_middle"} == {"failed"}
    assert {r["table_name"] for r in rows} == set(keys)

    # Once no unfinished run names them, the next tick removes the partitions.
    instance.report_run_canceled(queued)
    removed = discovery_tick(instance, resource)
    assert isinstance(removed, dg.SensorResult)
    assert list(instance.get_dynamic_partitions(iceberg_tables.name)) == ["lakehouse.b_middle"]
