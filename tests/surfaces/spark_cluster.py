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
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.servers import ServerProcess, free_ports, log_tail, wait_until

#: A test of the master's state (its JSON status page).
StateTest = Callable[[dict[str, Any]], bool]


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
        return "\n".join(f"--- {p.name}\n{log_tail(p)}" for p in sorted(self.log_dir.glob("*.log")))

    def seen(self, done: StateTest) -> Callable[[], dict[str, Any] | None]:
        """A probe: the master's state once ``done(state)`` is true, else None."""

        def probe() -> dict[str, Any] | None:
            state = self.state()
            return state if done(state) else None

        return probe

    def wait_for(self, what: str, done: StateTest, timeout: float) -> dict[str, Any]:
        """Poll the master's state until ``done(state)`` is true; the state then."""
        return wait_until(self.seen(done), timeout, f"Spark cluster: {what}", details=self.logs)


@contextlib.contextmanager
def spark_standalone_cluster(root: Path, timeout: float = 90) -> Iterator[SparkCluster]:
    """Start a master and one worker (1 core, 1 GB) on 127.0.0.1; stop both on exit, also
    when the block fails."""
    work_dir, log_dir, local_dir = root / "work", root / "logs", root / "local"
    for folder in (work_dir, log_dir, local_dir):
        folder.mkdir(parents=True, exist_ok=True)
    port, ui_port, worker_ui_port = free_ports(3)
    cluster = SparkCluster(port, ui_port, worker_ui_port, work_dir, log_dir)
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Executors' scratch space (shuffle, fetched jars) under root, not /tmp.
        "SPARK_LOCAL_DIRS": str(local_dir),
        # Heap of the master and worker daemons themselves (default 1g each).
        "SPARK_DAEMON_MEMORY": "256m",
    }

    def daemon(name: str, args: list[str]) -> ServerProcess:
        # Its own process group: stopping it also stops the executors a worker launched.
        # SIGTERM to the group, SIGKILL if it is still there after 20 s.
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        log = log_dir / f"{name}.log"
        return ServerProcess(
            f"the Spark {name}", command, log, env=env, own_group=True, stop_timeout=20
        )

    master_args = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    master_args += ["--port", str(cluster.port), "--webui-port", str(cluster.ui_port)]
    worker_args = ["org.apache.spark.deploy.worker.Worker", cluster.master_url]
    worker_args += ["--cores", "1", "--memory", "1g"]
    worker_args += ["--webui-port", str(cluster.worker_ui_port)]
    worker_args += ["--work-dir", str(work_dir)]
    # Leaving the blocks stops the worker (and its executors) first, then the master.
    with daemon("master", master_args) as master:
        # A worker that registers before the master is leader waits a retry (5-15 s) more.
        master.wait_ready(cluster.seen(lambda s: s.get("status") == "ALIVE"), timeout)
        with daemon("worker", worker_args) as worker:
            worker.wait_ready(
                cluster.seen(
                    lambda s: any(w.get("state") == "ALIVE" for w in s.get("workers", []))
                ),
                timeout,
                what="an ALIVE worker",
            )
            yield cluster
