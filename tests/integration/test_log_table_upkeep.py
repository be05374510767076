"""The log table does not rot: every pass appends to it, and every pass keeps it bounded."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pyarrow as pa

from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.log.totals import LogTotals
from icegate_dagster.maintenance.log.upkeep import (
    LOG_TABLE_SMALL_FILES,
    LOG_TABLE_SNAPSHOTS,
)
from icegate_dagster.maintenance.log.writer import ensure_log_table, log_size
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import LakehouseFactory

RUNS = 60  # three compaction groups and expiries: bounded across cycles


def test_many_small_appends_leave_bounded_files_and_snapshots_and_every_row(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    maintainer = Maintainer(lh.config)
    ref = maintainer.log_table
    ensure_log_table(lh.catalog, ref)
    schema = lh.catalog.load_table(ref.identifier).schema().as_arrow()
    worst_files = worst_snapshots = 0
    started = time.monotonic()
    for run in range(RUNS):
        # What each run leaves behind: one small append of its log rows...
        row = {
            "table_name": "lakehouse.logs",
            "operation": "optimize",
            "status": "skipped",
            "details": f"run {run}",
            "duration_ms": run,
            "run_id": f"run-{run}",
            "executed_at": datetime.now(UTC),
        }
        lh.catalog.load_table(ref.identifier).append(pa.Table.from_pylist([row], schema=schema))
        # ...then the pass's upkeep of the log table.
        upkeep = maintainer.maintain_log_table()
        assert all(op.status != "failed" for op in upkeep), [op.details for op in upkeep]
        table = lh.catalog.load_table(ref.identifier)
        files = len(table.inspect.files())
        worst_files = max(worst_files, files)
        worst_snapshots = max(worst_snapshots, len(table.metadata.snapshots))
    print(f"{RUNS} runs in {time.monotonic() - started:.1f}s")

    # Bounded however many runs: files by the compaction group, snapshots by expiry.
    assert worst_files <= LOG_TABLE_SMALL_FILES + 1
    assert worst_snapshots <= 2 * LOG_TABLE_SNAPSHOTS + 3
    # Nothing lost on the way.
    assert log_size(lh.catalog, ref) == RUNS
    details = lh.catalog.load_table(ref.identifier).scan().to_arrow().column("details")
    assert sorted(details.to_pylist()) == sorted(f"run {i}" for i in range(RUNS))


def _log_row(details: str, executed_at: datetime) -> dict[str, object]:
    return {
        "table_name": "lakehouse.logs",
        "operation": "optimize",
        "status": "completed",
        "details": details,
        "duration_ms": 1,
        "run_id": details,
        "executed_at": executed_at,
    }


def test_log_rows_older_than_the_history_setting_are_deleted_by_the_logs_own_upkeep(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """``maintain.history.log`` (here 30d): the pass's upkeep of the log table deletes rows
    older than it once the oldest is a day past it; newer rows stay, read back by Spark and
    pyiceberg. A log whose oldest row is within the day of slack starts no delete."""
    lh = lakehouse_factory(maintain={"history": {"log": "30d"}})
    maintainer = Maintainer(lh.config)
    ref = maintainer.log_table
    ensure_log_table(lh.catalog, ref)
    schema = lh.catalog.load_table(ref.identifier).schema().as_arrow()
    # An exporter running since before the rows were logged counts all five.
    totals = LogTotals(lambda: lh.catalog, ref)
    totals.refresh()
    now = datetime.now(UTC)
    ages = {"a year": 365, "40 days": 40, "31 days": 31, "29 days": 29, "today": 0}
    rows = [_log_row(name, now - timedelta(days=days)) for name, days in ages.items()]
    lh.catalog.load_table(ref.identifier).append(pa.Table.from_pylist(rows, schema=schema))
    seen = totals.refresh()
    assert seen.totals[("lakehouse.logs", "optimize")].rows == 5

    upkeep = maintainer.maintain_log_table()

    [retention] = [op for op in upkeep if op.operation == "retention"]
    assert retention.status == "completed", retention.details
    assert retention.output["rows_deleted"] == 3
    kept = {"29 days", "today"}
    assert {r["details"] for r in lh.log_rows()} == kept  # pyiceberg
    name = ref.spark_identifier(lh.config.catalog.name)
    spark_rows = get_spark(lh.config).sql(f"SELECT details FROM {name}").collect()
    assert {r[0] for r in spark_rows} == kept
    assert log_size(lh.catalog, ref) == 2
    # The exporter's counters do not go down: the delete is not read as rows lost.
    after = totals.refresh()
    assert after.totals[("lakehouse.logs", "optimize")].rows == 5
    assert after.full_reads == seen.full_reads  # the delete made no read of the whole log

    # 30.5 days old: past the setting, but within the day of slack: no delete this pass.
    almost = _log_row("30.5 days", now - timedelta(days=30, hours=12))
    lh.catalog.load_table(ref.identifier).append(pa.Table.from_pylist([almost], schema=schema))
    again = maintainer.maintain_log_table()
    assert "retention" not in [op.operation for op in again]
    assert {r["details"] for r in lh.log_rows()} == {*kept, "30.5 days"}


def test_a_log_kept_forever_keeps_every_row(lakehouse_factory: LakehouseFactory) -> None:
    lh = lakehouse_factory(maintain={"history": {"log": "forever"}})
    maintainer = Maintainer(lh.config)
    ref = maintainer.log_table
    ensure_log_table(lh.catalog, ref)
    schema = lh.catalog.load_table(ref.identifier).schema().as_arrow()
    old = _log_row("ten years", datetime.now(UTC) - timedelta(days=3650))
    lh.catalog.load_table(ref.identifier).append(pa.Table.from_pylist([old], schema=schema))

    upkeep = maintainer.maintain_log_table()

    assert "retention" not in [op.operation for op in upkeep]
    assert [r["details"] for r in lh.log_rows()] == ["ten years"]
