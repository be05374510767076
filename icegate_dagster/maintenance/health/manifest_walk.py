"""One walk over the current snapshot's manifests (pyiceberg, no JVM, no data read): the
figures a table's stats (:func:`~icegate_dagster.maintenance.stats.table_stats`) and its
health (:func:`~icegate_dagster.maintenance.table_health.collect_metrics`) are built
from, read once per metadata file (:data:`WALK_CACHE`).

Data files are tallied per partition: files, bytes, rows, small files (under the
``small_file_threshold``, ``optimize.file_size_threshold``). Then each delete file is
judged against them. It is *dangling*, able to delete nothing, when:

- a file-scoped position delete file (its ``file_path`` bounds name one data file, as
  Spark writes them, see :func:`referenced_data_file`): its data file is gone;
- another position delete file or a deletion vector: it is older, by data sequence
  number, than every data file of its partition (Iceberg's own rule, as in
  ``RemoveDanglingDeleteFiles``), or no data file of its partition lies within its
  ``file_path`` bounds;
- an equality delete file: it is not newer than every data file of its partition (of
  every partition for one of an unpartitioned spec: it applies table-wide).

A file whose bounds span several data files, some gone, is not found out:
``rewrite_position_delete_files`` drops those rows when it rewrites it. A deletion vector
names its data file in ``referenced_data_file``, which pyiceberg does not read.

Dangling files are counted in their kinds but delete nothing. The data files a rewrite
would pick for their deletes are counted as Iceberg's planner picks them
(``tooManyDeletes``: ``delete_file_threshold`` file-scoped deletes on the file;
``tooHighDeleteRatio``: ``delete_ratio_threshold`` of its rows deleted), each live
delete file that names no data file counting as one (it may apply to any file of its
partitions).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyiceberg.manifest import DataFile, DataFileContent, FileFormat, ManifestContent

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import TableSettings

#: Iceberg's reserved field id of a position delete file's ``file_path`` column: its lower
#: and upper bounds name the data files the file deletes from.
DELETE_FILE_PATH_ID = 2147483546
#: A manifest under this share of ``commit.manifest.target-size-bytes`` is small.
SMALL_MANIFEST_SHARE = 0.75
#: The table property of Iceberg's manifest target size, and Iceberg's default.
MANIFEST_TARGET_PROPERTY = "commit.manifest.target-size-bytes"
DEFAULT_MANIFEST_TARGET = 8 * 1024**2

#: A partition: its spec id and its values.
Partition = tuple[int, str]
#: A manifest entry's file and its data sequence number.
Entry = tuple[DataFile, int | None]


def referenced_data_file(delete_file: DataFile) -> str | None:
    """The one data file a position delete file deletes from, where its metadata says so:
    equal lower and upper bounds of its ``file_path`` column (Iceberg's own test, as in
    ``ContentFileUtil.referencedDataFile``; Spark writes such file-scoped deletes)."""
    lower = (delete_file.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
    upper = (delete_file.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
    if lower is None or lower != upper:
        return None
    return lower.decode("utf-8")


@dataclass(frozen=True)
class PartitionFragments:
    """One fragmented partition: it holds at least two small data files."""

    #: ``field=value, ...`` (``(unpartitioned)`` for an unpartitioned spec).
    partition: str
    spec_id: int
    data_files: int
    small_files: int
    small_bytes: int


@dataclass(frozen=True)
class WalkRules:
    """The settings a walk's figures depend on (part of its cache key)."""

    small_file_threshold: int
    delete_file_threshold: int = 1
    delete_ratio_threshold: float = 0.3

    @classmethod
    def of(cls, settings: TableSettings) -> WalkRules:
        """The rules of a table's ``optimize`` settings."""
        rule = settings.optimize
        return cls(
            rule.file_size_threshold, rule.delete_file_threshold, rule.delete_ratio_threshold
        )


