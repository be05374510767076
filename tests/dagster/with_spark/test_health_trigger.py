"""The health trigger on real tables, a real trigger memory and a temporary Dagster instance:
``table_health_sensor`` requests exactly the due tables with exactly their due operations,
on a fresh instance too, never a table with a run in flight or a lease held elsewhere,
within its budget, not more often than ``health.min_interval``, counting requests no run
answered and backing off operations that keep failing; ``lakehouse_health`` carries the
totals; a maintenance run records each table's ``health_score``, its ``healthy`` check and
its outcome in the trigger's memory."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import dagster as dg
import pytest
import yaml

from icegate_dagster.assets.lakehouse_health import lakehouse_health
from icegate_dagster.assets.names import (
    BATCH_JOB,
    HEALTH_SENSOR,
    LAKEHOUSE_HEALTH,
    MAINTAINED_TABLE,
    STATE_TAG,
    TABLE_TAG,
    TRIGGER_TAG,
    iceberg_tables,
)
from icegate_dagster.assets.runs import BatchEntry, batch_entries, batch_run_config
from icegate_dagster.assets.trigger_state import simulated_clock
from icegate_dagster.definitions import defs
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.trigger.decision import decide
from icegate_dagster.maintenance.trigger.look import LookCache, look_at_lakehouse
from icegate_dagster.maintenance.trigger.records import OperationAttempt, PassRecord
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors import health_sensor
from icegate_dagster.sensors.health_sensor import table_health_sensor
from icegate_dagster.sensors.tick import Tick
from tests.dagster.conftest import BUSY, IDLE, OLD, health_lakehouse, launch, resources_for
from tests.lakehouse import Lakehouse, LakehouseFactory, batch


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    return health_lakehouse(lakehouse_factory)


def _resource(lh: Lakehouse) -> LakehouseResource:
    return LakehouseResource(config_path=str(lh.config_path))


def _tick(lh: Lakehouse, instance: dg.DagsterInstance, cursor: str | None = None) -> Any:
    """One tick as the daemon runs it: partitions added, events stored."""
    context = dg.build_sensor_context(
        instance=instance, resources={"lakehouse": _resource(lh)}, cursor=cursor
    )
    result = table_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    for request in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result


def _memory(lh: Lakehouse) -> TriggerMemory:
    store = lease_store(lh.config, lh.catalog)
    assert store is not None
    return memory_for(store.engine)


def _health(result: dg.SensorResult) -> dict[str, Any]:
    """The tick's ``lakehouse_health`` materialization, its metadata as plain values."""
    [event] = [e for e in result.asset_events if e.asset_key == LAKEHOUSE_HEALTH]
    assert isinstance(event, dg.AssetMaterialization)
    return {key: value.value for key, value in event.metadata.items()}


def _entries(request: dg.RunRequest) -> list[BatchEntry]:
    run = dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
    return batch_entries(run)


def _by_table(result: dg.SensorResult) -> dict[str, tuple[dg.RunRequest, BatchEntry]]:
    """Each requested table, with its run request and its entry in that run."""
    return {
        entry.table: (request, entry)
        for request in result.run_requests or []
        for entry in _entries(request)
    }


def _tables(result: dg.SensorResult) -> set[str]:
    return set(_by_table(result))


def _decisions(lh: Lakehouse, instance: dg.DagsterInstance) -> dict[str, str]:
    """What the trigger would do now with every table, and why."""
    resource = _resource(lh)
    tick = Tick.for_run(instance, resource)
    look = look_at_lakehouse(resource.maintainer("test"), tick.memory, tick.now, until=None)
    assert tick.memory is not None
    selection, _ = decide(
        look,
        tick.memory.tables_memory(),
        tick.busy(look.tables),
        now=tick.now,
        trigger=tick.config.trigger,
    )
    return selection.decisions()


