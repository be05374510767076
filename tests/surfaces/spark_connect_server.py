"""A Spark Connect server with Iceberg, on a free port, from pyspark's own Spark.

pip's pyspark is a complete Spark distribution; Spark Connect's server for 3.5 is a plugin
jar of it (``spark-connect_2.12``, pinned in ``jars.lock`` with role ``server`` and fetched
by set-up beside the other jars). Its command is the product's
(:func:`icegate_dagster.spark.connect_server.server_command`): the Iceberg runtime, the
JDBC drivers and Iceberg's SQL extensions, nothing about any catalog: each run registers
its own catalog, secrets included, as settings of its session. Small: two local cores, a
1 GB driver. Its log (Spark's default INFO level) is a file the tests read.

Spark 3.5's server binds every interface (``spark.connect.grpc.binding.address`` only
came with 4.0); the tests connect to it on 127.0.0.1.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from icegate_dagster.spark.connect_server import (
    READY_LINE,
    ServerSpec,
    server_command,
    spark_home,
)
from tests.servers import ServerProcess, free_port, process_tree


@dataclass(frozen=True)
class ConnectServer:
    """A running Spark Connect server."""

    port: int
    log_path: Path
    server: ServerProcess

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.server.process.pid

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def spark_connect_server(
    root: Path, timeout: float = 180, *, iceberg: bool = True
) -> Iterator[ConnectServer]:
    """Start the server under ``root`` (its log, its scratch space); stop it (and its JVM)
    on exit, also when the block fails. ``iceberg=False``: a bare Spark (:class:`ServerSpec`)."""
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = root / "spark-connect.log"
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home()),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOCAL_DIRS": str(root / "local"),
    }
    env.pop("SPARK_REMOTE", None)
    process = ServerProcess(
        "the Spark Connect server",
        server_command(ServerSpec(port, iceberg=iceberg, name="icegate-connect-tests")),
        log_path,
        env=env,
        own_group=True,
        stop_timeout=20,
    )
    with process as server:

        def started() -> bool | None:
            ready = READY_LINE in log_path.read_text(errors="replace") and _listening(port)
            return True if ready else None

        server.wait_ready(started, timeout, what="Spark Connect server started")
        yield ConnectServer(port, log_path, server)


@dataclass
class TreeWatch:
    """Every process that ran below ``root`` while the block ran: name and command line,
    sampled every ~50 ms (a JVM lives seconds at least: it cannot slip between samples)."""

    root: int
    seen: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            for pid in process_tree(self.root):
                if pid in self.seen:
                    continue
                with contextlib.suppress(OSError):
                    name = Path(f"/proc/{pid}/comm").read_text().strip()
                    args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                    self.seen[pid] = f"{name}: {args.decode(errors='replace').strip()}"
            self._stop.wait(0.05)

    def __enter__(self) -> TreeWatch:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def javas(self) -> list[str]:
        """The JVMs seen: processes named java, or running a java binary."""
        return [
            line
            for line in self.seen.values()
            if line.startswith("java:") or "/bin/java " in f"{line.split(': ', 1)[-1]} "
        ]
