"""One catalog, two engines: the pyiceberg catalog and the matching Spark catalog settings.

Both come from the single ``catalog:`` block. pyiceberg gets the properties as
they are; Spark gets the Iceberg ``SparkCatalog`` with the same name (the name
is stored in the catalog database, so both sides must agree) and the JDBC URL
derived from the SQLAlchemy URI.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import make_url

from icegate_dagster.config import CatalogSettings
from icegate_dagster.config.secrets import redact_uri, scrub
from icegate_dagster.errors import CatalogUnavailableError, ConfigError

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog

#: pyiceberg-only properties that mean nothing to Iceberg's Java catalogs.
_PYICEBERG_ONLY = {"uri", "type", "echo", "pool_pre_ping", "init_catalog_tables", "py-io-impl"}
#: Locations Iceberg's Java side reads through an S3 file system.
_S3_SCHEMES = ("s3://", "s3a://", "s3n://")
SQLITE_JDBC_JAR = Path("/usr/share/java/sqlite-jdbc.jar")
POSTGRES_JDBC_JAR = Path("/usr/share/java/postgresql.jar")


def catalog_kind(settings: CatalogSettings) -> str:
    """``sqlite``, ``postgresql``, ``rest`` or the declared ``type``."""
    uri = settings.properties.get("uri", "")
    if uri.startswith("sqlite"):
        return "sqlite"
    if uri.startswith("postgresql"):
        return "postgresql"
    declared = settings.properties.get("type")
    if declared:
        return declared
    return "rest" if uri.startswith("http") else "unknown"


def s3_usage(settings: CatalogSettings) -> str | None:
    """Why the catalog's files live in S3, for messages (``its warehouse is s3://...``), or
    None. Judged from the properties alone: the warehouse, ``io-impl`` or any ``s3.*`` key."""
    props = settings.properties
    warehouse = props.get("warehouse", "")
    if warehouse.lower().startswith(_S3_SCHEMES):
        return f"its warehouse is {warehouse}"
    io_impl = props.get("io-impl", "")
    if io_impl.endswith("S3FileIO"):
        return f"its io-impl is {io_impl}"
    s3_keys = sorted(key for key in props if key.startswith("s3."))
    if s3_keys:
        return f"it sets {'s3.endpoint' if 's3.endpoint' in s3_keys else s3_keys[0]}"
    return None


def sqlite_path(settings: CatalogSettings) -> Path:
    """The SQLite database file of a SQLite catalog."""
    database = make_url(settings.properties["uri"]).database
    if not database:
        raise ConfigError(
            f"invalid config: catalog.uri = {settings.properties['uri']!r}: "
            "an in-memory SQLite catalog cannot be shared with Spark; name a file"
        )
    return Path(database)


def open_catalog(settings: CatalogSettings) -> Catalog:
    """Open the pyiceberg catalog (creating the SQL catalog tables if needed)."""
    from pyiceberg.catalog import load_catalog

    kind = catalog_kind(settings)
    if kind == "sqlite":
        folder = sqlite_path(settings).parent
        if settings.embedded:
            folder.mkdir(parents=True, exist_ok=True)
        elif not folder.is_dir():
            raise CatalogUnavailableError(
                f"catalog {settings.name!r}: folder {folder} of catalog.uri does not exist"
            )
    props: dict[str, Any] = dict(settings.properties)
    if kind in ("sqlite", "postgresql"):
        props.setdefault("type", "sql")
    try:
        catalog = load_catalog(settings.name, **props)
        catalog.list_namespaces()  # fail here, clearly, rather than mid-run
    except Exception as exc:  # drivers raise anything; the message is what matters
        detail = scrub(f"{type(exc).__name__}: {exc}".splitlines()[0], settings)
        if isinstance(exc, ModuleNotFoundError) and exc.name == "boto3":
            detail += (
                " (pyiceberg signs REST requests with boto3 when rest.sigv4-enabled is true: "
                "pip install boto3, or use OAuth2 with credential: <access key>:<secret key>)"
            )
        raise CatalogUnavailableError(
            f"catalog {settings.name!r} at {redact_uri(settings.properties.get('uri', '?'))} "
            f"cannot be opened: {detail}"
        ) from None
    return catalog


def spark_catalog_conf(settings: CatalogSettings) -> dict[str, str]:
    """Spark settings that register the same catalog under the same name."""
    prefix = f"spark.sql.catalog.{settings.name}"
    conf = {
        prefix: "org.apache.iceberg.spark.SparkCatalog",
        # Other writers (pyiceberg, ingest) commit between our steps: always read fresh metadata.
        f"{prefix}.cache-enabled": "false",
    }
    kind = catalog_kind(settings)
    if kind == "sqlite":
        conf[f"{prefix}.type"] = "jdbc"
        conf[f"{prefix}.uri"] = f"jdbc:sqlite:{sqlite_path(settings)}"
        # Without this Spark keeps a SQLite read lock until the JVM exits.
        conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
    elif kind == "postgresql":
        url = make_url(settings.properties["uri"])
        port = f":{url.port}" if url.port else ""
        query = "&".join(f"{k}={v}" for k, v in url.query.items() if isinstance(v, str))
        conf[f"{prefix}.type"] = "jdbc"
        conf[f"{prefix}.uri"] = (
            f"jdbc:postgresql://{url.host or 'localhost'}{port}/{url.database or ''}"
            + (f"?{query}" if query else "")
        )
        conf[f"{prefix}.jdbc.init-catalog-tables"] = "false"
        if url.username:
            conf[f"{prefix}.jdbc.user"] = url.username
        if url.password:
            conf[f"{prefix}.jdbc.password"] = str(url.password)
    else:
        conf[f"{prefix}.type"] = kind
        if "uri" in settings.properties:
            conf[f"{prefix}.uri"] = settings.properties["uri"]
    for key, value in settings.properties.items():
        if key not in _PYICEBERG_ONLY:
            conf[f"{prefix}.{key}"] = value
    # pyiceberg's s3.region is client.region to Iceberg's Java S3FileIO (AWS bundle).
    if "s3.region" in settings.properties and "client.region" not in settings.properties:
        conf[f"{prefix}.client.region"] = settings.properties["s3.region"]
    return conf


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