def test_a_fresh_instance_is_acted_on_at_its_first_tick_without_waiting_for_discovery(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    first = _tick(lh, instance)
    assert _tables(first) == {BUSY, OLD}
    [added] = first.dynamic_partitions_requests
    assert sorted(added.partition_keys) == [BUSY, IDLE, OLD]
    assert sorted(instance.get_dynamic_partitions(iceberg_tables.name)) == [BUSY, IDLE, OLD]


def test_sensor_requests_the_due_tables_with_their_operations_and_a_run_records_health(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])

    first = _tick(lh, instance)

    requested = _by_table(first)
    assert set(requested) == {BUSY, OLD}  # not the healthy table
    assert requested[BUSY][1].operations == ("optimize",)
    assert requested[OLD][1].operations == ("expire_snapshots",)
    # Both in one run (one process, one Spark session), each with its own operations.
    [request] = first.run_requests
    assert request.job_name == BATCH_JOB and request.tags[TRIGGER_TAG] == HEALTH_SENSOR
    assert float(request.tags["icegate/need"]) > 0
    health = _health(first)
    assert health["tables"] == 3 and health["tables_assessed"] == 3
    assert health["tables_due"] == 2 and health["tables_requested"] == 2
    assert health["backlog_tables"] == 0
    assert health["small_files"] >= 12
    assert isinstance(health["mean_score"], float) and health["lowest_score"] < 100
    least = health["least_healthy"]
    assert least.index(BUSY) < least.index(OLD) < least.index(IDLE)
    assert "requested" in least and "holds 6 small files" in least

    # The daemon queues the run: while it waits, nothing is asked again.
    queued = launch(instance, request)
    waiting = _tick(lh, instance)
    assert not waiting.run_requests
    assert f"run {queued.run_id} is not_started" in waiting.skip_reason.skip_message

    # It runs BUSY's part only (the rest of it was canceled): only optimize runs.
    instance.report_run_canceled(queued)
    idle_metadata = lh.table(IDLE).metadata_location
    rows_before = lh.rows_without_spark(BUSY)
    busy = requested[BUSY][1]
    result = defs.resolve_job_def(BATCH_JOB).execute_in_process(
        instance=instance,
        run_config=batch_run_config([busy]),
        tags={TRIGGER_TAG: HEALTH_SENSOR, TABLE_TAG: BUSY, STATE_TAG: busy.state or ""},
        resources=resources_for(lh),
    )
    assert result.success
    assert len(lh.table(BUSY).inspect.files()) == 2  # one file per partition
    assert lh.rows_without_spark(BUSY) == rows_before
    assert lh.table(IDLE).metadata_location == idle_metadata
    record = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[BUSY]), limit=1
    ).records[0]
    assert record.asset_materialization is not None
    metadata = record.asset_materialization.metadata
    assert metadata["optimize_status"].value == "completed"
    assert "expire_snapshots_status" not in metadata
    assert isinstance(metadata["health_score"], dg.FloatMetadataValue)
    assert metadata["health_score"].value is not None and metadata["health_score"].value > 90
    assert metadata["due_operations"].value == "none"
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    healthy = checks["healthy"]
    assert healthy.passed is True and healthy.partition == BUSY
    assert "nothing due" in str(healthy.description)
    # The run kept its outcome in the trigger's memory, as each table finished.
    remembered = _memory(lh).tables_memory([BUSY])[BUSY]
    assert remembered.operations["optimize"].outcome == "completed"
    assert remembered.operations["optimize"].run_id == result.run_id
    assert remembered.recorded_at is not None and remembered.shown_state is not None

    # BUSY is healthy now. OLD's part of the canceled run was never answered: counted as
    # one failure (retried at once), under a new run key.
    after = _tick(lh, instance)
    assert _tables(after) == {OLD}
    assert _health(after)["tables_due"] == 1
    [retry] = after.run_requests
    assert retry.run_key != request.run_key and (retry.run_key or "").startswith(f"health:{OLD}:2-")
    assert _memory(lh).tables_memory([OLD])[OLD].operations["expire_snapshots"].outcome == "lost"
    instance.report_run_canceled(launch(instance, retry))

    # 6 more small appends: BUSY is due again, but was maintained moments ago.
    table = lh.table(BUSY)
    for i in range(6):
        table.append(batch(100_000 + i * 1000, ("api",)))
    decisions = _decisions(lh, instance)
    assert decisions[BUSY].startswith("waits: maintained ")
    assert "; next after " in decisions[BUSY]
    # Its own property shortens the interval (policy next to the data): requested again.
    with lh.table(BUSY).transaction() as transaction:
        transaction.set_properties({"icegate.health.min_interval": "1s"})
    time.sleep(1.1)
    assert BUSY in _tables(_tick(lh, instance))


