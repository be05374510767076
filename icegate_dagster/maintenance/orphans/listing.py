"""A cheap look for orphan candidates before starting Iceberg's ``remove_orphan_files``.

The Spark procedure lists the table's folder and joins it with every file the
table's metadata reaches: a Spark job even when there is nothing to remove.
This module does the same comparison from pyiceberg metadata and one listing,
but only to decide whether the procedure is worth calling. Either mistake is
harmless: a file wrongly thought referenced means a missed clean-up (the next
pass tries again); a file wrongly thought orphaned means calling the procedure,
which decides and deletes as always.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from icegate_dagster.maintenance.discovery import metadata_reach
from icegate_dagster.maintenance.storage import io_filesystem

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem
    from pyiceberg.table import Table

#: Above this many manifests the metadata walk costs more than it saves: ask Spark.
MAX_MANIFESTS = 500


def fs_path(uri: str) -> str:
    """The path pyarrow lists for ``uri``: ``/x`` for ``file:/x``, ``bucket/key`` for S3."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        return "/" + parsed.path.lstrip("/")
    return f"{parsed.netloc}{parsed.path}"


def referenced_files(table: Table, max_manifests: int = MAX_MANIFESTS) -> set[str] | None:
    """Every file the table's metadata reaches (``DELETED`` entries' files too), as pyarrow
    paths; None when too costly."""
    reach = metadata_reach(table, live_only=False, max_manifests=max_manifests)
    return None if reach is None else {fs_path(p) for p in reach}


def table_filesystem(table: Table) -> tuple[FileSystem, str]:
    """The file system of the table's folder as its FileIO configures it, and the folder's
    path there. Not ``FileSystem.from_uri``: that ignores the catalog's ``s3.endpoint`` and
    keys, and would ask another store (real AWS) about a bucket of the same name."""
    from pyarrow import fs

    found = io_filesystem(table.io, table.location())
    if found is not None:
        return found
    return fs.FileSystem.from_uri(table.location())  # type: ignore[no-any-return]


def orphan_candidates(table: Table, older_than: datetime) -> list[str] | None:
    """Files in the table's folder older than ``older_than`` that its metadata does not
    reach, sorted; None when this cannot be decided cheaply (then ask Iceberg)."""
    from pyarrow import fs

    try:
        filesystem, root = table_filesystem(table)
        infos = filesystem.get_file_info(
            fs.FileSelector(root, recursive=True, allow_not_found=True)
        )
    except Exception:  # an unusual store: leave the decision to the procedure
        return None
    old = [
        info.path
        for info in infos
        if info.type == fs.FileType.File and info.mtime is not None and info.mtime < older_than
    ]
    if not old:
        return []
    referenced = referenced_files(table)
    if referenced is None:
        return None
    return sorted(path for path in old if path not in referenced)


# -- Iceberg's answer, without Spark --------------------------------------------------------

#: Schemes Iceberg's procedure counts as one (its ``equal_schemes`` default).
EQUAL_SCHEMES = {"s3n": "s3", "s3a": "s3"}
#: Characters a path may not hold for this module to read it as Hadoop's ``Path`` does
#: (a query, a fragment, an escape): such a table is left to Iceberg's procedure.
_UNUSUAL = ("?", "#", "%", "\\")


def _ident(uri: str) -> tuple[str | None, str | None, str] | None:
    """(scheme, authority, path) of ``uri`` as Iceberg compares listed and referenced
    files (Hadoop's ``Path(uri).toUri()``, equal schemes merged); None when unusual."""
    if any(ch in uri for ch in _UNUSUAL):
        return None
    parsed = urlparse(uri, allow_fragments=False)
    scheme = EQUAL_SCHEMES.get(parsed.scheme.lower(), parsed.scheme.lower()) or None
    path = "/" + parsed.path.lstrip("/") if parsed.path else ""
    while "//" in path:  # Hadoop's Path normalizes repeated slashes
        path = path.replace("//", "/")
    return scheme, parsed.netloc or None, path.rstrip("/") or "/"


def hidden_partition_prefixes(table: Table) -> tuple[str, ...]:
    """``name=`` of every partition field, in any spec, whose name starts with ``_`` or
    ``.``: folders Iceberg lists although they look hidden."""
    names = {
        field.name
        for spec in table.metadata.partition_specs
        for field in spec.fields
        if field.name.startswith(("_", "."))
    }
    return tuple(f"{name}=" for name in sorted(names))


