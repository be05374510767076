"""Runs whose worker is gone are recognized from the lease store and marked failed by the
sensors, and only those: a ``STARTED`` run that never beat is failed after three leases,
saying why, and its table is requested again; a run whose heartbeat process on this host
was killed is failed at the next tick; one whose process lives on is never failed, however
long its beats stay away (a lease store it could not reach); one that holds a table stays.
A real run keeps its heartbeat while it runs, and a run whose lease store cannot be opened
does not start. (Lease 15 s here, the shortest allowed: 2 min by default.)"""

from __future__ import annotations

import importlib.util
import subprocess
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.remote_representation.external import RemoteJob
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin

from icegate_dagster.assets.names import BATCH_JOB, HEALTH_SENSOR, TRIGGER_TAG, iceberg_tables
from icegate_dagster.assets.runs import BatchEntry, batch_entries, batch_run_config
from icegate_dagster.config.models import MIN_LEASE
from icegate_dagster.definitions import defs
from icegate_dagster.jobs.maintenance import daily_maintenance
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.healing import SILENT_LEASES, fail_dead_runs
from icegate_dagster.sensors.health_sensor import table_health_sensor
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from tests.dagster.conftest import resources_for
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.lease_holder import beating_in_another_process, held_by_another_process
from tests.webserver import REPO

#: Dagster's run monitoring fails a run that ran longer than this tag says (seconds).
MAX_RUNTIME_TAG = "dagster/max_runtime"

