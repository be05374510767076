"""A Spark standalone cluster on loopback: one master and one worker, from pyspark's own jars.

pip's pyspark is a complete Spark distribution (``bin/spark-class``, ``jars/``), so
the master and worker run the very Spark version the driver uses. Both bind to
127.0.0.1 on ports chosen at run time; the worker keeps its executors' folders
(``app-*/<executor id>/stderr``) in a temporary work dir.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.net import free_port


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-class").is_file():
        raise RuntimeError(f"{home} has no bin/spark-class: not a full pyspark install")
    return home


@dataclass(frozen=True)
class SparkCluster:
    """A running master and worker."""

    port: int
    ui_port: int
    worker_ui_port: int
    work_dir: Path
    log_dir: Path

    @property
    def master_url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict[str, Any]:
        """The master's JSON status page (workers, active and completed applications)."""
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            state: dict[str, Any] = json.loads(response.read())
        return state

    def logs(self) -> str:
        """The master's and the worker's own output, for failure messages."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-4000:]}"
            for p in sorted(self.log_dir.glob("*.log"))
        )

    def wait_for(self, what: str, done: Any, timeout: float) -> dict[str, Any]:
        """Poll the master's state until ``done(state)`` is true; the state then."""
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(OSError, ValueError):
                state = self.state()
                if done(state):
                    return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"Spark cluster: {what} not seen in {timeout}s\n{self.logs()}")
            time.sleep(0.5)


def _spawn(args: list[str], log: IO[bytes], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # Its own process group: stopping it also stops the executors a worker launched.
    return subprocess.Popen(
        [str(spark_home() / "bin" / "spark-class"), *args],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group, SIGKILL if it is still there after 20 s."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def spark_standalone_cluster(root: Path, timeout: float = 90) -> Iterator[SparkCluster]:
    """Start a master and one worker (1 core, 1 GB) on 127.0.0.1; stop both on exit, also
    when the block fails."""
    work_dir, log_dir, local_dir = root / "work", root / "logs", root / "local"
    for folder in (work_dir, log_dir, local_dir):
        folder.mkdir(parents=True, exist_ok=True)
    cluster = SparkCluster(free_port(), free_port(), free_port(), work_dir, log_dir)
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Executors' scratch space (shuffle, fetched jars) under root, not /tmp.
        "SPARK_LOCAL_DIRS": str(local_dir),
        # Heap of the master and worker daemons themselves (default 1g each).
        "SPARK_DAEMON_MEMORY": "256m",
    }
    processes: list[subprocess.Popen[bytes]] = []
    with contextlib.ExitStack() as stack:
        master_log = stack.enter_context((log_dir / "master.log").open("wb"))
        worker_log = stack.enter_context((log_dir / "worker.log").open("wb"))
        try:
            master_args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
            master_args += ["--port", str(cluster.port), "--webui-port", str(cluster.ui_port)]
            processes.append(_spawn(master_args, master_log, env))
            # A worker that registers before the master is leader waits a retry (5-15 s) more.
            cluster.wait_for("the master", lambda s: s.get("status") == "ALIVE", timeout)
            worker_args = ["org.apache.spark.deploy.worker.Worker", cluster.master_url]
            worker_args += ["--cores", "1", "--memory", "1g"]
            worker_args += ["--webui-port", str(cluster.worker_ui_port)]
            worker_args += ["--work-dir", str(work_dir)]
            processes.append(_spawn(worker_args, worker_log, env))
            cluster.wait_for(
                "an ALIVE worker",
                lambda s: any(w.get("state") == "ALIVE" for w in s.get("workers", [])),
                timeout,
            )
            yield cluster
        finally:
            for process in reversed(processes):  # the worker (and its executors) first
                _stop(process)
