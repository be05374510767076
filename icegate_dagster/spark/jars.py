"""The jars Spark's driver needs, found before its JVM starts.

The Iceberg Spark runtime comes from the installed ``snowpark-connect-deps-iceberg``
package unless the user's ``spark.jars`` or ``spark.jars.packages`` name one; the JDBC
driver of a SQL catalog is Debian's. S3 support: :mod:`.s3_file_io`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path

from icegate_dagster.catalog import catalog_kind
from icegate_dagster.config import CatalogSettings
from icegate_dagster.errors import CatalogUnavailableError, SparkStartError

_RUNTIME_PACKAGE = "snowpark_connect_deps_iceberg"
_RUNTIME_GLOB = "iceberg-spark-runtime-3.5_2.12-*.jar"
#: The Iceberg version in a runtime jar's file name or Maven coordinates.
_RUNTIME_VERSION = re.compile(
    r"iceberg-spark-runtime-[0-9.]+_[0-9.]+[-:]([0-9][^,:/\s]*?)(?:\.jar)?(?=,|\s|$)"
)
SQLITE_JDBC_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")


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
