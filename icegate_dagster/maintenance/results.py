"""Small result objects shared by the CLI and the Dagster assets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

Status = Literal["completed", "failed", "skipped"]


@dataclass
class Outcome:
    """What one operation did to one table: every operation returns this.

    ``output`` holds the operation's own figures (Iceberg's procedure output, files
    ingested, rows deleted...); the log row and the partition metadata carry it.
    """

    status: Status
    details: str
    output: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def done(cls, details: str, **output: Any) -> Outcome:
        """A completed operation."""
        return cls("completed", details, dict(output))

    @classmethod
    def skip(cls, details: str, **output: Any) -> Outcome:
        """An operation that had nothing to do, or was not to run here."""
        return cls("skipped", details, dict(output))


@dataclass(frozen=True)
class TableStats:
    """What a table's current metadata says, read by pyiceberg without a JVM.

    ``rows`` is the data files' record count: rows removed by delete files still count
    until a rewrite applies the deletes. :attr:`live_rows` is what a reader sees.
    """

    data_files: int
    data_bytes: int
    small_files: int
    #: Every delete file: position, equality and deletion vectors.
    delete_files: int
    snapshots: int
    rows: int
    manifests: int
    compactable_files: int = 0
    #: The current snapshot these figures describe (``None``: the table has none).
    snapshot_id: int | None = None
    #: Position delete files other than deletion vectors (Parquet/Avro/ORC).
    position_delete_files: int = 0
    #: Deletion vectors (format v3, blobs in Puffin files), one per data file.
    deletion_vectors: int = 0
    equality_delete_files: int = 0
    #: Position delete files (deletion vectors aside) that can apply to no data file left
    #: in the snapshot (they delete nothing, yet every reader still opens them).
    dangling_delete_files: int = 0
    #: The most position delete files (deletion vectors aside) any one partition holds.
    max_partition_position_deletes: int = 0
    #: Data files ``optimize`` would rewrite to apply their deletes (Iceberg's
    #: ``delete-file-threshold``/``delete-ratio-threshold``); each live delete file whose
    #: data file the metadata does not name counts as one (it may apply to any).
    delete_rewrite_files: int = 0
    #: Rows a reader sees, counted by Spark (``count(*)`` at :attr:`snapshot_id`) for a
    #: table with delete files; ``None`` until counted. See :attr:`live_rows`.
    counted_live_rows: int | None = None

    @property
    def live_rows(self) -> int | None:
        """Rows a reader sees: ``rows`` when there are no delete files (exact from
        metadata), else the Spark count, ``None`` when nobody counted them."""
        return self.rows if self.delete_files == 0 else self.counted_live_rows

    def with_live_rows(self, count: int) -> TableStats:
        """These figures with the live rows counted at :attr:`snapshot_id`."""
        return replace(self, counted_live_rows=count)

    def as_dict(self) -> dict[str, int | None]:
        """Plain dict, for JSON output and metadata."""
        return {**asdict(self), "live_rows": self.live_rows}


@dataclass
class OpResult:
    """The outcome of one maintenance operation on one table."""

    table: str
    operation: str
    status: Status
    details: str
    before: TableStats | None
    after: TableStats | None
    duration_s: float
    output: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    #: When the operation ended (UTC): the log row's ``executed_at``.
    finished_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    @classmethod
    def of(
        cls,
        table: str,
        operation: str,
        outcome: Outcome,
        stats: tuple[TableStats | None, TableStats | None],
        duration_s: float,
    ) -> OpResult:
        """The result of ``operation`` from its outcome and the table's stats around it;
        a failure's details are its error."""
        failed = outcome.status == "failed"
        return cls(
            table,
            operation,
            outcome.status,
            outcome.details,
            *stats,
            duration_s,
            output=outcome.output,
            error=outcome.details if failed else None,
        )

    @property
    def ok(self) -> bool:
        """Completed or skipped: anything but a failure."""
        return self.status != "failed"

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {
            "table": self.table,
            "operation": self.operation,
            "status": self.status,
            "details": self.details,
            "before": self.before.as_dict() if self.before else None,
            "after": self.after.as_dict() if self.after else None,
            "duration_s": round(self.duration_s, 3),
            "output": self.output,
            "error": self.error,
        }


def _counted(stats: TableStats | None, ops: Sequence[OpResult]) -> TableStats | None:
    """``stats`` with the live rows any of ``ops`` counted at the same snapshot."""
    if stats is None or stats.live_rows is not None or stats.snapshot_id is None:
        return stats
    for op in ops:
        for seen in (op.before, op.after):
            if (
                seen is not None
                and seen.snapshot_id == stats.snapshot_id
                and seen.live_rows is not None
            ):
                return stats.with_live_rows(seen.live_rows)
    return stats


@dataclass
class TableResult:
    """Every operation run on one table in one pass, with the table's state around them."""

    table: str
    before: TableStats | None
    after: TableStats | None
    ops: list[OpResult]
    duration_s: float
    error: str | None = None

    @classmethod
    def from_ops(
        cls,
        table: str,
        before: TableStats | None,
        ops: list[OpResult],
        duration_s: float,
        error: str | None = None,
    ) -> TableResult:
        """A table's result; its state after is the last operation's that could be read.

        Live rows counted by an operation (see ``Maintainer.run_op``) are carried over to
        the table's state before and after where they describe the same snapshot."""
        after = next((op.after for op in reversed(ops) if op.after is not None), before)
        return cls(
            table,
            _counted(before, ops),
            _counted(after, ops),
            list(ops),
            duration_s,
            error,
        )

    @classmethod
    def failed(
        cls, table: str, error: str, operations: Sequence[str], duration_s: float = 0.0
    ) -> TableResult:
        """A table that could not be resolved or read: it fails alone, each operation it
        would have run failing with ``error`` (so each reaches the log as a failed row)."""
        ops = [
            OpResult(table, name, "failed", error, None, None, 0.0, error=error)
            for name in operations
        ]
        return cls(table, None, None, ops, duration_s, error=error)

    @property
    def ok(self) -> bool:
        """No operation failed and the table itself could be opened."""
        return self.error is None and all(op.ok for op in self.ops)

    def op(self, name: str) -> OpResult | None:
        """The result of operation ``name``, if it ran."""
        return next((op for op in self.ops if op.operation == name), None)

    def as_dict(self) -> dict[str, Any]:
        """Plain dict, for JSON output and metadata."""
        return {
            "table": self.table,
            "ok": self.ok,
            "error": self.error,
            "before": self.before.as_dict() if self.before else None,
            "after": self.after.as_dict() if self.after else None,
            "duration_s": round(self.duration_s, 3),
            "ops": [op.as_dict() for op in self.ops],
        }
