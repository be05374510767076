"""The trigger's run requests against a temporary Dagster instance, with the sensor daemon's
own rule for run keys (a request whose key a run of the same sensor already has is dropped):
no request is ever dropped as a duplicate, whatever the trigger's memory went through (a
table dropped and created again, the memory's database restored from a copy), and no
request is counted lost unless its run provably existed and ended without its table (a
tick whose result never reached Dagster is not a failure). A memory that another writer
keeps locked ends the tick within its deadline, saying so."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.names import BATCH_JOB, HEALTH_SENSOR, WAL_SENSOR, iceberg_tables
from icegate_dagster.assets.runs import batch_entries
from icegate_dagster.assets.trigger_state import simulated_clock
from icegate_dagster.definitions import defs
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.trigger.records import OperationAttempt, PassRecord
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.health_sensor import table_health_sensor
from icegate_dagster.sensors.tick import LAUNCH_GRACE_S
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from tests.dagster.conftest import BUSY, OLD, discovery_tick, health_lakehouse
from tests.lakehouse import Lakehouse, LakehouseFactory

#: The tags the sensor daemon puts on a run it makes of a request (``dagster._daemon.sensor``).
RUN_KEY_TAG, SENSOR_NAME_TAG = "dagster/run_key", "dagster/sensor_name"


def submit(
    instance: dg.DagsterInstance, sensor: str, request: dg.RunRequest
) -> dg.DagsterRun | None:
    """What the sensor daemon does with a request (``fetch_existing_runs``): nothing when a run
    of the same sensor already has its key (the request is dropped), else a queued run."""
    assert request.run_key is not None and request.job_name is not None
    existing = instance.get_runs(
        filters=dg.RunsFilter(tags={RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: sensor})
    )
    if existing:
        return None
    return instance.create_run_for_job(
        defs.resolve_job_def(request.job_name),
        run_config=request.run_config,
        tags={**request.tags, RUN_KEY_TAG: request.run_key, SENSOR_NAME_TAG: sensor},
        status=dg.DagsterRunStatus.NOT_STARTED,
    )


def _resource(lh: Lakehouse) -> LakehouseResource:
    return LakehouseResource(config_path=str(lh.config_path))


def _evaluate(lh: Lakehouse, instance: dg.DagsterInstance) -> Any:
    """One evaluation of the health sensor (its partitions added, as the daemon does)."""
    context = dg.build_sensor_context(instance=instance, resources={"lakehouse": _resource(lh)})
    result = table_health_sensor(context)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests or []:
            instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))
    return result


def _by_table(result: Any) -> dict[str, dg.RunRequest]:
    assert isinstance(result, dg.SensorResult)
    found = {}
    for request in result.run_requests or []:
        run = dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
        [entry] = batch_entries(run)  # one table a run (trigger.tables_per_run 1)
        found[entry.table] = request
    return found


def _memory(lh: Lakehouse) -> TriggerMemory:
    store = lease_store(lh.config, lh.catalog)
    assert store is not None
    return memory_for(store.engine)


def _lost(lh: Lakehouse) -> dict[str, list[str]]:
    """Per table, its operations the trigger's memory counts as lost with their run."""
    return {
        table: [op for op, memory in ops.items() if memory.outcome == "lost"]
        for table, ops in _memory(lh).operations().items()
        if any(memory.outcome == "lost" for memory in ops.values())
    }


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as temp_instance:
        yield temp_instance


def _lakehouse(factory: LakehouseFactory, tmp_path: Path, **trigger: Any) -> Lakehouse:
    """BUSY and OLD due (one run each), the trigger's memory in its own SQLite file."""
    locks = {"uri": f"sqlite:///{tmp_path / 'locks.db'}"}
    return health_lakehouse(factory, trigger={"tables_per_run": 1, **trigger}, locks=locks)


