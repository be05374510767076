"""Health of a table after a pass: its asset checks, evaluated without Dagster."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import TableSettings
from icegate_dagster.maintenance.exclusion import NOT_EXCLUDED, Exclusion
from icegate_dagster.maintenance.results import TableResult
from icegate_dagster.maintenance.wal import WalStats

if TYPE_CHECKING:
    from icegate_dagster.maintenance.health.summary import Assessed

#: The checks on every table after a pass, and what each judges (the Dagster check's
#: description, and so the documentation's).
CHECK_DESCRIPTIONS = {
    "rows_preserved": "The live rows (what a reader sees) changed only by what the pass "
    "itself added (WAL ingest) or deleted (TTL retention).",
    "small_files": "No small file the rewrite would pick is left (`optimize.file_size_threshold`, "
    "`optimize.min_input_files`).",
    "snapshot_count": "The table keeps at most `maintain.checks.max_snapshots` snapshots.",
    "wal_backlog": "At most `maintain.checks.max_wal_files` WAL files and "
    "`max_wal_bytes` wait, and none sits in quarantine.",
    "ops_succeeded": "Every operation of the pass succeeded (a failed one fails this check "
    "with its error; the others still ran).",
    "healthy": "The table's health score is at least its `health.min_score`.",
}
CHECK_NAMES = tuple(CHECK_DESCRIPTIONS)


@dataclass(frozen=True)
class CheckOutcome:
    """One check's verdict on one table."""

    name: str
    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


def _rows_preserved(result: TableResult) -> CheckOutcome:
    """Live rows (what a reader sees) may change only by what the pass itself added (WAL)
    or removed (TTL): applying delete files changes the records in data files, not these.
    Live rows are exact from metadata without delete files; with them, Spark counted them
    at the snapshots before and after (see ``live_rows.LiveRows.count``)."""
    before, after = result.before, result.after
    added = sum(int(op.output.get("rows_added", 0)) for op in result.ops)
    removed = sum(int(op.output.get("rows_deleted", 0)) for op in result.ops)
    if before is None or after is None:
        return CheckOutcome("rows_preserved", False, "the table could not be read")
    live_before, live_after = before.live_rows, after.live_rows
    if live_before is not None and live_after is not None:
        expected = live_before + added - removed
        return CheckOutcome(
            "rows_preserved",
            live_after == expected,
            f"{live_before} rows before, {live_after} after (expected {expected})",
            {"rows_before": live_before, "rows_after": live_after, "rows_expected": expected},
        )
    if before.snapshot_id == after.snapshot_id and added == removed:
        # Nothing was committed: the rows are the ones there were, and no JVM was started
        # just to count them on a table with delete files.
        return CheckOutcome(
            "rows_preserved",
            True,
            f"nothing committed: the rows are unchanged ({after.rows} records in data files, "
            f"{after.delete_files} delete files; live rows not counted)",
            {"records_after": after.rows, "delete_files_after": after.delete_files},
        )
    error = next(
        (
            op.output["live_rows_error"]
            for op in reversed(result.ops)
            if "live_rows_error" in op.output
        ),
        None,
    )
    return CheckOutcome(
        "rows_preserved",
        False,
        "the table has delete files and its live rows could not be counted"
        + (f": {error}" if error else " at the snapshots before and after the pass"),
        {"records_before": before.rows, "records_after": after.rows},
    )


#: The checks that judge what maintenance keeps in shape, and the operation that does it:
#: on a table excluded from that operation they pass, saying so (excluded, not failing).
_MAINTAINED_BY = {
    "small_files": "optimize",
    "snapshot_count": "expire_snapshots",
    "wal_backlog": "wal_compaction",
}


def _excused(check: CheckOutcome, reason: Callable[[str], str | None]) -> CheckOutcome:
    """``check`` passed, with why, where the table is excluded from the operation that
    would make it pass (``reason(operation)``: why it is, or None); as it was otherwise."""
    why = reason(_MAINTAINED_BY.get(check.name, ""))
    if check.passed or why is None:
        return check
    return CheckOutcome(
        check.name,
        True,
        f"not judged: {why} ({check.description})",
        {**check.metadata, "excluded": why},
    )


def evaluate_health(
    result: TableResult,
    settings: TableSettings,
    wal: WalStats,
    exclusion: Exclusion = NOT_EXCLUDED,
) -> list[CheckOutcome]:
    """Evaluate every check on the outcome of one table's pass; a check whose operation
    the table is excluded from (``exclusion``) passes, saying why it is not judged."""
    return [_excused(check, exclusion.reason) for check in _evaluate(result, settings, wal)]


def _evaluate(result: TableResult, settings: TableSettings, wal: WalStats) -> list[CheckOutcome]:
    after = result.after
    checks: list[CheckOutcome] = []

    checks.append(_rows_preserved(result))

    if after is None:
        checks.append(unreadable("small_files"))
        checks.append(unreadable("snapshot_count"))
    else:
        checks.append(
            small_files_check(after.compactable_files, after.small_files, after.data_files)
        )
        checks.append(snapshot_count_check(after.snapshots, settings))
    checks.append(wal_backlog_check(wal, settings))

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


