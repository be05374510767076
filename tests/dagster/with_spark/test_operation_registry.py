"""An operation registered in one place shows up everywhere: as a Dagster step of
``maintained_table``, in ``icegate-maintain run --dry-run``, in the log rows and in a
partition's metadata, with no other edit."""

import json
from collections.abc import Iterator

import dagster as dg
import pytest

from icegate_dagster.assets.maintained_table import (
    MAINTAINED_TABLE,
    MAINTAINED_TABLE_CHECKS,
    build_maintained_table,
    maintenance_steps,
    operations_run_config,
)
from icegate_dagster.assets.names import iceberg_tables
from icegate_dagster.assets.runs import BatchEntry, batch_run_config
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.jobs.batch import build_batch_job
from icegate_dagster.maintenance import OPERATIONS
from icegate_dagster.maintenance.ops import OpContext, Operation
from icegate_dagster.maintenance.results import Outcome
from tests.dagster.conftest import resources_for
from tests.lakehouse import Lakehouse

STAMP = "icegate.test-stamp"
TABLE = "lakehouse.orders"


class StampTable(Operation):
    """Throw-away: sets a table property with pyiceberg (no Spark), so its effect is visible."""

    name = "stamp_table"
    description = "Test-only: stamp the table with a property."
    settings_block = "optimize"
    metadata_sums = {"stamps_set": "stamps"}

    def plan(self, ctx: OpContext) -> str | None:
        if ctx.table.properties.get(STAMP) == "yes":
            return "already stamped"
        return None

    def run(self, ctx: OpContext) -> Outcome:
        if ctx.dry_run:
            return Outcome.skip(f"dry run: would set {STAMP}")
        with ctx.table.transaction() as transaction:
            transaction.set_properties({STAMP: "yes"})
        return Outcome.done(f"set {STAMP}", stamps_set=1)


@pytest.fixture
def stamp_registered() -> Iterator[None]:
    with OPERATIONS.registered(StampTable()):
        yield
    assert "stamp_table" not in OPERATIONS.names()  # the registry is as it was


def test_a_registered_operation_is_a_dagster_step_with_log_rows_and_metadata(
    stamp_registered: None, small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    asset = build_maintained_table()
    steps = {node.name for node in asset.node_def.node_defs}  # type: ignore[attr-defined]
    assert steps == {"plan", *OPERATIONS.names(), "record"}
    assert "stamp_table" in steps

    instance.add_dynamic_partitions(iceberg_tables.name, [TABLE])
    result = dg.materialize(
        [asset, *MAINTAINED_TABLE_CHECKS],
        selection=[MAINTAINED_TABLE],
        partition_key=TABLE,
        instance=instance,
        resources=resources_for(small_lakehouse),
        run_config=operations_run_config(["stamp_table"]),
    )

    assert result.success
    assert small_lakehouse.table(TABLE).properties[STAMP] == "yes"
    step_events = [e.step_key for e in result.get_step_success_events()]
    assert "maintained_table.stamp_table" in step_events
    materialization = result.asset_materializations_for_node("maintained_table")[0]
    assert materialization.metadata["stamp_table_status"].value == "completed"
    assert materialization.metadata["stamps_set"].value == 1
    assert "| stamp_table | completed |" in str(materialization.metadata["ops"].value)
    rows = [r for r in small_lakehouse.log_rows() if r["run_id"] == result.run_id]
    assert [(r["table_name"], r["operation"], r["status"]) for r in rows] == [
        (TABLE, "stamp_table", "completed")
    ]


def test_a_registered_operation_is_a_step_of_the_sensors_batch_job_too(
    stamp_registered: None, small_lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> None:
    steps = maintenance_steps()
    job = build_batch_job(steps)
    assert "stamp_table" in {node.name for node in job.graph.nodes}

    result = job.execute_in_process(
        instance=instance,
        run_config=batch_run_config([BatchEntry(TABLE, ("stamp_table",), "s")]),
        resources=resources_for(small_lakehouse),
    )

    assert result.success
    assert small_lakehouse.table(TABLE).properties[STAMP] == "yes"
    [record] = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[TABLE]), limit=1
    ).records
    assert record.asset_materialization is not None
    assert record.asset_materialization.metadata["stamp_table_status"].value == "completed"


def test_a_registered_operation_is_planned_by_run_dry_run(
    stamp_registered: None, small_lakehouse: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(["run", "--dry-run", "--json", "--config", str(small_lakehouse.config_path)])

    assert code == 0
    tables = json.loads(capsys.readouterr().out)["tables"]
    planned = {(t["table"], op["operation"]): op for t in tables for op in t["ops"]}
    assert {key for key, _ in planned} == {"lakehouse.logs", "lakehouse.orders", "lakehouse.spans"}
    stamp = planned[(TABLE, "stamp_table")]
    assert (stamp["status"], stamp["details"]) == ("skipped", f"dry run: would set {STAMP}")
    assert STAMP not in small_lakehouse.table(TABLE).properties  # a dry run changed nothing

    # A real pass runs it after the built-in operations, and logs it.
    args = ["run", "--json", "--table", TABLE, "--config", str(small_lakehouse.config_path)]
    assert run_cli(args) == 0
    run = json.loads(capsys.readouterr().out)
    assert [op["operation"] for op in run["tables"][0]["ops"]][-1] == "stamp_table"
    assert small_lakehouse.table(TABLE).properties[STAMP] == "yes"
    logged = {
        (r["operation"], r["status"])
        for r in small_lakehouse.log_rows()
        if r["run_id"] == run["run_id"]
    }
    assert ("stamp_table", "completed") in logged
