"""The WAL folder of a table: listing, sizing and quarantine, on the file system only (no JVM).

IceGate's ingest lands rows as Parquet files under
``<wal.root>/<namespace>/<table>/*.parquet``. Only names ending in ``.parquet``
and not starting with ``_`` or ``.`` count (Spark ignores such names, and they
are the usual in-progress names), so a writer that writes ``*.tmp`` or
``.x.parquet`` and renames is never read half-written.
Files that cannot be ingested are moved to ``<table's WAL folder>/_quarantine/``
with a ``<file>.reason.txt`` beside each.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icegate_dagster.config import CompactionSettings
from icegate_dagster.errors import InvalidIdentifierError
from icegate_dagster.maintenance.identifiers import TableRef

if TYPE_CHECKING:
    from pyarrow import fs

QUARANTINE_DIR = "_quarantine"
REASON_SUFFIX = ".reason.txt"


@dataclass(frozen=True)
class WalStats:
    """The WAL files waiting under ``<wal.root>/<namespace>/<table>/``."""

    files: int
    bytes: int
    quarantined: int = 0
    oldest: str | None = None
    #: When the oldest waiting file was written (epoch seconds): how long the backlog has
    #: been waiting.
    oldest_at: float | None = None
    #: When the oldest quarantined file was last modified (epoch seconds; a move keeps it):
    #: how long a file has been waiting for a person.
    quarantined_oldest_at: float | None = None


@dataclass(frozen=True)
class WalFile:
    """One WAL Parquet file."""

    name: str
    #: Path inside the file system (no scheme), for pyarrow.
    path: str
    #: The file as a Hadoop path string, for Spark (taken literally: see :class:`WalRoot`).
    uri: str
    size: int
    modified: datetime | None
    #: Modification time in nanoseconds (0 when the file system has none): with name and
    #: size, it tells a new file apart from an ingested one that had the same name.
    modified_ns: int = 0

    @property
    def identity(self) -> tuple[str, int, int]:
        """What a WAL commit records of this file."""
        return (self.name, self.size, self.modified_ns)


@functools.lru_cache(maxsize=100_000)
def wal_folder_problem(part: str) -> str | None:
    """Why ``part`` (a namespace or table name) cannot be one folder under ``wal.root``:
    a separator, ``.``/``..`` or an empty name, also once percent-escapes are decoded (the
    folder is the name as it is, but a writer or tool that decodes escapes would leave the
    root). ``None`` when it can."""
    from urllib.parse import unquote

    for spelling in dict.fromkeys((part, unquote(part))):
        decoded = " once its %-escapes are decoded" if spelling != part else ""
        if not spelling:
            return f"is empty{decoded}"
        if "/" in spelling or "\\" in spelling:
            return f"contains a path separator ('/' or '\\'){decoded}"
        if spelling in (".", ".."):
            return f"is {spelling!r}{decoded}"
    return None


def wal_location(wal_root: str, ref: TableRef) -> str:
    """``<wal.root>/<namespace>/<table>``, as messages show it; a name that would leave
    that folder is refused (TableRef allows such names for ordinary maintenance, never for
    WAL work). Never parsed as a URI: the names are joined to the resolved root as they are
    (:func:`wal_filesystem`)."""
    for what, part in (("namespace", ref.namespace), ("table name", ref.name)):
        problem = wal_folder_problem(part)
        if problem is not None:
            raise InvalidIdentifierError(
                f"table {ref.key!r}: no WAL work for it: its {what} {part!r} {problem}, so "
                f"its WAL folder would not be one folder under wal.root ({wal_root}); rename "
                "the table to use a WAL"
            )
    return f"{wal_root.rstrip('/')}/{ref.namespace}/{ref.name}"


@dataclass(frozen=True)
class WalRoot:
    """``wal.root`` resolved: its file system, and the root as pyarrow and Hadoop name it.

    Only the root is a URI. Table folders are joined to it as plain path text: a URI parser
    given ``<root>/<namespace>/<table>`` cuts it at ``#`` or ``?``, decodes ``%xx`` and
    refuses spaces and non-ASCII letters, which sent ``ns.a#b`` to ``ns.a``'s WAL (issue 37).
    """

    filesystem: fs.FileSystem
    #: The root's path inside ``filesystem``, exact (percent-escapes of the URI decoded).
    path: str
    #: The same folder as a Hadoop path string for Spark: the URI's scheme and authority,
    #: then the exact path. Hadoop takes a path string literally (no query, fragment or
    #: %-decoding), so a name joined to it names that very folder.
    hadoop: str

    def folder(self, ref: TableRef) -> str:
        """The table's WAL folder inside :attr:`filesystem` (the name checked by the caller)."""
        return f"{self.path.rstrip('/')}/{ref.namespace}/{ref.name}"

    def hadoop_folder(self, ref: TableRef) -> str:
        """The table's WAL folder as Spark is given it."""
        return f"{self.hadoop.rstrip('/')}/{ref.namespace}/{ref.name}"


