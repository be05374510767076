"""Table statistics from Iceberg metadata alone (pyiceberg, no JVM, no data read)."""

from __future__ import annotations

import threading
from collections import Counter
from typing import TYPE_CHECKING

from pyiceberg.manifest import DataFileContent

from icegate_dagster.maintenance.results import TableStats

if TYPE_CHECKING:
    from pyiceberg.table import Table


def table_stats(table: Table, small_file_threshold: int, min_input_files: int = 1) -> TableStats:
    """Count the current snapshot's files, bytes and rows, and the table's snapshots.

    ``rows`` is the sum of the data files' record counts: rows removed by
    delete files still count until a rewrite applies the deletes.
    ``compactable_files`` counts small files in partitions holding at least
    ``min_input_files`` of them: what a binpack rewrite would pick up.
    """
    snapshots = len(table.metadata.snapshots)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return TableStats(0, 0, 0, 0, snapshots, 0, 0, 0)
    data_files = data_bytes = small_files = delete_files = rows = 0
    small_per_partition: Counter[tuple[int, str]] = Counter()
    manifests = snapshot.manifests(table.io)
    for manifest in manifests:
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
            data_file = entry.data_file
            if data_file.content == DataFileContent.DATA:
                data_files += 1
                data_bytes += data_file.file_size_in_bytes
                rows += data_file.record_count
                if data_file.file_size_in_bytes < small_file_threshold:
                    small_files += 1
                    small_per_partition[(data_file.spec_id, repr(data_file.partition))] += 1
            else:
                delete_files += 1
    return TableStats(
        data_files=data_files,
        data_bytes=data_bytes,
        small_files=small_files,
        delete_files=delete_files,
        snapshots=snapshots,
        rows=rows,
        manifests=len(manifests),
        compactable_files=sum(n for n in small_per_partition.values() if n >= min_input_files),
    )


class StatsCache:
    """One metadata file, one answer: a table's stats are read once per table version."""

    def __init__(self, limit: int = 512) -> None:
        self._stats: dict[tuple[str, str], TableStats] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def get(
        self, key: str, table: Table, small_file_threshold: int, min_input_files: int
    ) -> TableStats:
        """``table``'s stats (``key`` names it), computed once per metadata location."""
        cache_key = (key, table.metadata_location)
        with self._lock:
            cached = self._stats.get(cache_key)
        if cached is None:
            cached = table_stats(table, small_file_threshold, min_input_files)
            with self._lock:
                if len(self._stats) >= self._limit:
                    self._stats.clear()
                self._stats[cache_key] = cached
        return cached