def is_hidden(name: str, partition_prefixes: tuple[str, ...] = ()) -> bool:
    """Whether Iceberg's listing skips an entry called ``name`` (and, for a folder,
    everything in it): a name starting with ``_`` or ``.`` (``_SUCCESS``, ``.crc``
    checksums, ``_temporary``) unless it is a partition folder of such a field."""
    if name.startswith(partition_prefixes) and partition_prefixes:
        return False
    return name.startswith(("_", "."))


def listed_roots(table: Table) -> list[str]:
    """The folders Iceberg's ``remove_orphan_files`` lists for a table: its whole location,
    as the pinned runtime (1.10.2) does, folders beside ``data/`` and ``metadata/`` included
    and a ``write.data.path`` elsewhere not (``tests/integration/test_orphans_without_spark``
    compares the two answers and fails when a new pin lists otherwise)."""
    return [table.location().rstrip("/")]


def live_references(table: Table, max_manifests: int | None = None) -> set[str] | None:
    """Every file Iceberg's procedure counts as referenced, as URIs: the live entries (added
    or existing) of every snapshot's manifests, the manifests, the manifest lists, the
    current and logged metadata files, ``version-hint.text`` and statistics files; None when
    there are more than ``max_manifests`` (:data:`MAX_MANIFESTS`) manifests: Spark reads
    those faster."""
    limit = MAX_MANIFESTS if max_manifests is None else max_manifests
    reach = metadata_reach(table, live_only=True, max_manifests=limit)
    if reach is None:
        return None
    location = table.location().rstrip("/")
    metadata_folder = table.properties.get("write.metadata.path", f"{location}/metadata")
    return reach | {f"{metadata_folder}/version-hint.text"}


def _list_old(
    filesystem: FileSystem, root: str, older_than: datetime, prefixes: tuple[str, ...]
) -> list[str]:
    """Files under ``root`` (a path of ``filesystem``) modified before ``older_than``,
    walking folder by folder and skipping hidden entries as Iceberg's listing does."""
    from pyarrow import fs

    found, folders = [], [root]
    while folders:
        folder = folders.pop()
        for info in filesystem.get_file_info(fs.FileSelector(folder, allow_not_found=True)):
            if is_hidden(info.base_name, prefixes):
                continue
            if info.type == fs.FileType.Directory:
                folders.append(info.path)
            elif (
                info.type == fs.FileType.File and info.mtime is not None and info.mtime < older_than
            ):
                found.append(info.path)
    return found


def iceberg_orphans(table: Table, older_than: datetime) -> list[str] | None:
    """What Iceberg's ``remove_orphan_files(older_than)`` would delete from ``table``, as
    the URIs it reports (``file:/...``, ``s3://bucket/key``), worked out from the table's
    metadata and one listing, without Spark: the files of its location, hidden ones left
    out, modified before ``older_than``, that no live manifest entry,
    manifest, manifest list, metadata or statistics file names (schemes ``s3``, ``s3a`` and
    ``s3n`` counted as one). None where this cannot be told exactly here, for Iceberg's
    procedure to decide: a store the table's pyarrow FileIO does not list, a path Hadoop
    would read differently, more than :data:`MAX_MANIFESTS` manifests, or a listed file that
    matches a referenced one but for its scheme or authority (Iceberg refuses those)."""
    try:
        prefixes = hidden_partition_prefixes(table)
        listed: list[str] = []
        for root in listed_roots(table):
            if _ident(root) is None:
                return None
            found = io_filesystem(table.io, root)
            if found is None:  # not a pyarrow FileIO
                return None
            filesystem, folder = found
            root_scheme = urlparse(root).scheme
            prefix = "file:" if root_scheme in ("", "file") else f"{root_scheme}://"
            listed += [prefix + p for p in _list_old(filesystem, folder, older_than, prefixes)]
        referenced = live_references(table)
    except Exception:  # an unusual store or metadata: Iceberg's procedure decides
        return None
    if referenced is None:
        return None
    valid: dict[str, list[tuple[str | None, str | None]]] = {}
    for uri in referenced:
        ident = _ident(uri)
        if ident is None:
            return None
        valid.setdefault(ident[2], []).append(ident[:2])
    orphans = []
    for uri in listed:
        ident = _ident(uri)
        if ident is None:
            return None
        scheme, authority, path = ident
        if path not in valid:
            orphans.append(uri)
            continue
        for valid_scheme, valid_authority in valid[path]:
            same_scheme = valid_scheme is None or valid_scheme == scheme
            same_authority = (
                valid_authority is None or valid_authority.lower() == (authority or "").lower()
            )
            if not (same_scheme and same_authority):
                return None  # Iceberg's prefix mismatch: it raises, naming both
    return sorted(orphans)
