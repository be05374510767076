"""The daemon as users run it, under faults: ``dagster dev`` with nothing but its daemon
acting maintains a busy lakehouse while run workers are killed and the whole of ``dagster
dev`` dies once, and heals by itself.

Throughout the fault phase a pyiceberg writer appends to one table every 1.5 s and an
ingester drops a WAL file for another every 2 s; a run worker (or its JVM) is killed with
SIGKILL every ~25 s, as an OOM killer would; once, while a run is started, the whole
``dagster dev`` process group is killed with SIGKILL (a host crash) and started again on
the same ``DAGSTER_HOME``. After the faults stop, within 5 minutes: the WAL is drained,
every table is back under its health thresholds, no run is left unfinished (the ones the
crash left ``STARTED`` were failed by the sensors, saying why), and every committed row
and every WAL row is present exactly once (ids compared as multisets). The healthy table
beside them got no run and no commit; each run did only its tables' due operations.

Short lease (20 s) and back-off (5 s doubling to 20 s) keep the test within minutes; the
defaults are 2 min and 1 min doubling to 1 h.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
from pyiceberg.exceptions import CommitFailedException

from icegate_dagster.assets.names import (
    ASSESSMENT_SOURCE,
    BATCH_JOB,
    ICEBERG_TABLES,
    MAINTAINED_TABLE,
    SOURCE_TAG,
)
from icegate_dagster.assets.runs import UNFINISHED, batch_entries
from icegate_dagster.catalog import open_catalog
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.health.score import assess_table
from icegate_dagster.maintenance.wal import configured_wal_root, wal_stats
from tests.integration.test_wal_compaction import wal_rows
from tests.lakehouse import Lakehouse, LakehouseFactory, batch
from tests.servers import ServerProcess, free_port, http_answers, process_tree, wait_until
from tests.webserver import REPO, make_dagster_home

pytestmark = pytest.mark.slow

WRITTEN = "lakehouse.written"  # a pyiceberg writer appends to it throughout
LOGS = "lakehouse.logs"  # fed through the WAL throughout
IDLE = "lakehouse.idle"  # healthy: never touched
MAINTAIN = {
    "locks": {"lease": "20s"},
    "lock_wait": "5s",
    # Whatever waits is ingested at the WAL sensor's next tick: the WAL can drain.
    "compaction": {"min_files": 1, "min_size_bytes": "1GB"},
    "health": {"min_interval": "10s"},
    "trigger": {"backoff": "5s", "backoff_max": "20s"},
}
#: How long writer, ingester and killer run at least (the crash comes in the middle, and
#: they go on until two run workers were killed, however slow the host): the suite's budget
#: allows 60 s; ``ICEGATE_SOAK_SECONDS=1800`` soaks longer (same assertions).
FAULT_SECONDS = int(os.environ.get("ICEGATE_SOAK_SECONDS", "60"))
#: Run workers the killer must have killed before the faults stop.
KILLS = 2
KILL_EVERY_S = 25
#: The issue's promise: healed within 5 minutes of the last fault.
HEALED_WITHIN_S = 300


def _cmdline(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes()).replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_jvm(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip() == "java"
    except OSError:
        return False


def run_workers(root: int) -> list[tuple[int, list[int]]]:
    """The run workers under ``root`` (the code server starts each run in a spawned
    Python process), each with the JVMs below it."""
    workers = []
    for pid in process_tree(root):
        if "spawn_main" in _cmdline(pid) or "execute_run" in _cmdline(pid):
            workers.append((pid, [child for child in process_tree(pid)[1:] if _is_jvm(child)]))
    return workers


def killprocess_tree(root: int) -> None:
    """SIGKILL ``root`` and everything below it at once, as a host that dies would."""
    for pid in process_tree(root):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


class Loop(threading.Thread):
    """Calls ``step`` every ``every`` seconds until stopped; keeps the first error."""

    def __init__(self, name: str, every: float, step: Callable[[], None]) -> None:
        super().__init__(name=name, daemon=True)
        self.every, self.step = every, step
        self.halt = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        while not self.halt.wait(self.every):
            try:
                self.step()
            except BaseException as exc:  # reported by the test
                self.error = exc
                return

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=60)
        if self.error is not None:
            raise self.error


def _ids(lh: Lakehouse, key: str) -> Counter[int]:
    return Counter(lh.table(key).scan(selected_fields=("id",)).to_arrow().column("id").to_pylist())


def _due(lh: Lakehouse) -> dict[str, tuple[str, ...]]:
    """Each table with due operations (from metadata, as the health trigger sees it)."""
    due = {}
    for key in (WRITTEN, LOGS, IDLE):
        ref = TableRef.parse(key)
        table = lh.catalog.load_table(ref.identifier)
        wal = wal_stats(configured_wal_root(lh.config), ref)
        health = assess_table(table, key, lh.config.for_table(key), datetime.now(UTC), wal)
        if health.due_operations:
            due[key] = tuple(health.due_operations)
    return due


def test_the_daemon_heals_itself_through_killed_workers_and_a_crash(
    lakehouse_factory: LakehouseFactory, tmp_path: Path
) -> None:
    lh = lakehouse_factory(maintain=MAINTAIN, wal=True)
    lh.add_table(WRITTEN, appends=14, services=("api",))  # 14 small files: optimize due
    lh.add_table(LOGS, appends=2, services=("api",))
    lh.add_table(IDLE, appends=1)
    idle_metadata = lh.table(IDLE).metadata_location
    expected_written, expected_logs = _ids(lh, WRITTEN), _ids(lh, LOGS)
    next_id = iter(range(1_000_000, 10**9, 10))

    # The writer: a committed append's ids are expected once; a refused one's never.
    writer_catalog = open_catalog(lh.config.catalog)
    refused = []

    def append() -> None:
        start = next(next_id)
        table = writer_catalog.load_table(TableRef.parse(WRITTEN).identifier)
        try:
            table.append(batch(start, ("api",), rows_per_service=4))
        except CommitFailedException:
            refused.append(start)
            return
        expected_written.update(range(start, start + 4))

    # The ingester: whole files (written aside, then renamed), 5 rows each.
    wal_files = [0]

    def ingest() -> None:
        start = next(next_id)
        lh.write_wal(LOGS, wal_rows(start, 5), f"soak-{start}.parquet")
        expected_logs.update(range(start, start + 5))
        wal_files[0] += 1

    home = make_dagster_home(tmp_path / "dagster_home")
    port = free_port()
    env = {
        "DAGSTER_HOME": str(home),
        "ICEGATE_CONFIG": str(lh.config_path),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
    }
    command = [sys.executable, "-m", "dagster", "dev", "-w", str(REPO / "workspace.yaml")]
    command += ["-h", "127.0.0.1", "-p", str(port)]

    def dagster_dev(n: int) -> ServerProcess:
        server = ServerProcess(
            "dagster dev",
            command,
            tmp_path / f"dagster_dev_{n}.log",
            cwd=REPO,
            env=env,
            own_group=True,
        ).start()
        wait_until(
            lambda: http_answers(f"http://127.0.0.1:{port}/"),
            180,
            "dagster dev to start",
            interval=1,
            abort=server.exit_reason,
            details=lambda: server.log_tail(60),
        )
        return server

    server = dagster_dev(1)
    kills: list[str] = []

    def kill_a_worker() -> None:
        """Wait (up to 25 s) for a run worker that has worked a few seconds, then SIGKILL
        it, or only its JVM (the biggest process, an OOM killer's pick), in turns."""
        deadline = time.monotonic() + 25
        while time.monotonic() < deadline:
            workers = [w for w in run_workers(server.process.pid) if w[1]]
            if workers:
                time.sleep(3)
                pid, jvms = workers[0]
                target = jvms[0] if len(kills) % 2 else pid
                try:
                    os.kill(target, signal.SIGKILL)
                except ProcessLookupError:
                    continue
                kills.append("jvm" if target != pid else "worker")
                return
            time.sleep(0.5)

    writer = Loop("writer", 1.5, append)
    ingester = Loop("ingester", 2.0, ingest)
    killer = Loop("killer", KILL_EVERY_S, kill_a_worker)
    crashed_runs: list[str] = []
    with dg.DagsterInstance.from_config(str(home)) as instance:
        try:
            for loop in (writer, ingester, killer):
                loop.start()
            faults_end = time.monotonic() + FAULT_SECONDS

            # The crash: wait for a started run, then kill the whole tree at once.
            started = wait_until(
                lambda: instance.get_run_ids(dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])),
                180,
                "a run to start before the crash",
                interval=0.5,
                details=lambda: server.log_tail(60),
            )
            time.sleep(2)
            killprocess_tree(server.process.pid)
            server.process.wait()
            crashed_runs = [
                run_id
                for run_id in started
                if (run := instance.get_run_by_id(run_id)) is not None
                and run.status == dg.DagsterRunStatus.STARTED
            ]
            server = dagster_dev(2)  # the same DAGSTER_HOME

            time.sleep(max(0.0, faults_end - time.monotonic()))
            # A loaded host starts fewer runs a minute: the faults go on until the killer
            # has killed its share, so that every run of the suite proves the same.
            wait_until(
                lambda: len(kills) >= KILLS,
                KILL_EVERY_S * 2 * KILLS + FAULT_SECONDS,
                f"{KILLS} run workers killed",
                interval=1,
                details=lambda: server.log_tail(60),
            )
        finally:
            for loop in (writer, ingester, killer):
                loop.stop()
        faults_over = time.monotonic()
        try:
            healed = _healed(lh, instance, faults_over, server)
        finally:
            server.stop()

        runs = instance.get_runs(dg.RunsFilter(job_name=BATCH_JOB))
        print(
            f"soak: healed {healed - faults_over:.0f}s after the faults; {len(runs)} runs "
            f"({sum(r.status == dg.DagsterRunStatus.FAILURE for r in runs)} failed); kills "
            f"{kills}; left STARTED by the crash: {crashed_runs}; {wal_files[0]} WAL files; "
            f"{len(expected_written)} rows written, {len(refused)} appends refused"
        )
        # Everything the faults left behind is settled; nothing was lost or doubled.
        assert healed - faults_over <= HEALED_WITHIN_S
        assert crashed_runs, "the crash left a run STARTED"
        for run_id in crashed_runs:
            run = instance.get_run_by_id(run_id)
            assert run is not None and run.status == dg.DagsterRunStatus.FAILURE
            [failure] = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
            assert failure.dagster_event is not None
            assert "worker is gone" in str(failure.dagster_event.message)
        assert len(kills) >= KILLS, kills
        _same_rows(lh, WRITTEN, expected_written)
        _same_rows(lh, LOGS, expected_logs)
        assert wal_files[0] >= FAULT_SECONDS // 3
        # The healthy table: no run, no commit. Runs did only due operations.
        assert lh.table(IDLE).metadata_location == idle_metadata
        named = [entry for run in runs for entry in batch_entries(run)]
        assert IDLE not in {entry.table for entry in named}
        assert {op for entry in named for op in entry.operations or ()} <= {
            "wal_compaction",
            "optimize",
            "rewrite_manifests",
            "expire_snapshots",
            "rewrite_position_delete_files",
        }
        assert set(instance.get_dynamic_partitions(ICEBERG_TABLES)) >= {WRITTEN, LOGS, IDLE}
        [health] = instance.fetch_materializations(dg.AssetKey("lakehouse_health"), limit=1).records
        assert health.asset_materialization is not None
        figures = health.asset_materialization.metadata
        assert figures["tables"].value == figures["tables_assessed"].value == 3
        # The healthy table no run touched is not "Missing": the sensor assessed it once, and
        # every partition's page says it is healthy now.
        where = dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[IDLE])
        assessments = instance.fetch_materializations(where, limit=10).records
        assert len(assessments) == 1, "assessed once, however many ticks"
        [assessment] = assessments
        assert assessment.asset_materialization is not None
        assert assessment.asset_materialization.tags[SOURCE_TAG] == ASSESSMENT_SOURCE
        for key in (WRITTEN, LOGS, IDLE):
            where = dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key])
            records = [
                *instance.fetch_materializations(where, limit=1).records,
                *instance.fetch_observations(where, limit=1).records,
            ]
            newest = max(records, key=lambda r: r.storage_id).asset_event
            assert newest is not None and newest.metadata["healthy"].value is True, key


