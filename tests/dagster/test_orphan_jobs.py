"""The deferred orphan deletion jobs: collect now, delete later, from Dagster."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import dagster as dg

from icegate_dagster.definitions import defs
from icegate_dagster.maintenance.orphans.candidates import candidates_table, read_candidates
from tests.dagster.conftest import resources_for
from tests.lakehouse import LakehouseFactory

LOGS, SPANS = "lakehouse.logs", "lakehouse.spans"


def _run(job: str, lh: Any, instance: dg.DagsterInstance, tables: list[str]) -> Any:
    op = {"collect_orphans_job": "collect_orphans"}.get(job, "delete_collected_orphans")
    return defs.resolve_job_def(job).execute_in_process(
        instance=instance,
        run_config={"ops": {op: {"config": {"tables": tables}}}},
        resources=resources_for(lh),
        raise_on_error=False,
    )


def _output_metadata(result: dg.ExecuteInProcessResult) -> dict[str, Any]:
    [event] = [e for e in result.all_events if e.event_type_value == "STEP_OUTPUT"]
    return {k: v.value for k, v in event.event_specific_data.metadata.items()}  # type: ignore[union-attr]


def test_collect_job_records_every_table_and_delete_job_fails_only_the_missing_table(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory()
    lh.add_table(LOGS, appends=2)
    lh.add_table(SPANS, appends=2)
    logs_orphan = lh.plant_file(LOGS, "orphan.parquet", timedelta(days=30))
    spans_orphan = lh.plant_file(SPANS, "orphan.parquet", timedelta(days=30))
    logs_size = logs_orphan.stat().st_size
    size = logs_size + spans_orphan.stat().st_size

    collected = _run("collect_orphans_job", lh, instance, [])  # empty: every table

    assert collected.success
    metadata = _output_metadata(collected)
    assert (metadata["tables"], metadata["candidates"], metadata["candidate_bytes"]) == (
        2,
        2,
        size,
    )
    pending = read_candidates(lh.catalog, candidates_table(lh.config))
    assert {(r["table_name"], r["status"], r["run_id"]) for r in pending} == {
        (LOGS, "pending", collected.run_id),
        (SPANS, "pending", collected.run_id),
    }
    assert logs_orphan.exists() and spans_orphan.exists()

    deleted = _run("delete_collected_orphans_job", lh, instance, [LOGS, "lakehouse.missing"])

    assert not deleted.success
    failure = deleted.failure_data_for_node("delete_collected_orphans")
    assert failure is not None and failure.user_failure_data is not None
    assert "1 table(s): lakehouse.missing" in str(failure.user_failure_data.description)
    assert failure.user_failure_data.metadata["orphans_removed"].value == 1
    assert failure.user_failure_data.metadata["bytes_removed"].value == logs_size
    assert not logs_orphan.exists()  # the missing table failed alone
    assert spans_orphan.exists()  # not named: untouched
    statuses = {
        r["table_name"]: r["status"]
        for r in read_candidates(lh.catalog, candidates_table(lh.config))
    }
    assert statuses == {LOGS: "deleted", SPANS: "pending"}
    this_run = [r for r in lh.log_rows() if r["run_id"] == deleted.run_id]
    logged = {(r["table_name"], r["status"]) for r in this_run}
    assert logged == {(LOGS, "completed"), ("lakehouse.missing", "failed")}
