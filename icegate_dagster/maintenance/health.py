"""Health of a table after a pass: the five asset checks, evaluated without Dagster."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from icegate_dagster.config import TableSettings
from icegate_dagster.maintenance.results import TableResult
from icegate_dagster.maintenance.wal import WalStats

CHECK_NAMES = ("rows_preserved", "small_files", "snapshot_count", "wal_backlog", "ops_succeeded")


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict on one table."""

    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


def evaluate_health(
    result: TableResult, settings: TableSettings, wal: WalStats
) -> list[CheckOutcome]:
    """Evaluate every check on the outcome of one table's pass."""
    before, after = result.before, result.after
    checks: list[CheckOutcome] = []

    # Rows may change only by what the pass itself added (WAL) or removed (TTL).
    added = sum(int(op.output.get("rows_added", 0)) for op in result.ops)
    removed = sum(int(op.output.get("rows_deleted", 0)) for op in result.ops)
    if before is None or after is None:
        checks.append(CheckOutcome("rows_preserved", False, "the table could not be read"))
    else:
        expected = before.rows + added - removed
        checks.append(
            CheckOutcome(
                "rows_preserved",
                after.rows == expected,
                f"{before.rows} rows before, {after.rows} after (expected {expected})",
                {"rows_before": before.rows, "rows_after": after.rows, "rows_expected": expected},
            )
        )

    if after is None:
        checks.append(CheckOutcome("small_files", False, "the table could not be read"))
        checks.append(CheckOutcome("snapshot_count", False, "the table could not be read"))
    else:
        checks.append(
            CheckOutcome(
                "small_files",
                after.compactable_files == 0,
                f"{after.compactable_files} small files still compactable "
                f"({after.small_files} of {after.data_files} under the threshold)",
                {"small_files": after.small_files, "compactable_files": after.compactable_files},
            )
        )
        limit = settings.checks.max_snapshots
        checks.append(
            CheckOutcome(
                "snapshot_count",
                after.snapshots <= limit,
                f"{after.snapshots} snapshots (alert above {limit})",
                {"snapshots": after.snapshots, "max_snapshots": limit},
            )
        )

    # Quarantined WAL files are rows that will not land until someone looks at them.
    max_files, max_bytes = settings.checks.max_wal_files, settings.checks.max_wal_bytes
    quarantine_note = (
        f"; {wal.quarantined} files in quarantine need attention" if wal.quarantined else ""
    )
    checks.append(
        CheckOutcome(
            "wal_backlog",
            wal.files <= max_files and wal.bytes <= max_bytes and wal.quarantined == 0,
            f"{wal.files} WAL files, {wal.bytes} bytes waiting "
            f"(alert above {max_files} files or {max_bytes} bytes){quarantine_note}",
            {
                "wal_files_count": wal.files,
                "wal_size_bytes": wal.bytes,
                "wal_files_quarantined": wal.quarantined,
            },
        )
    )

    failed = [op for op in result.ops if op.status == "failed"]
    errors = [f"{op.operation}: {op.error or op.details}" for op in failed]
    if result.error:
        errors.insert(0, result.error)
    checks.append(
        CheckOutcome(
            "ops_succeeded",
            not errors,
            "; ".join(errors) if errors else f"all {len(result.ops)} operations succeeded",
            {
                "failed_ops": [op.operation for op in failed],
                "errors": errors,
            },
        )
    )
    return checks
