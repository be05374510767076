"""No secret on a command line: a session's settings sorted by how they reach the JVM.

PySpark hands every builder setting to ``spark-submit`` as ``--conf k=v``, which every
local user reads in ``ps``. A setting that holds a secret (what is one:
:mod:`icegate_dagster.config.secrets`) goes another way: set on the session right after
it starts, or in a properties file only this user can read (:class:`SplitConf`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from icegate_dagster.config.secrets import holds_secret, is_secret_key, secret_parts
from icegate_dagster.errors import SparkStartError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

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
    ``-D...secret.key=``) or holds one of ``secrets`` as a whole (``config_secrets``)."""
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
    also goes into the SparkContext's Hadoop configuration, as it would at start (on
    Spark Connect, a session setting of its own: :func:`~.remote.set_session_settings`)."""
    from icegate_dagster.spark.remote import is_remote, set_session_settings

    if is_remote(session):  # no JVM here: the server builds Hadoop's conf from settings
        set_session_settings(session, runtime)
        return
    hadoop = None
    for key, value in runtime.items():
        session.conf.set(key, value)
        if key.startswith("spark.hadoop."):
            if hadoop is None:
                hadoop = session.sparkContext._jsc.hadoopConfiguration()
            hadoop.set(key.removeprefix("spark.hadoop."), value)
