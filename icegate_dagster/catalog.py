"""The pyiceberg catalog of the ``catalog:`` block: what kind it is, and opening it.

pyiceberg gets the block's properties as they are. Spark's settings for the same catalog
are built from the same block in :mod:`icegate_dagster.spark.catalog_conf`.
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

#: The newest table format version pyiceberg 0.12 writes (no format-version 3 metadata,
#: manifest lists or row lineage): a newer table's commits need Iceberg's own (Java) API.
PYICEBERG_MAX_FORMAT_VERSION = 2


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
