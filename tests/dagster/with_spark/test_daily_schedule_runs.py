"""The daily schedule's day end to end (issue 41, item 2): its tick asks for one run of the
due tables, the run maintains them, and the next day's tick over the healthy lakehouse asks
for none. Every day the log holds a row per table and operation: the run's for the tables
it maintained, the tick's for the others."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from icegate_dagster.assets.trigger_state import simulated_clock
from icegate_dagster.jobs.maintenance import daily_maintenance
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.log.upkeep import LOG_TABLE_SMALL_FILES
from icegate_dagster.maintenance.results import OpResult
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import BUSY, IDLE, OLD, health_lakehouse, run_request
from tests.lakehouse import Lakehouse, LakehouseFactory

DAY = datetime(2026, 11, 27, 3, tzinfo=UTC)


def _tick(lh: Lakehouse, instance: dg.DagsterInstance, scheduled: datetime) -> Any:
    with dg.build_schedule_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
        scheduled_execution_time=scheduled,
    ) as context:
        result = daily_maintenance(context)
    return result if isinstance(result, dg.SkipReason) else list(result or [])


def test_a_day_maintains_the_due_tables_and_the_next_day_asks_for_nothing(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = health_lakehouse(lakehouse_factory)
    tables = [BUSY, IDLE, OLD]
    full = {t: Maintainer(lh.config).operations_for(TableRef.parse(t)) for t in tables}

    [request] = _tick(lh, instance, DAY)
    result = run_request(request, lh, instance)
    assert result.success

    rows = lh.log_rows()
    run_rows = [r for r in rows if r["run_id"] == result.run_id]
    tick_rows = [r for r in rows if r["run_id"] == "schedule-20261127T030000Z"]
    # Day one: the run's rows for BUSY and OLD (their whole pass), the tick's for IDLE.
    assert Counter((r["table_name"], r["operation"]) for r in run_rows + tick_rows) == Counter(
        (t, op) for t in tables for op in full[t]
    )
    done = {(r["table_name"], r["operation"]) for r in run_rows if r["status"] == "completed"}
    assert {(BUSY, "optimize"), (OLD, "expire_snapshots")} <= done
    assert len(lh.data_file_paths(BUSY)) == 2  # one file per partition

    later = time.time() + 24 * 3600
    with simulated_clock(lambda: later):
        second = _tick(lh, instance, DAY + timedelta(days=1))

    assert isinstance(second, dg.SkipReason), second
    assert "3 tables looked at, none due" in str(second.skip_message)
    next_rows = [r for r in lh.log_rows() if r["run_id"] == "schedule-20261128T030000Z"]
    assert Counter((r["table_name"], r["operation"]) for r in next_rows) == Counter(
        (t, op) for t in tables for op in full[t]
    )
    assert {r["status"] for r in next_rows} == {"skipped"}


def test_the_log_tables_upkeep_run_compacts_the_daily_rows(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """An idle lakehouse whose log holds more small files than its upkeep allows (the tick
    appends one a day): the tick's run of no table compacts the log, and keeps its rows."""
    lh = lakehouse_factory()
    lh.add_table("lakehouse.a", appends=1, services=("api",))
    writer = Maintainer(lh.config).log
    for day in range(LOG_TABLE_SMALL_FILES + 1):
        writer.write([OpResult("lakehouse.a", "optimize", "skipped", f"day {day}", None, None, 0)])
    rows = len(lh.log_rows())

    [request] = _tick(lh, instance, DAY)
    result = run_request(request, lh, instance)

    assert result.success
    log = lh.table(lh.config.log_table)
    assert len(log.inspect.files()) == 1
    ops = Maintainer(lh.config).operations_for(TableRef.parse("lakehouse.a"))
    assert len(lh.log_rows()) == rows + len(ops)  # the tick's rows of lakehouse.a, kept
