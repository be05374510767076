"""Which tables the health trigger maintains now, and why the others wait (pure: no
Dagster, no I/O; the sensor gathers the facts and passes them in).

The rules, in the order a table meets them:

1. A table excluded from maintenance (its ``icegate.maintenance.enabled=false`` property or
   the configuration, ``maintenance.exclusion``) is reported as excluded, never asked for;
   one with no due operation is healthy and left alone (an operation it is excluded
   from, such as rewrites left to Amoro, is never due).
2. Due operations this code location has no step for are dropped (a table left with
   none is reported, not requested).
3. A table with a run in flight (any run naming it: schedule, backfill, sensor), or held
   by another maintainer's lease, waits.
4. A due operation whose last attempts failed, or left it due (``ineffective``), two or
   more times in a row waits out its back-off (``trigger.backoff × 2^(n−2)``, at most
   ``trigger.backoff_max``, from the trigger's memory); the table is asked for with its
   other due operations, or waits when all of them back off.
5. A table a pass left in its very state (same metadata file, same WAL, same due work
   with the same figures) waits until that changes: running again would do the same
   nothing, so health rules the operations cannot satisfy cost one run, not one every
   interval.
6. A table maintained (by anyone) less than its ``health.min_interval`` ago waits.
7. The rest go **longest-waiting first**: a table waits since it fell due, or since the
   trigger last served it (its last request, or the last pass that recorded the table)
   if that is later; among equals (or where neither is known), the neediest (``need`` =
   100 − score), then more work bytes, then the name. They are taken until ``trigger.max_tables``
   tables or ``trigger.max_bytes`` work bytes; the first always fits, and the first that
   does not fit ends the selection. So no table can starve the others: a table that
   keeps failing, cannot be fixed or is larger than the budget is served, then goes
   behind every table that has waited longer; a large one is taken alone when its turn
   comes, never passed over by smaller ones. What is left is the backlog, reported by
   count, bytes and name.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from statistics import fmean
from typing import TYPE_CHECKING, Any, Literal

from icegate_dagster.maintenance.trigger.records import utc

if TYPE_CHECKING:
    from icegate_dagster.config import TriggerSettings
    from icegate_dagster.maintenance.health.summary import Assessed, HealthSummary
    from icegate_dagster.maintenance.trigger.records import TableMemory

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


@dataclass(frozen=True)
class Request:
    """A table to maintain now, doing exactly these operations."""

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
    """Due tables the budget left for a later evaluation, in turn order."""

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
    #: Tables excluded from maintenance (``maintenance.exclusion``), with why.
    excluded: tuple[tuple[str, str], ...] = ()

    def skipped_as(self, kind: SkipKind) -> tuple[Skip, ...]:
        """The skipped tables of one kind, in selection order."""
        return tuple(s for s in self.skipped if s.kind == kind)

    def decisions(self) -> dict[str, str]:
        """Per table, what the trigger did: ``requested``, ``healthy`` or the skip reason."""
        out = {table: "healthy" for table in self.healthy}
        out |= {table: f"excluded: {why}" for table, why in self.excluded}
        out |= {r.table: "requested" for r in self.requested}
        out |= {s.table: f"waits: {s.reason}" for s in self.skipped}
        return out

    def summary(self, shown: int = 10) -> str:
        """One line per reason, for a tick's skip reason or log (at most ``shown`` tables
        named per reason: a skip reason is stored with every tick)."""

        def some(items: Sequence[str]) -> str:
            more = f"; and {len(items) - shown} more" if len(items) > shown else ""
            return "; ".join(items[:shown]) + more

        parts = []
        if self.requested:
            parts.append(
                f"{len(self.requested)} tables requested: "
                + some([f"{r.table} ({', '.join(r.operations)})" for r in self.requested])
            )
        due = len(self.requested) + len(self.skipped)
        if not due:
            parts.append(f"{len(self.healthy)} tables healthy, none due")
        if self.excluded:
            parts.append(
                f"{len(self.excluded)} tables excluded from maintenance: "
                + some([f"{table} ({why})" for table, why in self.excluded])
            )
        labels = {
            "in_flight": "a run in flight or another maintainer's lease",
            "backoff": "backing off after failed or ineffective runs",
            "unchanged": "unchanged since a pass left them so",
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
                parts.append(head + ": " + some([f"{s.table} ({s.reason})" for s in skips]))
        if due and self.healthy:
            parts.append(f"{len(self.healthy)} tables healthy")
        return "; ".join(parts)


def rotation(keys: Collection[str], start: str | None) -> list[str]:
    """``keys`` in name order, beginning at ``start`` (or the next name after it, when that
    table is gone) and wrapping around: where an evaluation that ran out of time resumes."""
    from bisect import bisect_left

    ordered = sorted(keys)
    if start is None:
        return ordered
    at = bisect_left(ordered, start)
    return ordered[at:] + ordered[:at]


def last_served(memory: TableMemory | None) -> float | None:
    """When the trigger last served a table: its last request, or the last pass that
    recorded it, whichever is later (None: never)."""
    if memory is None:
        return None
    times = [t for t in (memory.requested_at, memory.recorded_at) if t is not None]
    return max(times) if times else None


def waiting_since(memory: TableMemory | None, due_since: float | None) -> float:
    """Since when a due table has been waiting for the trigger: since it fell due, or
    since it was last served if that is later (a table that fails, is served, and stays
    due waits from then on). Unknown: since ever (first in turn)."""
    times = [t for t in (last_served(memory), due_since) if t is not None]
    return max(times) if times else float("-inf")


def select_runs(
    candidates: Sequence[Assessed],
    *,
    now: float,
    trigger: TriggerSettings,
    min_interval: Mapping[str, timedelta] | timedelta,
    in_flight: Mapping[str, str] | None = None,
    memory: Mapping[str, TableMemory] | None = None,
    states: Mapping[str, str] | None = None,
    due_since: Mapping[str, float] | None = None,
    runnable: Collection[str] | None = None,
) -> Selection:
    """Decide which of ``candidates`` to maintain now (rules in the module docstring).

    ``now``: epoch seconds (the clock ``memory``'s times are on).
    ``in_flight``: table -> the run or lease holding it (``run 1a2b is queued``).
    ``memory``: table -> the trigger's memory of it (its operations' outcomes and back-off,
    its last request and pass, the state the last pass left).
    ``states``: table -> its state now (``summary.table_state``), to compare with that.
    ``due_since``: table -> since when it has been due without a break (the turn order).
    ``min_interval``: per table, or one for all (a table missing from the mapping has none).
    ``runnable``: the operations that have a step (unset: all).
    """
    in_flight = in_flight or {}
    memory = memory or {}
    states = states or {}
    due_since = due_since or {}
    healthy: list[str] = []
    excluded: list[tuple[str, str]] = []
    skipped: list[Skip] = []
    eligible: list[tuple[Assessed, tuple[str, ...]]] = []
    for health in candidates:
        key = health.table
        due = health.due_operations
        if health.excluded is not None:
            excluded.append((key, health.excluded))
            continue
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
        remembered = memory.get(key)
        ops_memory = remembered.operations if remembered is not None else {}
        waiting = [
            ops_memory[op] for op in operations if op in ops_memory and ops_memory[op].waits(now)
        ]
        operations = tuple(op for op in operations if op not in {m.operation for m in waiting})
        if not operations:
            skipped.append(Skip(key, "backoff", "; ".join(m.describe() for m in waiting)))
            continue
        if (
            remembered is not None
            and remembered.settled_state is not None
            and remembered.settled_state == states.get(key)
        ):
            at = remembered.recorded_at
            when = f" at {utc(at)}" if at is not None else ""
            skipped.append(
                Skip(
                    key,
                    "unchanged",
                    f"a pass{when} left it in this very state (same metadata file, WAL and "
                    "due work); asked for again once it changes",
                )
            )
            continue
        interval = min_interval if isinstance(min_interval, timedelta) else min_interval.get(key)
        last = remembered.recorded_at if remembered is not None else None
        if interval is not None and last is not None and now < last + interval.total_seconds():
            skipped.append(
                Skip(
                    key,
                    "min_interval",
                    f"maintained {utc(last)}; next after {utc(last + interval.total_seconds())}",
                )
            )
            continue
        eligible.append((health, operations))

    def turn(item: tuple[Assessed, tuple[str, ...]]) -> tuple[float, float, int, str]:
        health = item[0]
        since = waiting_since(memory.get(health.table), due_since.get(health.table))
        return (since, -health.need, -health.work_bytes, health.table)

    eligible.sort(key=turn)
    requested: list[Request] = []
    taken_bytes = 0
    waiting_budget: list[Assessed] = []
    limit = ""
    for health, operations in eligible:
        if not waiting_budget and requested and len(requested) >= trigger.max_tables:
            limit = f"maintain.trigger.max_tables {trigger.max_tables} reached"
        elif (
            not waiting_budget and requested and taken_bytes + health.work_bytes > trigger.max_bytes
        ):
            limit = (
                f"maintain.trigger.max_bytes {trigger.max_bytes} reached "
                f"({taken_bytes} taken, {health.work_bytes} more would pass it)"
            )
        if waiting_budget or limit:
            waiting_budget.append(health)  # the first that does not fit ends the selection
            continue
        reasons = tuple(
            f"{d.operation}: {d.reason}" for d in health.due if d.operation in operations
        )
        requested.append(Request(health.table, operations, health.need, health.work_bytes, reasons))
        taken_bytes += health.work_bytes
    skipped.extend(
        Skip(h.table, "budget", f"need {h.need}, {h.work_bytes} work bytes; {limit}")
        for h in waiting_budget
    )
    backlog = Backlog(
        tuple(h.table for h in waiting_budget), sum(h.work_bytes for h in waiting_budget)
    )
    return Selection(tuple(requested), tuple(skipped), tuple(healthy), backlog, tuple(excluded))


@dataclass(frozen=True)
class LakehouseHealth:
    """Lakehouse-wide totals over the assessed tables, and the least healthy of them."""

    #: Every table known, assessed or not.
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
    #: Tables whose operation keeps failing, or stays due after it ran, with what happened.
    failing: dict[str, str] = field(default_factory=dict)
    #: Tables excluded from maintenance, with why.
    excluded: dict[str, str] = field(default_factory=dict)
    #: Tables that share their location without ``gc.enabled=false``, with the warning.
    unsafe_sharing: dict[str, str] = field(default_factory=dict)

    def numbers(self) -> dict[str, int | float]:
        """The figures to plot over time (absent ones left out)."""
        figures: dict[str, Any] = {
            "tables": self.tables,
            "tables_assessed": self.assessed,
            "tables_unreadable": self.unreadable,
            "unhealthy_tables": self.unhealthy,
            "failing_tables": len(self.failing),
            "excluded_tables": len(self.excluded),
            "unsafe_sharing_tables": len(self.unsafe_sharing),
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

    def verdicts(self) -> dict[str, Any]:
        """What the lakehouse's health *is*, as opposed to figures that move with every
        write (files, bytes, scores): recorded again when this changes. Which tables are
        unreadable or failing, and how many are unhealthy and due, per operation."""
        return {
            "tables": self.tables,
            "tables_assessed": self.assessed,
            "unhealthy_tables": self.unhealthy,
            "tables_due": self.tables_due,
            "due_by_operation": self.due_by_operation,
            "unreadable": sorted(self.errors),
            "failing": sorted(self.failing),
            "excluded": sorted(self.excluded),
            "unsafe_sharing": sorted(self.unsafe_sharing),
        }


#: Rows in the least-healthy table of ``lakehouse_health``.
LEAST_HEALTHY_ROWS = 20


def summarize(
    healths: Sequence[HealthSummary],
    *,
    tables: int,
    errors: Mapping[str, str] | None = None,
    selection: Selection | None = None,
    failing: Mapping[str, str] | None = None,
    unsafe_sharing: Mapping[str, str] | None = None,
    rows: int = LEAST_HEALTHY_ROWS,
) -> LakehouseHealth:
    """Totals and the least healthy tables, for the ``lakehouse_health`` asset (built by
    :func:`.decision.lakehouse_report`, for the sensor's event and the asset's own
    materialization alike)."""
    errors = dict(errors or {})
    scores = [h.score for h in healths]
    decisions = selection.decisions() if selection is not None else {}
    due_by_operation: dict[str, int] = {}
    totals = dict.fromkeys(
        ("small_files", "delete_files", "snapshots", "expirable_snapshots", "wal_files"), 0
    )
    wal_bytes = 0
    for health in healths:
        for op in health.due_operations:
            due_by_operation[op] = due_by_operation.get(op, 0) + 1
        figures = health.figures()
        for name in totals:
            totals[name] += figures[name]
        wal_bytes += figures["wal_bytes"]
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
        unhealthy=sum(1 for h in healths if not h.healthy),
        mean_score=round(fmean(scores), 1) if scores else None,
        lowest_score=round(min(scores), 1) if scores else None,
        tables_due=sum(1 for h in healths if h.due),
        small_files=totals["small_files"],
        delete_files=totals["delete_files"],
        snapshots=totals["snapshots"],
        expirable_snapshots=totals["expirable_snapshots"],
        wal_files=totals["wal_files"],
        wal_bytes=wal_bytes,
        work_bytes=sum(h.work_bytes for h in healths if h.due),
        backlog_tables=selection.backlog.count if selection is not None else None,
        backlog_bytes=selection.backlog.bytes if selection is not None else None,
        requested=len(selection.requested) if selection is not None else None,
        due_by_operation=dict(sorted(due_by_operation.items())),
        least_healthy=least,
        errors=errors,
        failing=dict(sorted((failing or {}).items())),
        excluded={h.table: h.excluded for h in healths if h.excluded is not None},
        unsafe_sharing=dict(sorted((unsafe_sharing or {}).items())),
    )
