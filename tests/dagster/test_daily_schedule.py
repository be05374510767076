"""The daily schedule costs what its work costs (issue 41, item 2): a tick looks at every
table from its metadata as the health trigger does, requests runs for the tables with work
only (time-based work such as expiry included), and writes the maintenance-log rows of the
others itself, without a JVM. Real Dagster instance, real SQLite catalogs, no JVM."""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg

from icegate_dagster.assets.names import BATCH_JOB, iceberg_tables
from icegate_dagster.assets.runs import batch_entries
from icegate_dagster.assets.trigger_state import simulated_clock
from icegate_dagster.jobs.maintenance import daily_maintenance
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.log.upkeep import LOG_TABLE_SMALL_FILES
from icegate_dagster.maintenance.results import OpResult
from icegate_dagster.maintenance.trigger.look import look_at_lakehouse
from icegate_dagster.maintenance.trigger.store import memory_for
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import BUSY, IDLE, OLD, discovery_tick, health_lakehouse, health_tick
from tests.lakehouse import SCHEMA, Lakehouse, LakehouseFactory, batch

SCHEDULED = datetime(2026, 11, 27, 3, tzinfo=UTC)
RUN_ID = "schedule-20261127T030000Z"


def _resource(lh: Lakehouse) -> LakehouseResource:
    return LakehouseResource(config_path=str(lh.config_path))


def _tick(lh: Lakehouse, instance: dg.DagsterInstance) -> Any:
    """One evaluation of ``daily_maintenance`` at its 03:00 of :data:`SCHEDULED`."""
    # Closed after the tick, as the daemon closes it: an open one leaves Dagster's
    # definitions-state storage pointing at this (then discarded) instance.
    with dg.build_schedule_context(
        instance=instance,
        resources={"lakehouse": _resource(lh)},
        scheduled_execution_time=SCHEDULED,
    ) as context:
        result = daily_maintenance(context)
    return result if isinstance(result, dg.SkipReason) else list(result or [])


def _daily_rows(lh: Lakehouse) -> list[dict[str, Any]]:
    return [r for r in lh.log_rows() if r["run_id"] == RUN_ID]


def _full_pass(lh: Lakehouse, key: str) -> tuple[str, ...]:
    return Maintainer(lh.config).operations_for(TableRef.parse(key))