BUSY = "lakehouse.busy"
LEASE_S = MIN_LEASE.total_seconds()
#: How long a run that cannot be asked about must be silent before it is failed.
SILENCE_S = LEASE_S * SILENT_LEASES
STUCK_AFTER = timedelta(hours=3)


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(
        maintain={
            "locks": {"lease": f"{LEASE_S:g}s", "stuck_after": "3h"},
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
    assert f"3 × maintain.locks.lease ({SILENCE_S:g}s)" in message
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

    # Another maintainer holds the table for more than a lease (less than lock_wait): the
    # run waits for it, so it lives longer than a lease however fast its Spark work is.
    with held_by_another_process(lh.config_path, BUSY):
        worker = threading.Thread(target=run)
        worker.start()
        held_until = time.monotonic() + LEASE_S + 3
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


def _zombie(worker: subprocess.Popen[str]) -> None:
    """Kill ``worker`` and leave it unreaped, as a run worker whose parent hangs is left."""
    worker.kill()
    deadline = time.monotonic() + 30  # liveness bound only
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{worker.pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return
        time.sleep(0.01)
    raise AssertionError(f"process {worker.pid} did not become a zombie")


def test_a_run_whose_worker_is_a_zombie_is_failed_at_the_next_tick(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """Its process ended but nobody reaped it: same PID, same start time, still in /proc,
    running nothing. It holds the maintenance slot until it is failed."""
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY])
    run = _started_run(instance)
    with beating_in_another_process(lh.config_path, run.run_id) as worker:
        _tick(lh, instance)
        assert _status(instance, run) == dg.DagsterRunStatus.STARTED
        _zombie(worker)
        healed = _tick(lh, instance)
        assert _status(instance, run) == dg.DagsterRunStatus.FAILURE, "a zombie counted alive"
    message = _failure_message(instance, run)
    assert f"process {worker.pid} on " in message and "no longer exists" in message
    assert _requested_tables(healed) == [BUSY]


def _location(
    instance: dg.DagsterInstance, name: str, target: LoadableTargetOrigin
) -> Iterator[RemoteJob]:
    """The ``migrate_job`` of code location ``name``, loaded as Dagster loads a location."""
    origin = InProcessCodeLocationOrigin(loadable_target_origin=target, location_name=name)
    with origin.create_location(instance) as location:
        yield location.get_repository("__repository__").get_full_job("migrate_job")


OTHER_TEAM = """
import dagster as dg

@dg.op
def move_accounts() -> None:
    pass

@dg.job(name="migrate_job")
def migrate_job() -> None:
    move_accounts()

defs = dg.Definitions(jobs=[migrate_job])
"""


def test_the_healer_leaves_another_code_locations_runs_alone(
    lh: Lakehouse, instance: dg.DagsterInstance, tmp_path: Path
) -> None:
    """Another team's code location has its own ``migrate_job``; its live run, started 7
    minutes ago, keeps no heartbeat in icegate's lease store (it knows nothing of it) and is
    none of icegate's business. Ours, in the same state, is failed."""
    (tmp_path / "team_b.py").write_text(OTHER_TEAM)
    spec = importlib.util.spec_from_file_location("team_b", tmp_path / "team_b.py")
    assert spec is not None and spec.loader is not None
    team_b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(team_b)
    theirs_target = LoadableTargetOrigin(
        python_file=str(tmp_path / "team_b.py"), working_directory=str(tmp_path)
    )
    ours_target = LoadableTargetOrigin(
        module_name="icegate_dagster.definitions", working_directory=str(REPO)
    )
    runs = {}
    for name, target, job in (
        ("team_b", theirs_target, team_b.migrate_job),
        ("icegate", ours_target, defs.resolve_job_def("migrate_job")),
    ):
        for remote in _location(instance, name, target):
            for key, tags in ((name, dict(remote.run_tags)), (f"{name} untagged", {})):
                # Dagster's launch gives a run its job's tags; a run without them (one
                # launched before the job had its tag) is known by its code alone.
                runs[key] = instance.create_run_for_job(
                    job,
                    status=dg.DagsterRunStatus.STARTED,
                    tags=tags,
                    remote_job_origin=remote.get_remote_origin(),
                    job_code_origin=remote.get_python_origin(),
                )
    locks = Maintainer(lh.config).leasing.locks
    assert locks is not None
    seven_minutes_on = datetime.now(UTC) + timedelta(minutes=7)

    dead = fail_dead_runs(instance, locks.run_liveness, lh.config.locks.lease, seven_minutes_on)

    for theirs in ("team_b", "team_b untagged"):
        assert _status(instance, runs[theirs]) == dg.DagsterRunStatus.STARTED, (
            "another code location's run was failed"
        )
        assert not instance.all_logs(runs[theirs].run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
    ours = (runs["icegate"].run_id, runs["icegate untagged"].run_id)
    assert sorted(run.run_id for run in dead) == sorted(ours)
    for run_id in ours:
        run = instance.get_run_by_id(run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
        assert "never recorded a heartbeat" in _failure_message(instance, run)


def test_sensor_and_schedule_runs_carry_a_max_runtime_from_the_config(
    lh: Lakehouse, instance: dg.DagsterInstance, lakehouse_factory: LakehouseFactory
) -> None:
    """A run that hangs (a worker alive but making no progress) holds the only maintenance
    slot: Dagster's run monitoring fails it past ``dagster/max_runtime``, which every run
    the sensors and the schedule request carries: ``maintain.locks.stuck_after`` (by then a
    hung operation has given up its lease) plus one lease (by then that lease ran out)."""
    expected = str(int((STUCK_AFTER + timedelta(seconds=LEASE_S)).total_seconds()))
    # A second table for the WAL sensor: BUSY's open health request makes the WAL sensor
    # wait for that run (each table has one run in flight at a time).
    ingest = "lakehouse.ingest"
    lh.add_table(ingest, appends=1)
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, ingest])
    health = _tick(lh, instance)
    assert isinstance(health, dg.SensorResult) and health.run_requests
    for i in range(4):
        lh.write_wal(ingest, lh.table(ingest).scan().to_arrow().slice(0, 2), f"w-{i}.parquet")
    wal = _tick(lh, instance, wal_size_sensor)
    assert isinstance(wal, dg.SensorResult) and wal.run_requests
    # The schedule asks for no table a sensor asked for already: its own lakehouse, alike.
    nightly = lakehouse_factory(
        maintain={
            "locks": {"lease": f"{LEASE_S:g}s", "stuck_after": "3h"},
            "health": {"small_files": 5},
        }
    )
    nightly.add_table(BUSY, appends=6)
    with dg.build_schedule_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(nightly.config_path))},
        scheduled_execution_time=datetime(2026, 11, 21, 3, tzinfo=UTC),
    ) as context:
        schedule = daily_maintenance(context)
    assert not isinstance(schedule, dg.SkipReason)
    requests = [*health.run_requests, *wal.run_requests, *schedule]
    assert len(requests) == 3
    assert [request.tags.get(MAX_RUNTIME_TAG) for request in requests] == [expected] * 3