def test_a_table_with_a_run_in_flight_or_a_lease_held_elsewhere_gets_no_request(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])
    job = defs.resolve_job_def("maintenance_job")
    queued = instance.create_run_for_job(
        job, tags={"dagster/partition": BUSY}, status=dg.DagsterRunStatus.NOT_STARTED
    )
    # OLD is held by another maintainer (a CLI pass elsewhere): its lease is live.
    store = lease_store(lh.config, lh.catalog)
    assert store is not None
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with store.hold(OLD, "elsewhere:1:cli-run", timedelta(0)):
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    try:
        none = _tick(lh, instance)
    finally:
        release.set()
        holder.join()

    assert not none.run_requests
    message = str(none.skip_reason.skip_message)
    assert "2 due tables wait, a run in flight or another maintainer's lease" in message
    assert f"{BUSY} (run {queued.run_id} is not_started)" in message
    assert f"{OLD} (held by elsewhere:1:cli-run)" in message
    assert _health(none)["tables_requested"] == 0

    # A batch run over both (the schedule's range tags): nothing to request, and why.
    instance.report_run_canceled(queued)
    batch_run = instance.create_run_for_job(
        job,
        tags={
            "dagster/asset_partition_range_start": BUSY,
            "dagster/asset_partition_range_end": OLD,
        },
        status=dg.DagsterRunStatus.STARTED,
    )
    decisions = _decisions(lh, instance)
    assert decisions[BUSY] == decisions[OLD] == f"waits: run {batch_run.run_id} is started"
    # Once the runs are over, both are requested.
    instance.report_run_canceled(batch_run)
    assert _tables(_tick(lh, instance)) == {BUSY, OLD}


def test_the_budget_takes_tables_in_turn_and_names_the_backlog(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = health_lakehouse(lakehouse_factory, trigger={"max_tables": 1})
    result = _tick(lh, instance)

    assert _tables(result) == {BUSY}  # never served, 6 small files per partition: neediest
    health = _health(result)
    assert health["tables_requested"] == 1 and health["backlog_tables"] == 1
    assert f"| {OLD} |" in health["least_healthy"]
    assert "maintain.trigger.max_tables 1 reached" in health["least_healthy"]
    # BUSY's run is in the queue; OLD's turn comes at the next tick.
    launch(instance, result.run_requests[0])
    assert _tables(_tick(lh, instance)) == {OLD}


def test_requests_no_run_answered_count_as_failures_and_back_off(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A run whose worker died before recording its tables (two of them): each table's
    operation counts a failure; the second in a row backs off, named with its next attempt,
    in the skip reason and in lakehouse_health's failing tables."""
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])
    keys = []
    for _ in range(2):
        [request] = _tick(lh, instance).run_requests
        assert len(_entries(request)) == 2
        keys.append(request.run_key)
        run = launch(instance, request, dg.DagsterRunStatus.STARTED)
        instance.report_run_failed(run, "the worker was OOM-killed")
    assert keys[0] != keys[1]

    waiting = _tick(lh, instance)

    assert not waiting.run_requests
    message = str(waiting.skip_reason.skip_message)
    assert f"{BUSY} (optimize failed 2 times in a row; next attempt after" in message
    assert f"{OLD} (expire_snapshots failed 2 times in a row; next attempt after" in message
    assert "ended without recording this table" in message
    failing = _health(waiting)["failing_tables"]
    assert set(failing) == {BUSY, OLD}


