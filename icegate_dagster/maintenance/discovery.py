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


def all_namespaces(catalog: Catalog) -> list[tuple[str, ...]]:
    """Every namespace of the catalog, nested ones included (``list_namespaces(parent)``)."""
    from pyiceberg.exceptions import NoSuchNamespaceError

    found: list[tuple[str, ...]] = []
    todo = [tuple(ns) for ns in catalog.list_namespaces()]
    seen: set[tuple[str, ...]] = set()
    while todo:
        namespace = todo.pop()
        if namespace in seen:
            continue
        seen.add(namespace)
        found.append(namespace)
        # Children only: a catalog that answers with the parent itself or with strangers
        # (some list every namespace whatever the parent) cannot loop this forever.
        try:
            children = catalog.list_namespaces(namespace)
        except (NoSuchNamespaceError, NotImplementedError):  # gone since, or never nested
            continue
        todo += [
            tuple(child)
            for child in children
            if len(child) > len(namespace) and tuple(child[: len(namespace)]) == namespace
        ]
    return sorted(found)


def table_locations(catalog: Catalog, unreadable: dict[str, str] | None = None) -> dict[str, str]:
    """Every table of every namespace, nested ones and ``_`` tables included, and its
    normalized location.

    Fails closed: a table whose location cannot be read is recorded in ``unreadable``
    (key -> error) when given, and otherwise raises, naming the table. (Its files could be
    anywhere, inside another table's folder included.)
    """
    locations: dict[str, str] = {}
    for namespace in all_namespaces(catalog):
        for identifier in catalog.list_tables(namespace):
            key = ".".join(identifier)
            try:
                location = catalog.load_table(identifier).location()
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                if unreadable is None:
                    raise CatalogUnavailableError(
                        f"cannot read the location of table {key!r}: {error}"
                    ) from None
                unreadable[key] = error
                continue
            locations[key] = normalize_location(location)
    return locations


def wal_root_conflict(key: str, location: str, wal_root: str | None) -> str | None:
    """Why ``wal.root`` and the table's folder cannot both be used, or ``None``.

    ``wal.root`` inside the table's folder makes waiting WAL files look orphaned to the
    table's orphan removal; the table's folder inside ``wal.root`` lets WAL work list the
    table's own files.
    """
    if not wal_root:
        return None
    table, wal = normalize_location(location), normalize_location(wal_root)
    if table == wal or wal.startswith(table + "/"):
        where = "is" if table == wal else "lies inside"
        return (
            f"wal.root {wal_root} {where} the folder of table {key} ({location}): "
            "its orphan removal would delete waiting WAL files"
        )
    if table.startswith(wal + "/"):
        return (
            f"the folder of table {key} ({location}) lies inside wal.root {wal_root}: "
            "WAL work would list the table's own files"
        )
    return None


def overlapping_tables(key: str, location: str, locations: dict[str, str]) -> list[str]:
    """Tables other than ``key`` whose location contains, or lies inside, ``location``."""
    mine = normalize_location(location) + "/"
    return sorted(
        other
        for other, theirs in locations.items()
        if other != key and (mine.startswith(theirs + "/") or (theirs + "/").startswith(mine))
    )
