"""The Spark session: one per process, with the Iceberg runtime and the catalog registered.

The Iceberg runtime jar is located in the installed ``snowpark-connect-deps-iceberg``
package at run time; a user's own ``spark.jars`` or ``spark.jars.packages`` take
precedence. The user's ``spark.conf`` is merged last. A catalog whose files are in
S3 needs Iceberg's AWS bundle on Spark's class path; without it the session is
refused before the JVM starts, with the coordinates to add.

No secret goes on a command line: see :class:`SplitConf`.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
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
from icegate_dagster.config.secrets import config_secrets, holds_secret, is_secret_key, secret_parts
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

#: WAL files may hold INT64 nanosecond timestamps, which Spark 3.5 reads only as longs
#: behind this flag (wal_compaction floors them to microseconds). It is set once for the
#: whole session, never switched per table: tables are maintained side by side in one
#: session. Only Parquet INT64 TIMESTAMP(NANOS) columns are affected, which Iceberg data
#: files never hold (Iceberg reads its own files with its own reader anyway).
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"

#: Secret settings a running session accepts: catalogs are loaded on first use, and
#: Hadoop's configuration is read when a file system is opened.
_RUNTIME_PREFIXES = ("spark.sql.catalog.", "spark.hadoop.")
#: Settings Spark's launcher copies onto the JVM's own command line (client mode).
_JAVA_COMMAND_LINE = {
    "spark.driver.memory",
    "spark.driver.defaultJavaOptions",
    "spark.driver.extraJavaOptions",
    "spark.driver.extraClassPath",
}

#: Where setup puts the archive of the driver's classes (``icegate_dagster.spark_classes``):
#: beside the installed packages it was made from.
CLASSES_ARCHIVE = Path(sys.prefix) / "share" / "icegate" / "spark-driver-classes.jsa"
#: The JVM's notes on the archive off: they go to standard output.
QUIET_CLASS_SHARING = "-Xlog:cds=off,cds+dynamic=off"
#: JVM options a user may have set themselves, which then win.
_USER_CLASS_SHARING = ("-XX:SharedArchiveFile", "-Xshare", "-XX:ArchiveClassesAtExit")


def class_sharing_options(user_options: str = "", archive: Path = CLASSES_ARCHIVE) -> str:
    """The driver JVM options that map ``archive`` when it exists ("" otherwise, or when the
    user's own options already choose class-data sharing). The JVM's notes about the archive
    are silenced: they would go to standard output, which ``--json`` owns."""
    if not archive.is_file() or any(option in user_options for option in _USER_CLASS_SHARING):
        return ""
    return f"-XX:SharedArchiveFile={archive} -Xshare:auto {QUIET_CLASS_SHARING}"


#: The driver's collector in local mode with a small heap: the serial collector runs no
#: threads of its own, which on a few cores take CPU from Spark's tasks (G1's do). The JVM
#: itself picks it below 2 CPUs or 1792 MB of memory. Measured on 2 cores, cold processes:
#: a full pass over 12 small tables 72 s instead of 74-77 s, 0.4 GB compacted in 45 s
#: instead of 49-50 s, and 150-250 MB less resident memory in both (docs/performance.md).
SERIAL_GC = "-XX:+UseSerialGC"
#: Above this driver heap a stop-the-world collector's pauses grow: G1 stays.
SERIAL_GC_MAX_HEAP = 2 * 1024**3
_USER_GC = re.compile(r"-XX:[+-]Use\w*GC\b")
_JVM_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)b?\s*$", re.IGNORECASE)


def jvm_bytes(text: str) -> int | None:
    """A JVM memory size as Spark reads ``spark.driver.memory`` (``512m``, ``2g``; a bare
    number is MiB), in bytes; None when it is not one."""
    match = _JVM_SIZE.match(text)
    if match is None:
        return None
    number, unit = int(match.group(1)), (match.group(2) or "m").lower()
    return int(number * 1024 ** "bkmgt".index(unit))


def local_gc_options(master: str, user: Mapping[str, str]) -> str:
    """:data:`SERIAL_GC` for a local master whose driver heap is at most
    :data:`SERIAL_GC_MAX_HEAP` (Spark's default is 1 GB), unless the user's options choose
    a collector; "" otherwise (a cluster's driver, a big heap, the user's own choice)."""
    if not master.startswith("local"):
        return ""
    options = " ".join(
        user.get(key, "")
        for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
    )
    if _USER_GC.search(options):
        return ""
    heap = jvm_bytes(user.get("spark.driver.memory", "1g"))
    if heap is None or heap > SERIAL_GC_MAX_HEAP:
        return ""
    return SERIAL_GC


#: The driver's JIT for a pass whose rewrites are known to be small before its JVM starts:
#: C1 alone. C2 spends the first tables' CPU compiling Spark's and Iceberg's planning code,
#: which a small pass runs a few times only; its faster code pays on big rewrites. Measured
#: on 2 cores, cold processes: 12 small tables' full pass 37 s instead of 45 s; 0.4 GB
#: compacted in 54 s instead of 50 s (docs/performance.md).
QUICK_JIT = "-XX:TieredStopAtLevel=1"
#: The most bytes of data files a pass may have to rewrite to start with :data:`QUICK_JIT`.
QUICK_JIT_MAX_BYTES = 256 * 1024**2
_USER_JIT = re.compile(r"-XX:(TieredStopAtLevel=|[+-]TieredCompilation\b)|-Xint\b|-Xcomp\b")


def local_jit_options(master: str, user: Mapping[str, str], *, small_work: bool) -> str:
    """:data:`QUICK_JIT` for a local driver whose pass is ``small_work`` (see
    :data:`QUICK_JIT_MAX_BYTES`), unless the user's options choose the JIT; "" otherwise."""
    if not small_work or not master.startswith("local"):
        return ""
    options = " ".join(
        user.get(key, "")
        for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
    )
    return "" if _USER_JIT.search(options) else QUICK_JIT


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


def build_spark_conf(config: IcegateConfig, *, small_work: bool = False) -> dict[str, str]:
    """Every Spark setting of the session, user ``spark.conf`` merged last; ``small_work``:
    the process knows its rewrites are small (:func:`local_jit_options`)."""
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
    # The driver's classes mapped from setup's archive when there is one.
    shared = class_sharing_options(user.get("spark.driver.extraJavaOptions", ""))
    master = config.spark.master
    for options in (
        shared,
        local_gc_options(master, user),
        local_jit_options(master, user, small_work=small_work),
    ):
        if options:
            conf["spark.driver.extraJavaOptions"] += " " + options
    if "spark.driver.extraJavaOptions" in user:
        user["spark.driver.extraJavaOptions"] += " " + conf["spark.driver.extraJavaOptions"]
    conf.update(user)
    conf[NO_SUBSTITUTION] = "false"  # names and messages are data, never expanded
    conf[NANOS_AS_LONG] = "true"  # WAL nanoseconds as longs, session-wide (see NANOS_AS_LONG)
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


@dataclass(frozen=True)
class SplitConf:
    """A session's settings by how they reach the JVM.

    PySpark hands every builder setting to ``spark-submit`` as ``--conf k=v``, readable
    by every local user in ``ps``: only ``public`` goes that way. ``runtime`` secrets
    (catalog properties, Hadoop settings) are set on the session right after it starts,
    before any catalog is loaded; ``launch`` secrets, which Spark reads only at JVM start,
    travel in a properties file only this user can read (:func:`private_launch_settings`).
    """

    public: dict[str, str]
    runtime: dict[str, str]
    launch: dict[str, str]


def is_secret_setting(key: str, value: str, secrets: Iterable[str]) -> bool:
    """Whether a Spark setting must stay off the command line: its key names a secret
    (``is_secret_key``), its value holds a secret part (a URI's password, ``?password=``,
    ``-D...secret.key=``) or holds one of ``secrets`` as a whole (``catalog.config_secrets``)."""
    return is_secret_key(key) or bool(secret_parts(value)) or holds_secret(value, secrets)


def split_secret_conf(conf: Mapping[str, str], secrets: Iterable[str]) -> SplitConf:
    """Sort ``conf`` by :func:`is_secret_setting` and by when Spark reads the setting."""
    secrets = tuple(s for s in secrets if s)
    split = SplitConf({}, {}, {})
    for key, value in conf.items():
        if not is_secret_setting(key, value, secrets):
            split.public[key] = value
        elif key.startswith(_RUNTIME_PREFIXES):
            split.runtime[key] = value
        elif key in _JAVA_COMMAND_LINE:
            raise SparkStartError(
                f"spark.conf {key} holds a secret (a -D option with a secret-looking key, a "
                "password in a URI or the value of a secret setting), but Spark copies it onto "
                "the JVM's command line, which every local user can read: give it its own "
                "setting instead (spark.hadoop.<key>, spark.sql.catalog.<name>.<key>), which is "
                "set after the JVM starts"
            )
        else:
            split.launch[key] = value
    return split


def _properties_line(key: str, value: str) -> str:
    """One ``key=value`` line of a Java properties file, escaped."""

    def escape(text: str) -> str:
        out = []
        for char in text:
            if char in "\\=:#! ":
                out.append("\\" + char)
            elif char in "\t\n\r\f":
                out.append({"\t": "\\t", "\n": "\\n", "\r": "\\r", "\f": "\\f"}[char])
            else:
                out.append(char)
        return "".join(out)

    return f"{escape(key)}={escape(value)}\n"


@contextlib.contextmanager
def private_launch_settings(launch: Mapping[str, str]) -> Iterator[None]:
    """While a JVM starts in this block, ``launch`` reaches ``spark-submit`` through a
    ``--properties-file`` readable only by this user (deleted once the block ends).

    spark-submit reads one properties file: Spark's ``spark-defaults.conf`` (or the one
    ``PYSPARK_SUBMIT_ARGS`` names) is copied into it first, so those settings still apply.
    """
    from pyspark import SparkContext

    if not launch or SparkContext._active_spark_context is not None:  # no launch coming
        yield
        return
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    args = shlex.split(previous or "pyspark-shell")
    base: Path | None = None
    if "--properties-file" in args[:-1]:
        at = args.index("--properties-file")
        base = Path(args[at + 1])
        del args[at : at + 2]
    else:
        from pyspark.find_spark_home import _find_spark_home

        home = _find_spark_home()  # type: ignore[no-untyped-call]
        conf_dir = os.environ.get("SPARK_CONF_DIR") or str(Path(home) / "conf")
        base = Path(conf_dir) / "spark-defaults.conf"
    folder = Path(tempfile.mkdtemp(prefix="icegate-spark-"))  # mode 0700
    try:
        path = folder / "secret.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            if base.is_file():
                out.write(base.read_text(encoding="utf-8") + "\n")
            out.writelines(_properties_line(k, v) for k, v in launch.items())
        os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(["--properties-file", str(path), *args])
        yield
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = previous
        shutil.rmtree(folder, ignore_errors=True)


def apply_runtime_conf(session: SparkSession, runtime: Mapping[str, str]) -> None:
    """Set held-back secrets on a started session, before any catalog is used: Iceberg's
    SparkCatalog reads ``spark.sql.catalog.<name>.*`` when first loaded; ``spark.hadoop.*``
    also goes into the SparkContext's Hadoop configuration, as it would at start."""
    hadoop = None
    for key, value in runtime.items():
        session.conf.set(key, value)
        if key.startswith("spark.hadoop."):
            if hadoop is None:
                hadoop = session.sparkContext._jsc.hadoopConfiguration()
            hadoop.set(key.removeprefix("spark.hadoop."), value)


def get_spark(config: IcegateConfig, *, small_work: bool = False) -> SparkSession:
    """The process's Spark session, started on first use (``small_work``: see
    :func:`local_jit_options`); later calls register new catalogs."""
    global _session
    conf = build_spark_conf(config, small_work=small_work)
    split = split_secret_conf(conf, config_secrets(config))
    with _lock:
        if _session is None:
            _session = _start(split.public, split.runtime, split.launch)
        else:
            _register_catalog(_session, config)
        return _session


def _start(
    conf: Mapping[str, str],
    runtime: Mapping[str, str] | None = None,
    launch: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or join) the session with ``conf`` on the command line, the secrets not."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with private_launch_settings(launch or {}):
            session = builder.getOrCreate()
        apply_runtime_conf(session, runtime or {})
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkStartError(
            f"Spark could not start (master {conf.get('spark.master')!r}): {first}. "
            "Check that Java 17 is installed (JAVA_HOME) and spark.conf is valid."
        ) from None
    quiet_logs(session)
    # Also when getOrCreate returned a session someone else started (dagster-pyspark).
    session.conf.set(NO_SUBSTITUTION, "false")
    session.conf.set(NANOS_AS_LONG, "true")
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
