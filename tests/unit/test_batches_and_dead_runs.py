"""How the sensors' runs are made and read back, and when a run counts as dead (no JVM, no
Spark): tables split evenly into runs keyed by their decision numbers, each table's
operations and state carried in the run config, and a run failed only when its worker is
provably gone."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import dagster as dg
import pytest

from icegate_dagster.automation.healing import SILENT_LEASES, dead_run_reason
from icegate_dagster.automation.requests import sensor_run_requests, split_evenly
from icegate_dagster.automation.runs import (
    BATCH_JOB,
    STATE_TAG,
    TABLE_TAG,
    TABLES_TAG,
    TRIGGER_TAG,
    BatchEntry,
    batch_entries,
)
from icegate_dagster.maintenance.leases.process import process_gone, process_identity
from icegate_dagster.maintenance.leases.store import RunLiveness

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


def _entries(count: int) -> list[BatchEntry]:
    return [
        BatchEntry(f"ns.t{i:02d}", ("optimize",) if i % 2 else ("expire_snapshots",), f"s{i}")
        for i in range(count)
    ]


def _decisions(entries: list[BatchEntry], number: int = 1) -> dict[str, int]:
    return {entry.table: number for entry in entries}


def _run(request: dg.RunRequest) -> dg.DagsterRun:
    return dg.DagsterRun(
        job_name=BATCH_JOB,
        run_id="r",
        status=dg.DagsterRunStatus.NOT_STARTED,
        run_config=request.run_config,
        tags=request.tags,
    )


def test_each_run_lists_its_tables_with_their_own_operations_and_state() -> None:
    entries = _entries(30)
    requests = sensor_run_requests(
        entries,
        _decisions(entries),
        trigger="table_health_sensor",
        tables_per_run=25,
        tags=lambda c: {"x": str(len(c))},
    )
    assert [len(batch_entries(_run(r))) for r in requests] == [15, 15]
    listed = [e for r in requests for e in batch_entries(_run(r))]
    assert listed == entries  # in turn order, none lost or doubled
    first = requests[0]
    assert first.job_name == BATCH_JOB
    assert first.tags[TRIGGER_TAG] == "table_health_sensor"
    assert first.tags[TABLES_TAG] == "15" and first.tags["x"] == "15"
    assert TABLE_TAG not in first.tags  # a batch names its tables in its config
    assert first.run_key is not None and first.run_key.startswith("health:batch:")


def _keys(entries: list[BatchEntry], decisions: dict[str, int]) -> list[str | None]:
    requests = sensor_run_requests(entries, decisions, trigger="wal_size_sensor", tables_per_run=25)
    return [request.run_key for request in requests]


def test_a_run_key_names_one_decision_and_a_new_decision_never_reuses_one() -> None:
    """Dagster drops a request whose key the sensor used before: a new decision on any of
    a run's tables makes a new key, whatever the tables' states."""
    entries = _entries(3)
    assert _keys(entries, _decisions(entries)) == _keys(entries, _decisions(entries))
    seen: set[str | None] = set()
    for number in range(1, 200):
        [key] = _keys(entries, {**_decisions(entries), "ns.t02": number})
        assert key not in seen
        seen.add(key)


def test_a_one_table_run_is_keyed_and_tagged_with_its_table_and_decision() -> None:
    entry = BatchEntry("ns.logs", ("wal_compaction",), "b1")
    [request] = sensor_run_requests(
        [entry], {"ns.logs": 26}, trigger="wal_size_sensor", tables_per_run=25
    )
    assert request.run_key == "wal:ns.logs:26"
    assert request.tags[TABLE_TAG] == "ns.logs" and request.tags[STATE_TAG] == "b1"
    assert batch_entries(_run(request)) == [entry]


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


def _liveness(
    until: datetime | None, tables: tuple[str, ...] = (), process: str | None = None
) -> RunLiveness:
    return RunLiveness("r", NOW, until, tables, process)


def _ended_process() -> str:
    """The identity of a process of this host that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = process_identity(child.pid)
    child.wait()
    return identity


def test_a_process_on_this_host_is_asked_whether_it_still_runs() -> None:
    assert process_gone(process_identity()) is False
    assert process_gone(_ended_process()) is True
    # Another host, another PID namespace, a reused PID, an older heartbeat: cannot tell.
    host, boot, namespace, pid, start = process_identity().split("|")
    assert process_gone("|".join(("elsewhere", boot, namespace, pid, start))) is None
    assert process_gone("|".join((host, boot, "pid:[1]", pid, start))) is None
    assert process_gone("|".join((host, boot, namespace, pid, str(int(start) + 1)))) is True
    assert process_gone(None) is None and process_gone("old-style") is None


def test_a_live_process_on_this_host_is_never_failed_however_late_its_beats() -> None:
    """Beats late because the lease store was unreachable: the process is asked, and lives."""
    long_ago = NOW - timedelta(hours=3)
    silent = _liveness(NOW - timedelta(hours=1), process=process_identity(os.getpid()))
    assert dead_run_reason(long_ago, silent, LEASE, NOW) is None


def test_a_run_whose_process_ended_on_this_host_is_dead_at_once() -> None:
    """Its heartbeat may still be live for up to a lease: the process is the proof."""
    beating = _liveness(NOW + timedelta(seconds=90), process=_ended_process())
    reason = dead_run_reason(NOW - timedelta(seconds=10), beating, LEASE, NOW)
    assert reason is not None and "no longer exists" in reason
    # ...unless it still holds a table: its lease is being renewed by someone.
    held = _liveness(None, ("ns.t",), process=_ended_process())
    assert dead_run_reason(NOW - timedelta(seconds=10), held, LEASE, NOW) is None


def test_elsewhere_a_run_is_dead_only_after_several_leases_of_silence() -> None:
    other_host = "worker-7|boot|pid:[1]|42|100"
    long_ago = NOW - timedelta(minutes=30)
    silence = LEASE * SILENT_LEASES
    # Beating now, or holding a table: alive, however old.
    assert dead_run_reason(long_ago, _liveness(NOW + timedelta(seconds=5)), LEASE, NOW) is None
    assert dead_run_reason(long_ago, _liveness(None, ("ns.t",)), LEASE, NOW) is None
    # Its last renewal was a bit less than three leases ago: still given the benefit.
    recent = _liveness(NOW - silence + LEASE + timedelta(seconds=1), process=other_host)
    assert dead_run_reason(long_ago, recent, LEASE, NOW) is None
    # Silent for longer: dead, and the message says when it was last renewed.
    quiet = _liveness(NOW - silence + LEASE - timedelta(seconds=1), process=other_host)
    reason = dead_run_reason(long_ago, quiet, LEASE, NOW)
    assert reason is not None
    assert "last renewed at 2026-11-24 11:53:59 UTC" in reason
    assert "3 × maintain.locks.lease (6m)" in reason
    # Never beat: dead once it started more than three leases ago, not before.
    assert (
        dead_run_reason(NOW - silence + timedelta(seconds=1), _liveness(None), LEASE, NOW) is None
    )
    never = dead_run_reason(NOW - silence - timedelta(seconds=1), _liveness(None), LEASE, NOW)
    assert never is not None and "never recorded a heartbeat" in never
