"""Spark's settings for the catalog of the ``catalog:`` block: the same catalog under the
same name.

Spark gets Iceberg's ``SparkCatalog`` with the catalog's name (the name is stored in the
catalog database, so both engines must agree) and the JDBC URL derived from the
SQLAlchemy URI; the other properties pass through, but for pyiceberg's own. A catalog
whose files live in S3 also gets what Iceberg's ``S3FileIO`` needs to reach them
(:func:`~icegate_dagster.spark.s3_file_io.s3_catalog_properties`).
"""

from __future__ import annotations

from sqlalchemy.engine import make_url

from icegate_dagster.catalog import catalog_kind, sqlite_path
from icegate_dagster.config import CatalogSettings
from icegate_dagster.spark.s3_file_io import s3_catalog_properties

#: pyiceberg-only properties that mean nothing to Iceberg's Java catalogs.
_PYICEBERG_ONLY = {"uri", "type", "echo", "pool_pre_ping", "init_catalog_tables", "py-io-impl"}


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
    for key, value in s3_catalog_properties(settings).items():
        conf[f"{prefix}.{key}"] = value
    return conf