def resolve_wal_root(wal_root: str) -> WalRoot:
    """``wal.root``'s file system and exact path (a URI, or a plain local path)."""
    from urllib.parse import unquote, urlsplit

    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(wal_root)
    parts = urlsplit(wal_root)
    if len(parts.scheme) <= 1:  # a plain path (or a Windows drive): nothing is decoded
        hadoop = wal_root
    elif type(filesystem).__name__ == "LocalFileSystem":
        hadoop = f"file://{path}"
    else:
        hadoop = f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
    return WalRoot(filesystem, str(path), hadoop)


def wal_filesystem(wal_root: str, ref: TableRef) -> tuple[fs.FileSystem, str]:
    """The pyarrow file system holding the table's WAL folder, and the folder's path in it."""
    wal_location(wal_root, ref)  # refuses names that are not one folder
    root = resolve_wal_root(wal_root)
    return root.filesystem, root.folder(ref)


def list_wal_files(wal_root: str | None, ref: TableRef) -> list[WalFile]:
    """The table's ``*.parquet`` WAL files, oldest first (a missing folder is empty)."""
    if not wal_root:
        return []
    from pyarrow import fs

    wal_location(wal_root, ref)  # refuses names that are not one folder
    root = resolve_wal_root(wal_root)
    selector = fs.FileSelector(root.folder(ref), allow_not_found=True)
    infos = root.filesystem.get_file_info(selector)
    spark_folder = root.hadoop_folder(ref)
    files = [
        WalFile(
            name=info.base_name,
            path=info.path,
            uri=f"{spark_folder}/{info.base_name}",
            size=info.size or 0,
            modified=info.mtime.astimezone(UTC) if info.mtime is not None else None,
            modified_ns=info.mtime_ns or 0,
        )
        for info in infos
        if info.type == fs.FileType.File and is_wal_name(info.base_name)
    ]
    oldest_first = datetime.min.replace(tzinfo=UTC)
    return sorted(files, key=lambda f: (f.modified or oldest_first, f.name))


def is_wal_name(name: str) -> bool:
    """``*.parquet``, not hidden (``.``) nor internal (``_``): the names Spark reads too."""
    return name.endswith(".parquet") and not name.startswith(("_", "."))


def quarantined_files(wal_root: str | None, ref: TableRef) -> list[str]:
    """Names of the files in the table's quarantine folder (reason files left out)."""
    return sorted(name for name, _ns in _quarantined(wal_root, ref))


def _quarantined(wal_root: str | None, ref: TableRef) -> list[tuple[str, int]]:
    """Each quarantined file's name and modification time (ns)."""
    if not wal_root:
        return []
    from pyarrow import fs

    filesystem, folder = wal_filesystem(wal_root, ref)
    selector = fs.FileSelector(f"{folder}/{QUARANTINE_DIR}", allow_not_found=True)
    return [
        (info.base_name, info.mtime_ns or 0)
        for info in filesystem.get_file_info(selector)
        if info.type == fs.FileType.File and not info.base_name.endswith(REASON_SUFFIX)
    ]


def wal_stats(wal_root: str | None, ref: TableRef) -> WalStats:
    """Count and size the table's waiting WAL files, and count its quarantined ones."""
    files = list_wal_files(wal_root, ref)
    quarantined = _quarantined(wal_root, ref)
    quarantined_at = min((ns for _name, ns in quarantined), default=None)
    return WalStats(
        files=len(files),
        bytes=sum(f.size for f in files),
        quarantined=len(quarantined),
        oldest=files[0].name if files else None,
        oldest_at=files[0].modified_ns / 1e9 if files and files[0].modified_ns else None,
        quarantined_oldest_at=quarantined_at / 1e9 if quarantined_at else None,
    )


def compaction_due(files: int, size: int, settings: CompactionSettings) -> bool:
    """A WAL is compacted once it reaches ``min_files`` files or ``min_size_bytes`` bytes."""
    return files > 0 and (files >= settings.min_files or size >= settings.min_size_bytes)


