"""Spark Connect: with ``spark.remote`` (or ``$SPARK_REMOTE``) a run is a thin client of a
Spark server, with no JVM of its own.

Everything a run sets on its own Spark (the catalog and its secrets, the WAL bucket's S3A
keys, the session's SQL settings, the user's ``spark.conf``) is set here as settings of the
run's session on the server, at run time: never on a command line. What only the server
can have (Iceberg's SQL extensions, the Iceberg runtime and the catalog's JDBC driver on its
class path) is checked right after connecting, with an error naming what is missing.
Code that reaches into the JVM asks :func:`is_remote` and takes its Connect equivalent.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark.catalog_conf import spark_catalog_conf
from icegate_dagster.spark.conf import ICEBERG_EXTENSIONS, NANOS_AS_LONG, NO_SUBSTITUTION
from icegate_dagster.spark.s3a import wal_s3a_conf

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Where the deploy guide says how to start a server that has what a run needs.
GUIDE = "docs/how-to/deploy.md#spark-as-a-service"
#: Seconds to wait for the server's port before saying nothing listens there (PySpark's
#: own client would retry an unreachable server for minutes).
CONNECT_TIMEOUT = 10.0
#: The Hadoop settings prefix: a session's Hadoop configuration is its SQL settings with
#: their names as given, so each ``spark.hadoop.<key>`` is also set as ``<key>``.
HADOOP_PREFIX = "spark.hadoop."


def is_remote(spark: object) -> bool:
    """Whether ``spark`` is a Spark Connect session (its JVM is a server's, out of reach).

    Read from the class's module, so the classic path never imports Connect's client."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def _shown(url: str) -> str:
    """``url`` with its parameters' values masked (``;token=...`` is a credential)."""
    return re.sub(r"(;[^;=]+=)[^;]*", r"\1***", url)


def _address(url: str) -> tuple[str, int]:
    """The host and port of a ``sc://`` URL (15002, Spark's default, when none is given)."""
    rest = url.strip().removeprefix("sc://").split("/", 1)[0]
    if rest.startswith("["):
        host, _, port = rest[1:].partition("]")
        port = port.removeprefix(":")
    else:
        host, _, port = rest.partition(":")
    return host, int(port) if port else 15002


def session_settings(config: IcegateConfig, extra: Mapping[str, str]) -> dict[str, str]:
    """The run's settings, set on its session on the server: those of a local session that
    a running session accepts, the user's ``spark.conf`` and ``extra`` merged last."""
    settings = {"spark.sql.session.timeZone": "UTC"}
    settings.update(spark_catalog_conf(config.catalog))
    settings.update(wal_s3a_conf(config))
    settings.update(config.spark.conf)
    settings.update(extra)
    settings[NO_SUBSTITUTION] = "false"  # names and messages are data, never expanded
    settings[NANOS_AS_LONG] = "true"  # WAL nanoseconds as longs (see spark.conf)
    return settings


def set_session_settings(spark: SparkSession, settings: Mapping[str, str]) -> None:
    """Set ``settings`` on a Connect session; ``spark.hadoop.<key>`` also as ``<key>``
    (what the session's Hadoop configuration is built from). A setting Spark reads only at
    its start is refused by name (its value may be a secret): the server must have it."""
    for key, value in settings.items():
        names = [key]
        if key.startswith(HADOOP_PREFIX):
            names.append(key.removeprefix(HADOOP_PREFIX))
        for name in names:
            try:
                spark.conf.set(name, value)
            except Exception as exc:
                # Spark's reason may quote the value, which may be a secret.
                why = _first_line(exc).replace(value, "***") if value else _first_line(exc)
                raise SparkStartError(
                    f"spark.conf {key} cannot be set by a Spark Connect client ({why}): "
                    "Spark may read it only when the server starts; set it on the server "
                    f"instead (see {GUIDE})"
                ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


#: PySpark's process-wide switch: its functions (``F.col``, ``F.lit``, ...) and its session
#: builder take Connect's implementation while it is set. PySpark's own builder sets it for
#: a remote session; without it they take the classic path and fail on a missing context.
CONNECT_MODE_FLAG = "SPARK_CONNECT_MODE_ENABLED"
#: Whether this module set the flag (then :func:`leave_connect_mode` unsets it).
_flag_set_here = False


def enter_connect_mode() -> None:
    """Switch this process's PySpark to Connect, as PySpark's builder does for a remote
    session (a process is Connect's or classic, one at a time)."""
    global _flag_set_here
    if CONNECT_MODE_FLAG not in os.environ:
        os.environ[CONNECT_MODE_FLAG] = "1"
        _flag_set_here = True


def leave_connect_mode() -> None:
    """Undo :func:`enter_connect_mode` once the process's remote sessions are stopped: a
    local session started later in the same process (a test run, a notebook) is classic."""
    global _flag_set_here
    if _flag_set_here:
        os.environ.pop(CONNECT_MODE_FLAG, None)
        _flag_set_here = False


def connect(config: IcegateConfig, extra: Mapping[str, str] | None = None) -> SparkSession:
    """A new session on the Spark Connect server of ``spark.remote``, with the run's
    settings, once the server is found to have what a run needs (:func:`check_extensions`,
    :func:`check_catalog`)."""
    url = config.spark.remote
    if url is None:
        raise SparkStartError("spark.remote is not set: no Spark Connect server to connect to")
    host, port = _address(url)
    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        raise SparkStartError(
            f"cannot reach the Spark Connect server of spark.remote {_shown(url)!r}: nothing "
            f"answers at {host}:{port} ({exc.strerror or exc}). Start the server (see {GUIDE}) "
            "or fix spark.remote / $SPARK_REMOTE"
        ) from None
    try:
        from pyspark.sql.connect.session import SparkSession as RemoteSession
    except ImportError as exc:
        raise SparkStartError(
            f"spark.remote is set but PySpark's Spark Connect client cannot load ({exc}): "
            "install the project's connect extra (pip install -e '.[connect]'; "
            "scripts/setup.sh does)"
        ) from None
    enter_connect_mode()
    try:
        session = RemoteSession.builder.remote(url).create()
        check_extensions(session, url)
    except SparkStartError:
        raise
    except Exception as exc:
        raise SparkStartError(
            f"the Spark Connect server of spark.remote {_shown(url)!r} refused the session: "
            f"{_first_line(exc)}"
        ) from None
    spark: SparkSession = session
    set_session_settings(spark, session_settings(config, extra or {}))
    check_catalog(spark, config.catalog.name, url)
    return spark


def check_extensions(spark: Any, url: str) -> None:
    """Iceberg's SQL extensions (``CALL``, ``ALTER TABLE ... WRITE ORDERED BY``) are a
    static setting: only the server's start sets them."""
    extensions = spark.conf.get("spark.sql.extensions", None) or ""
    if ICEBERG_EXTENSIONS not in extensions:
        raise SparkStartError(
            f"the Spark Connect server at {_shown(url)!r} runs without Iceberg's SQL "
            f"extensions (its spark.sql.extensions is {extensions!r}): maintenance calls "
            "Iceberg's procedures, which they provide. Start the server with "
            f"--conf spark.sql.extensions={ICEBERG_EXTENSIONS} (a static setting: no client "
            f"can set it; see {GUIDE})"
        )


def check_catalog(spark: SparkSession, catalog: str, url: str) -> None:
    """The run's catalog loads on the server: its Iceberg runtime (and a SQL catalog's JDBC
    driver) are on the server's class path."""
    quoted = "`" + catalog.replace("`", "``") + "`"
    try:
        spark.sql(f"SHOW NAMESPACES IN {quoted}").collect()
    except Exception as exc:
        text = str(exc)
        first = _first_line(exc)
        if "ClassNotFoundException" in text or "SparkCatalog" in first:
            missing = (
                "the Iceberg Spark runtime is not on its class path: start it with "
                "--packages org.apache.iceberg:iceberg-spark-runtime-3.5_2.12:1.12.0 (or "
                "--jars <that jar>)"
            )
        elif "No suitable driver" in text:
            missing = (
                "the catalog's JDBC driver is not on its class path: add it with --jars "
                "(sqlite-jdbc, postgresql)"
            )
        else:
            missing = f"the catalog does not load there: {first}"
        raise SparkStartError(
            f"the Spark Connect server at {_shown(url)!r} cannot serve catalog {catalog!r}: "
            f"{missing} (see {GUIDE})"
        ) from None
