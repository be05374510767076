"""Which tables exist (the configured namespaces' tables, minus ``_``-prefixed ones),
and where their folders are."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import (
    CatalogUnavailableError,
    IcegateError,
    InvalidIdentifierError,
    OperationError,
    TableNotFoundError,
    describe_error,
)
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.parallel import each_table

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.io import FileIO
    from pyiceberg.table import Table


def list_namespaces(catalog: Catalog, configured: Iterable[str] | None) -> list[str]:
    """The configured namespaces, or every top-level namespace of the catalog."""
    if configured is not None:
        return list(configured)
    return sorted(".".join(ns) for ns in catalog.list_namespaces())


def discover_tables(
    catalog: Catalog, namespaces: Iterable[str] | None, excluded: Iterable[str] = ()
) -> list[TableRef]:
    """Tables to maintain, sorted; metadata tables (name starts with ``_``) and the
    ``excluded`` ones (the project's own: the log and orphan-candidates tables) are left
    out. (Catalogs such as SeaweedFS and S3 Tables refuse ``_`` names, so those may be
    ordinary names in a maintained namespace.)

    A configured namespace that does not exist yields no tables rather than an
    error, so a fresh lakehouse can be configured before its first write. Names
    that cannot be handled safely (control characters) are skipped here and
    refused with a clear error if asked for by name.
    """
    from pyiceberg.exceptions import NoSuchNamespaceError

    found: list[TableRef] = []
    skip = set(excluded)
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
            # A configured nested namespace's table (``a.b`` + ``t``) would have the key
            # ``a.b.t``, which names table ``b.t`` of namespace ``a``: nested namespaces are
            # not maintained (as the health trigger's listing), never mistaken for another.
            if len(identifier) != 2:
                continue
            try:
                ref = TableRef(*identifier)
            except InvalidIdentifierError:
                continue
            if not ref.is_internal and ref.key not in skip:
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


def sql_metadata_locations(catalog: Catalog) -> dict[tuple[str, str], str | None] | None:
    """Every table's current metadata file of a pyiceberg SQL catalog, in one query (views
    left out), by ``(namespace, name)``; None for any other kind of catalog. A catalog that
    cannot be queried raises :class:`~icegate_dagster.errors.CatalogUnavailableError`."""
    try:
        from pyiceberg.catalog.sql import IcebergTables, SqlCatalog
    except ImportError:  # pyiceberg without its SQL extra
        return None
    if not isinstance(catalog, SqlCatalog):
        return None
    from sqlalchemy import or_, select

    rows = IcebergTables
    query = select(rows.table_namespace, rows.table_name, rows.metadata_location).where(
        rows.catalog_name == catalog.name,
        or_(rows.iceberg_type.is_(None), rows.iceberg_type == "TABLE"),
    )
    try:
        with catalog.engine.connect() as conn:
            return {(str(ns), str(t)): loc for ns, t, loc in conn.execute(query)}
    except Exception as exc:
        raise CatalogUnavailableError(f"cannot list the catalog's tables: {exc}") from None


class LocationCache:
    """Table locations by metadata file. A metadata file never changes, so the location
    read from it never does either: a table whose metadata file is known needs no load to
    know its location (bounded; the least recently used go first)."""

    def __init__(self, size: int = 200_000) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._locations: OrderedDict[str, str] = OrderedDict()

    def get(self, metadata_location: str | None) -> str | None:
        """The location read from ``metadata_location`` before, if any."""
        if metadata_location is None:
            return None
        with self._lock:
            found = self._locations.get(metadata_location)
            if found is not None:
                self._locations.move_to_end(metadata_location)
            return found

    def put(self, metadata_location: str | None, location: str) -> None:
        """Remember ``location`` as read from ``metadata_location``."""
        if metadata_location is None:
            return
        with self._lock:
            self._locations[metadata_location] = location
            self._locations.move_to_end(metadata_location)
            while len(self._locations) > self.size:
                self._locations.popitem(last=False)

    def update(self, known: Mapping[str, str]) -> None:
        """Remember many (metadata file -> location) at once."""
        for metadata_location, location in known.items():
            self.put(metadata_location, location)


#: This process's table locations, by metadata file.
LOCATIONS = LocationCache()


def table_names(identifiers: Iterable[tuple[str, ...]]) -> dict[tuple[str, ...], str]:
    """A name for each identifier, unique among them: ``namespace.table`` (a one-level
    namespace's table keeps its :attr:`TableRef.key`), and where two identifiers join to
    one name (table ``x.y`` of namespace ``a`` and table ``y`` of the nested namespace
    ``a.x`` are both ``a.x.y``) the nested one says its namespace. A name is for reading:
    a table is loaded by its identifier, never by a name split at its dots."""
    names: dict[tuple[str, ...], str] = {}
    taken: set[str] = set()
    # One-level namespaces first: their tables' names are the keys maintenance uses.
    for identifier in sorted(set(identifiers), key=lambda i: (len(i), i)):
        name = ".".join(identifier)
        if name in taken:
            name = f"{name} (table {identifier[-1]!r} of namespace {'.'.join(identifier[:-1])!r})"
        if name in taken:  # a nested namespace whose levels hold dots too
            name = repr(identifier)
        taken.add(name)
        names[identifier] = name
    return names


def table_locations(
    catalog: Catalog,
    unreadable: dict[str, str] | None = None,
    clean: Callable[[str], str] = str,
    known: Callable[[], Mapping[str, str]] | None = None,
    identifiers: dict[str, tuple[str, ...]] | None = None,
    presumed: dict[str, str] | None = None,
) -> dict[str, str]:
    """Every table of every namespace, nested ones and ``_`` tables included, and its
    normalized location, by the name :func:`table_names` gives it (``identifiers``, when
    given, receives each name's identifier).

    On a SQL catalog one query lists every table with its metadata file, and a table whose
    metadata file's location is known (:data:`LOCATIONS`, or ``known()``: metadata file ->
    location, asked at most once, e.g. the trigger's last looks) is not loaded. Elsewhere
    every table is loaded.

    Fails closed: a table whose location cannot be read is recorded in ``unreadable``
    (key -> error) when given, and otherwise raises, naming the table. (Its files could be
    anywhere, inside another table's folder included.) Where the catalog named its metadata
    file, the folder that file says it lives in goes to ``presumed``
    (:func:`presumed_location`).
    """
    metadata = sql_metadata_locations(catalog)
    if metadata is not None:
        listed = [(tuple([*ns.split("."), name]), loc) for (ns, name), loc in metadata.items()]
    else:
        listed = [
            (tuple(identifier), None)
            for namespace in all_namespaces(catalog)
            for identifier in catalog.list_tables(namespace)
        ]
    names = table_names(identifier for identifier, _ in listed)
    if identifiers is not None:
        identifiers.update({name: identifier for identifier, name in names.items()})
    asked = False
    locations: dict[str, str] = {}
    unknown: list[tuple[tuple[str, ...], str | None]] = []
    for identifier, metadata_location in listed:
        key = names[identifier]
        location = LOCATIONS.get(metadata_location)
        if location is None and metadata_location is not None and known is not None and not asked:
            asked = True
            LOCATIONS.update(known())
            location = LOCATIONS.get(metadata_location)
        if location is None:
            unknown.append((identifier, metadata_location))
        else:
            locations[key] = normalize_location(location)
    files = _FileIOs(catalog)
    metadata_of = dict(unknown)
    for (identifier, _), read in each_table(
        unknown, lambda item: _read_location(catalog, files, *item), LOCATION_READERS, "locations"
    ):
        key = names[identifier]
        if isinstance(read, str):
            locations[key] = normalize_location(read)
            continue
        folder = presumed_location(metadata_of[identifier])
        if presumed is not None and folder is not None:
            presumed[key] = folder
        # Masked (``clean``) before the cut, so no piece of a secret survives it.
        error = clean(f"{type(read).__name__}: {read}".splitlines()[0])[:300]
        if unreadable is None:
            raise CatalogUnavailableError(
                f"cannot read the location of table {key!r}: {error}"
            ) from None
        unreadable[key] = error
    return dict(sorted(locations.items()))


def presumed_location(metadata_location: str | None) -> str | None:
    """The folder a table whose metadata cannot be read lives in, as its metadata file's
    path says (``<location>/metadata/<file>``, Iceberg's layout), normalized; None when the
    file lies elsewhere (``write.metadata.path``) or is not known: its table may lie
    anywhere."""
    if metadata_location is None:
        return None
    folder, _, _ = normalize_location(metadata_location).rpartition("/")
    location, _, last = folder.rpartition("/")
    return location if last == "metadata" and location.count("/") > 2 else None


#: Tables whose location is read at once when none is known (each a metadata file read or
#: a catalog round trip: waiting, not computing).
LOCATION_READERS = 16


class _FileIOs:
    """One FileIO per scheme for a catalog's metadata files (as the catalog reads them: its
    own properties), made on first use and shared by the readers."""

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._lock = threading.Lock()
        self._made: dict[str, FileIO] = {}

    def read(self, location: str) -> bytes:
        """The bytes of the file at ``location``."""
        from pyiceberg.io import load_file_io

        scheme = location.split("://", 1)[0] if "://" in location else ""
        with self._lock:
            io = self._made.get(scheme)
            if io is None:
                io = self._made[scheme] = load_file_io(self._catalog.properties, location)
        with io.new_input(location).open() as stream:
            return stream.read()


def _read_location(
    catalog: Catalog, files: _FileIOs, identifier: tuple[str, ...], metadata_location: str | None
) -> str | Exception:
    """A table's location: from its metadata file's ``location`` field when the catalog named
    the file (no catalog round trip, no full parse), else by loading the table; the error
    when neither can be read."""
    if metadata_location is not None:
        try:
            location = _metadata_file_location(files.read(metadata_location), metadata_location)
        except Exception:  # an unreadable file: the catalog's own load says why
            pass
        else:
            LOCATIONS.put(metadata_location, location)
            return location
    try:
        table = catalog.load_table(identifier)
        location = table.location()
    except Exception as exc:
        return exc
    LOCATIONS.put(table.metadata_location, location)
    return location


def _metadata_file_location(content: bytes, metadata_location: str) -> str:
    """The ``location`` field of a table metadata file's content (plain or gzip JSON)."""
    import gzip
    import json

    if content[:2] == b"\x1f\x8b":
        content = gzip.decompress(content)
    location = json.loads(content)["location"]
    if not isinstance(location, str) or not location:
        raise ValueError(f"{metadata_location} names no table location")
    return location


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


def overlapping_tables(key: str, location: str, locations: Mapping[str, str]) -> list[str]:
    """Tables other than ``key`` whose location contains, or lies inside, ``location``
    (one table against all: :func:`all_overlaps` answers for every table at once)."""
    mine = normalize_location(location) + "/"
    return sorted(
        other
        for other, theirs in locations.items()
        if other != key and (mine.startswith(theirs + "/") or (theirs + "/").startswith(mine))
    )


def all_overlaps(locations: Mapping[str, str]) -> dict[str, tuple[str, ...]]:
    """Every table whose location overlaps another's (the same folder, or one inside the
    other), with those others: :func:`overlapping_tables` for every table at once, in
    ``O(n log n)`` plus the overlaps (a sweep over the sorted locations with a stack of the
    folders that contain the current one)."""
    ordered = sorted((normalize_location(loc) + "/", key) for key, loc in locations.items())
    found: dict[str, set[str]] = {}
    stack: list[tuple[str, str]] = []
    for folder, key in ordered:
        while stack and not folder.startswith(stack[-1][0]):
            stack.pop()
        for _, outer in stack:  # every folder on the stack contains (or is) this one
            found.setdefault(key, set()).add(outer)
            found.setdefault(outer, set()).add(key)
        stack.append((folder, key))
    return {key: tuple(sorted(others)) for key, others in sorted(found.items())}


class TableLocations:
    """Every table's location, listed once (on first use) and shared by the threads of a
    pass: orphan removal lists a table's folder, and every deleting operation consults the
    tables whose folders overlap (see :mod:`.sharing`)."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        clean: Callable[[str], str] = str,
        known: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        self._catalog = catalog
        self._clean = clean
        self._known = known
        self._lock = threading.Lock()
        self._locations: dict[str, str] | None = None
        self._unreadable: dict[str, str] = {}
        self._identifiers: dict[str, tuple[str, ...]] = {}
        self._presumed: dict[str, str] = {}
        self._overlaps: dict[str, tuple[str, ...]] | None = None

    @property
    def catalog(self) -> Catalog:
        """The catalog the locations are listed from."""
        return self._catalog()

    def listed(self) -> tuple[dict[str, str], dict[str, str]]:
        """Every table's normalized location (key -> location), and the tables whose
        location could not be read (key -> error); listed on first use. Raises when the
        catalog itself cannot be listed."""
        with self._lock:
            if self._locations is None:
                unreadable: dict[str, str] = {}
                identifiers: dict[str, tuple[str, ...]] = {}
                presumed: dict[str, str] = {}
                self._locations = table_locations(
                    self._catalog(), unreadable, self._clean, self._known, identifiers, presumed
                )
                self._unreadable = unreadable
                self._identifiers = identifiers
                self._presumed = presumed
            return self._locations, self._unreadable

    def identifier(self, name: str) -> tuple[str, ...]:
        """The catalog identifier of a listed table (``name`` as :meth:`listed` gives it):
        what it is loaded by, a name being ambiguous where its parts hold dots."""
        self.listed()
        with self._lock:
            found = self._identifiers.get(name)
        return found if found is not None else TableRef.parse(name).identifier

    def overlaps(self) -> dict[str, tuple[str, ...]]:
        """:func:`all_overlaps` of the listed locations, computed once: a pass over 10,000
        tables asks for each table's, and one against all would be quadratic."""
        listed, _ = self.listed()
        with self._lock:
            if self._overlaps is None:
                self._overlaps = all_overlaps(listed)
            return self._overlaps

    def overlapping(self, key: str, location: str) -> tuple[str, ...]:
        """The listed tables other than ``key`` whose location overlaps ``location``: from
        the one sweep when ``key`` is listed there, else compared with every table."""
        listed, _ = self.listed()
        if listed.get(key) == normalize_location(location):
            return self.overlaps().get(key, ())
        return tuple(overlapping_tables(key, location, listed))

    def unreadable_near(self, key: str, location: str) -> dict[str, str]:
        """The tables other than ``key`` whose location cannot be read and may overlap
        ``location`` (name -> why): those whose metadata file lies in a folder overlapping
        it, and those whose folder cannot even be presumed (:func:`presumed_location`). One
        whose metadata file lies in a folder apart is no concern of ``key``'s: an unreadable
        table does not stop the maintenance of every other."""
        _, unreadable = self.listed()
        near = {}
        for other, error in sorted(unreadable.items()):
            if other == key:
                continue
            folder = self._presumed.get(other)
            if folder is None:
                near[other] = f"{error}; where its files lie is not known"
            elif overlapping_tables(key, location, {other: folder}):
                near[other] = f"{error}; its metadata file lies in {folder}"
        return near


def _exists(catalog: Catalog, identifier: tuple[str, ...]) -> bool:
    """The catalog has the table. pyiceberg's ``table_exists`` loads it: a table whose
    metadata cannot be read exists all the same, and its pass fails on its own, naming why
    (:func:`load_table`), rather than the whole command."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.table_exists(identifier)
    except NoSuchTableError:
        return False
    except Exception:
        return True


def resolve_table(catalog: Catalog, name: str, catalog_name: str) -> TableRef:
    """Parse a user-given ``namespace.table`` and check that the table exists."""
    ref = TableRef.parse(name)
    if not _exists(catalog, ref.identifier):
        parts = tuple(name.split("."))
        if len(parts) > 2 and _exists(catalog, parts):
            raise InvalidIdentifierError(
                f"table {name!r} is in the nested namespace {'.'.join(parts[:-1])!r}; "
                "only one-level namespaces are maintained"
            )
        raise TableNotFoundError(f"table {ref.key!r} does not exist in catalog {catalog_name!r}")
    return ref


def load_table(
    catalog: Catalog, ref: TableRef, catalog_name: str, scrub: Callable[[str], str]
) -> Table:
    """Load a table's current metadata; an error naming the table when it is gone or
    unreadable (``scrub`` masks secrets in the catalog's own message)."""
    from pyiceberg.exceptions import NoSuchTableError

    try:
        return catalog.load_table(ref.identifier)
    except NoSuchTableError:
        raise TableNotFoundError(
            f"table {ref.key!r} does not exist in catalog {catalog_name!r}"
        ) from None
    except IcegateError:
        raise
    except Exception as exc:  # corrupt or unreachable metadata: name the table
        detail = describe_error(exc, scrub)
        raise OperationError(f"table {ref.key!r}: cannot read its metadata: {detail}") from None


@dataclass(frozen=True)
class MetadataReach:
    """What one metadata file reaches (see :func:`metadata_reach`); ``everything`` and
    ``live`` are None when the walk stopped at its manifest limit."""

    #: Distinct manifests of all snapshots (at least the limit + 1 when it stopped there).
    manifests: int
    everything: frozenset[str] | None = None
    live: frozenset[str] | None = None


def _walk_reach(table: Table, max_manifests: int | None) -> MetadataReach:
    """One walk of ``table``'s metadata for :func:`metadata_reach`: both answers at once
    (a ``DELETED`` entry's file is in ``everything`` only)."""
    from pyiceberg.manifest import ManifestEntryStatus

    metadata = table.metadata
    paths = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    manifests: dict[str, Any] = {}
    for snapshot in metadata.snapshots:
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            manifests.setdefault(manifest.manifest_path, manifest)
            if max_manifests is not None and len(manifests) > max_manifests:
                return MetadataReach(len(manifests))
    paths.update(manifests)
    live, deleted = set(paths), set[str]()
    for manifest in manifests.values():
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            if entry.status == ManifestEntryStatus.DELETED:
                deleted.add(entry.data_file.file_path)
            else:
                live.add(entry.data_file.file_path)
    live = {p for p in live if p}
    everything = live | {p for p in deleted if p}
    return MetadataReach(len(manifests), frozenset(everything), frozenset(live))


class ReachCache:
    """:func:`metadata_reach` walks per metadata file (immutable, so never stale): an
    operation plans outside its table's lease, again under it, then runs, all on one
    table version. Keeps the latest walks up to ``max_paths`` paths in all."""

    def __init__(self, max_paths: int = 200_000) -> None:
        self._max_paths = max_paths
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, MetadataReach] = OrderedDict()
        self._paths = 0  # held by the entries, kept as they come and go

    @staticmethod
    def _size(reach: MetadataReach) -> int:
        return 1 + (len(reach.everything) if reach.everything is not None else 0)

    def get(self, table: Table, max_manifests: int | None) -> MetadataReach:
        """The walk of ``table``'s current metadata file, read once."""
        key = table.metadata_location
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
        if cached is not None:
            complete = cached.everything is not None
            if complete or (max_manifests is not None and cached.manifests > max_manifests):
                return cached
        reach = _walk_reach(table, max_manifests)
        size = self._size(reach)
        if size <= self._max_paths:
            with self._lock:
                replaced = self._entries.pop(key, None)
                self._paths -= self._size(replaced) if replaced is not None else 0
                self._entries[key] = reach
                self._paths += size
                while self._paths > self._max_paths:
                    _, dropped = self._entries.popitem(last=False)
                    self._paths -= self._size(dropped)
        return reach

    def clear(self) -> None:
        """Forget every walk."""
        with self._lock:
            self._entries.clear()
            self._paths = 0


#: The process-wide cache of :func:`metadata_reach` walks.
REACH_CACHE = ReachCache()


def metadata_reach(
    table: Table, *, live_only: bool, max_manifests: int | None = None
) -> set[str] | None:
    """Every file ``table``'s metadata reaches, spelled as written there: its current and
    logged metadata files, its statistics files, every snapshot's manifest list (so every
    branch and tag), the manifests they list and the data and delete files those list
    (only their live entries, added or existing, when ``live_only``; ``DELETED`` ones too
    otherwise). None when there are more than ``max_manifests`` manifests. Read once per
    metadata file (:data:`REACH_CACHE`)."""
    reach = REACH_CACHE.get(table, max_manifests)
    if max_manifests is not None and reach.manifests > max_manifests:
        return None
    found = reach.live if live_only else reach.everything
    assert found is not None  # complete: within the limit
    return set(found)
