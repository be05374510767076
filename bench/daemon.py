"""The daemon side of ``bench daemon``: Dagster's daemon alone brings a lakehouse to health.

A fresh ``DAGSTER_HOME`` (the repo's ``dagster.yaml``, the tables already partitions, as on
a running deployment that knows its tables) and a cold ``dagster-daemon run`` on the repo's
``workspace.yaml``: the daemon starts its code server, the sensors tick, the run queue
launches the runs, the run workers start their JVMs. Nothing else acts. Measured from the
daemon's spawn until the last table is recorded healthy (its latest materialization, by a
run of this daemon, says nothing is due and its checks passed), with the peak resident
memory of the whole process tree (daemon, code server, run workers, JVMs) and, from the
instance, every run's start and end: their sum is what a deployment pays in run-seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.measure import PeakMemory, SideFailed, settle

REPO = Path(__file__).resolve().parent.parent
#: Seconds between two looks at the instance (one query; the times measured come from
#: the events themselves, so the interval only delays noticing the end).
POLL_S = 2.0


@dataclass
class DaemonRun:
    """What one cold daemon did until the lakehouse was healthy."""

    seconds: float
    peak_mb: float
    jvm: bool
    run_seconds: float
    runs: int
    #: Seconds from the spawn to the first run's creation (daemon start, code load, tick).
    first_request_s: float
    #: Seconds from the spawn to the first run's start (plus the queue and the launch).
    first_start_s: float
    tables_per_run: list[int] = field(default_factory=list)
    #: Most runs in progress at one time.
    most_at_once: int = 0


def _fresh_home(home: Path, keys: list[str], dagster_yaml: Path) -> None:
    import dagster as dg

    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    shutil.copy(dagster_yaml, home / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions("iceberg_tables", keys)


def _healthy(instance: Any, keys: list[str], since: float) -> dict[str, float]:
    """Tables whose latest materialization since ``since`` says nothing is due and every
    check passed, with its time (one query of the event log)."""
    import dagster as dg

    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("maintained_table"), after_timestamp=since),
        limit=10 * len(keys) + 100,
        ascending=True,
    ).records
    wanted = set(keys)
    done: dict[str, float] = {}
    for record in records:  # oldest first: the latest of each table wins
        event = record.asset_materialization
        if event is None or event.partition not in wanted:
            continue
        due = getattr(event.metadata.get("due_operations"), "value", None)
        checks = getattr(event.metadata.get("checks"), "value", None) or {}
        if due == "none" and all(c.get("passed") for c in checks.values()):
            done[event.partition] = record.timestamp
        else:
            done.pop(event.partition, None)
    return done


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop the daemon and everything it started (its own process group)."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def daemon_until_healthy(
    config_path: Path,
    keys: list[str],
    work: Path,
    env: dict[str, str],
    timeout: float,
    dagster_yaml: Path = REPO / "dagster.yaml",
    bin_dir: Path | None = None,
    server: int | None = None,
) -> DaemonRun:
    """Start a cold daemon (instance settings ``dagster_yaml``; ``bin_dir``'s
    ``dagster-daemon``, by default this interpreter's) over the lakehouse at
    ``config_path``; measure until every table of ``keys`` is recorded healthy; stop it.
    ``server``: a Spark Connect server's pid, its memory counted with the daemon's."""
    import dagster as dg

    home = work / "dagster_home"
    _fresh_home(home, keys, dagster_yaml)
    daemon = (bin_dir or Path(sys.executable).parent) / "dagster-daemon"
    command = str(daemon) if daemon.exists() else shutil.which("dagster-daemon")
    if command is None:
        raise SideFailed("dagster-daemon", reason="not installed (run ./scripts/setup.sh)")
    run_env = {**env, "DAGSTER_HOME": str(home), "ICEGATE_CONFIG": str(config_path)}
    log_path = work / "daemon.log"
    with dg.DagsterInstance.from_config(str(home)) as instance, log_path.open("wb") as log:
        spawned = time.time()
        started = time.perf_counter()
        proc = subprocess.Popen(  # noqa: S603
            [command, "run", "-w", str(REPO / "workspace.yaml")],
            cwd=REPO,
            env=run_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        healthy: dict[str, float] = {}
        try:
            with PeakMemory(proc.pid, server) as memory:
                while len(healthy) < len(keys):
                    if proc.poll() is not None:
                        raise SideFailed("dagster-daemon", reason=f"exited {proc.returncode}")
                    if time.perf_counter() - started > timeout:
                        raise SideFailed(
                            "dagster-daemon",
                            reason=f"{len(keys) - len(healthy)} of {len(keys)} tables still "
                            f"not healthy after {timeout:.0f}s; see {log_path}",
                        )
                    time.sleep(POLL_S)
                    healthy = _healthy(instance, keys, spawned)
                # The last run's final step (maintenance_log) ends after its tables are
                # recorded: let the runs finish, untimed, so none is cut off.
                deadline = time.perf_counter() + 120
                while time.perf_counter() < deadline and any(
                    not r.dagster_run.is_finished for r in instance.get_run_records()
                ):
                    time.sleep(POLL_S)
        finally:
            _stop(proc)
        settle(memory.jvm_pids)
        records = list(instance.get_run_records())
    runs = [r for r in records if r.start_time is not None]
    if not runs:
        raise SideFailed("dagster-daemon", reason="no run started")
    spans = [(r.start_time, r.end_time or r.start_time) for r in runs]
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    at_once, most = 0, 0
    for _, step in events:
        at_once += step
        most = max(most, at_once)
    sizes = [int(r.dagster_run.tags.get("icegate/tables", "0") or 0) for r in runs]
    return DaemonRun(
        seconds=max(healthy.values()) - spawned,
        peak_mb=memory.mb,
        jvm=memory.jvm,
        run_seconds=sum(end - start for start, end in spans),
        runs=len(runs),
        first_request_s=min(r.create_timestamp.timestamp() for r in records) - spawned,
        first_start_s=min(s for s, _ in spans) - spawned,
        tables_per_run=sorted(sizes, reverse=True),
        most_at_once=most,
    )


def describe(run: DaemonRun) -> str:
    """One line for the bench's log."""
    return json.dumps(
        {
            "runs": run.runs,
            "tables_per_run": run.tables_per_run,
            "most_at_once": run.most_at_once,
            "first_request_s": round(run.first_request_s, 1),
            "first_start_s": round(run.first_start_s, 1),
            "run_seconds": round(run.run_seconds, 1),
        }
    )