def test_a_table_a_pass_left_in_its_state_waits_until_it_changes(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A pass that assessed the table after it ran remembers the state it left (here the
    table's state now, as a run whose optimize could not help would): no new run until the
    table changes."""
    requested = _by_table(_tick(lh, instance))
    for table, operation in ((BUSY, "optimize"), (OLD, "expire_snapshots")):
        _memory(lh).record_pass(
            PassRecord(
                table,
                "run-x",
                (OperationAttempt(operation, "completed"),),
                requested=(operation,),
                still_due={operation: "still due"},
                settled_state=requested[table][1].state,
            ),
            backoff=timedelta(minutes=1),
            backoff_max=timedelta(hours=1),
        )
    settled = _tick(lh, instance)
    assert not settled.run_requests
    assert "2 due tables wait, unchanged since a pass left them so" in str(
        settled.skip_reason.skip_message
    )
    lh.table(BUSY).append(batch(500_000, ("api",)))
    with lh.table(BUSY).transaction() as transaction:
        transaction.set_properties({"icegate.health.min_interval": "1s"})
    time.sleep(1.1)
    assert _tables(_tick(lh, instance)) == {BUSY}


def test_a_healthy_lakehouse_gets_no_run_and_its_health_is_still_recorded(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    lh = lakehouse_factory()
    lh.add_table(IDLE, appends=1)
    lh.add_table("lakehouse.idle2", appends=1)

    result = _tick(lh, instance)

    assert not result.run_requests
    assert result.skip_reason.skip_message == "2 tables healthy, none due"
    health = _health(result)
    assert health["tables"] == 2 and health["unhealthy_tables"] == 0
    assert health["mean_score"] == 100.0 and health["tables_due"] == 0
    # Nothing changed: no lakehouse_health again (until the hour is up), no page events.
    quiet = _tick(lh, instance, result.cursor)
    assert quiet.asset_events == []


def test_a_look_out_of_time_resumes_at_the_next_table(
    lh: Lakehouse, instance: dg.DagsterInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(health_sensor, "LOOK_SHARE", 0.0)  # one table per tick

    cursor, assessed, resumed = None, [], []
    for _ in range(4):
        result = _tick(lh, instance, cursor)
        health = [e for e in result.asset_events if e.asset_key == LAKEHOUSE_HEALTH]
        if health:
            assessed.append(health[0].metadata["tables_assessed"].value)
        cursor = result.cursor or cursor
        resumed.append(health_sensor.HealthCursor.parse(cursor).resume_at)
    # One more table a tick, in name order; then every table has its look and none waits.
    assert assessed == [1, 2, 3]
    assert resumed == [IDLE, OLD, None, None]


def test_materializing_lakehouse_health_assesses_every_table_now(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, OLD, IDLE])

    result = dg.materialize([lakehouse_health], instance=instance, resources=resources_for(lh))

    assert result.success
    [materialization] = result.asset_materializations_for_node("lakehouse_health")
    metadata = {key: value.value for key, value in materialization.metadata.items()}
    assert metadata["tables"] == 3 and metadata["tables_assessed"] == 3
    assert metadata["tables_due"] == 2 and metadata["tables_requested"] == 2
    assert metadata["due_by_operation"] == {"expire_snapshots": 1, "optimize": 1}
    assert metadata["least_healthy"].splitlines()[2].startswith(f"| {BUSY} |")
    recorded = instance.fetch_materializations(LAKEHOUSE_HEALTH, limit=1).records
    assert recorded and recorded[0].run_id == result.run_id


def test_materializing_lakehouse_health_records_what_the_sensor_records(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """The sensor's ``lakehouse_health`` event and the asset's own materialization carry the
    same metadata keys: one function builds the report for both, the shared-location
    warning included (a twin registered on IDLE's metadata file shares its location without
    gc.enabled=false)."""
    lh.catalog.register_table(("lakehouse", "idle_twin"), lh.table(IDLE).metadata_location)
    sensed = _health(_tick(lh, instance))
    assert "unsafe_sharing" in sensed

    result = dg.materialize([lakehouse_health], instance=instance, resources=resources_for(lh))

    assert result.success
    [materialization] = result.asset_materializations_for_node("lakehouse_health")
    assert sorted(materialization.metadata) == sorted(sensed)


def test_lakehouse_health_is_recorded_when_its_verdicts_change_or_hourly_not_with_ingest(
    lakehouse_factory: LakehouseFactory, instance: dg.DagsterInstance
) -> None:
    """WAL arriving every tick moves the lakehouse's figures, not its verdicts: recorded once
    an hour (the test's clock), and then over the whole lakehouse."""
    lh = lakehouse_factory(maintain={"compaction": {"min_files": 10_000}}, wal=True)
    lh.add_table(IDLE, appends=1)
    lh.add_table("lakehouse.idle2", appends=1)
    now = [1_800_000_000.0]
    rows = lh.table(IDLE).scan().to_arrow().slice(0, 1)
    recorded: list[dict[str, Any]] = []
    cursor = None
    with simulated_clock(lambda: now[0]):
        for tick in range(130):  # 65 minutes, a tick every 30 s, a WAL file each
            lh.write_wal(IDLE, rows, f"w{tick:03d}.parquet")
            result = _tick(lh, instance, cursor)
            cursor = result.cursor or cursor
            recorded += [
                {k: v.value for k, v in e.metadata.items()}
                for e in result.asset_events
                if e.asset_key == LAKEHOUSE_HEALTH
            ]
            now[0] += 30
    assert len(recorded) == 2  # the first tick, and an hour later
    assert recorded[0]["wal_files"] == 1 and recorded[1]["wal_files"] == 121
    assert recorded[1]["tables"] == recorded[1]["tables_assessed"] == 2


def test_excluded_and_unsafely_shared_tables_are_named_and_never_requested(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """BUSY opts out by its own property: due by its figures, never asked for, reported as
    excluded (skip reason, its page, lakehouse_health). A twin registered on IDLE's metadata
    file shares its location without gc.enabled=false: named as unsafe, once per change."""
    with lh.table(BUSY).transaction() as change:
        change.set_properties({"icegate.maintenance.enabled": "false"})
    lh.catalog.register_table(("lakehouse", "idle_twin"), lh.table(IDLE).metadata_location)

    first = _tick(lh, instance)

    assert _tables(first) == {OLD}
    assert _decisions(lh, instance)[BUSY].startswith("excluded: ")
    health = _health(first)
    assert set(health["excluded_tables"]) == {BUSY}
    assert set(health["unsafe_sharing"]) == {IDLE, "lakehouse.idle_twin"}
    assert "does not set gc.enabled=false" in health["unsafe_sharing"][IDLE]
    [page] = [e for e in first.asset_events if e.partition == BUSY]
    assert "icegate.maintenance.enabled=false" in page.metadata["excluded"].value
    assert page.metadata["healthy"].value is True  # not judged: excluded
    # Setting gc.enabled=false on both makes the sharing safe: recorded once, then quiet.
    for key in (IDLE, "lakehouse.idle_twin"):
        with lh.table(key).transaction() as change:
            change.set_properties({"gc.enabled": "false"})
    settled = _tick(lh, instance, first.cursor)
    assert "unsafe_sharing" not in _health(settled)


def test_a_configuration_change_is_judged_at_the_next_tick_not_after_the_recheck(
    lh: Lakehouse, instance: dg.DagsterInstance
) -> None:
    """A look is kept while its table does not change, but it was judged by the settings
    of its time: raising a threshold (or a ``min_interval``, an opt-out) in the config file
    makes every table it touches looked at again at the next tick."""
    resource = _resource(lh)
    tick = Tick.for_run(instance, resource)
    cache = LookCache()
    until = time.monotonic() + 60

    first = look_at_lakehouse(
        _resource(lh).maintainer("test"), tick.memory, tick.now, until=until, cache=cache
    )
    assert BUSY in first.fresh and "optimize" in first.healths[BUSY].due_operations
    again = look_at_lakehouse(
        _resource(lh).maintainer("test"), tick.memory, tick.now, until=until, cache=cache
    )
    assert again.fresh == []  # nothing changed: no table is read again

    raw = yaml.safe_load(lh.config_path.read_text())
    raw["maintain"]["health"]["small_files"] = 1000
    raw["maintain"]["health"]["min_interval"] = "7m"
    lh.config_path.write_text(yaml.safe_dump(raw))
    later = look_at_lakehouse(
        _resource(lh).maintainer("test"), tick.memory, tick.now, until=until, cache=cache
    )

    assert sorted(later.fresh) == sorted(later.tables)
    assert "optimize" not in later.healths[BUSY].due_operations
    assert later.healths[BUSY].min_interval_s == 7 * 60
    # The trigger's memory keeps the new judgement for the next process too.
    stored = _memory(lh).stored_looks([BUSY])[BUSY]
    assert stored.health is not None and stored.health.min_interval_s == 7 * 60
