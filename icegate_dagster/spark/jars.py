"""The jars Spark's driver needs, found before its JVM starts.

Iceberg's Spark runtime, Iceberg's AWS bundle and Hadoop's S3A with its AWS SDK are Maven
Central's own jars, pinned by coordinates and SHA-256 in the running Spark line's lock
(:mod:`.line`: ``jars.lock`` for 3.5, ``jars-spark4.lock`` for 4.1) and fetched once by
``scripts/setup.sh`` (``--spark4`` for the 4.1 line) into :data:`SETUP_JARS_DIR` (or the
folder ``ICEGATE_SPARK_JARS_DIR`` names: an air-gapped host's own copy). Nothing is
downloaded when a session starts. A user's ``spark.jars`` or ``spark.jars.packages`` naming
a runtime wins. The JDBC driver of a SQL catalog is Debian's. A lakehouse in S3 gets the S3
jars too (:func:`default_jars`; the 3.5 line's lock pins them, the 4.1 line's not yet); what
its catalog needs on Spark's side, and the refusal without them: :mod:`.s3_file_io`.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from icegate_dagster.catalog import catalog_kind
from icegate_dagster.config import CatalogSettings, IcegateConfig
from icegate_dagster.errors import CatalogUnavailableError, SparkStartError
from icegate_dagster.spark.line import SparkLine, running_line
from icegate_dagster.spark.s3_file_io import CLASSPATH_KEYS, S3_SCHEMES, s3_keys, s3_usage

#: Where ``scripts/setup.sh`` puts the pinned jars: beside the installed packages.
SETUP_JARS_DIR = Path(sys.prefix) / "share" / "icegate" / "jars"
#: A folder of jars that replaces :data:`SETUP_JARS_DIR` (set-up fetches into it too).
JARS_DIR_ENV = "ICEGATE_SPARK_JARS_DIR"
AWS_BUNDLE_ARTIFACT = "iceberg-aws-bundle"
#: Spark's own S3 file system (S3A) and the AWS SDK it is built against.
S3A_ARTIFACTS = ("hadoop-aws", "aws-java-sdk-bundle")
#: Spark Connect's server (a plugin of PySpark's Spark): only a Spark server loads it.
CONNECT_SERVER_ARTIFACT = "spark-connect_2.12"
#: ``jars.lock``'s third column: a jar a run's own Spark may load (the default), or one only
#: a Spark server loads (never on a run's class path).
DRIVER_ROLE, SERVER_ROLE = "driver", "server"
#: The Iceberg version in a runtime jar's file name or Maven coordinates.
_RUNTIME_VERSION = re.compile(
    r"iceberg-spark-runtime-[0-9.]+_[0-9.]+[-:]([0-9][^,:/\s]*?)(?:\.jar)?(?=,|\s|$)"
)
SQLITE_JDBC_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")


@dataclass(frozen=True)
class PinnedJar:
    """One line of a jars lock: a jar by its Maven coordinates and SHA-256."""

    group: str
    artifact: str
    version: str
    sha256: str
    #: :data:`DRIVER_ROLE` or :data:`SERVER_ROLE` (the lock's optional third column).
    role: str = DRIVER_ROLE

    @property
    def coordinates(self) -> str:
        return f"{self.group}:{self.artifact}:{self.version}"

    @property
    def file_name(self) -> str:
        return f"{self.artifact}-{self.version}.jar"


def pinned_jars(line: SparkLine | None = None) -> list[PinnedJar]:
    """The jars of ``line``'s lock (the running line's by default), in its order."""
    lock = (line or running_line()).lock
    text = (resources.files("icegate_dagster.spark") / lock).read_text()
    pins = []
    for entry in text.splitlines():
        if not entry.strip() or entry.lstrip().startswith("#"):
            continue
        coordinates, sha256, *rest = entry.split()
        role = rest[0] if rest else DRIVER_ROLE
        if role not in (DRIVER_ROLE, SERVER_ROLE):
            raise SparkStartError(
                f"{lock}: {coordinates} has role {role!r}: must be {DRIVER_ROLE} or {SERVER_ROLE}"
            )
        group, artifact, version = coordinates.split(":")
        pins.append(PinnedJar(group, artifact, version, sha256, role))
    return pins


def _pin(artifact: str, line: SparkLine | None = None) -> PinnedJar | None:
    found = [p for p in pinned_jars(line) if p.artifact == artifact]
    return found[0] if found else None


def _driver_jar(artifact: str, line: SparkLine | None = None) -> Path | None:
    """:func:`_find_jar` for a jar a run's own Spark may load (never a server's)."""
    pin = _pin(artifact, line)
    if pin is not None and pin.role != DRIVER_ROLE:
        raise SparkStartError(f"{artifact} is a Spark server's jar: no run loads it")
    return _find_jar(artifact, line)


def connect_server_jar() -> Path:
    """Spark Connect's server jar in :func:`jars_dir` (for a server started beside runs: the
    tests', docs/how-to/deploy.md); a clear error when set-up has not fetched it."""
    jar = _find_jar(CONNECT_SERVER_ARTIFACT)
    if jar is None:
        pin = _pin(CONNECT_SERVER_ARTIFACT)
        fetched = f" (it fetches {pin.coordinates} from Maven Central)" if pin else ""
        raise SparkStartError(
            f"no {CONNECT_SERVER_ARTIFACT} jar in {jars_dir()}: run scripts/setup.sh{fetched}"
        )
    return jar


