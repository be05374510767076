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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from icegate_dagster.config import CompactionSettings, IcegateConfig
from icegate_dagster.errors import InvalidIdentifierError
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.storage import CONFIGURED_SCHEMES, storage_filesystem
from icegate_dagster.spark.s3a import S3A_SCHEMES

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
    """``wal.root`` and the storage properties it is opened with (:func:`configured_wal_root`);
    its file system and exact path are worked out on first use (:attr:`filesystem`,
    :attr:`path`, :attr:`hadoop`).

    Only the root is a URI. Table folders are joined to it as plain path text: a URI parser
    given ``<root>/<namespace>/<table>`` cuts it at ``#`` or ``?``, decodes ``%xx`` and
    refuses spaces and non-ASCII letters, which sent ``ns.a#b`` to ``ns.a``'s WAL (issue 37).
    """

    #: ``wal.root`` as configured (what messages name).
    uri: str
    #: The storage properties, sorted (kept out of ``repr``: they hold keys).
    storage: tuple[tuple[str, str], ...] = field(default=(), repr=False)

    @property
    def filesystem(self) -> fs.FileSystem:
        """The pyarrow file system holding the root."""
        return _opened(self.uri, self.storage)[0]

    @property
    def path(self) -> str:
        """The root's path inside :attr:`filesystem`, exact (percent-escapes of the URI
        decoded; ``bucket/prefix`` on S3)."""
        return _opened(self.uri, self.storage)[1]

    @property
    def hadoop(self) -> str:
        """The same folder as a Hadoop path string for Spark: the URI's scheme and
        authority, then the exact path. Hadoop takes a path string literally (no query,
        fragment or %-decoding), so a name joined to it names that very folder."""
        return _opened(self.uri, self.storage)[2]

    @property
    def is_local(self) -> bool:
        """Whether the root is on a local file system (``flock`` and renames exist there)."""
        return type(self.filesystem).__name__ == "LocalFileSystem"

    def location(self, ref: TableRef) -> str:
        """The table's WAL folder as messages name it (:func:`wal_location`)."""
        return wal_location(self.uri, ref)

    def folder(self, ref: TableRef) -> str:
        """The table's WAL folder inside :attr:`filesystem` (the name checked by the caller)."""
        return f"{self.path.rstrip('/')}/{ref.namespace}/{ref.name}"

    def hadoop_folder(self, ref: TableRef) -> str:
        """The table's WAL folder as Spark is given it."""
        return f"{self.hadoop.rstrip('/')}/{ref.namespace}/{ref.name}"


def resolve_wal_root(wal_root: str, storage: Mapping[str, str] | None = None) -> WalRoot:
    """``wal_root`` (a URI, or a plain local path) opened with ``storage`` properties."""
    return WalRoot(wal_root, tuple(sorted((storage or {}).items())))


def configured_wal_root(config: IcegateConfig) -> WalRoot | None:
    """The configuration's ``wal.root`` with its storage properties
    (:meth:`~icegate_dagster.config.IcegateConfig.wal_storage_properties`); None without a
    root."""
    if not config.wal_root:
        return None
    return resolve_wal_root(config.wal_root, config.wal_storage_properties())


@functools.lru_cache(maxsize=64)
def _opened(wal_root: str, storage: tuple[tuple[str, str], ...]) -> tuple[fs.FileSystem, str, str]:
    """(file system, exact path, Hadoop path) of a root. An object store (or HDFS) is opened
    through a FileIO configured from ``storage``, as a table's folder is: never
    ``FileSystem.from_uri``, which ignores ``s3.endpoint`` and asks AWS about the bucket. A
    local root, a scheme only pyarrow knows, or a URI with pyarrow's options in its query, is
    opened by pyarrow from its URI."""
    from urllib.parse import unquote, urlsplit

    from pyarrow import fs

    parts = urlsplit(wal_root)
    if len(parts.scheme) <= 1:  # a plain path (or a Windows drive): nothing is decoded
        filesystem, path = fs.FileSystem.from_uri(wal_root)
        return filesystem, str(path), wal_root
    hadoop = f"{parts.scheme}://{parts.netloc}{unquote(parts.path)}"
    if parts.scheme in S3A_SCHEMES:  # Spark reads S3 through Hadoop's S3A (spark/s3a.py)
        hadoop = f"s3a://{parts.netloc}{unquote(parts.path)}"
    # A root carrying pyarrow's own options (``?endpoint_override=...&scheme=http``) is
    # opened by pyarrow from its URI, as before ``wal.storage`` existed.
    if parts.scheme in CONFIGURED_SCHEMES and not parts.query:
        filesystem, path = storage_filesystem(wal_root, dict(storage))
        return filesystem, unquote(path), hadoop
    filesystem, path = fs.FileSystem.from_uri(wal_root)
    if type(filesystem).__name__ == "LocalFileSystem":
        hadoop = f"file://{path}"
    return filesystem, str(path), hadoop


