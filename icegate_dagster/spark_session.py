"""The Spark session: one per process, with the Iceberg runtime and the catalog registered.

The Iceberg runtime jar is located in the installed ``snowpark-connect-deps-iceberg``
package at run time; a user's own ``spark.jars`` or ``spark.jars.packages`` take
precedence. The user's ``spark.conf`` is merged last. A catalog whose files are in
S3 needs Iceberg's AWS bundle on Spark's class path; without it the session is
refused before the JVM starts, with the coordinates to add.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from icegate_dagster.catalog import (
    POSTGRES_JDBC_JAR,
    SQLITE_JDBC_JAR,
    jdbc_driver_jars,
    s3_usage,
    spark_catalog_conf,
)
from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import SparkStartError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"
_RUNTIME_PACKAGE = "snowpark_connect_deps_iceberg"
_RUNTIME_GLOB = "iceberg-spark-runtime-3.5_2.12-*.jar"
#: The Iceberg version in a runtime jar's file name or Maven coordinates.
_RUNTIME_VERSION = re.compile(
    r"iceberg-spark-runtime-[0-9.]+_[0-9.]+[-:]([0-9][^,:/\s]*?)(?:\.jar)?(?=,|\s|$)"
)
#: What gives Spark an S3 file system: Iceberg's AWS bundle (S3FileIO with the AWS SDK),
#: the AWS SDK itself, or Hadoop's S3A connector.
_S3_SUPPORT = ("iceberg-aws-bundle", "software.amazon.awssdk", "hadoop-aws", "aws-java-sdk-bundle")
#: Where such a jar may be named.
_CLASSPATH_KEYS = (
    "spark.jars",
    "spark.jars.packages",
    "spark.driver.extraClassPath",
    "spark.executor.extraClassPath",
)

#: Spark SQL would expand ${var}, ${env:VAR} and ${spark:key} inside SQL text, string
#: literals included: a table named `t${env:SECRET}` would be maintained as `t<value>`.
NO_SUBSTITUTION = "spark.sql.variable.substitute"

_lock = threading.Lock()
_session: SparkSession | None = None


def iceberg_runtime_jar() -> Path:
    """The Iceberg Spark runtime jar shipped by the installed PyPI package."""
    try:
        folder = Path(str(resources.files(_RUNTIME_PACKAGE))) / "jars"
    except ModuleNotFoundError:
        raise SparkStartError(
            f"the Iceberg runtime package {_RUNTIME_PACKAGE} is not installed "
            "(pip install snowpark-connect-deps-iceberg==1.0.2), and spark.conf names no "
            "iceberg-spark-runtime jar"
        ) from None
    jars = sorted(folder.glob(_RUNTIME_GLOB))
    if not jars:
        raise SparkStartError(f"no {_RUNTIME_GLOB} in {folder}")
    return jars[-1]


def iceberg_version(conf: Mapping[str, str]) -> str:
    """The Iceberg version Spark will load: the user's runtime jar or package, else ours."""
    for key in ("spark.jars.packages", "spark.jars"):
        match = _RUNTIME_VERSION.search(conf.get(key, ""))
        if match:
            return match.group(1)
    match = _RUNTIME_VERSION.search(iceberg_runtime_jar().name)
    if match is None:  # a renamed jar: say so rather than guess
        return "<the Iceberg version of your iceberg-spark-runtime jar>"
    return match.group(1)


def check_s3_support(config: IcegateConfig, conf: Mapping[str, str]) -> None:
    """Refuse, before the JVM starts, a catalog in S3 when Spark has no S3 file system.

    Without Iceberg's AWS bundle every Spark read or write of the catalog's files fails
    deep in Java (``No FileSystem for scheme "s3"``); this says what to add instead.
    """
    reason = s3_usage(config.catalog)
    if reason is None:
        return
    named = " ".join(conf.get(key, "") for key in _CLASSPATH_KEYS)
    if any(jar in named for jar in _S3_SUPPORT):
        return
    raise SparkStartError(
        f"catalog {config.catalog.name!r} keeps its files in S3 ({reason}) but Spark has no "
        "S3 support: add org.apache.iceberg:iceberg-aws-bundle:"
        f"{iceberg_version(conf)} to spark.conf spark.jars.packages (or its jar to spark.jars)"
    )


