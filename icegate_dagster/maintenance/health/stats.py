"""Table statistics from Iceberg metadata alone (pyiceberg, no JVM, no data read): a
:class:`TableStats` from the current snapshot's one manifest walk
(:mod:`~icegate_dagster.maintenance.health.manifest_walk`, which the health model reads too)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from icegate_dagster.maintenance.health.manifest_walk import (
    DELETE_FILE_PATH_ID,
    WALK_CACHE,
    Entry,
    ManifestWalk,
    WalkCache,
    WalkRules,
    referenced_data_file,
    walk,
    walk_entries,
)
from icegate_dagster.maintenance.results import TableStats

if TYPE_CHECKING:
    from pyiceberg.table import Table

__all__ = [
    "DELETE_FILE_PATH_ID",
    "Entry",
    "StatsCache",
    "delete_figures",
    "referenced_data_file",
    "stats_of",
    "table_stats",
]


def stats_of(
    figures: ManifestWalk,
    *,
    snapshots: int,
    snapshot_id: int | None,
    min_input_files: int = 1,
) -> TableStats:
    """The :class:`TableStats` of a snapshot from its manifest walk."""
    return TableStats(
        data_files=figures.data_files,
        data_bytes=figures.data_bytes,
        small_files=figures.small_files,
        delete_files=figures.delete_files,
        snapshots=snapshots,
        rows=figures.rows,
        manifests=figures.manifests,
        compactable_files=figures.compactable_files(min_input_files),
        snapshot_id=snapshot_id,
        position_delete_files=figures.position_delete_files,
        deletion_vectors=figures.deletion_vectors,
        equality_delete_files=figures.equality_delete_files,
        dangling_delete_files=figures.dangling_position_deletes,
        max_partition_position_deletes=figures.max_partition_position_deletes,
        delete_rewrite_files=figures.delete_rewrite_files,
    )


def delete_figures(
    data: Iterable[Entry],
    deletes: Iterable[Entry],
    *,
    delete_file_threshold: int = 1,
    delete_ratio_threshold: float = 0.3,
) -> TableStats:
    """The stats of a snapshot made of these manifest entries (no table, no snapshot:
    ``snapshots`` and ``manifests`` are 0, no file is small): ``deletes`` told apart and
    judged against the live ``data`` files, as :func:`table_stats` does."""
    rules = WalkRules(0, delete_file_threshold, delete_ratio_threshold)
    figures = walk_entries([*data, *deletes], rules)
    return stats_of(figures, snapshots=0, snapshot_id=None)


def _of_table(table: Table, figures: ManifestWalk, min_input_files: int) -> TableStats:
    snapshot = table.current_snapshot()
    return stats_of(
        figures,
        snapshots=len(table.metadata.snapshots),
        snapshot_id=snapshot.snapshot_id if snapshot is not None else None,
        min_input_files=min_input_files,
    )


def table_stats(
    table: Table,
    small_file_threshold: int,
    min_input_files: int = 1,
    *,
    delete_file_threshold: int = 1,
    delete_ratio_threshold: float = 0.3,
) -> TableStats:
    """Count the current snapshot's files, bytes and rows, and the table's snapshots
    (the manifests read afresh; :class:`StatsCache` reads them once per table version).

    ``rows`` is the sum of the data files' record counts: rows removed by
    delete files still count until a rewrite applies the deletes (``live_rows`` of the
    result is exact only for a table without delete files).
    ``compactable_files`` counts small files in partitions holding at least
    ``min_input_files`` of them: what a binpack rewrite would pick up.
    Delete files are told apart (position, deletion vectors, equality) and judged against
    the live data files (see :mod:`~icegate_dagster.maintenance.health.manifest_walk`):
    ``dangling_delete_files`` counts the position delete files that can no longer apply
    to any, and ``delete_rewrite_files`` leaves every dangling delete file out.
    """
    rules = WalkRules(small_file_threshold, delete_file_threshold, delete_ratio_threshold)
    return _of_table(table, walk(table, rules), min_input_files)


class StatsCache:
    """One metadata file, one answer: a table's stats come from its manifest walk, read
    once per table version into ``walks`` (by default the process-wide
    :data:`~icegate_dagster.maintenance.manifest_walk.WALK_CACHE`, which the health
    assessments read too)."""

    def __init__(self, walks: WalkCache | None = None) -> None:
        self._walks = walks if walks is not None else WALK_CACHE

    def get(
        self,
        key: str,
        table: Table,
        small_file_threshold: int,
        min_input_files: int,
        *,
        delete_file_threshold: int = 1,
        delete_ratio_threshold: float = 0.3,
    ) -> TableStats:
        """``table``'s stats (``key`` names it), its manifests walked once per metadata
        location."""
        rules = WalkRules(small_file_threshold, delete_file_threshold, delete_ratio_threshold)
        return _of_table(table, self._walks.walk(key, table, rules), min_input_files)