def wal_filesystem(wal_root: WalRoot, ref: TableRef) -> tuple[fs.FileSystem, str]:
    """The pyarrow file system holding the table's WAL folder, and the folder's path in it."""
    wal_root.location(ref)  # refuses names that are not one folder
    return wal_root.filesystem, wal_root.folder(ref)


def list_wal_files(wal_root: WalRoot | None, ref: TableRef) -> list[WalFile]:
    """The table's ``*.parquet`` WAL files, oldest first (a missing folder is empty)."""
    if wal_root is None:
        return []
    from pyarrow import fs

    root = wal_root
    root.location(ref)  # refuses names that are not one folder
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


def quarantined_files(wal_root: WalRoot | None, ref: TableRef) -> list[str]:
    """Names of the files in the table's quarantine folder (reason files left out)."""
    return sorted(name for name, _ns in _quarantined(wal_root, ref))


def _quarantined(wal_root: WalRoot | None, ref: TableRef) -> list[tuple[str, int]]:
    """Each quarantined file's name and modification time (ns)."""
    if wal_root is None:
        return []
    from pyarrow import fs

    filesystem, folder = wal_filesystem(wal_root, ref)
    selector = fs.FileSelector(f"{folder}/{QUARANTINE_DIR}", allow_not_found=True)
    return [
        (info.base_name, info.mtime_ns or 0)
        for info in filesystem.get_file_info(selector)
        if info.type == fs.FileType.File and not info.base_name.endswith(REASON_SUFFIX)
    ]


def wal_stats(wal_root: WalRoot | None, ref: TableRef) -> WalStats:
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


def quarantine(wal_root: WalRoot, ref: TableRef, wal_file: WalFile, reason: str) -> str:
    """Move ``wal_file`` into the quarantine folder with a reason file; return its new path.

    On object storage a move is a copy, then a delete of the source: a run killed between
    the two leaves the same bytes in both places. A quarantined file of the same name and
    the very same bytes is that copy: the move is finished (the source deleted) rather
    than a second copy made, whose rows a person moving the quarantine back would ingest
    twice."""
    from pyarrow import fs

    filesystem, folder = wal_filesystem(wal_root, ref)
    target_dir = f"{folder}/{QUARANTINE_DIR}"
    filesystem.create_dir(target_dir, recursive=True)
    target = f"{target_dir}/{wal_file.name}"
    existing = filesystem.get_file_info(target)
    if existing.type != fs.FileType.NotFound:
        if existing.size == wal_file.size and _same_bytes(filesystem, wal_file.path, target):
            check_lease()  # deleting a WAL file: only while the table's lease is ours
            filesystem.delete_file(wal_file.path)
            return target
        # Never overwrite an earlier quarantined file of the same name.
        stem = wal_file.name.removesuffix(".parquet")
        target = f"{target_dir}/{stem}.{datetime.now(UTC):%Y%m%dT%H%M%S%f}.parquet"
    with filesystem.open_output_stream(target + REASON_SUFFIX) as out:
        out.write(f"{datetime.now(UTC).isoformat()} {wal_file.name}: {reason}\n".encode())
    filesystem.move(wal_file.path, target)
    return target


#: Bytes compared at a time by :func:`_same_bytes`.
_CHUNK = 1 << 20


def _same_bytes(filesystem: fs.FileSystem, one: str, other: str) -> bool:
    """Whether two files hold the same bytes (read side by side, a chunk at a time)."""
    with filesystem.open_input_stream(one) as a, filesystem.open_input_stream(other) as b:
        while True:
            chunk = a.read(_CHUNK)
            if chunk != b.read(_CHUNK):
                return False
            if not chunk:
                return True


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


def list_root_folders(wal_root: WalRoot) -> RootFolders:
    """**One** recursive listing of ``wal.root``, counted by table folder: on object
    storage one LIST call per 1,000 objects under the root, whatever the number of tables.
    Only ``<namespace>/<table>/<file>`` and ``<namespace>/<table>/_quarantine/<file>``
    count; a root that does not exist yet is empty."""
    from pyarrow import fs

    filesystem, root = wal_root.filesystem, wal_root.path.rstrip("/")
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
    wal_root: WalRoot, refs: Iterable[TableRef]
) -> tuple[dict[str, WalStats], dict[str, str]]:
    """Every table's :class:`WalStats` from **one** recursive listing of ``wal.root``
    (:func:`list_root_folders`, :func:`backlogs_of`): the same figures as :func:`wal_stats`
    table by table, at the cost of one listing."""
    return backlogs_of(wal_root.uri, list_root_folders(wal_root), refs)
