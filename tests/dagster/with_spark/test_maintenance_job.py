"""Materializing partitions of maintained_table on a temporary instance, with real Spark."""

import dagster as dg

from icegate_dagster.assets.names import MAINTAINED_TABLE
from icegate_dagster.maintenance import OPERATIONS
from icegate_dagster.maintenance.health.checks import CHECK_NAMES
from tests.contract import CONTRACT_METADATA_KEYS
from tests.dagster.conftest import run_maintenance
from tests.lakehouse import Lakehouse


def _materialization(instance: dg.DagsterInstance, key: str) -> dg.AssetMaterialization:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]), limit=1
    ).records
    assert records, f"no materialization for {key}"
    materialization = records[0].asset_materialization
    assert materialization is not None
    return materialization


def _checks(result: dg.ExecuteInProcessResult) -> dict[tuple[str | None, str], bool]:
    return {(e.partition, e.check_name): e.passed for e in result.get_asset_check_evaluations()}


def test_one_partition_records_contract_metadata_and_checks(
    small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    result = run_maintenance(small_lakehouse, instance, ["lakehouse.logs"])
    assert result.success

    metadata = _materialization(instance, "lakehouse.logs").metadata
    assert set(metadata) >= set(CONTRACT_METADATA_KEYS)
    assert metadata["files_before"].value == 12
    assert metadata["files_after"].value == 2
    assert metadata["rows_before"].value == metadata["rows_after"].value == 60
    assert isinstance(metadata["files_after"], dg.IntMetadataValue)  # plotted over runs

    checks = _checks(result)
    assert {name for (_, name) in checks} == set(CHECK_NAMES)
    assert checks[("lakehouse.logs", "rows_preserved")] is True
    assert checks[("lakehouse.logs", "ops_succeeded")] is True
    assert checks[("lakehouse.logs", "small_files")] is True
    # The other tables were not part of the run.
    assert small_lakehouse.table("lakehouse.orders").inspect.files().num_rows == 5
    # maintenance_log ran downstream, in the same run, and saw this run's rows.
    log = result.asset_materializations_for_node("maintenance_log")
    assert log and log[0].metadata["rows_this_run"].value == 5  # one per operation


def test_op_failure_is_a_failed_check_with_the_error(
    small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    lost = small_lakehouse.data_file_paths("lakehouse.logs")[0]
    lost.unlink()
    result = run_maintenance(small_lakehouse, instance, ["lakehouse.logs"])
    assert result.success  # the run completes; the failure is the check's to report

    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    failed = evaluations["ops_succeeded"]
    assert failed.passed is False
    assert lost.name in str(failed.description)
    metadata = _materialization(instance, "lakehouse.logs").metadata
    assert metadata["optimize_status"].value == "failed"
    assert metadata["rewrite_manifests_status"].value == "completed"
    # Nothing is old enough to expire or to be an orphan: planned away from metadata.
    assert metadata["expire_snapshots_status"].value == "skipped"
    assert metadata["remove_orphan_files_status"].value == "skipped"


def test_multi_partition_run_maintains_every_table_in_one_session(
    small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    keys = ["lakehouse.logs", "lakehouse.orders", "lakehouse.spans"]
    result = run_maintenance(small_lakehouse, instance, keys)
    assert result.success

    for key, files_after in zip(keys, (2, 1, 1), strict=True):
        metadata = _materialization(instance, key).metadata
        assert metadata["files_after"].value == files_after, key
    checks = _checks(result)
    for key in keys:
        assert checks[(key, "ops_succeeded")] is True
        assert checks[(key, "rows_preserved")] is True
    # Each op is its own step, in order, in one process (so one Spark session).
    started = [e.step_key for e in result.all_events if e.event_type_value == "STEP_START"]
    steps = ["plan", *OPERATIONS.names(), "record"]
    assert started == [f"maintained_table.{step}" for step in steps] + ["maintenance_log"]
    assert len({e.pid for e in result.all_events if e.event_type_value == "STEP_START"}) == 1
    # One run: every log row of the run carries the same run id.
    rows = [r for r in small_lakehouse.log_rows() if r["run_id"] == result.run_id]
    assert sorted({r["table_name"] for r in rows}) == keys


def test_ui_style_backfill_batch_with_check_steps_succeeds(
    small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A backfill launched from the UI also runs the checks' own steps, over a range."""
    from icegate_dagster.assets.maintained_table import MAINTAINED_TABLE_CHECKS, maintained_table
    from icegate_dagster.assets.names import iceberg_tables
    from tests.dagster.conftest import resources_for

    keys = ["lakehouse.logs", "lakehouse.orders", "lakehouse.spans"]
    instance.add_dynamic_partitions(iceberg_tables.name, keys)
    result = dg.materialize(
        [maintained_table, *MAINTAINED_TABLE_CHECKS],
        instance=instance,
        resources=resources_for(small_lakehouse),
        tags={
            "dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1],
        },
    )
    assert result.success
    per_table = {
        (e.partition, e.check_name): e.passed
        for e in result.get_asset_check_evaluations()
        if e.partition is not None
    }
    assert all(per_table[(key, "ops_succeeded")] for key in keys)
    summaries = [e for e in result.get_asset_check_evaluations() if e.partition is None]
    assert {e.check_name for e in summaries} == set(CHECK_NAMES)
    assert all(e.passed for e in summaries if e.check_name == "ops_succeeded")
