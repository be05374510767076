"""A warm Spark Connect server for ``--connect``: our side a thin client of it.

The server is started untimed before a benchmark's sides run, with the product's command
(:func:`icegate_dagster.spark.connect_server.server_command`: pyspark's Spark 3.5.9,
``spark-connect_2.12``, Iceberg's runtime and SQL extensions), ``local[2]`` and a 2 GB
driver, on a free loopback port. A benchmark then runs one untimed pass of its own through
it (the server's classes loaded and its JIT warm, as a service's are after its first
clients) before the timed repetitions. Our side's processes get ``SPARK_REMOTE``; their
memory is counted with the server's (:class:`bench.measure.PeakMemory`: the peak of our
process tree plus the server's JVM, sampled at the same instants; the server's own peak and
its growth during each run are reported beside it).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from bench.harness import child_env
from bench.measure import SideFailed, rss_kb, tree
from icegate_dagster.spark.connect_server import READY_LINE, ServerSpec, server_command, spark_home

#: The server's size: two local cores (the machine's), a driver large enough for W2.
MASTER, DRIVER_MEMORY = "local[2]", "2g"
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class WarmServer:
    """A running Connect server: its URL and its ``spark-submit`` process (the JVM is it
    or its child: its tree is measured)."""

    url: str
    pid: int
    log_path: Path

    def env(self) -> dict[str, str]:
        """Our side's environment: ours, with ``SPARK_REMOTE`` naming the server."""
        return {**child_env(), "SPARK_REMOTE": self.url}

    def rss_mb(self) -> float:
        return sum(rss_kb(p) for p in tree(self.pid)) / 1024


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def warm_server(work: Path) -> Iterator[WarmServer]:
    """Start the server under ``work`` (untimed), yield it, stop it and its JVM."""
    work.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log_path = work / "spark-connect.log"
    spec = ServerSpec(port, MASTER, DRIVER_MEMORY, name="icegate-bench-connect")
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(work / "local"),
    }
    env.pop("SPARK_REMOTE", None)
    started = time.perf_counter()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(  # noqa: S603
            server_command(spec),
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        while READY_LINE not in log_path.read_text(errors="replace") or not _listening(port):
            if proc.poll() is not None:
                raise SideFailed("the Spark Connect server", reason=f"exited {proc.returncode}")
            if time.perf_counter() - started > START_TIMEOUT_S:
                raise SideFailed("the Spark Connect server", reason=f"not up; see {log_path}")
            time.sleep(0.5)
        server = WarmServer(f"sc://127.0.0.1:{port}", proc.pid, log_path)
        print(
            f"    Spark Connect server up in {time.perf_counter() - started:.1f}s (untimed), "
            f"{server.rss_mb():.0f} MB, {server.url}",
            flush=True,
        )
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
