"""How the sensors' runs are made and read back, and when a run counts as dead (no JVM, no
Spark): tables split evenly into runs keyed by their decision numbers, each table's
operations and state carried in the run config, and a run failed only when its worker is
provably gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from icegate_dagster.assets.names import BATCH_JOB, STATE_TAG, TABLE_TAG, TABLES_TAG, TRIGGER_TAG
from icegate_dagster.assets.runs import BatchEntry, batch_entries
from icegate_dagster.config import config_from_dict, format_duration
from icegate_dagster.config.models import MIN_LEASE
from icegate_dagster.errors import ConfigError
from icegate_dagster.maintenance.leases.process import process_gone, process_identity
from icegate_dagster.maintenance.leases.store import RunLiveness, TableLocks
from icegate_dagster.maintenance.sql_store import engine_for
from icegate_dagster.sensors.healing import SILENT_LEASES, dead_run_reason
from icegate_dagster.sensors.requests import sensor_run_requests, split_evenly

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


def _state(pid: int) -> str:
    """The process state letter in ``/proc/<pid>/stat`` (``Z`` for a zombie)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[-1].split()[0]


def test_a_zombie_process_on_this_host_is_gone() -> None:
    """A worker that exited but was never reaped (its parent hung or ignores SIGCHLD) keeps
    its PID and start time in ``/proc`` as a zombie: it runs nothing and renews nothing, so
    its run must be failed like any other whose worker ended."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: wait for the word, then exit (nobody reaps it yet)
        os.close(write)
        os.read(read, 1)
        os._exit(0)
    os.close(read)
    try:
        identity = process_identity(pid)  # as its heartbeat recorded it while it ran
        assert process_gone(identity) is False
        os.write(write, b"x")
        deadline = time.monotonic() + 30  # liveness bound only
        while _state(pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _state(pid) == "Z"  # still in /proc, same PID, same start time

        assert process_gone(identity) is True
        beating = _liveness(NOW + timedelta(seconds=90), process=identity)
        reason = dead_run_reason(NOW - timedelta(seconds=10), beating, LEASE, NOW)
        assert reason is not None and f"process {pid} on " in reason
        assert "no longer exists" in reason
    finally:
        os.close(write)
        os.waitpid(pid, 0)


#: A maintainer whose work never returns: it takes ``argv[2]``'s lease (lease ``argv[3]``
#: seconds, ``stuck_after`` ``argv[4]`` seconds) in the lease store at ``argv[1]`` and then
#: blocks until its standard input closes; only then does its work reach a commit check.
HUNG_HOLDER = """
import sys
from datetime import timedelta
from icegate_dagster.maintenance.leases.store import LeaseLostError, LockHolder, TableLocks
from icegate_dagster.maintenance.sql_store import engine_for
locks = TableLocks(
    engine_for(sys.argv[1]),
    lease=timedelta(seconds=float(sys.argv[3])),
    stuck_after=timedelta(seconds=float(sys.argv[4])),
)
with locks.hold(sys.argv[2], "hung-host:1:hung-run", timedelta(0)) as held:
    assert not isinstance(held, LockHolder)
    print("holding", flush=True)
    sys.stdin.read()  # the work: never returns while the test runs
    try:
        held.verify()
        print("committed", flush=True)
    except LeaseLostError as exc:
        print(f"refused: {exc}", flush=True)
"""


def test_a_hung_lease_holder_stops_renewing_past_stuck_after(tmp_path: Path) -> None:
    """A worker whose main work makes no progress while its renewal thread goes on would hold
    its table (and, through it, its run) forever. Past ``stuck_after`` the holder stops
    renewing: the lease runs out in the store, another maintainer takes the table, and the
    hung work, should it ever reach a commit, is refused."""
    lease_s, stuck_s = 1.0, 3.0
    uri = f"sqlite:///{tmp_path / 'locks.db'}"
    locks = TableLocks(engine_for(uri), lease=timedelta(seconds=lease_s))
    holder = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HUNG_HOLDER, uri, "ns.t", str(lease_s), str(stuck_s)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        time.sleep(2 * lease_s)  # well past one lease: only its renewals keep it
        held = locks.holder("ns.t")
        assert held is not None and held.owner == "hung-host:1:hung-run"

        # Past stuck_after and one more lease (liveness bound only), the table is free.
        deadline = time.monotonic() + stuck_s + 2 * lease_s + 30
        while locks.holder("ns.t") is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert holder.poll() is None, "the holder still runs: it is hung, not dead"
        assert locks.holder("ns.t") is None, "a hung holder renewed its lease past stuck_after"
        assert locks.try_acquire("ns.t", "token-next", "next:2:run") is None

        assert holder.stdin is not None
        holder.stdin.close()  # the work wakes and reaches its commit check
        outcome = holder.stdout.readline().strip()
        assert outcome.startswith("refused: ns.t:"), outcome
        assert "maintain.locks.stuck_after" in outcome, outcome
    finally:
        holder.kill()
        holder.wait()


def test_a_lease_below_the_floor_is_refused_naming_key_and_value(tmp_path: Path) -> None:
    """A 5 s lease would make the healer's silence limit 15 s and leave a holder 3 s to
    ride out a store that does not answer: refused at load, naming the key, the value and
    the floor."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"maintain": {"locks": {"lease": "5s"}}}, tmp_path)
    message = str(info.value)
    assert "maintain.locks.lease" in message and "5s" in message, message
    assert f"at least {format_duration(MIN_LEASE)}" in message, message
    at_floor = config_from_dict(
        {"maintain": {"locks": {"lease": format_duration(MIN_LEASE)}}}, tmp_path
    )
    assert at_floor.locks.lease == MIN_LEASE


def test_stuck_after_must_be_longer_than_a_lease(tmp_path: Path) -> None:
    """A holder gives its lease up at ``stuck_after``: one no longer than a lease would take
    every operation for stuck."""
    with pytest.raises(ConfigError) as info:
        config_from_dict({"maintain": {"locks": {"lease": "2m", "stuck_after": "1m"}}}, tmp_path)
    message = str(info.value)
    assert "maintain.locks.stuck_after" in message and "1m" in message, message
    assert "longer than maintain.locks.lease (2m)" in message, message
