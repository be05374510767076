"""What the maintenance log adds up to, per table and operation: rows, failures, seconds
spent, and the figures its ``details`` state (files and bytes rewritten or freed, orphans
removed, WAL files and rows ingested), read with pyiceberg (no JVM) and kept up to date
incrementally.

What a process counts is what the log gained since it started, as Prometheus counters
are: each refresh reads only the data files that the ``append`` snapshots committed since
the last refresh added (a few small files), found by walking the current snapshot's
ancestry back to the one read last. Other snapshots add no row: ``replace`` (the log's own
compaction and manifest rewrites) moves rows, ``delete`` and ``overwrite`` (a retention on
the log) drop them; they are skipped, so the counters never go down while the process
runs. A start reads only the rows logged within :data:`RECENT` of it (the data files whose
``executed_at`` bounds lie wholly before are not opened), for each table and operation's
latest run (``last_*``), not its counts: what a start reads is bounded by a week of the
log, not by its age. A log table that appears after the start (made, or made anew) is new
in full and read in full. Where the walk cannot reach the snapshot read last (it expired
between two refreshes, the log was rolled back), the ancestors committed after it are
read.

The figures come from the ``details`` text the operations write (``rewrote 12 data files
(1234 bytes) into 1``, ``ingested 5 WAL files (500 rows) ...``, ``removed 3 orphan files
...``, ``deleted 4 data files, 2 manifests, 2 manifest lists (1.2 KB freed: 8 files, 1234
bytes)``, ``deleted 2 of 3 collected orphan candidates (100 bytes)``), matched with
pyarrow's vectorized regular expressions (``PATTERNS``; tests pin them to what the
operations write). Expiry rows written before the exact figures were added carry the freed
bytes rounded to a tenth of their unit; the distributed expiry and plain orphan removal do
not know the bytes they free (0).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from icegate_dagster.maintenance.identifiers import TableRef

if TYPE_CHECKING:
    import pyarrow as pa
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table
    from pyiceberg.table.snapshots import Snapshot

#: The log's columns a refresh reads.
COLUMNS = ("table_name", "operation", "status", "details", "duration_ms", "executed_at")

#: How far back a start reads the log: each table and operation's latest run within it.
RECENT = timedelta(days=7)

#: The figures summed from ``details``.
FIGURES = (
    "files_rewritten",
    "bytes_rewritten",
    "files_freed",
    "bytes_freed",
    "orphans_removed",
    "wal_files_ingested",
    "wal_rows_ingested",
)

#: Operation -> the pattern its ``details`` are matched with (RE2 syntax, named groups).
PATTERNS: Mapping[str, str] = {
    "optimize": r"^rewrote (?P<files>\d+) data files \((?P<bytes>\d+) bytes\)",
    "rewrite_position_delete_files": (
        r"^rewrote (?P<files>\d+) position delete files \((?P<bytes>\d+) bytes\)"
    ),
    "wal_compaction": r"^ingested (?P<files>\d+) WAL files \((?P<rows>\d+) rows\)",
    "expire_snapshots": (
        r"deleted (?P<data>\d+) data files, (?P<manifests>\d+) manifests, "
        r"(?P<lists>\d+) manifest lists"
        r"(?: \((?P<human>[0-9.]+ [KMGT]?B) freed(?:: (?P<files>\d+) files, "
        r"(?P<bytes>\d+) bytes)?\))?"
    ),
    "remove_orphan_files": (
        r"^(?:removed (?P<removed>\d+) (?:of \d+ )?orphan files"
        r"|deleted (?P<deleted>\d+) of \d+ collected orphan candidates \((?P<bytes>\d+) bytes\))"
    ),
}

#: Operations whose duration is the seed's ``compaction_duration_seconds``.
COMPACTIONS = ("wal_compaction", "optimize")

_UNITS = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}


@dataclass
class OperationTotals:
    """One operation's log rows on one table, added up."""

    rows: int = 0
    failures: int = 0
    duration_ms: int = 0
    figures: dict[str, int] = field(default_factory=dict)
    #: The latest row that did work (completed or failed; skipped rows say "nothing to do").
    last_at: float | None = None
    last_status: str | None = None
    last_duration_ms: int | None = None
    last_details: str | None = None

    def add(self, other: OperationTotals) -> None:
        """Add ``other`` (rows read later) to these totals."""
        self.rows += other.rows
        self.failures += other.failures
        self.duration_ms += other.duration_ms
        for name, value in other.figures.items():
            self.figures[name] = self.figures.get(name, 0) + value
        if other.last_at is not None and (self.last_at is None or other._latest() > self._latest()):
            self.last_at = other.last_at
            self.last_status = other.last_status
            self.last_duration_ms = other.last_duration_ms
            self.last_details = other.last_details

    def _latest(self) -> tuple[float, str, str, int]:
        # Rows of one instant are told apart by their text: the same row wins whatever
        # order the files are read in.
        return (
            self.last_at or 0.0,
            self.last_status or "",
            self.last_details or "",
            self.last_duration_ms if self.last_duration_ms is not None else -1,
        )


