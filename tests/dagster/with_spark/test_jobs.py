"""The migrate and rollback jobs: the CLI's commands, run from Dagster."""

import dagster as dg
import pytest

from icegate_dagster.definitions import defs
from tests.dagster.conftest import resources_for
from tests.integration.test_wal_compaction import wal_rows
from tests.lakehouse import Lakehouse, LakehouseFactory

LOGS = "lakehouse.logs"


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory()
    lakehouse.add_table(LOGS, appends=2)
    lakehouse.add_table("lakehouse.spans", appends=2)
    return lakehouse


def test_migrate_job_creates_evolves_then_changes_nothing(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    job = defs.resolve_job_def("migrate_job")
    first = job.execute_in_process(instance=instance, resources=resources_for(lh))
    assert first.success
    # logs and spans existed with fewer columns: evolved, rows kept; metrics, events created.
    assert {"trace_id", "service", "body"} <= set(lh.table(LOGS).schema().column_names)
    assert lh.table(LOGS).scan().count() == 20
    assert lh.catalog.table_exists(("lakehouse", "metrics"))
    assert lh.catalog.table_exists(("lakehouse", "events"))
    locations = {t: lh.table(f"lakehouse.{t}").metadata_location for t in ("logs", "events")}

    second = job.execute_in_process(instance=instance, resources=resources_for(lh))

    assert second.success
    assert {t: lh.table(f"lakehouse.{t}").metadata_location for t in locations} == locations


def test_rollback_job_restores_the_old_rows_and_refuses_an_unknown_snapshot(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    table = lh.table(LOGS)
    good_snapshot = table.metadata.current_snapshot_id
    good_rows = lh.rows(LOGS)
    table.append(wal_rows(70_000, 3).cast(table.schema().as_arrow()))  # a bad write
    job = defs.resolve_job_def("rollback_job")

    def run(snapshot_id: int) -> dg.ExecuteInProcessResult:
        config = {"table": LOGS, "snapshot_id": snapshot_id}
        return job.execute_in_process(
            instance=instance,
            run_config={"ops": {"rollback_table": {"config": config}}},
            resources=resources_for(lh),
            raise_on_error=False,
        )

    result = run(int(good_snapshot or 0))

    assert result.success
    assert lh.rows(LOGS) == good_rows
    [row] = [r for r in lh.log_rows() if r["operation"] == "rollback"]
    assert row["run_id"] == result.run_id and row["status"] == "completed"
    refused = run(12345)
    assert not refused.success
    failure = refused.failure_data_for_node("rollback_table")
    assert failure is not None
    assert "snapshot 12345 is not in the history" in str(failure.user_failure_data)
    assert lh.rows(LOGS) == good_rows
