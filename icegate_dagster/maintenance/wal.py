"""WAL sizing: how many WAL Parquet files wait for a table, read from the file system only."""

from __future__ import annotations

from dataclasses import dataclass

from icegate_dagster.maintenance.identifiers import TableRef


@dataclass(frozen=True)
class WalStats:
    """The WAL files waiting under ``<wal.root>/<namespace>/<table>/``."""

    files: int
    bytes: int


def wal_location(wal_root: str, ref: TableRef) -> str:
    """``<wal.root>/<namespace>/<table>``."""
    return f"{wal_root.rstrip('/')}/{ref.namespace}/{ref.name}"


def wal_stats(wal_root: str | None, ref: TableRef) -> WalStats:
    """Count and size the table's ``*.parquet`` WAL files (a missing folder counts as empty)."""
    if not wal_root:
        return WalStats(0, 0)
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(wal_location(wal_root, ref))
    infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    files = [i for i in infos if i.type == fs.FileType.File and i.base_name.endswith(".parquet")]
    return WalStats(len(files), sum(i.size or 0 for i in files))
