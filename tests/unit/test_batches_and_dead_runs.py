"""How the sensors' runs are made and read back, and when a run counts as dead (no JVM, no
Spark): tables split evenly into runs with stable keys, each table's operations and state
carried in the run config, and a run without heartbeat or lease past the lease is dead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.batches import sensor_run_requests, split_evenly
from icegate_dagster.maintenance.leases.store import RunLiveness
from icegate_dagster.runs import (
    BATCH_JOB,
    STATE_TAG,
    TABLE_TAG,
    TABLES_TAG,
    TRIGGER_TAG,
    BatchEntry,
    SensorRun,
    batch_entries,
    dead_run_reason,
    trigger_history,
)

NOW = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
LEASE = timedelta(minutes=2)


@pytest.mark.parametrize(
    ("count", "per_run", "sizes"),
    [
        (0, 25, []),
        (1, 25, [1]),
        (25, 25, [25]),
        (26, 25, [13, 13]),
        (30, 25, [15, 15]),
        (100, 25, [25, 25, 25, 25]),
        (101, 25, [21, 20, 20, 20, 20]),
        (7, 1, [1] * 7),
    ],
)
def test_tables_are_split_into_runs_as_evenly_as_possible(
    count: int, per_run: int, sizes: list[int]
) -> None:
    assert split_evenly(count, per_run) == sizes
    assert sum(sizes) == count and all(size <= per_run for size in sizes)


def _entries(count: int) -> list[tuple[BatchEntry, str]]:
    return [
        (
            BatchEntry(f"ns.t{i:02d}", ("optimize",) if i % 2 else ("expire_snapshots",), f"s{i}"),
            f"ns.t{i:02d}:s{i}:0",
        )
        for i in range(count)
    ]


def _run(request: dg.RunRequest, status: dg.DagsterRunStatus, run_id: str) -> dg.DagsterRun:
    return dg.DagsterRun(
        job_name=BATCH_JOB,
        run_id=run_id,
        status=status,
        run_config=request.run_config,
        tags=request.tags,
    )


def test_each_run_lists_its_tables_with_their_own_operations_and_state() -> None:
    entries = _entries(30)
    requests = sensor_run_requests(
        entries, trigger="table_health_sensor", tables_per_run=25, tags=lambda c: {"x": str(len(c))}
    )

    assert [
        len(batch_entries(_run(r, dg.DagsterRunStatus.NOT_STARTED, "r"))) for r in requests
    ] == [
        15,
        15,
    ]
    listed = [
        e for r in requests for e in batch_entries(_run(r, dg.DagsterRunStatus.NOT_STARTED, "r"))
    ]
    assert listed == [entry for entry, _ in entries]  # neediest first, none lost or doubled
    first = requests[0]
    assert first.job_name == BATCH_JOB
    assert first.tags[TRIGGER_TAG] == "table_health_sensor"
    assert first.tags[TABLES_TAG] == "15" and first.tags["x"] == "15"
    assert TABLE_TAG not in first.tags  # a batch names its tables in its config
    assert first.run_key is not None and first.run_key.startswith("health:batch:")


def _keys(entries: list[tuple[BatchEntry, str]]) -> list[str | None]:
    requests = sensor_run_requests(entries, trigger="wal_size_sensor", tables_per_run=25)
    return [request.run_key for request in requests]


def test_run_keys_are_stable_and_change_with_any_table_state_or_attempt() -> None:
    entries = _entries(3)
    assert _keys(entries) == _keys(entries)
    retried = [*entries[:2], (entries[2][0], "ns.t02:s2:1")]
    assert _keys(retried) != _keys(entries)


def test_a_one_table_run_is_keyed_and_tagged_as_before_batching() -> None:
    entry = BatchEntry("ns.logs", ("wal_compaction",), "b1")
    [request] = sensor_run_requests(
        [(entry, "ns.logs:b1:0")], trigger="wal_size_sensor", tables_per_run=25
    )
    assert request.run_key == "wal:ns.logs:b1:0"
    assert request.tags[TABLE_TAG] == "ns.logs" and request.tags[STATE_TAG] == "b1"
    assert batch_entries(_run(request, dg.DagsterRunStatus.NOT_STARTED, "r")) == [entry]


def test_a_run_of_the_asset_job_is_read_from_its_tags() -> None:
    run = dg.DagsterRun(
        job_name="maintenance_job",
        run_id="r",
        tags={TABLE_TAG: "ns.a", STATE_TAG: "s"},
        run_config={
            "ops": {"maintained_table": {"ops": {"plan": {"config": {"operations": ["optimize"]}}}}}
        },
    )
    assert batch_entries(run) == [BatchEntry("ns.a", ("optimize",), "s")]
    unrelated = dg.DagsterRun(job_name="other_job", run_id="o")
    assert batch_entries(unrelated) == []


def _record(run_id: str, status: dg.DagsterRunStatus, end: float) -> Any:
    stamp = datetime.fromtimestamp(end, UTC)
    return dg.RunRecord(
        storage_id=1,
        dagster_run=dg.DagsterRun(job_name=BATCH_JOB, run_id=run_id, status=status),
        create_timestamp=stamp,
        update_timestamp=stamp,
        start_time=end - 5,
        end_time=end,
    )


def test_a_tables_history_counts_failed_batches_it_was_in_and_settles_on_success() -> None:
    runs = [
        SensorRun(_record("r3", dg.DagsterRunStatus.FAILURE, 300.0), "s1"),
        SensorRun(_record("r2", dg.DagsterRunStatus.FAILURE, 200.0), "s1"),
        SensorRun(_record("r1", dg.DagsterRunStatus.SUCCESS, 100.0), "s0"),
    ]
    failures, attempts, settled = trigger_history(runs, {}, "s1")
    assert failures == (2, datetime.fromtimestamp(300.0, UTC))
    assert attempts == 2 and settled is None
    # A batch that succeeded with this table's operation failed counts as failed for it.
    failures, _, settled = trigger_history(runs[2:], {"r1": 1}, "s0")
    assert failures == (1, datetime.fromtimestamp(100.0, UTC)) and settled is None
    _, _, settled = trigger_history(runs[2:], {}, "s0")
    assert settled == "run r1 already succeeded on this table state"


def _liveness(until: datetime | None, tables: tuple[str, ...] = ()) -> RunLiveness:
    return RunLiveness("r", NOW, until, tables)


def test_a_run_is_dead_only_without_heartbeat_and_lease_for_longer_than_the_lease() -> None:
    long_ago = NOW - timedelta(minutes=30)
    # Beating now, or holding a table: alive, however old.
    assert dead_run_reason(long_ago, _liveness(NOW + timedelta(seconds=5)), LEASE, NOW) is None
    assert dead_run_reason(long_ago, _liveness(None, ("ns.t",)), LEASE, NOW) is None
    # Its heartbeat ran out: dead, and the message says when it was last renewed.
    reason = dead_run_reason(long_ago, _liveness(NOW - timedelta(seconds=1)), LEASE, NOW)
    assert reason is not None
    assert "last renewed at 2026-11-24 11:57:59 UTC" in reason
    assert "maintain.locks.lease (2m)" in reason
    # Never beat: dead once it started more than a lease ago, not before.
    assert dead_run_reason(NOW - timedelta(seconds=119), _liveness(None), LEASE, NOW) is None
    never = dead_run_reason(NOW - timedelta(seconds=121), _liveness(None), LEASE, NOW)
    assert never is not None and "never recorded a heartbeat" in never