def _user_supplies_iceberg(conf: Mapping[str, str]) -> bool:
    return any(
        "iceberg-spark-runtime" in conf.get(key, "")
        for key in ("spark.jars", "spark.jars.packages")
    )


def build_spark_conf(config: IcegateConfig) -> dict[str, str]:
    """Every Spark setting of the session, user ``spark.conf`` merged last."""
    user = dict(config.spark.conf)
    jars: list[str] = []
    if not _user_supplies_iceberg(user):
        jars.append(str(iceberg_runtime_jar()))
    jars += [str(p) for p in jdbc_driver_jars(config.catalog)]
    # The other JDBC drivers ride along when present: the process's one session must also
    # serve a catalog of the other kind registered later (jars are fixed at JVM start).
    for driver in (SQLITE_JDBC_JAR, POSTGRES_JDBC_JAR):
        if driver.is_file() and str(driver) not in jars:
            jars.append(str(driver))
    log4j = Path(str(resources.files("icegate_dagster"))) / "log4j2.properties"
    conf = {
        "spark.master": config.spark.master,
        "spark.app.name": "icegate-maintain",
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}",
    }
    if config.spark.master.startswith("local"):
        # Maintenance shuffles are small; Spark's 200 default mostly schedules empty tasks.
        conf["spark.sql.shuffle.partitions"] = "8"
    user_jars = [j for j in user.pop("spark.jars", "").split(",") if j.strip()]
    if user_jars or jars:
        conf["spark.jars"] = ",".join([*user_jars, *jars])
    conf.update(spark_catalog_conf(config.catalog))
    if "spark.driver.extraJavaOptions" in user:
        user["spark.driver.extraJavaOptions"] += " " + conf["spark.driver.extraJavaOptions"]
    conf.update(user)
    conf[NO_SUBSTITUTION] = "false"  # names and messages are data, never expanded
    _check_local_jars(conf.get("spark.jars", ""))
    check_s3_support(config, conf)
    return conf


def _check_local_jars(jars: str) -> None:
    for entry in filter(None, (j.strip() for j in jars.split(","))):
        if "://" in entry and not entry.startswith("file:"):
            continue
        path = Path(entry.removeprefix("file://").removeprefix("file:"))
        if not path.is_file():
            raise SparkStartError(f"spark.jars entry {entry!r} does not exist")


def get_spark(config: IcegateConfig) -> SparkSession:
    """The process's Spark session, started on first use; later calls register new catalogs."""
    global _session
    conf = build_spark_conf(config)
    with _lock:
        if _session is None:
            _session = _start(conf)
        else:
            _register_catalog(_session, config)
        return _session


def _start(conf: Mapping[str, str]) -> SparkSession:
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkStartError(
            f"Spark could not start (master {conf.get('spark.master')!r}): {first}. "
            "Check that Java 17 is installed (JAVA_HOME) and spark.conf is valid."
        ) from None
    quiet_logs(session)
    # Also when getOrCreate returned a session someone else started (dagster-pyspark).
    session.conf.set(NO_SUBSTITUTION, "false")
    return session


def quiet_logs(session: SparkSession) -> None:
    """Errors only from Spark: icegate reports results itself."""
    session.sparkContext.setLogLevel("ERROR")


def _register_catalog(session: SparkSession, config: IcegateConfig) -> None:
    """Add a catalog to a running session (Spark loads catalog plugins on first use)."""
    for key, value in spark_catalog_conf(config.catalog).items():
        current = session.conf.get(key, None)
        if current is None:
            session.conf.set(key, value)
        elif current != value:
            raise SparkStartError(
                f"Spark catalog {config.catalog.name!r} is already registered in this process "
                f"with another setting for {key}; give each catalog its own name"
            )


def stop_spark() -> None:
    """Stop the process's session, however it was started (tests and the CLI call this)."""
    global _session
    from pyspark.sql import SparkSession

    with _lock:
        session = _session or SparkSession.getActiveSession()
        if session is not None:
            session.stop()
        _session = None