Totals = dict[tuple[str, str], OperationTotals]


def human_bytes(text: str) -> int:
    """``1.5 KB`` (as ``format_bytes`` writes it) -> bytes (rounded as it was)."""
    number, unit = text.split()
    return int(float(number) * _UNITS[unit])


def _ints(column: Any) -> Any:
    """A regex group's strings as int64, with no match (null or "") as null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pc.equal(column, "")
    return pc.cast(pc.if_else(empty, pa.scalar(None, pa.string()), column), pa.int64())


def _figures(operation: str, rows: pa.Table) -> list[tuple[str, dict[str, int]]]:
    """(table, figures) for each of ``rows`` (one operation's, work rows only)."""
    import pyarrow.compute as pc

    if rows.num_rows == 0:
        return []
    matched = pc.extract_regex(rows.column("details"), PATTERNS[operation])
    groups = {
        name: _ints(pc.struct_field(matched, [index])).to_pylist()
        for index, name in enumerate(matched.type.names)
        if name != "human"
    }
    human = (
        pc.struct_field(matched, [matched.type.get_field_index("human")]).to_pylist()
        if operation == "expire_snapshots"
        else None
    )
    found = []
    for index, table in enumerate(rows.column("table_name").to_pylist()):

        def value(name: str, at: int = index) -> int | None:
            number = groups[name][at]
            return None if number is None else int(number)

        figures: dict[str, int] = {}
        if operation in ("optimize", "rewrite_position_delete_files"):
            figures = {
                "files_rewritten": value("files") or 0,
                "bytes_rewritten": value("bytes") or 0,
            }
        elif operation == "wal_compaction":
            figures = {
                "wal_files_ingested": value("files") or 0,
                "wal_rows_ingested": value("rows") or 0,
            }
        elif operation == "expire_snapshots":
            files = value("files")
            if files is None:
                files = sum(value(name) or 0 for name in ("data", "manifests", "lists"))
            freed = value("bytes")
            if freed is None and human is not None and human[index]:
                freed = human_bytes(str(human[index]))
            figures = {"files_freed": files, "bytes_freed": freed or 0}
        elif operation == "remove_orphan_files":
            removed = value("removed")
            if removed is None:
                removed = value("deleted") or 0
            figures = {
                "orphans_removed": removed,
                "files_freed": removed,
                "bytes_freed": value("bytes") or 0,
            }
        found.append((str(table), figures))
    return found


def aggregate(rows: pa.Table) -> Totals:
    """The totals of some log rows (columns :data:`COLUMNS`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    totals: Totals = {}
    if rows.num_rows == 0:
        return totals
    rows = rows.select(list(COLUMNS))
    failed = pc.cast(pc.equal(rows.column("status"), "failed"), pa.int64())
    counted = rows.append_column("failed", pc.fill_null(failed, 0))
    grouped = counted.group_by(["table_name", "operation"]).aggregate(
        [("duration_ms", "sum"), ("failed", "sum"), ([], "count_all")]
    )
    for row in grouped.to_pylist():
        totals[(str(row["table_name"]), str(row["operation"]))] = OperationTotals(
            rows=int(row["count_all"]),
            failures=int(row["failed_sum"] or 0),
            duration_ms=int(row["duration_ms_sum"] or 0),
        )
    work = rows.filter(pc.fill_null(pc.not_equal(rows.column("status"), "skipped"), False))
    if work.num_rows == 0:
        return totals
    # The latest row that did work, per table and operation (sorted, then the last of each).
    ordered = work.sort_by(
        [
            (name, "ascending", "at_start")
            for name in ("executed_at", "status", "details", "duration_ms")
        ]
    )
    latest = ordered.group_by(["table_name", "operation"], use_threads=False).aggregate(
        [
            ("executed_at", "last"),
            ("status", "last"),
            ("duration_ms", "last"),
            ("details", "last"),
        ]
    )
    for row in latest.to_pylist():
        entry = totals.setdefault(
            (str(row["table_name"]), str(row["operation"])), OperationTotals()
        )
        stamp = row["executed_at_last"]
        entry.last_at = stamp.timestamp() if stamp is not None else None
        entry.last_status = row["status_last"]
        duration = row["duration_ms_last"]
        entry.last_duration_ms = int(duration) if duration is not None else None
        entry.last_details = row["details_last"]
    for operation in PATTERNS:
        mine = work.filter(pc.equal(work.column("operation"), operation))
        for table, figures in _figures(operation, mine):
            entry = totals.setdefault((table, operation), OperationTotals())
            for name, value in figures.items():
                entry.figures[name] = entry.figures.get(name, 0) + value
    return totals


def _merge(into: Totals, more: Totals) -> None:
    for key, value in more.items():
        into.setdefault(key, OperationTotals()).add(value)


@dataclass(frozen=True)
class TotalsView:
    """The totals as of one refresh (a copy: the refresher goes on)."""

    totals: Mapping[tuple[str, str], OperationTotals]
    #: The log table's snapshot they sum up to (None: no log table yet, or empty).
    snapshot_id: int | None
    #: Rows read since the process started, and how many times the log was read beyond
    #: its newly appended files (the recent rows at a start, a log table made anew).
    rows_read: int
    full_reads: int

    def of_table(self, table: str) -> dict[str, OperationTotals]:
        """Operation -> totals of one table."""
        return {op: value for (name, op), value in self.totals.items() if name == table}


def _latest_only(totals: Totals) -> Totals:
    """``totals`` with only their latest rows kept (counts and sums at 0)."""
    return {
        key: OperationTotals(
            last_at=value.last_at,
            last_status=value.last_status,
            last_duration_ms=value.last_duration_ms,
            last_details=value.last_details,
        )
        for key, value in totals.items()
    }


class LogTotals:
    """The log table's totals, refreshed incrementally (see the module docstring)."""

    def __init__(
        self,
        catalog: Callable[[], Catalog],
        ref: TableRef,
        *,
        recent: timedelta = RECENT,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._catalog = catalog
        self.ref = ref
        self.recent = recent
        self._wall_clock = wall_clock
        self._totals: Totals = {}
        self._snapshot_id: int | None = None
        #: When the snapshot read last was committed (None: no snapshot read yet).
        self._snapshot_ms: int | None = None
        self._uuid: str | None = None
        #: Whether the log was looked at once: what it holds then was logged before the
        #: process started (not counted); a log table that appears later is all new.
        self._looked = False
        self.rows_read = 0
        self.files_read = 0
        self.full_reads = 0

    def view(self) -> TotalsView:
        """The totals as of the last refresh."""
        copied = {
            key: OperationTotals(
                value.rows,
                value.failures,
                value.duration_ms,
                dict(value.figures),
                value.last_at,
                value.last_status,
                value.last_duration_ms,
                value.last_details,
            )
            for key, value in self._totals.items()
        }
        return TotalsView(copied, self._snapshot_id, self.rows_read, self.full_reads)

    def refresh(self) -> TotalsView:
        """Read what the log gained since the last refresh (at the first, its recent rows);
        a log table that does not exist yet has no rows. Errors reading the catalog raise."""
        from pyiceberg.exceptions import NoSuchTableError

        first = not self._looked
        try:
            table = self._catalog().load_table(self.ref.identifier)
        except NoSuchTableError:
            self._looked = True
            self._uuid, self._snapshot_id, self._snapshot_ms = None, None, None
            return self.view()
        self._looked = True
        current = table.current_snapshot()
        uuid = str(table.metadata.table_uuid)
        if first:
            # Logged before the start: only each table and operation's latest run is read.
            if current is not None:
                _merge(self._totals, _latest_only(self._read_recent(table, current)))
            self._uuid = uuid
            self._snapshot_id = current.snapshot_id if current else None
            self._snapshot_ms = current.timestamp_ms if current else None
            return self.view()
        if current is None:
            self._uuid, self._snapshot_id, self._snapshot_ms = uuid, None, None
            return self.view()
        if uuid == self._uuid and current.snapshot_id == self._snapshot_id:
            return self.view()
        if uuid != self._uuid:  # a log table made since the last look: all of it is new
            self._uuid, self._snapshot_id, self._snapshot_ms = uuid, None, None
        new = self._since_last(table, current)
        # Another error (storage unreachable) raises: the next refresh reads them again.
        with contextlib.suppress(FileNotFoundError):  # rows deleted and expired since
            _merge(self._totals, self._read_appends(table, new))
        self._snapshot_id, self._snapshot_ms = current.snapshot_id, current.timestamp_ms
        return self.view()

    def _since_last(self, table: Table, current: Snapshot) -> list[Snapshot]:
        """The snapshots committed since the one read last (all of them when none was),
        oldest first. Where the walk cannot reach it (it expired, or the log was rolled
        back), the ancestors committed after it are."""
        found: list[Snapshot] = []
        snapshot: Snapshot | None = current
        while snapshot is not None and snapshot.snapshot_id != self._snapshot_id:
            found.append(snapshot)
            parent = snapshot.parent_snapshot_id
            snapshot = table.snapshot_by_id(parent) if parent is not None else None
        if snapshot is None and self._snapshot_ms is not None:
            found = [s for s in found if s.timestamp_ms > self._snapshot_ms]
        return list(reversed(found))

    def _read_appends(self, table: Table, snapshots: Iterable[Snapshot]) -> Totals:
        """The rows the ``append`` snapshots among ``snapshots`` added; the others add no
        row to the log (its compaction and a retention's deletes move or drop rows)."""
        from pyiceberg.expressions import AlwaysTrue
        from pyiceberg.io.pyarrow import ArrowScan
        from pyiceberg.manifest import ManifestContent, ManifestEntryStatus
        from pyiceberg.table import FileScanTask

        tasks = []
        for snapshot in snapshots:
            operation = snapshot.summary.operation.value if snapshot.summary else "append"
            if operation != "append":
                continue
            for manifest in snapshot.manifests(table.io):
                if (
                    manifest.added_snapshot_id != snapshot.snapshot_id
                    or manifest.content != ManifestContent.DATA
                ):
                    continue
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    if (
                        entry.status == ManifestEntryStatus.ADDED
                        and entry.snapshot_id == snapshot.snapshot_id
                    ):
                        tasks.append(FileScanTask(entry.data_file))
        if not tasks:
            return {}
        projected = table.schema().select(*COLUMNS)
        rows = ArrowScan(table.metadata, table.io, projected, AlwaysTrue()).to_table(tasks)
        self.rows_read += rows.num_rows
        self.files_read += len(tasks)
        return aggregate(rows)

    def _read_recent(self, table: Table, current: Snapshot) -> Totals:
        """The totals of the rows logged within :attr:`recent` of now, at ``current``: the
        data files whose ``executed_at`` bounds lie wholly before are not read."""
        import pyarrow as pa

        since = datetime.fromtimestamp(self._wall_clock(), UTC) - self.recent
        scan = table.scan(
            row_filter=f"executed_at >= '{since.isoformat()}'",
            selected_fields=COLUMNS,
            snapshot_id=current.snapshot_id,
        )
        tasks = list(scan.plan_files())
        totals: Totals = {}
        for batch in scan.to_arrow_batch_reader():
            self.rows_read += batch.num_rows
            _merge(totals, aggregate(pa.Table.from_batches([batch])))
        self.files_read += len(tasks)
        self.full_reads += 1
        return totals


def first_number(pattern: str, text: str | None) -> int | None:
    """The first group of ``pattern`` in ``text`` as a number (None: no match)."""
    if not text:
        return None
    match = re.search(pattern, text)
    return int(match.group(1)) if match else None
