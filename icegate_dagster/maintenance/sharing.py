"""Tables that share files: which tables' locations overlap a table's, whether that sharing
is unsafe, and which files those tables still reference.

Two tables share files when one is registered on the other's metadata (``register_table``,
as catalog migrations and REST/Nessie "register" flows do: both then point at one folder)
or when one's folder lies inside the other's. A file one of them no longer needs may be
read by the other, so every operation that deletes files (expiry's deletes, orphan
removal, deferred orphan deletion) treats a file as live while **any** table whose location
overlaps references it (:func:`shared_files`): any snapshot it keeps, branch and tag heads
included, its metadata files and statistics. Where that cannot be established (another
table's location or metadata cannot be read) nothing is deleted, and the error says why. A
table whose metadata cannot be read concerns only the tables whose folders its files may lie
in (its metadata file's folder, :func:`~..discovery.presumed_location`), not every table.

Iceberg's own answer is ``gc.enabled=false`` on tables that share files (its ``snapshot``
and ``migrate`` procedures set it): other engines' expiry and orphan removal then refuse to
run there. A table that shares its location without it is *unsafe* (:class:`Sharing`),
which ``status`` and the health trigger say, as a warning, not a failure.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.discovery import (
    metadata_reach,
    normalize_location,
    overlapping_tables,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyiceberg.table import Table

    from icegate_dagster.maintenance.discovery import TableLocations


def _gc_off(properties: Mapping[str, str]) -> bool:
    # As Iceberg reads it (Java's Boolean.parseBoolean): anything but "true" turns GC off.
    value = properties.get("gc.enabled")
    return value is not None and value.lower() != "true"


@dataclass(frozen=True)
class Sharing:
    """Which tables' locations overlap ``table``'s (the same folder, or one inside the
    other), and whether that is unsafe (no ``gc.enabled=false`` on ``table``)."""

    table: str
    location: str
    #: Tables whose location contains, equals or lies inside ``location``.
    overlapping: tuple[str, ...] = ()
    #: Tables of the catalog whose location cannot be read (key -> error): they may overlap.
    unknown: Mapping[str, str] = field(default_factory=dict)
    #: ``gc.enabled`` is off on ``table`` (other engines will not delete its files).
    gc_disabled: bool = False

    @property
    def shared(self) -> bool:
        """Another table's location overlaps this one's."""
        return bool(self.overlapping)

    @property
    def unsafe(self) -> bool:
        """Shared without ``gc.enabled=false``: this service consults the other tables
        before it deletes, but other engines' expiry and orphan removal do not."""
        return self.shared and not self.gc_disabled

    def warning(self) -> str | None:
        """The warning a person should read for an unsafe table, or ``None``."""
        if not self.unsafe:
            return None
        others = ", ".join(self.overlapping)
        return (
            f"{self.table} shares its location {self.location} with {others} and does not set "
            "gc.enabled=false: icegate-maintain keeps every file any of them still references, "
            "but another engine's expire_snapshots or remove_orphan_files on it (Spark, Trino, "
            "...) may delete files the others still read. Set gc.enabled=false on it (as "
            "Iceberg's snapshot and migrate procedures do), or give each table its own folder"
        )

    def as_dict(self) -> dict[str, Any]:
        """Plain data, for JSON output and metadata."""
        return {
            "table": self.table,
            "location": self.location,
            "overlapping": list(self.overlapping),
            "unknown_locations": dict(self.unknown),
            "gc_disabled": self.gc_disabled,
            "unsafe": self.unsafe,
            "warning": self.warning(),
        }


def sharing_of(
    key: str,
    location: str,
    properties: Mapping[str, str],
    locations: Mapping[str, str],
    unreadable: Mapping[str, str] | None = None,
    overlapping: Sequence[str] | None = None,
) -> Sharing:
    """The sharing of table ``key`` (its ``location`` and ``properties``) among every
    table's location (``locations``: key -> location, as :func:`~..discovery.table_locations`
    lists them; ``unreadable``: the tables whose location could not be read; ``overlapping``:
    the overlapping tables when already known). Pure."""
    if overlapping is None:
        overlapping = overlapping_tables(key, location, locations)
    return Sharing(
        table=key,
        location=normalize_location(location),
        overlapping=tuple(overlapping),
        unknown={k: v for k, v in (unreadable or {}).items() if k != key},
        gc_disabled=_gc_off(properties),
    )


def locations_of(tables: Mapping[str, Table]) -> dict[str, str]:
    """The normalized location of each loaded table (key -> location): a map for
    :func:`sharing_of` built from tables already in hand, with no catalog listing. It sees
    overlaps among those tables only (:class:`~..discovery.TableLocations` lists them all)."""
    return {key: normalize_location(table.location()) for key, table in tables.items()}


