"""The command that starts a Spark Connect server with what a run needs, from pyspark's own
Spark: ``spark-submit`` running Spark's ``SparkConnectServer`` with the pinned jars
(Spark 3.5's ``spark-connect_2.12`` plugin, Iceberg's runtime for the running Spark
line, the catalogs' JDBC drivers) and Iceberg's SQL
extensions, a static setting no client can set.

Pure: it builds the argv and starts nothing. The tests' server fixture, ``bench peers
--connect`` and the deploy guide ("Spark as a service") use it;
``python -m icegate_dagster.spark.connect_server --port 15002`` prints it. Nothing about
any catalog goes on it: each run registers its own catalog, secrets included, as settings
of its session (:mod:`.remote`).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from icegate_dagster.spark.conf import ICEBERG_EXTENSIONS
from icegate_dagster.spark.jars import (
    POSTGRES_JDBC_JAR,
    SQLITE_JDBC_JAR,
    connect_server_jar,
    iceberg_runtime_jar,
)

#: Spark's own Connect server (a plugin of Spark 3.5, part of Spark 4).
SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: The line its log prints once it listens.
READY_LINE = "Spark Connect server started"
#: Spark Connect's default port.
DEFAULT_PORT = 15002


def spark_home() -> Path:
    """The Spark distribution inside the installed pyspark package."""
    import pyspark

    home = Path(pyspark.__file__).parent
    if not (home / "bin" / "spark-submit").is_file():
        raise FileNotFoundError(f"{home} has no bin/spark-submit: not a full pyspark install")
    return home


def installed_jdbc_jars() -> list[Path]:
    """The JDBC drivers of a SQL catalog found on this host (SQLite's, PostgreSQL's)."""
    return [jar for jar in (SQLITE_JDBC_JAR, POSTGRES_JDBC_JAR) if jar.is_file()]


@dataclass(frozen=True)
class ServerSpec:
    """What the server gets: its port and size; ``iceberg=False`` a bare Spark (without
    Iceberg's runtime, JDBC drivers and extensions: what a run must refuse)."""

    port: int = DEFAULT_PORT
    master: str = "local[2]"
    driver_memory: str = "1g"
    #: About twice its cores: maintenance shuffles are small, Spark's 200 would mostly
    #: schedule empty tasks.
    shuffle_partitions: int = 4
    iceberg: bool = True
    #: ``None``: :func:`installed_jdbc_jars`.
    jdbc_jars: tuple[Path, ...] | None = None
    name: str = "icegate-connect"
    extra_conf: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise ValueError(f"port {self.port} is not a TCP port (1-65535)")
        if self.shuffle_partitions < 1:
            raise ValueError(f"shuffle_partitions {self.shuffle_partitions} must be at least 1")


def connect_plugin_jars(home: Path) -> list[Path]:
    """The Connect server's jar when ``home``'s Spark lacks it: Spark 4 ships its own
    (``jars/spark-connect_2.13-*.jar``); Spark 3.5's is a plugin, pinned in ``jars.lock``."""
    if any((home / "jars").glob("spark-connect_*.jar")):
        return []
    return [connect_server_jar()]


def server_command(spec: ServerSpec, home: Path | None = None) -> list[str]:
    """``spark-submit`` (of ``home``, default pyspark's Spark) starting the Connect server
    of ``spec``."""
    home = home or spark_home()
    jars = connect_plugin_jars(home)
    conf = {"spark.connect.grpc.binding.port": str(spec.port)}
    if spec.iceberg:
        jdbc = installed_jdbc_jars() if spec.jdbc_jars is None else list(spec.jdbc_jars)
        jars += [iceberg_runtime_jar(), *jdbc]
        conf["spark.sql.extensions"] = ICEBERG_EXTENSIONS
    conf |= {
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(spec.shuffle_partitions),
    }
    conf |= spec.extra_conf
    command = [str(home / "bin" / "spark-submit"), "--class", SERVER_CLASS]
    command += ["--name", spec.name, "--master", spec.master]
    command += ["--driver-memory", spec.driver_memory]
    if jars:
        command += ["--jars", ",".join(map(str, jars))]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    return [*command, "spark-internal"]


def main(argv: Sequence[str] | None = None) -> int:
    """Print the command (shell-quoted) for the given port and size."""
    parser = argparse.ArgumentParser(
        prog="python -m icegate_dagster.spark.connect_server",
        description="Print the spark-submit command starting a Spark Connect server with "
        "Iceberg (jars from set-up, Iceberg's SQL extensions).",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--shuffle-partitions", type=int, default=4)
    args = parser.parse_args(argv)
    spec = ServerSpec(args.port, args.master, args.driver_memory, args.shuffle_partitions)
    print(shlex.join(server_command(spec)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
