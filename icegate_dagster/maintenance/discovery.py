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
