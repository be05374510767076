"""Which tables the health trigger maintains now, and why the others wait (pure: no
Dagster, no I/O; the sensor gathers the facts and passes them in).

The rules, in the order a table meets them:

1. A table with no due operation is healthy and left alone.
2. Due operations this code location has no step for are dropped (a table left with
   none is reported, not requested).
3. A table with a run in flight (any run naming it: schedule, backfill, sensor) waits.
4. A table whose last ``N >= 2`` runs from the trigger failed in a row waits
   ``trigger.backoff * 2**(N-2)`` (at most ``trigger.backoff_max``) after its last
   failure; one failure is retried at once.
5. A table whose trigger run already succeeded on its very state (same metadata file,
   same WAL, same due work with the same figures) waits until that changes: running
   again would do the same nothing, so health rules the operations cannot satisfy cost
   one run, not one every interval.
6. A table maintained (by anyone) less than its ``health.min_interval`` ago waits.
7. The rest, neediest first (``need`` = 100 - score; ties: more work bytes, then
   name), are requested until ``trigger.max_tables`` tables or ``trigger.max_bytes``
   work bytes; the first always fits, and the first that does not fit ends the
   selection (a smaller table further down never jumps the queue, so a big one is not
   starved). What is left is the backlog, reported by count, bytes and name.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from statistics import fmean
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from icegate_dagster.config import TriggerSettings
    from icegate_dagster.maintenance.health.score import TableHealth

#: Why a table with due operations was not requested.
SkipKind = Literal["not_runnable", "in_flight", "backoff", "unchanged", "min_interval", "budget"]
#: The order the skip reasons are reported in.
SKIP_KINDS: tuple[SkipKind, ...] = (
    "in_flight",
    "backoff",
    "unchanged",
    "min_interval",
    "budget",
    "not_runnable",
)
#: The exponent of the back-off stops growing here (the cap is reached long before).
_MAX_DOUBLINGS = 32


@dataclass(frozen=True)
class Request:
    """A table to maintain now, doing exactly its due operations."""

    table: str
    operations: tuple[str, ...]
    need: float
    work_bytes: int
    #: Why each operation is due (``operation: reason``).
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Skip:
    """A table with due operations that was not requested, and why."""

    table: str
    kind: SkipKind
    reason: str


@dataclass(frozen=True)
class Backlog:
    """Due tables the budget left for a later evaluation, neediest first."""

    tables: tuple[str, ...] = ()
    bytes: int = 0

    @property
    def count(self) -> int:
        """How many tables wait for budget."""
        return len(self.tables)


@dataclass(frozen=True)
class Selection:
    """One evaluation's decision: what to run, what waits and why, what is healthy."""

    requested: tuple[Request, ...]
    skipped: tuple[Skip, ...]
    #: Tables with no due operation.
    healthy: tuple[str, ...]
    backlog: Backlog = field(default_factory=Backlog)

    def skipped_as(self, kind: SkipKind) -> tuple[Skip, ...]:
        """The skipped tables of one kind, in selection order."""
        return tuple(s for s in self.skipped if s.kind == kind)

    def decisions(self) -> dict[str, str]:
        """Per table, what the trigger did: ``requested``, ``healthy`` or the skip reason."""
        out = {table: "healthy" for table in self.healthy}
        out |= {r.table: "requested" for r in self.requested}
        out |= {s.table: f"waits: {s.reason}" for s in self.skipped}
        return out

    def summary(self) -> str:
        """One line per reason, for a tick's skip reason or log."""
        parts = []
        if self.requested:
            parts.append(
                f"{len(self.requested)} tables requested: "
                + ", ".join(f"{r.table} ({', '.join(r.operations)})" for r in self.requested)
            )
        due = len(self.requested) + len(self.skipped)
        if not due:
            parts.append(f"{len(self.healthy)} tables healthy, none due")
        labels = {
            "in_flight": "a run in flight",
            "backoff": "backing off after failed runs",
            "unchanged": "unchanged since a run that succeeded on that state",
            "min_interval": "maintained less than health.min_interval ago",
            "budget": "over this evaluation's budget (backlog)",
            "not_runnable": "due operations with no step here",
        }
        for kind in SKIP_KINDS:
            skips = self.skipped_as(kind)
            if skips:
                head = f"{len(skips)} due tables wait, {labels[kind]}"
                if kind == "budget":
                    head += f" ({self.backlog.count} tables, {self.backlog.bytes} bytes)"
                parts.append(head + ": " + "; ".join(f"{s.table} ({s.reason})" for s in skips))
        if due and self.healthy:
            parts.append(f"{len(self.healthy)} tables healthy")
        return "; ".join(parts)