def health_score_check(
    health: Assessed | None, min_score: float, error: str | None = None
) -> CheckOutcome:
    """The ``healthy`` check: the table's health score is at least its ``health.min_score``;
    a table that could not be assessed fails it with the error.

    A table excluded from maintenance passes, saying so; one excluded from some operations
    (rewrites left to Amoro) is judged by its ``judged_score``, which leaves out what only
    those operations would improve."""
    if health is None:
        why = error or "the table could not be assessed"
        return CheckOutcome("healthy", False, why, {"error": why, "min_score": min_score})
    due = [f"{d.operation}: {d.reason}" for d in health.due]
    judged = health.judged_score
    if health.excluded is not None:
        passed = True
        description = f"not judged: {health.excluded} (score {health.score:.1f})"
    else:
        passed = judged >= min_score
        description = f"score {health.score:.1f} (fails below {min_score:g}); "
        if judged != health.score:
            description += f"{judged:.1f} counting only what is maintained here; "
        description += f"still due: {'; '.join(due)}" if due else "nothing due"
        if health.withheld:
            left = "; ".join(
                f"{d.operation} ({health.excluded_operations[d.operation]})"
                for d in health.withheld
            )
            description += f"; not run here: {left}"
    figures = health.figures()
    metadata: dict[str, Any] = {
        "health_score": float(health.score),
        "min_score": float(min_score),
        "penalties": {k: round(float(v), 1) for k, v in health.penalties.items()},
        "due_operations": list(health.due_operations),
        "due": [{"operation": d.operation, "reason": d.reason} for d in health.due],
        # The figures the score and the due rules read (table metadata, WAL folder).
        "figures": {name: figures[name] for name in CHECKED_FIGURES},
    }
    if health.excluded_operations:  # every operation the table is excluded from, and why
        metadata["judged_score"] = float(judged)
        metadata["excluded_operations"] = dict(health.excluded_operations)
    return CheckOutcome("healthy", passed, description, metadata)


#: The figures the ``healthy`` check shows.
CHECKED_FIGURES = (
    "data_files",
    "small_files",
    "worst_partition_small_files",
    "delete_files",
    "manifests",
    "small_manifests",
    "snapshots",
    "expirable_snapshots",
    "wal_files",
    "wal_bytes",
    "work_bytes",
)


def unreadable(name: str) -> CheckOutcome:
    """``name`` failed: the table could not be read."""
    return CheckOutcome(name, False, "the table could not be read")


def small_files_check(compactable: int, small: int, data_files: int) -> CheckOutcome:
    """``small_files``: no small file the rewrite would pick is left."""
    return CheckOutcome(
        "small_files",
        compactable == 0,
        f"{compactable} small files still compactable ({small} of {data_files} under the "
        "threshold)",
        {"small_files": small, "compactable_files": compactable},
    )


def snapshot_count_check(snapshots: int, settings: TableSettings) -> CheckOutcome:
    """``snapshot_count``: at most ``checks.max_snapshots`` snapshots."""
    limit = settings.checks.max_snapshots
    return CheckOutcome(
        "snapshot_count",
        snapshots <= limit,
        f"{snapshots} snapshots (alert above {limit})",
        {"snapshots": snapshots, "max_snapshots": limit},
    )


def wal_backlog_check(wal: WalStats, settings: TableSettings) -> CheckOutcome:
    """``wal_backlog``: at most ``checks.max_wal_files`` files and ``max_wal_bytes`` wait,
    and none sits in quarantine (rows that will not land until someone looks at them)."""
    max_files, max_bytes = settings.checks.max_wal_files, settings.checks.max_wal_bytes
    quarantine_note = (
        f"; {wal.quarantined} files in quarantine need attention" if wal.quarantined else ""
    )
    return CheckOutcome(
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


#: The checks a table's metadata and WAL alone can judge, without a pass: what the health
#: sensor records on each partition when a verdict changes (a run evaluates all six).
METADATA_CHECKS = ("healthy", "small_files", "snapshot_count", "wal_backlog")


def metadata_checks(
    health: Assessed | None,
    settings: TableSettings,
    wal: WalStats | None,
    *,
    min_score: float,
    error: str | None = None,
) -> list[CheckOutcome]:
    """The :data:`METADATA_CHECKS` of a table as it is now (``health``: its assessment, or
    None with ``error`` when it could not be read; ``wal``: its WAL, None when unknown),
    judged as a pass judges them. Checks of operations it is excluded from pass, saying so."""
    verdict = health_score_check(health, min_score, error)
    wal_check = (
        wal_backlog_check(wal, settings)
        if wal is not None
        else CheckOutcome("wal_backlog", False, "the WAL could not be listed")
    )
    if health is None:
        return [verdict, unreadable("small_files"), unreadable("snapshot_count"), wal_check]
    figures = health.figures()
    checks = [
        small_files_check(
            figures["compactable_files"], figures["small_files"], figures["data_files"]
        ),
        snapshot_count_check(figures["snapshots"], settings),
        wal_check,
    ]

    def reason(operation: str) -> str | None:
        return health.excluded or health.excluded_operations.get(operation)

    return [verdict, *(_excused(check, reason) for check in checks)]


def failing_checks(outcomes: Iterable[CheckOutcome]) -> tuple[str, ...]:
    """The :data:`METADATA_CHECKS` among ``outcomes`` that failed, in that order: what a
    partition's page shows of them (``trigger.records.shown_state``)."""
    failed = {o.name for o in outcomes if not o.passed}
    return tuple(name for name in METADATA_CHECKS if name in failed)
