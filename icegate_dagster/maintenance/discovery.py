"""Which tables exist: the configured namespaces' tables, minus ``_``-prefixed ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from icegate_dagster.errors import CatalogUnavailableError, InvalidIdentifierError
from icegate_dagster.maintenance.identifiers import TableRef

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog


def list_namespaces(catalog: Catalog, configured: Iterable[str] | None) -> list[str]:
    """The configured namespaces, or every top-level namespace of the catalog."""
    if configured is not None:
        return list(configured)
    return sorted(".".join(ns) for ns in catalog.list_namespaces())


def discover_tables(catalog: Catalog, namespaces: Iterable[str] | None) -> list[TableRef]:
    """Tables to maintain, sorted; metadata tables (name starts with ``_``) are left out.

    A configured namespace that does not exist yields no tables rather than an
    error, so a fresh lakehouse can be configured before its first write. Names
    that cannot be handled safely (control characters) are skipped here and
    refused with a clear error if asked for by name.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError

    found: list[TableRef] = []
    for namespace in list_namespaces(catalog, namespaces):
        try:
            identifiers = catalog.list_tables(namespace)
        except NoSuchNamespaceError:
            continue
        except Exception as exc:
            raise CatalogUnavailableError(
                f"cannot list tables of namespace {namespace!r}: {exc}"
            ) from None
        for identifier in identifiers:
            try:
                ref = TableRef(".".join(identifier[:-1]), identifier[-1])
            except InvalidIdentifierError:
                continue
            if not ref.is_internal:
                found.append(ref)
    return sorted(found)


_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3", "file": "file"}


def normalize_location(location: str) -> str:
    """One spelling per place: ``file:/x``, ``file:///x`` and ``/x`` alike; ``s3a``/``s3n`` as
    ``s3``; no trailing slash. Used to compare table locations, never to address files."""
    scheme, sep, rest = location.partition(":")
    if not sep or "/" in scheme:  # a bare path
        scheme, rest = "file", location
    scheme = _SCHEME_ALIASES.get(scheme.lower(), scheme.lower())
    if scheme == "file":
        rest = "/" + rest.lstrip("/")
        return f"file://{rest}".rstrip("/")
    return f"{scheme}:{rest}".rstrip("/")


def table_locations(catalog: Catalog) -> dict[str, str]:
    """Every table of every namespace (``_`` tables included) and its normalized location."""
    locations: dict[str, str] = {}
    for namespace in catalog.list_namespaces():
        for identifier in catalog.list_tables(namespace):
            try:
                table = catalog.load_table(identifier)
            except Exception:  # an unreadable table is reported where it is maintained
                continue
            locations[".".join(identifier)] = normalize_location(table.location())
    return locations


def overlapping_tables(key: str, location: str, locations: dict[str, str]) -> list[str]:
    """Tables other than ``key`` whose location contains, or lies inside, ``location``."""
    mine = normalize_location(location) + "/"
    return sorted(
        other
        for other, theirs in locations.items()
        if other != key and (mine.startswith(theirs + "/") or (theirs + "/").startswith(mine))
    )