def quarantine(wal_root: str, ref: TableRef, wal_file: WalFile, reason: str) -> str:
    """Move ``wal_file`` into the quarantine folder with a reason file; return its new path."""
    from pyarrow import fs

    filesystem, folder = wal_filesystem(wal_root, ref)
    target_dir = f"{folder}/{QUARANTINE_DIR}"
    filesystem.create_dir(target_dir, recursive=True)
    target = f"{target_dir}/{wal_file.name}"
    if filesystem.get_file_info(target).type != fs.FileType.NotFound:
        # Never overwrite an earlier quarantined file of the same name.
        stem = wal_file.name.removesuffix(".parquet")
        target = f"{target_dir}/{stem}.{datetime.now(UTC):%Y%m%dT%H%M%S%f}.parquet"
    with filesystem.open_output_stream(target + REASON_SUFFIX) as out:
        out.write(f"{datetime.now(UTC).isoformat()} {wal_file.name}: {reason}\n".encode())
    filesystem.move(wal_file.path, target)
    return target


@dataclass
class FolderCount:
    """What one listing found in one table's WAL folder."""

    files: int = 0
    bytes: int = 0
    #: (modification time in ns, name) of the oldest waiting file.
    oldest: tuple[int, str] | None = None
    quarantined: int = 0
    #: Modification time (ns) of the oldest quarantined file.
    quarantined_oldest_ns: int | None = None

    def stats(self) -> WalStats:
        """The folder as :class:`WalStats`."""
        oldest = self.oldest
        quarantined_at = self.quarantined_oldest_ns
        return WalStats(
            files=self.files,
            bytes=self.bytes,
            quarantined=self.quarantined,
            oldest=oldest[1] if oldest else None,
            oldest_at=oldest[0] / 1e9 if oldest and oldest[0] else None,
            quarantined_oldest_at=quarantined_at / 1e9 if quarantined_at else None,
        )


#: Every table folder one listing of ``wal.root`` found, by (namespace, table name).
RootFolders = dict[tuple[str, str], FolderCount]


def list_root_folders(wal_root: str) -> RootFolders:
    """**One** recursive listing of ``wal.root``, counted by table folder: on object
    storage one LIST call per 1,000 objects under the root, whatever the number of tables.
    Only ``<namespace>/<table>/<file>`` and ``<namespace>/<table>/_quarantine/<file>``
    count; a root that does not exist yet is empty."""
    from pyarrow import fs

    resolved = resolve_wal_root(wal_root)
    filesystem, root = resolved.filesystem, resolved.path.rstrip("/")
    folders: RootFolders = {}
    selector = fs.FileSelector(root, recursive=True, allow_not_found=True)
    for info in filesystem.get_file_info(selector):
        if info.type != fs.FileType.File:
            continue
        parts = info.path[len(root) + 1 :].split("/")
        if len(parts) == 3 and is_wal_name(parts[2]):
            folder = folders.setdefault((parts[0], parts[1]), FolderCount())
            folder.files += 1
            folder.bytes += info.size or 0
            # The order list_wal_files sorts by: modification time, then name.
            stamp = (info.mtime_ns or 0, parts[2])
            if folder.oldest is None or stamp < folder.oldest:
                folder.oldest = stamp
        elif (
            len(parts) == 4 and parts[2] == QUARANTINE_DIR and not parts[3].endswith(REASON_SUFFIX)
        ):
            folder = folders.setdefault((parts[0], parts[1]), FolderCount())
            folder.quarantined += 1
            stamp_ns = info.mtime_ns or 0
            if folder.quarantined_oldest_ns is None or stamp_ns < folder.quarantined_oldest_ns:
                folder.quarantined_oldest_ns = stamp_ns
    return folders


def backlogs_of(
    wal_root: str, folders: RootFolders, refs: Iterable[TableRef]
) -> tuple[dict[str, WalStats], dict[str, str]]:
    """Each table's :class:`WalStats` from one listing's ``folders`` (a table with no
    folder has an empty WAL), and the tables that cannot have a WAL folder, with why."""
    stats: dict[str, WalStats] = {}
    errors: dict[str, str] = {}
    for ref in refs:
        try:
            wal_location(wal_root, ref)  # refuses names that are not one folder each
        except InvalidIdentifierError as exc:
            errors[ref.key] = str(exc)
            continue
        found = folders.get((ref.namespace, ref.name))
        stats[ref.key] = found.stats() if found is not None else WalStats(0, 0)
    return stats, errors


def wal_backlogs(
    wal_root: str, refs: Iterable[TableRef]
) -> tuple[dict[str, WalStats], dict[str, str]]:
    """Every table's :class:`WalStats` from **one** recursive listing of ``wal.root``
    (:func:`list_root_folders`, :func:`backlogs_of`): the same figures as :func:`wal_stats`
    table by table, at the cost of one listing."""
    return backlogs_of(wal_root, list_root_folders(wal_root), refs)
