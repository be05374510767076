"""Runs whose worker is gone are recognized from the lease store and marked failed by the
sensors, and only those: a ``STARTED`` run that never beat is failed after three leases,
saying why, and its table is requested again; a run whose heartbeat process on this host
was killed is failed at the next tick; one whose process lives on is never failed, however
long its beats stay away (a lease store it could not reach); one that holds a table stays.
A real run keeps its heartbeat while it runs, and a run whose lease store cannot be opened
does not start. (Lease 2 s here: 2 min by default.)"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import dagster as dg
import pytest

from icegate_dagster.automation.healing import SILENT_LEASES
from icegate_dagster.automation.health_sensor import table_health_sensor
from icegate_dagster.automation.runs import (
    BATCH_JOB,
    HEALTH_SENSOR,
    TRIGGER_TAG,
    BatchEntry,
    batch_entries,
    batch_run_config,
)
from icegate_dagster.automation.wal_sensor import wal_size_sensor
from icegate_dagster.definitions import defs
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import resources_for
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.lease_holder import beating_in_another_process, held_by_another_process

BUSY = "lakehouse.busy"
LEASE_S = 2.0
#: How long a run that cannot be asked about must be silent before it is failed.
SILENCE_S = LEASE_S * SILENT_LEASES


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(
        maintain={
            "locks": {"lease": f"{LEASE_S:g}s"},
            "health": {"small_files": 5},
            "compaction": {"min_files": 3},
        },
        wal=True,
    )
    lakehouse.add_table(BUSY, appends=6)
    return lakehouse


def _tick(lh: Lakehouse, instance: dg.DagsterInstance, sensor: object = None) -> object:
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(lh.config_path))},
    )
    return (sensor or table_health_sensor)(context)  # type: ignore[operator]


def _started_run(instance: dg.DagsterInstance) -> dg.DagsterRun:
    """A batch run of BUSY that Dagster calls STARTED (as after a killed ``dagster dev``)."""
    return instance.create_run_for_job(
        defs.resolve_job_def(BATCH_JOB),
        run_config=batch_run_config([BatchEntry(BUSY, ("optimize",), "s")]),
        tags={TRIGGER_TAG: HEALTH_SENSOR},
        status=dg.DagsterRunStatus.STARTED,
    )


def _status(instance: dg.DagsterInstance, run: dg.DagsterRun) -> dg.DagsterRunStatus:
    current = instance.get_run_by_id(run.run_id)
    assert current is not None
    return current.status


def _requested_tables(result: object) -> list[str]:
    assert isinstance(result, dg.SensorResult)
    runs = [
        dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
        for request in result.run_requests or []
    ]
    return [entry.table for run in runs for entry in batch_entries(run)]


def _failure_message(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str:
    [event] = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    return str(event.dagster_event.message if event.dagster_event else event.user_message)


def test_a_started_run_with_no_worker_is_failed_saying_why_and_its_table_requested_again(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    run = _started_run(instance)

    # It never beat, but may still be starting: its table waits for it.
    young = _tick(lh, instance)
    assert _status(instance, run) == dg.DagsterRunStatus.STARTED
    assert isinstance(young, dg.SensorResult) and not young.run_requests
    assert run.run_id in str(young.skip_reason)

    time.sleep(SILENCE_S + 0.5)
    healed = _tick(lh, instance)

    assert _status(instance, run) == dg.DagsterRunStatus.FAILURE
    message = _failure_message(instance, run)
    assert "worker is gone" in message and "never recorded a heartbeat" in message
    assert "3 × maintain.locks.lease (6s)" in message
    assert _requested_tables(healed) == [BUSY]


def test_a_run_whose_process_was_killed_on_this_host_is_failed_at_the_next_tick(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    run = _started_run(instance)
    with beating_in_another_process(lh.config_path, run.run_id) as worker:
        alive = _tick(lh, instance)
        assert _status(instance, run) == dg.DagsterRunStatus.STARTED
        assert _requested_tables(alive) == []

        worker.kill()  # an OOM kill: no clean-up, the heartbeat just stops
        worker.wait()
        healed = _tick(lh, instance)  # no waiting for the heartbeat to run out

    assert _status(instance, run) == dg.DagsterRunStatus.FAILURE
    message = _failure_message(instance, run)
    assert f"process {worker.pid} on " in message and "no longer exists" in message
    assert _requested_tables(healed) == [BUSY]


def test_a_run_whose_process_lives_is_never_failed_however_late_its_beats(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """Its heartbeat stops (its lease store is unreachable from its side) while the
    process runs on: on the same host the healer asks the process, not the clock."""
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    run = _started_run(instance)
    with beating_in_another_process(lh.config_path, run.run_id, falls_silent=True) as worker:
        time.sleep(SILENCE_S + 1)
        _tick(lh, instance)
        _tick(lh, instance, wal_size_sensor)
        assert _status(instance, run) == dg.DagsterRunStatus.STARTED
        worker.kill()
        worker.wait()
        _tick(lh, instance)
    assert _status(instance, run) == dg.DagsterRunStatus.FAILURE


def test_a_run_whose_lease_store_cannot_be_opened_does_not_start(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """Nobody could tell such a run from a dead one: its set-up fails, saying why."""
    lh = lakehouse_factory(
        # Nothing listens on port 1: the store is unreachable.
        maintain={"locks": {"uri": "postgresql+psycopg2://icegate@127.0.0.1:1/leases"}}
    )
    lh.add_table(BUSY, appends=1)
    result = defs.resolve_job_def(BATCH_JOB).execute_in_process(
        instance=instance,
        run_config=batch_run_config([BatchEntry(BUSY, ("optimize",), "s")]),
        resources=resources_for(lh),
        raise_on_error=False,
    )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE)
    text = str(result.all_events)
    assert "cannot keep its heartbeat in the lease store" in text, failure
    assert "127.0.0.1" in text
    # Nothing ran: the table was not touched.
    assert not [e for e in result.all_events if e.event_type == dg.DagsterEventType.STEP_START]


def test_a_run_holding_a_table_lease_is_alive_and_the_wal_sensor_heals_too(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    for i in range(4):
        lh.write_wal(BUSY, lh.table(BUSY).scan().to_arrow().slice(0, 2), f"w-{i}.parquet")
    run = instance.create_run_for_job(
        defs.resolve_job_def(BATCH_JOB),
        run_config=batch_run_config([BatchEntry(BUSY, ("wal_compaction",), "b")]),
        tags={TRIGGER_TAG: "wal_size_sensor"},
        status=dg.DagsterRunStatus.STARTED,
    )
    with held_by_another_process(lh.config_path, BUSY, run_id=run.run_id):
        time.sleep(SILENCE_S + 0.5)
        waiting = _tick(lh, instance, wal_size_sensor)
        assert _status(instance, run) == dg.DagsterRunStatus.STARTED
        assert isinstance(waiting, dg.SensorResult) and run.run_id in str(waiting.skip_reason)

    # The holder released it; now nothing renews anything, and no process of the run
    # ever beat on this host: silent for three leases since it started, it is failed.
    healed = _tick(lh, instance, wal_size_sensor)
    assert _status(instance, run) == dg.DagsterRunStatus.FAILURE
    assert _requested_tables(healed) == [BUSY]


def test_a_real_run_keeps_its_heartbeat_while_it_runs_and_stops_after(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    locks = Maintainer(lh.config).leasing.locks
    assert locks is not None
    results: list[dg.ExecuteInProcessResult] = []

    def run() -> None:
        results.append(
            defs.resolve_job_def(BATCH_JOB).execute_in_process(
                instance=instance,
                run_config=batch_run_config([BatchEntry(BUSY, ("optimize",), "s")]),
                resources=resources_for(lh),
            )
        )

    seen = []

    def look() -> None:
        started = instance.get_run_ids(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
        if started:
            seen.append(locks.run_liveness(started)[started[0]])
        time.sleep(0.2)

    # Another maintainer holds the table for two leases: the run waits for it (lock_wait),
    # so it lives longer than a lease however fast its Spark work is.
    with held_by_another_process(lh.config_path, BUSY):
        worker = threading.Thread(target=run)
        worker.start()
        held_until = time.monotonic() + 2 * LEASE_S
        while time.monotonic() < held_until and worker.is_alive():
            look()
    while worker.is_alive():
        look()
    worker.join()

    [result] = results
    assert result.success
    assert lh.table(BUSY).inspect.files().num_rows < 12, "the run compacted after the wait"
    # From its first heartbeat (the resource's set-up, right after the run starts) to its
    # end, every look finds the run alive, and the heartbeat is renewed: it lived past the
    # first lease.
    beating = [liveness for liveness in seen if liveness.heartbeat_until is not None]
    assert len(beating) >= 5 and all(liveness.alive for liveness in beating)
    first, last = beating[0], beating[-1]
    assert last.now - first.now > timedelta(seconds=LEASE_S)
    assert last.heartbeat_until is not None and first.heartbeat_until is not None
    assert last.heartbeat_until > first.heartbeat_until + timedelta(seconds=LEASE_S / 2)
    # After the run, the heartbeat thread stops within one beat (a sixth of the lease).
    time.sleep(LEASE_S / 6 + 1)
    assert not [t for t in threading.enumerate() if t.name == f"heartbeat {result.run_id}"]