def table_sharing(locations: TableLocations, key: str, table: Table) -> Sharing:
    """:func:`sharing_of` for a loaded table, against the locations listed once by
    ``locations`` (every table of the catalog). Raises when the catalog cannot be listed."""
    listed, unreadable = locations.listed()
    location = table.location()
    overlapping = locations.overlapping(key, location)
    return sharing_of(key, location, table.properties, listed, unreadable, overlapping)


# --- what the sharing tables reference ---------------------------------------------------


def table_references(table: Table) -> frozenset[str]:
    """Every file ``table``'s metadata reaches, in one spelling (:func:`normalize_location`):
    its current and logged metadata files, the statistics files, every snapshot's manifest
    list (so every branch and tag), the manifests they list and the data and delete files
    they list live (added or existing). A file only a ``DELETED`` entry names is read by no
    snapshot: where a kept snapshot still reads it, that snapshot's manifests list it live,
    the rule expiry's own diff follows."""
    reach = metadata_reach(table, live_only=True)
    assert reach is not None  # no manifest limit
    return frozenset(normalize_location(p) for p in reach)


class _ReferenceCache:
    """:func:`table_references` per metadata file (immutable, so never stale), the last
    few kept: a pass consults one sharing table from its expiry and its orphan removal."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, frozenset[str]] = OrderedDict()

    def of(self, table: Table) -> frozenset[str]:
        key = table.metadata_location
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return self._entries[key]
        found = table_references(table)
        with self._lock:
            self._entries[key] = found
            while len(self._entries) > self._size:
                self._entries.popitem(last=False)
        return found


REFERENCES = _ReferenceCache()


@dataclass(frozen=True)
class SharedFiles:
    """What the tables sharing a table's location reference now: path (one spelling) ->
    the first table (by name) that references it."""

    #: The tables consulted (whose location overlaps), by name.
    tables: tuple[str, ...] = ()
    paths: Mapping[str, str] = field(default_factory=dict)

    def owner(self, path: str) -> str | None:
        """The sharing table that references ``path`` (any spelling), or ``None``."""
        return self.paths.get(normalize_location(path))

    def keeps(self, path: str) -> bool:
        """Another table still references ``path``: it must not be deleted."""
        return self.owner(path) is not None


NO_SHARED_FILES = SharedFiles()


class SharingUnknownError(OperationError):
    """Whether another table still references a file cannot be established: nothing is
    deleted. ``unreadable``: the tables whose metadata could not be read (none when the
    catalog itself could not be listed)."""

    def __init__(self, message: str, unreadable: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.unreadable = tuple(unreadable)


def refuse_unreadable_near(
    locations: TableLocations, key: str, location: str, *, for_what: str
) -> None:
    """Raise :class:`SharingUnknownError` while a table whose metadata cannot be read may
    have files in ``key``'s folder (``location``): they would look unreferenced there
    (:meth:`~..discovery.TableLocations.unreadable_near`; one apart is no concern)."""
    near = locations.unreadable_near(key, location)
    if near:
        named = "; ".join(f"{k} ({v})" for k, v in near.items())
        raise SharingUnknownError(
            f"the metadata of {len(near)} table(s) of the catalog cannot be read and their "
            f"files may lie in {key}'s folder {normalize_location(location)}, so {for_what}: "
            f"{named}; repair or drop {'it' if len(near) == 1 else 'them'} first",
            unreadable=tuple(near),
        )


def shared_files(
    locations: TableLocations,
    key: str,
    location: str,
    *,
    clean: Callable[[str], str] | None = None,
) -> SharedFiles:
    """The files that the tables whose location overlaps ``key``'s (``location``) reference
    now, each of them loaded afresh from the catalog. Fails closed with
    :class:`SharingUnknownError` when a table whose location cannot be read may overlap
    (:func:`refuse_unreadable_near`)
    or an overlapping table's metadata cannot be read: nothing may then be deleted."""
    try:
        locations.listed()
    except Exception as exc:
        raise SharingUnknownError(
            f"cannot list the catalog's tables to find those sharing {key}'s location: "
            f"{describe_error(exc, clean)}"
        ) from None
    refuse_unreadable_near(locations, key, location, for_what="they may share its files")
    overlapping = locations.overlapping(key, location)
    paths: dict[str, str] = {}
    catalog = locations.catalog
    for other in overlapping:
        try:
            table = catalog.load_table(locations.identifier(other))
            references = REFERENCES.of(table)
        except Exception as exc:
            raise SharingUnknownError(
                f"cannot tell which files {other} (its location overlaps {key}'s) still "
                f"references: {describe_error(exc, clean)}",
                unreadable=(other,),
            ) from None
        for path in references:
            paths.setdefault(path, other)
    return SharedFiles(tuple(overlapping), paths)