def backoff_wait(failures: int, base: timedelta, cap: timedelta) -> timedelta | None:
    """How long after its last failure a table whose last ``failures`` runs failed in a row
    waits: none for fewer than two, then ``base * 2**(failures - 2)``, at most ``cap``."""
    if failures < 2:
        return None
    return min(base * (1 << min(failures - 2, _MAX_DOUBLINGS)), cap)


def rotation(keys: Collection[str], start: str | None) -> list[str]:
    """``keys`` in name order, beginning at ``start`` (or the next name after it, when that
    table is gone) and wrapping around: where an evaluation that ran out of time resumes."""
    ordered = sorted(keys)
    if start is None:
        return ordered
    at = bisect_left(ordered, start)
    return ordered[at:] + ordered[:at]


def _utc(moment: datetime) -> str:
    return f"{moment:%Y-%m-%d %H:%M:%S} UTC"


def select_runs(
    candidates: Sequence[TableHealth],
    *,
    now: datetime,
    trigger: TriggerSettings,
    min_interval: Mapping[str, timedelta] | timedelta,
    in_flight: Mapping[str, str] | None = None,
    last_maintained: Mapping[str, datetime] | None = None,
    failures: Mapping[str, tuple[int, datetime]] | None = None,
    settled: Mapping[str, str] | None = None,
    runnable: Collection[str] | None = None,
) -> Selection:
    """Decide which of ``candidates`` to maintain now (rules in the module docstring).

    ``in_flight``: table -> the unfinished run naming it (e.g. ``run 1a2b is queued``).
    ``last_maintained``: table -> its latest maintenance, whoever ran it.
    ``failures``: table -> (failed trigger runs in a row, the last one's end).
    ``settled``: table -> the trigger run that already succeeded on its current state.
    ``min_interval``: per table, or one for all (a table missing from the mapping has none).
    ``runnable``: the operations that have a step (unset: all).
    """
    in_flight = in_flight or {}
    last_maintained = last_maintained or {}
    failures = failures or {}
    settled = settled or {}
    healthy: list[str] = []
    skipped: list[Skip] = []
    eligible: list[tuple[TableHealth, tuple[str, ...]]] = []
    for health in candidates:
        key = health.table
        due = health.due_operations
        if not due:
            healthy.append(key)
            continue
        operations = tuple(op for op in due if runnable is None or op in runnable)
        if not operations:
            skipped.append(
                Skip(key, "not_runnable", f"due: {', '.join(due)}, none of which has a step")
            )
            continue
        if key in in_flight:
            skipped.append(Skip(key, "in_flight", in_flight[key]))
            continue
        count, last_failure = failures.get(key, (0, None))
        wait = backoff_wait(count, trigger.backoff, trigger.backoff_max)
        if wait is not None and last_failure is not None and now < last_failure + wait:
            skipped.append(
                Skip(
                    key,
                    "backoff",
                    f"its last {count} runs failed; next attempt after {_utc(last_failure + wait)}",
                )
            )
            continue
        if key in settled:
            skipped.append(Skip(key, "unchanged", settled[key]))
            continue
        interval = min_interval if isinstance(min_interval, timedelta) else min_interval.get(key)
        last = last_maintained.get(key)
        if interval is not None and last is not None and now < last + interval:
            skipped.append(
                Skip(
                    key,
                    "min_interval",
                    f"maintained {_utc(last)}; next after {_utc(last + interval)}",
                )
            )
            continue
        eligible.append((health, operations))

    eligible.sort(key=lambda item: (-item[0].need, -item[0].work_bytes, item[0].table))
    requested: list[Request] = []
    taken_bytes = 0
    waiting: list[TableHealth] = []
    limit = ""
    for health, operations in eligible:
        if not waiting and requested and len(requested) >= trigger.max_tables:
            limit = f"maintain.trigger.max_tables {trigger.max_tables} reached"
        elif not waiting and requested and taken_bytes + health.work_bytes > trigger.max_bytes:
            limit = (
                f"maintain.trigger.max_bytes {trigger.max_bytes} reached "
                f"({taken_bytes} taken, {health.work_bytes} more would pass it)"
            )
        if waiting or limit:
            waiting.append(health)  # the first that does not fit ends the selection
            continue
        reasons = tuple(
            f"{d.operation}: {d.reason}" for d in health.due if d.operation in operations
        )
        requested.append(Request(health.table, operations, health.need, health.work_bytes, reasons))
        taken_bytes += health.work_bytes
    skipped.extend(
        Skip(h.table, "budget", f"need {h.need}, {h.work_bytes} work bytes; {limit}")
        for h in waiting
    )
    backlog = Backlog(tuple(h.table for h in waiting), sum(h.work_bytes for h in waiting))
    return Selection(tuple(requested), tuple(skipped), tuple(healthy), backlog)