@dataclass(frozen=True)
class ManifestWalk:
    """The figures of one walk over a snapshot's manifests (see the module docstring)."""

    data_files: int = 0
    data_bytes: int = 0
    #: Records in the data files (rows deleted by delete files still count).
    rows: int = 0
    #: Partitions holding a data file.
    partitions: int = 0
    small_files: int = 0
    small_bytes: int = 0
    #: Partitions with two small files or more, the most fragmented first.
    fragmented: tuple[PartitionFragments, ...] = ()
    #: Position delete files other than deletion vectors.
    position_delete_files: int = 0
    equality_delete_files: int = 0
    deletion_vectors: int = 0
    #: Records of the live delete files.
    deleted_rows: int = 0
    dangling_position_deletes: int = 0
    dangling_deletion_vectors: int = 0
    dangling_equality_deletes: int = 0
    #: Data files a rewrite would pick for their deletes, as Iceberg's planner does, each
    #: live delete file that names no data file counting as one.
    delete_rewrite_files: int = 0
    #: Bytes of the picked data files and of every data file of a partition where a live
    #: delete file naming none applies (at most ``data_bytes``).
    delete_affected_bytes: int = 0
    position_delete_bytes: int = 0
    #: The most position delete files (deletion vectors apart) one partition holds.
    max_partition_position_deletes: int = 0
    manifests: int = 0
    #: Manifests under :data:`SMALL_MANIFEST_SHARE` of the table's manifest target size.
    small_manifests: int = 0
    #: Small manifests of the current partition spec: the ones Iceberg's rewrite merges
    #: (the Spark procedure leaves other specs' manifests alone).
    rewritable_small_manifests: int = 0
    #: About how many manifests a rewrite leaves: the other specs' as they are, the current
    #: spec's bytes at the table's manifest target size.
    manifests_after_rewrite: int = 0

    @property
    def delete_files(self) -> int:
        """Every delete file: position, equality and deletion vectors."""
        return self.position_delete_files + self.equality_delete_files + self.deletion_vectors

    def compactable_files(self, min_input_files: int) -> int:
        """Small files in partitions holding at least ``min_input_files`` of them: what a
        binpack rewrite would pick up."""
        if min_input_files <= 1:
            return self.small_files
        return sum(p.small_files for p in self.fragmented if p.small_files >= min_input_files)


def _partition(data_file: DataFile) -> Partition:
    return (data_file.spec_id, repr(data_file.partition))


def _raw_label(data_file: DataFile) -> str:
    return repr(data_file.partition)


