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

if TYPE_CHECKING:
    from pyarrow.fs import FileSystem
    from pyiceberg.manifest import ManifestFile
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
    """Every file the table's metadata reaches, as pyarrow paths; None when too costly."""
    metadata = table.metadata
    paths = {table.metadata_location, *(entry.metadata_file for entry in metadata.metadata_log)}
    paths.update(s.statistics_path for s in metadata.statistics)
    paths.update(s.statistics_path for s in metadata.partition_statistics)
    manifests: dict[str, ManifestFile] = {}
    for snapshot in metadata.snapshots:
        paths.add(snapshot.manifest_list)
        for manifest in snapshot.manifests(table.io):
            manifests.setdefault(manifest.manifest_path, manifest)
            if len(manifests) > max_manifests:
                return None
    for path, manifest in manifests.items():
        paths.add(path)
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=False):
            paths.add(entry.data_file.file_path)
    return {fs_path(p) for p in paths if p}


def table_filesystem(table: Table) -> tuple[FileSystem, str]:
    """The file system of the table's folder as its FileIO configures it, and the folder's
    path there. Not ``FileSystem.from_uri``: that ignores the catalog's ``s3.endpoint`` and
    keys, and would ask another store (real AWS) about a bucket of the same name."""
    from pyarrow import fs

    io = table.io
    if hasattr(io, "parse_location") and hasattr(io, "fs_by_scheme"):  # PyArrowFileIO
        scheme, netloc, path = io.parse_location(table.location())
        return io.fs_by_scheme(scheme, netloc), path
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