def test_over_a_healthy_lakehouse_the_tick_launches_no_run_and_logs_every_table(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """Three idle tables of one file each: no run; the skip reason says how many tables were
    looked at and that none is due; the log holds a ``skipped`` row per table and operation,
    with the reason, as a pass would have written them."""
    lh = lakehouse_factory()
    keys = ["lakehouse.a", "lakehouse.b", "lakehouse.c"]
    for key in keys:
        lh.add_table(key, appends=1, services=("api",))
    discovery_tick(instance, _resource(lh))
    assert sorted(instance.get_dynamic_partitions(iceberg_tables.name)) == keys

    result = _tick(lh, instance)

    assert isinstance(result, dg.SkipReason), result
    assert "3 tables looked at, none due" in str(result.skip_message)
    rows = _daily_rows(lh)
    ops = _full_pass(lh, keys[0])
    assert Counter((r["table_name"], r["operation"]) for r in rows) == Counter(
        (key, op) for key in keys for op in ops
    )
    assert {r["status"] for r in rows} == {"skipped"}
    optimize = next(r for r in rows if r["operation"] == "optimize")
    assert optimize["details"].startswith("not due from the table's metadata (health score 100")
    assert optimize["files_before"] == optimize["files_after"] == 1
    assert optimize["snapshots_before"] == 1
    orphans = next(r for r in rows if r["operation"] == "remove_orphan_files")
    assert "orphan files are listed in a run only" in orphans["details"]


def test_due_tables_get_one_run_keyed_as_the_sensors_and_the_health_trigger_waits_for_it(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """BUSY (small files), OLD (snapshots past their retention: time alone made expiry due)
    and IDLE: one run of ``maintenance_batch_job`` over BUSY and OLD, each doing its whole
    daily pass, tagged and keyed as the sensors' runs; IDLE's rows written by the tick. The
    health trigger's next tick asks for neither again (the schedule's request is in its
    memory)."""
    lh = health_lakehouse(lakehouse_factory)
    discovery_tick(instance, _resource(lh))
    result = _tick(lh, instance)

    assert isinstance(result, list) and len(result) == 1, result
    [request] = result
    assert request.job_name == BATCH_JOB
    entries = batch_entries(dg.DagsterRun(job_name=BATCH_JOB, run_config=request.run_config))
    assert {e.table: e.operations for e in entries} == {
        BUSY: _full_pass(lh, BUSY),
        OLD: _full_pass(lh, OLD),
    }
    assert request.tags["icegate/trigger"] == "daily_maintenance"
    assert request.tags["icegate/tables"] == "2"
    assert "dagster/max_runtime" in request.tags
    assert request.run_key is not None and request.run_key.startswith("daily:batch:")
    assert {r["table_name"] for r in _daily_rows(lh)} == {IDLE}
    assert sorted(instance.get_dynamic_partitions(iceberg_tables.name)) == sorted(
        [BUSY, OLD, IDLE]
    )

    health, _ = health_tick(instance, _resource(lh), None)
    assert not health.run_requests
    assert "its run is not made yet" in str(health.skip_reason)


def _tiny_tables(lh: Lakehouse, count: int) -> list[str]:
    """``count`` tables of one small file each, cheaply: one table made by pyiceberg, then
    its metadata copied for each (each copy with its own location) and registered in the
    SQLite catalog in one transaction, as ``register_table`` would one by one."""
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    template = lh.catalog.create_table(("lakehouse", "tiny0000"), schema=SCHEMA)
    template.append(batch(0, ("api",), 2))
    source = json.loads(Path(template.metadata_location.removeprefix("file://")).read_text())
    keys, rows = ["lakehouse.tiny0000"], []
    for i in range(1, count):
        name = f"tiny{i:04d}"
        folder = lh.root / "copies" / name
        (folder / "metadata").mkdir(parents=True)
        metadata = folder / "metadata" / "00000-copy.metadata.json"
        metadata.write_text(json.dumps({**source, "location": folder.as_uri()}))
        rows.append((lh.config.catalog.name, "lakehouse", name, metadata.as_uri(), None, "TABLE"))
        keys.append(f"lakehouse.{name}")
    with sqlite3.connect(lh.root / "catalog.db") as db:
        db.executemany("INSERT INTO iceberg_tables VALUES (?, ?, ?, ?, ?, ?)", rows)
    return keys


def test_over_1000_tables_with_10_due_one_run_names_exactly_those_10(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """990 idle tables of one file, 8 with small files and 2 whose snapshots crossed their
    retention since the health trigger's last look (expiry is due with time alone). The
    health trigger looked at every table an hour before; two hours later the schedule's
    tick re-reads what changed, requests exactly one run naming the 10, and writes the
    rows of the 990 others: one per operation of their pass, ``skipped``."""
    small = [f"lakehouse.small{i}" for i in range(8)]
    aging = ["lakehouse.aging0", "lakehouse.aging1"]
    lh = lakehouse_factory(
        maintain={
            "health": {"small_files": 5, "expirable_snapshots": 1},
            "trigger": {"tick_deadline": "50s"},
            "tables": {key: {"expire_snapshots": {"retention_threshold": "1h"}} for key in aging},
        }
    )
    idle = _tiny_tables(lh, 990)
    for key in small:
        lh.add_table(key, appends=6, services=("api",))
    for key in aging:
        lh.add_table(key, appends=3, services=("api",))
    # The health trigger's look (as its sensor keeps it): nothing due on the aging tables yet.
    maintainer = Maintainer(lh.config)
    locks = lease_store(lh.config, lh.catalog)
    assert locks is not None
    looked = look_at_lakehouse(maintainer, memory_for(locks.engine), time.time(), until=None)
    assert sorted(t for t, h in looked.healths.items() if h.due) == small
    assert len(looked.tables) == 1000
    instance.add_dynamic_partitions(iceberg_tables.name, looked.tables)  # discovery's work

    later = time.time() + 2 * 3600
    with simulated_clock(lambda: later):
        result = _tick(lh, instance)

    assert isinstance(result, list) and len(result) == 1, result
    [request] = result
    entries = batch_entries(dg.DagsterRun(job_name=BATCH_JOB, run_config=request.run_config))
    assert sorted(e.table for e in entries) == sorted(small + aging)
    assert request.tags["icegate/tables"] == "10"
    rows = _daily_rows(lh)
    ops = _full_pass(lh, idle[0])
    assert Counter((r["table_name"], r["operation"]) for r in rows) == Counter(
        (key, op) for key in idle for op in ops
    )
    assert {r["status"] for r in rows} == {"skipped"}


def test_a_log_table_due_for_upkeep_gets_a_run_of_no_table_when_nothing_else_runs(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """Every run keeps the log table in its last step; on a lakehouse where no table needs
    a run, the daily rows would pile up one small file a day. Once the log holds more small
    files than its upkeep allows, the tick asks for one run of ``maintenance_batch_job``
    naming no table (its last step is the log's upkeep), and says why."""
    lh = lakehouse_factory()
    lh.add_table("lakehouse.a", appends=1, services=("api",))
    first = _tick(lh, instance)
    assert isinstance(first, dg.SkipReason), first  # one day's rows: nothing to keep yet
    writer = Maintainer(lh.config).log
    for day in range(LOG_TABLE_SMALL_FILES):  # the rows of as many more days
        writer.write([OpResult("lakehouse.a", "optimize", "skipped", f"day {day}", None, None, 0)])

    result = _tick(lh, instance)

    assert isinstance(result, list) and len(result) == 1, result
    [request] = result
    assert request.job_name == BATCH_JOB
    assert batch_entries(dg.DagsterRun(job_name=BATCH_JOB, run_config=request.run_config)) == []
    assert request.tags["icegate/tables"] == "0"
    assert request.run_key is not None and request.run_key.startswith("daily:log:")