@dataclass(frozen=True)
class LakehouseHealth:
    """Lakehouse-wide totals over the assessed tables, and the least healthy of them."""

    #: Every table (partition) known, assessed or not.
    tables: int
    assessed: int
    unreadable: int
    unhealthy: int
    mean_score: float | None
    lowest_score: float | None
    tables_due: int
    small_files: int
    delete_files: int
    snapshots: int
    expirable_snapshots: int
    wal_files: int
    wal_bytes: int
    work_bytes: int
    #: Tables (and their work bytes) a trigger's budget left waiting; ``None`` outside one.
    backlog_tables: int | None
    backlog_bytes: int | None
    requested: int | None
    #: Operation -> how many tables have it due.
    due_by_operation: dict[str, int]
    #: Rows of the least healthy tables: table, score, due operations, why, decision.
    least_healthy: tuple[tuple[str, str, str, str, str], ...]
    #: Unreadable table -> the error.
    errors: dict[str, str]

    def numbers(self) -> dict[str, int | float]:
        """The figures to plot over time (absent ones left out)."""
        figures: dict[str, Any] = {
            "tables": self.tables,
            "tables_assessed": self.assessed,
            "tables_unreadable": self.unreadable,
            "unhealthy_tables": self.unhealthy,
            "mean_score": self.mean_score,
            "lowest_score": self.lowest_score,
            "tables_due": self.tables_due,
            "small_files": self.small_files,
            "delete_files": self.delete_files,
            "snapshots": self.snapshots,
            "expirable_snapshots": self.expirable_snapshots,
            "wal_files": self.wal_files,
            "wal_bytes": self.wal_bytes,
            "work_bytes": self.work_bytes,
            "backlog_tables": self.backlog_tables,
            "backlog_bytes": self.backlog_bytes,
            "tables_requested": self.requested,
        }
        return {k: v for k, v in figures.items() if v is not None}


#: Rows in the least-healthy table of ``lakehouse_health``.
LEAST_HEALTHY_ROWS = 20


def min_score_of(health: TableHealth, default: float) -> float:
    """The score under which ``health``'s table counts as unhealthy (its own threshold)."""
    value = health.thresholds.get("min_score", default)
    return float(value) if isinstance(value, int | float) else default


def summarize(
    healths: Sequence[TableHealth],
    *,
    tables: int,
    default_min_score: float,
    errors: Mapping[str, str] | None = None,
    selection: Selection | None = None,
    rows: int = LEAST_HEALTHY_ROWS,
) -> LakehouseHealth:
    """Totals and the least healthy tables, for the ``lakehouse_health`` asset (the sensor's
    event at each evaluation and the asset's own materialization build it the same way)."""
    errors = dict(errors or {})
    scores = [h.score for h in healths]
    decisions = selection.decisions() if selection is not None else {}
    due_by_operation: dict[str, int] = {}
    for health in healths:
        for op in health.due_operations:
            due_by_operation[op] = due_by_operation.get(op, 0) + 1
    worst = sorted(healths, key=lambda h: (h.score, -h.work_bytes, h.table))[:rows]
    least = tuple(
        (
            h.table,
            f"{h.score:.1f}",
            ", ".join(h.due_operations) or "-",
            "; ".join(f"{d.operation}: {d.reason}" for d in h.due) or "-",
            decisions.get(h.table, "-"),
        )
        for h in worst
    )
    least += tuple(
        (key, "?", "-", f"cannot assess: {error}", "skipped")
        for key, error in sorted(errors.items())[: max(0, rows - len(least))]
    )
    return LakehouseHealth(
        tables=tables,
        assessed=len(healths),
        unreadable=len(errors),
        unhealthy=sum(1 for h in healths if h.score < min_score_of(h, default_min_score)),
        mean_score=round(fmean(scores), 1) if scores else None,
        lowest_score=round(min(scores), 1) if scores else None,
        tables_due=sum(1 for h in healths if h.due),
        small_files=sum(h.metrics.small_files for h in healths),
        delete_files=sum(h.metrics.delete_files for h in healths),
        snapshots=sum(h.metrics.snapshots for h in healths),
        expirable_snapshots=sum(h.metrics.expirable_snapshots for h in healths),
        wal_files=sum(h.metrics.wal_files for h in healths),
        wal_bytes=sum(h.metrics.wal_bytes for h in healths),
        work_bytes=sum(h.work_bytes for h in healths if h.due),
        backlog_tables=selection.backlog.count if selection is not None else None,
        backlog_bytes=selection.backlog.bytes if selection is not None else None,
        requested=len(selection.requested) if selection is not None else None,
        due_by_operation=dict(sorted(due_by_operation.items())),
        least_healthy=least,
        errors=errors,
    )