def _same_rows(lh: Lakehouse, key: str, expected: Counter[int]) -> None:
    """Every expected id exactly once; on a difference, what the table and WAL say of it."""
    found = _ids(lh, key)
    if found == expected:
        return
    missing, extra = expected - found, found - expected
    quarantine = lh.wal_dir(key) / "_quarantine"
    reasons = sorted(p.read_text()[:300] for p in quarantine.glob("*.reason.txt"))
    history = [
        (
            s.snapshot_id,
            s.summary.operation if s.summary else None,
            s.summary.additional_properties if s.summary else {},
        )
        for s in lh.table(key).snapshots()
    ]
    logged = [
        (r["operation"], r["status"], r["details"][:400], r["run_id"])
        for r in lh.log_rows()
        if r["table_name"] == key and r["operation"] == "wal_compaction"
    ]
    raise AssertionError(
        f"{key}: {len(missing)} ids missing (first {sorted(missing)[:20]}), "
        f"{len(extra)} extra (first {sorted(extra)[:20]}); quarantined: {reasons}; "
        f"wal_compaction log: {logged}; snapshots: {history}"
    )


def _healed(
    lh: Lakehouse, instance: dg.DagsterInstance, since: float, server: ServerProcess
) -> float:
    """When the lakehouse was healed: WAL drained, nothing due, no run unfinished."""

    def state() -> dict[str, Any]:
        return {
            "wal_files": lh.wal_files(LOGS),
            "due": _due(lh),
            "unfinished": instance.get_run_ids(dg.RunsFilter(statuses=UNFINISHED)),
        }

    def healed() -> float | None:
        now = state()
        if now["wal_files"] or now["due"] or now["unfinished"]:
            return None
        return time.monotonic()

    return wait_until(
        healed,
        HEALED_WITHIN_S + 30,
        "the lakehouse to heal after the faults",
        interval=2,
        abort=server.exit_reason,
        details=lambda: f"{state()}\n{server.log_tail(80)}",
    )