class _Walker:
    """Tallies of one walk: every data file, then each delete file judged against them."""

    def __init__(
        self,
        rules: WalkRules,
        *,
        keep_paths: bool,
        unpartitioned: frozenset[int] = frozenset(),
        label: Callable[[DataFile], str] = _raw_label,
    ) -> None:
        self.rules = rules
        #: Data file paths are kept only where delete files need judging against them.
        self.keep_paths = keep_paths
        #: Spec ids without partition fields: their equality deletes apply table-wide.
        self.unpartitioned = unpartitioned
        self.label = label
        self.totals: dict[str, int] = defaultdict(int)
        self.files: Counter[Partition] = Counter()
        self.bytes: Counter[Partition] = Counter()
        self.small: Counter[Partition] = Counter()
        self.small_bytes: Counter[Partition] = Counter()
        self.min_seq: dict[Partition, int] = {}
        self.sample: dict[Partition, DataFile] = {}
        #: Live data files by path: size and records.
        self.paths: dict[str, tuple[int, int]] = {}
        #: Per partition: its live data files' paths (UTF-8, sorted before judging).
        self.partition_paths: dict[Partition, list[bytes]] = defaultdict(list)
        #: File-scoped position deletes per live data file: how many, and rows deleted.
        self.per_data_file: dict[str, list[int]] = {}
        self.position_per_partition: Counter[Partition] = Counter()
        #: Partitions a live delete file that names no data file may apply to.
        self.affected: set[Partition] = set()
        self.unattributed = 0
        #: Delete files, judged once every data file is known.
        self.deletes: list[Entry] = []

    def add(self, entries: Iterable[Entry]) -> None:
        """Tally the data files; keep the delete files for :meth:`result` to judge."""
        for data_file, seq in entries:
            if data_file.content == DataFileContent.DATA:
                self._data(data_file, seq)
            else:
                self.deletes.append((data_file, seq))

    def _data(self, data_file: DataFile, seq: int | None) -> None:
        where = _partition(data_file)
        size = data_file.file_size_in_bytes
        self.totals["data_files"] += 1
        self.totals["data_bytes"] += size
        self.totals["rows"] += data_file.record_count
        self.files[where] += 1
        self.bytes[where] += size
        if self.keep_paths:
            self.paths[data_file.file_path] = (size, data_file.record_count)
            self.partition_paths[where].append(data_file.file_path.encode("utf-8"))
        # An unknown sequence number is the oldest: deletes may apply to the file.
        seq = seq if seq is not None else 0
        self.min_seq[where] = min(seq, self.min_seq.get(where, seq))
        if size < self.rules.small_file_threshold:
            self.totals["small_files"] += 1
            self.totals["small_bytes"] += size
            self.small[where] += 1
            self.small_bytes[where] += size
            self.sample.setdefault(where, data_file)

    def _delete(self, delete_file: DataFile, seq: int | None) -> None:
        where = _partition(delete_file)
        records = delete_file.record_count
        if delete_file.content == DataFileContent.EQUALITY_DELETES:
            self.totals["equality_delete_files"] += 1
            # Iceberg applies an equality delete to data files older than it, and one of
            # an unpartitioned spec to every partition.
            table_wide = where[0] in self.unpartitioned
            oldest = (
                min(self.min_seq.values(), default=None) if table_wide else self.min_seq.get(where)
            )
            if oldest is None or (seq is not None and oldest >= seq):
                self.totals["dangling_equality_deletes"] += 1
            else:
                self._unattributed(set(self.files) if table_wide else {where}, records)
            return
        vector = delete_file.file_format == FileFormat.PUFFIN
        if vector:
            self.totals["deletion_vectors"] += 1
        else:
            self.totals["position_delete_files"] += 1
            self.totals["position_delete_bytes"] += delete_file.file_size_in_bytes
            self.position_per_partition[where] += 1
        target = None if vector else referenced_data_file(delete_file)
        if target is not None:  # a file-scoped delete: live while its data file is
            if target not in self.paths:
                self.totals["dangling_position_deletes"] += 1
                return
            counted = self.per_data_file.setdefault(target, [0, 0])
            counted[0] += 1
            counted[1] += records
            self.totals["deleted_rows"] += records
            return
        # ...and a position delete (or vector) to data files no newer than it, within its
        # ``file_path`` bounds.
        oldest = self.min_seq.get(where)
        if (
            oldest is None
            or (seq is not None and oldest > seq)
            or not self._in_bounds(where, delete_file)
        ):
            self.totals["dangling_deletion_vectors" if vector else "dangling_position_deletes"] += 1
            return
        self._unattributed({where}, records)

    def _in_bounds(self, where: Partition, delete_file: DataFile) -> bool:
        """Whether a data file of the partition lies within the delete file's
        ``file_path`` bounds (``True`` when it has none: it may delete from any)."""
        lower = (delete_file.lower_bounds or {}).get(DELETE_FILE_PATH_ID)
        upper = (delete_file.upper_bounds or {}).get(DELETE_FILE_PATH_ID)
        if lower is None or upper is None:
            return True
        paths = self.partition_paths.get(where, [])
        index = bisect.bisect_left(paths, lower)
        return index < len(paths) and paths[index] <= upper

    def _unattributed(self, partitions: set[Partition], records: int) -> None:
        # A live delete file whose data file the metadata does not name: a rewrite may
        # pick any data file of its partitions for it (counted as one file).
        self.unattributed += 1
        self.affected |= partitions
        self.totals["deleted_rows"] += records

    def result(
        self,
        manifests: int = 0,
        small_manifests: int = 0,
        rewritable_small_manifests: int = 0,
        manifests_after_rewrite: int = 0,
    ) -> ManifestWalk:
        for paths in self.partition_paths.values():
            paths.sort()
        for delete_file, seq in self.deletes:
            self._delete(delete_file, seq)
        # The data files Iceberg's planner picks for their deletes (tooManyDeletes,
        # tooHighDeleteRatio), and those that may be picked for the unattributed deletes.
        rules = self.rules
        picked = []
        for path, (count, deleted) in self.per_data_file.items():
            records = self.paths[path][1]
            ratio = min(deleted, records) / records if records else 1.0
            if count >= rules.delete_file_threshold or ratio >= rules.delete_ratio_threshold:
                picked.append(path)
        affected_bytes = sum(self.bytes[w] for w in self.affected)
        affected_bytes += sum(self.paths[p][0] for p in picked)
        fragmented = sorted(
            (
                PartitionFragments(
                    partition=self.label(self.sample[where]),
                    spec_id=where[0],
                    data_files=self.files[where],
                    small_files=count,
                    small_bytes=self.small_bytes[where],
                )
                for where, count in self.small.items()
                if count >= 2
            ),
            key=lambda p: (-p.small_files, p.partition),
        )
        return ManifestWalk(
            **self.totals,
            partitions=len(self.files),
            fragmented=tuple(fragmented),
            delete_rewrite_files=len(picked) + self.unattributed,
            delete_affected_bytes=min(affected_bytes, self.totals["data_bytes"]),
            max_partition_position_deletes=max(self.position_per_partition.values(), default=0),
            manifests=manifests,
            small_manifests=small_manifests,
            rewritable_small_manifests=rewritable_small_manifests,
            manifests_after_rewrite=manifests_after_rewrite,
        )