def jars_dir() -> Path:
    """The folder Spark's jars are taken from: ``$ICEGATE_SPARK_JARS_DIR``, else set-up's."""
    chosen = os.environ.get(JARS_DIR_ENV, "").strip()
    return Path(chosen).expanduser() if chosen else SETUP_JARS_DIR


def _find_jar(artifact: str, line: SparkLine | None = None) -> Path | None:
    """``artifact``'s jar in :func:`jars_dir`: the version ``line``'s lock pins when it is
    there, else the one version present (several: refused, rather than one picked by its
    name)."""
    folder = jars_dir()
    pin = _pin(artifact, line)
    if pin is not None and (folder / pin.file_name).is_file():
        return folder / pin.file_name
    found = sorted(folder.glob(f"{artifact}-[0-9]*.jar"))
    if len(found) > 1:
        raise SparkStartError(
            f"{folder} holds several {artifact} jars ({', '.join(p.name for p in found)}): keep one"
        )
    return found[0] if found else None


def iceberg_runtime_jar(line: SparkLine | None = None) -> Path:
    """The Iceberg Spark runtime jar of ``line`` (the running PySpark's by default) in
    :func:`jars_dir`; a clear error naming the set-up command when it is missing."""
    line = line or running_line()
    jar = _driver_jar(line.runtime_artifact, line)
    if jar is None:
        pin = _pin(line.runtime_artifact, line)
        assert pin is not None, f"{line.lock} pins no {line.runtime_artifact}"
        raise SparkStartError(
            f"no {line.runtime_artifact} jar in {jars_dir()}: run {line.setup_command} (it "
            f"fetches {pin.coordinates} from Maven Central; PySpark {line.spark} needs "
            f"Iceberg's runtime for Spark {line.spark}, Scala {line.scala}), put "
            f"{pin.file_name} in the folder {JARS_DIR_ENV} names, or name a runtime in "
            "spark.conf spark.jars.packages (or its jar in spark.jars)"
        )
    return jar


def aws_bundle_jar() -> Path | None:
    """Iceberg's AWS bundle in :func:`jars_dir` (``S3FileIO`` with its AWS SDK), or None."""
    return _driver_jar(AWS_BUNDLE_ARTIFACT)


def s3_jars() -> list[Path]:
    """The S3 jars in :func:`jars_dir` (Iceberg's AWS bundle, Hadoop's S3A and its AWS
    SDK), in the lock's order: all three, or [] when any is missing."""
    return list(_s3_jars_by_artifact().values())


def _s3_jars_by_artifact() -> dict[str, Path]:
    found = {a: _driver_jar(a) for a in (AWS_BUNDLE_ARTIFACT, *S3A_ARTIFACTS)}
    return {a: jar for a, jar in found.items() if jar is not None} if all(found.values()) else {}