def test_a_table_dropped_and_created_again_is_launched_and_not_counted_lost(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    lh = _lakehouse(lakehouse_factory, tmp_path)
    first = _by_table(_evaluate(lh, instance))
    assert set(first) == {BUSY, OLD}
    runs = {table: submit(instance, HEALTH_SENSOR, r) for table, r in first.items()}
    for run in runs.values():
        assert run is not None
        instance.report_run_canceled(run)

    # OLD is dropped; discovery confirms it gone, so the trigger forgets it; a new OLD is
    # made, due like the old one.
    lh.catalog.drop_table(("lakehouse", "old"))
    discovery_tick(instance, _resource(lh))
    assert OLD not in instance.get_dynamic_partitions(iceberg_tables.name)
    assert OLD not in _memory(lh).tables_memory()
    # Due for expiry once its newest snapshot is older than the 1 s threshold (counted from
    # that commit: making the table may itself take a second on a busy host).
    newest = max(s.timestamp_ms for s in lh.add_table(OLD, appends=3).metadata.snapshots)
    time.sleep(max(0.0, newest / 1000 + 1.1 - time.time()))

    again = _by_table(_evaluate(lh, instance))
    assert OLD in again
    assert again[OLD].run_key != first[OLD].run_key
    run = submit(instance, HEALTH_SENSOR, again[OLD])
    assert run is not None, f"Dagster dropped {again[OLD].run_key}: a key used before"

    # Its run waits in the queue: nothing is counted lost, nothing asked again.
    later = _evaluate(lh, instance)
    assert OLD not in _by_table(later)
    assert OLD not in _lost(lh)


def test_a_restored_memory_database_never_repeats_a_run_key(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    lh = _lakehouse(lakehouse_factory, tmp_path)
    _memory(lh)  # its tables made
    backup = tmp_path / "locks-backup.db"
    with sqlite3.connect(tmp_path / "locks.db") as source, sqlite3.connect(backup) as copy:
        source.backup(copy)

    first = _by_table(_evaluate(lh, instance))
    assert set(first) == {BUSY, OLD}
    for request in first.values():
        run = submit(instance, HEALTH_SENSOR, request)
        assert run is not None
        instance.report_run_canceled(run)

    # The lease store's database is restored from the copy made before those requests.
    with sqlite3.connect(backup) as copy, sqlite3.connect(tmp_path / "locks.db") as target:
        copy.backup(target)
    assert _memory(lh).tables_memory() == {}

    again = _by_table(_evaluate(lh, instance))
    assert set(again) == {BUSY, OLD}
    for table, request in again.items():
        assert request.run_key != first[table].run_key
        assert submit(instance, HEALTH_SENSOR, request) is not None, request.run_key

    later = _evaluate(lh, instance)
    assert _by_table(later) == {}
    assert _lost(lh) == {}


@contextmanager
def _write_lock(path: Path) -> Iterator[None]:
    """Another process's connection holding a write transaction on the SQLite file."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("DELETE FROM icegate_trigger_looks WHERE table_name = 'none'")
        yield
    finally:
        conn.execute("ROLLBACK")
        conn.close()


def test_a_locked_memory_ends_the_tick_within_its_deadline_and_says_why(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    lh = _lakehouse(lakehouse_factory, tmp_path, tick_deadline="5s")
    _memory(lh)
    with _write_lock(tmp_path / "locks.db"):
        started = time.monotonic()
        locked = _evaluate(lh, instance)
        took = time.monotonic() - started
    # A generous liveness bound: SQLite alone would wait 30 s for each write; Dagster
    # cancels an evaluation at 60 s and keeps nothing of it.
    assert took < 25, took
    assert isinstance(locked, dg.SensorResult) and not locked.run_requests
    message = str(locked.skip_reason.skip_message if locked.skip_reason else "")
    assert "maintain.locks.uri" in message and "locked" in message, message
    # Nothing was remembered as requested, so nothing is lost; once the lock is gone the
    # due tables are asked for.
    assert set(_by_table(_evaluate(lh, instance))) == {BUSY, OLD}
    assert _lost(lh) == {}


def test_a_tick_whose_requests_never_reached_dagster_counts_nothing_lost(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    lh = _lakehouse(lakehouse_factory, tmp_path)
    start = time.time()
    with simulated_clock(lambda: start):
        cancelled = _evaluate(lh, instance)  # Dagster canceled it: its result is lost
    assert set(_by_table(cancelled)) == {BUSY, OLD}

    # Within the grace a run may take to appear, the tables wait for it.
    with simulated_clock(lambda: start + 30):
        soon = _evaluate(lh, instance)
    assert _lost(lh) == {}
    assert _by_table(soon) == {}
    # Past it, no run with those keys exists: Dagster never got them. Asked again, under new
    # keys, and no failure counted.
    with simulated_clock(lambda: start + LAUNCH_GRACE_S + 30):
        later = _by_table(_evaluate(lh, instance))
    assert set(later) == {BUSY, OLD}
    for table, request in later.items():
        assert request.run_key != _by_table(cancelled)[table].run_key
        assert submit(instance, HEALTH_SENSOR, request) is not None
    assert _lost(lh) == {}


def test_a_wal_request_never_hides_an_unanswered_health_request(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory(
        maintain={
            "health": {"small_files": 5},
            "compaction": {"min_files": 3},
            "trigger": {"tables_per_run": 1},
            "locks": {"uri": f"sqlite:///{tmp_path / 'locks.db'}"},
        },
        wal=True,
    )
    lh.add_table(BUSY, appends=6)
    health = _by_table(_evaluate(lh, instance))
    assert set(health) == {BUSY}
    health_run = submit(instance, HEALTH_SENSOR, health[BUSY])
    assert health_run is not None

    # WAL arrives while the health run waits: the WAL sensor asks for its ingest (the
    # health run does not ingest WAL).
    rows = lh.table(BUSY).scan().to_arrow().slice(0, 2)
    for i in range(3):
        lh.write_wal(BUSY, rows, f"w-{i}.parquet")
    context = dg.build_sensor_context(instance=instance, resources={"lakehouse": _resource(lh)})
    wal = wal_size_sensor(context)
    assert isinstance(wal, dg.SensorResult)
    [wal_request] = wal.run_requests or []
    wal_run = submit(instance, WAL_SENSOR, wal_request)
    assert wal_run is not None
    # The health run waits in the queue: its request is not lost.
    assert _lost(lh) == {}

    # The WAL run records the table as it finishes; the health run's worker dies before.
    _memory(lh).record_pass(
        PassRecord(
            BUSY,
            wal_run.run_id,
            (OperationAttempt("wal_compaction", "completed"),),
            requested=("wal_compaction",),
        ),
        backoff=timedelta(minutes=1),
        backoff_max=timedelta(hours=1),
    )
    instance.report_run_canceled(wal_run)
    instance.report_run_failed(health_run, "the worker was OOM-killed")

    _evaluate(lh, instance)
    assert _lost(lh) == {BUSY: ["optimize"]}