def _manifest_target(table: Table) -> int:
    try:
        return int(table.properties.get(MANIFEST_TARGET_PROPERTY, DEFAULT_MANIFEST_TARGET))
    except ValueError:  # a malformed property is Iceberg's to refuse; ours is a figure
        return DEFAULT_MANIFEST_TARGET


def _partition_label(table: Table, data_file: DataFile) -> str:
    """``field=value, ...`` in the partition's human form."""
    spec = table.specs().get(data_file.spec_id)
    if spec is None or not spec.fields:
        return "(unpartitioned)"
    try:
        types = spec.partition_type(table.schema()).fields
        return ", ".join(
            f"{pf.name}={pf.transform.to_human_string(types[i].field_type, data_file.partition[i])}"
            for i, pf in enumerate(spec.fields)
        )
    except Exception:  # a dropped source column: the raw tuple still names it
        return repr(data_file.partition)


def walk(table: Table, rules: WalkRules) -> ManifestWalk:
    """One pass over the current snapshot's manifests (nothing cached: see
    :class:`WalkCache`)."""
    snapshot = table.current_snapshot()
    if snapshot is None:
        return ManifestWalk()
    manifests = snapshot.manifests(table.io)
    walker = _Walker(
        rules,
        keep_paths=any(m.content == ManifestContent.DELETES for m in manifests),
        unpartitioned=frozenset(sid for sid, spec in table.specs().items() if not spec.fields),
        label=lambda data_file: _partition_label(table, data_file),
    )
    walker.add(
        (entry.data_file, entry.sequence_number)
        for manifest in manifests
        for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
    )
    target = _manifest_target(table)
    small = SMALL_MANIFEST_SHARE * target
    current = [m for m in manifests if m.partition_spec_id == table.metadata.default_spec_id]
    current_bytes = sum(m.manifest_length for m in current)
    return walker.result(
        len(manifests),
        sum(1 for m in manifests if m.manifest_length < small),
        sum(1 for m in current if m.manifest_length < small),
        len(manifests) - len(current) + -(-current_bytes // max(target, 1)),
    )


def walk_entries(
    entries: Iterable[Entry], rules: WalkRules, *, unpartitioned: frozenset[int] = frozenset()
) -> ManifestWalk:
    """The figures of a snapshot made of these manifest entries, without a table:
    partitions are named by their raw values, manifests are not counted. ``unpartitioned``
    holds the spec ids without partition fields."""
    walker = _Walker(rules, keep_paths=True, unpartitioned=unpartitioned)
    walker.add(entries)
    return walker.result()


class WalkCache:
    """One metadata file, one manifest walk: a table's figures are read once per table
    version (metadata files never change), for its stats and its health alike.
    Thread-safe; it forgets everything once it holds ``limit`` walks."""

    def __init__(self, limit: int = 512) -> None:
        self._walks: dict[tuple[str, str, WalkRules], ManifestWalk] = {}
        self._limit = limit
        self._lock = threading.Lock()

    def walk(self, key: str, table: Table, rules: WalkRules) -> ManifestWalk:
        """The manifest figures of ``table`` (``key`` names it) at its current metadata."""
        cache_key = (key, table.metadata_location, rules)
        with self._lock:
            cached = self._walks.get(cache_key)
        if cached is None:
            cached = walk(table, rules)
            with self._lock:
                if len(self._walks) >= self._limit:
                    self._walks.clear()
                self._walks[cache_key] = cached
        return cached

    def clear(self) -> None:
        """Forget every walk."""
        with self._lock:
            self._walks.clear()


#: The process-wide cache: the Maintainer's stats and every health assessment (sensor,
#: the asset's ``record`` step, the CLI) read a table version's walk from it once.
WALK_CACHE = WalkCache()
