"""Small result objects shared by the CLI and the Dagster assets."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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
    """What a table's current metadata says, read by pyiceberg without a JVM."""

    data_files: int
    data_bytes: int
    small_files: int
    delete_files: int
    snapshots: int
    rows: int
    manifests: int
    compactable_files: int = 0

    def as_dict(self) -> dict[str, int]:
        """Plain dict, for JSON output and metadata."""
        return asdict(self)


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
        """A table's result; its state after is the last operation's that could be read."""
        after = next((op.after for op in reversed(ops) if op.after is not None), before)
        return cls(table, before, after, list(ops), duration_s, error)

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