def s3_jars_available() -> bool:
    """Whether :func:`s3_jars` finds every S3 jar."""
    return bool(s3_jars())


def uses_s3(config: IcegateConfig) -> bool:
    """Whether the lakehouse may keep files in S3: the catalog's (an ``s3://`` warehouse,
    ``S3FileIO``, or ``s3.*`` keys, which may serve a table placed in S3 beside a warehouse
    on local disk) or the WAL."""
    wal_root = (config.wal_root or "").lower()
    return (
        s3_usage(config.catalog) is not None
        or bool(s3_keys(config.catalog))
        or wal_root.startswith(S3_SCHEMES)
    )


def names_artifact(conf: Mapping[str, str], artifact: str) -> bool:
    """Whether the user's class path settings already name ``artifact`` (a jar or package)."""
    return any(artifact in conf.get(key, "") for key in CLASSPATH_KEYS)


def default_jars(config: IcegateConfig, user: Mapping[str, str]) -> list[Path]:
    """The jars of :func:`jars_dir` this session needs that the user's ``spark.conf`` does
    not supply: the runtime, unless theirs is named (their AWS bundle must then match
    theirs: ours is not added); the S3 jars when the lakehouse uses S3 (they are ~350 MB,
    which Spark copies at every session start)."""
    own_runtime = user_supplies_iceberg(user)
    jars = [] if own_runtime else [iceberg_runtime_jar()]
    if uses_s3(config):
        for artifact, jar in _s3_jars_by_artifact().items():
            if artifact == AWS_BUNDLE_ARTIFACT and own_runtime:
                continue
            if not names_artifact(user, artifact):
                jars.append(jar)
    return jars


def iceberg_version(conf: Mapping[str, str]) -> str:
    """The Iceberg version Spark will load: the user's runtime jar or package, else ours
    (the pinned one when the runtime jar is missing: the message then names that)."""
    for key in ("spark.jars.packages", "spark.jars"):
        match = _RUNTIME_VERSION.search(conf.get(key, ""))
        if match:
            return match.group(1)
    line = running_line()
    jar = _find_jar(line.runtime_artifact, line)
    if jar is None:
        pin = _pin(line.runtime_artifact, line)
        assert pin is not None, f"{line.lock} pins no {line.runtime_artifact}"
        return pin.version
    match = _RUNTIME_VERSION.search(jar.name)
    if match is None:  # a renamed jar: say so rather than guess
        return "<the Iceberg version of your iceberg-spark-runtime jar>"
    return match.group(1)


def user_supplies_iceberg(conf: Mapping[str, str]) -> bool:
    """Whether ``spark.jars`` or ``spark.jars.packages`` already name an Iceberg runtime."""
    return any(
        "iceberg-spark-runtime" in conf.get(key, "")
        for key in ("spark.jars", "spark.jars.packages")
    )


def jdbc_driver_jars(settings: CatalogSettings) -> list[Path]:
    """The JDBC driver jar Spark needs for this catalog; a clear error when it is missing."""
    needed = {"sqlite": SQLITE_JDBC_JAR, "postgresql": POSTGRES_JDBC_JAR}.get(
        catalog_kind(settings)
    )
    if needed is None:
        return []
    if not needed.is_file():
        package = {
            SQLITE_JDBC_JAR: "libxerial-sqlite-jdbc-java",
            POSTGRES_JDBC_JAR: "libpostgresql-jdbc-java",
        }[needed]
        raise CatalogUnavailableError(
            f"catalog {settings.name!r}: Spark needs the JDBC driver {needed}, which is missing; "
            f"install Debian's {package} (scripts/setup.sh does)"
        )
    return [needed]


def check_local_jars(jars: str) -> None:
    """Refuse a local ``spark.jars`` entry that is not there (before the JVM starts)."""
    for entry in filter(None, (j.strip() for j in jars.split(","))):
        if "://" in entry and not entry.startswith("file:"):
            continue
        path = Path(entry.removeprefix("file://").removeprefix("file:"))
        if not path.is_file():
            raise SparkStartError(f"spark.jars entry {entry!r} does not exist")
