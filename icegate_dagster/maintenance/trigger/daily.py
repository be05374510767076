"""The daily pass (``daily_maintenance``) from one look and decision of the health trigger:
which tables get a run today, and the log rows of every other table (pure: no Dagster, no
I/O; the schedule gathers the look, the decision and each table's full pass).

A table gets a run when:

- the decision requests it (:func:`.decision.decide` without the per-evaluation budget: the
  daily pass serves every due table it may, time-based due work such as expiry included),
  doing its whole daily pass less the operations backing off; or
- its daily pass holds an operation no look can judge from metadata and that time alone
  makes due: ``retention`` (a TTL rule deletes the rows that crossed the cutoff since
  yesterday), unless a run or another maintainer holds it.

Every other table is **looked at**: one row per operation of its daily pass, as a CLI pass
writes them without a JVM (``skipped`` with the reason; ``failed`` with the error for a
table that could not be read), its figures from the look. Tables the look had no time for
(never looked at before) say so; the health trigger looks at them at its next ticks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from icegate_dagster.maintenance.health.score import DUE_ORDER
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.results import OpResult, Status, TableResult, TableStats
from icegate_dagster.maintenance.trigger.look import LakehouseLook
from icegate_dagster.maintenance.trigger.records import utc
from icegate_dagster.maintenance.trigger.selection import Request, Selection

#: Operations whose work time alone makes due and no look judges: a table whose daily pass
#: holds one gets a run every day.
DAILY_OPERATIONS = ("retention",)
#: Operations the look judges from metadata (the health trigger's due rules).
JUDGED = frozenset(DUE_ORDER)
#: How the decision's reasons for leaving a due table alone read in a log row.
WAIT_LABELS = {
    "in_flight": "a run in flight or another maintainer's lease holds it",
    "backoff": "backing off after failed or ineffective runs",
    "unchanged": "unchanged since a pass left it so",
    "min_interval": "maintained less than health.min_interval ago",
    "budget": "over the budget",
    "not_runnable": "its due operations have no step here",
}


@dataclass(frozen=True)
class DailyPass:
    """One day's pass: the tables to run, and the rows of the others."""

    #: Tables asked for, each with the operations its run does.
    requested: tuple[Request, ...]
    #: Every other table, with one row per operation of its daily pass.
    looked_at: tuple[TableResult, ...]
    #: Tables with no look at all (the look had no time for them).
    not_looked_at: tuple[str, ...]

    def summary(self, shown: int = 10) -> str:
        """One line for the tick's skip reason or log."""
        tables = len(self.requested) + len(self.looked_at) - len(self.not_looked_at)
        due = [r.table for r in self.requested]
        head = f"{tables} tables looked at, " + (
            f"{len(due)} due: " + "; ".join(due[:shown]) + ("; ..." if len(due) > shown else "")
            if due
            else "none due"
        )
        failed = [r.table for r in self.looked_at if any(op.status == "failed" for op in r.ops)]
        if failed:
            head += f"; {len(failed)} could not be read: " + "; ".join(failed[:shown])
        if self.not_looked_at:
            head += (
                f"; {len(self.not_looked_at)} never looked at (no time left in this tick; "
                "the health trigger looks at them next)"
            )
        return head


def stats_of(health: HealthSummary) -> TableStats:
    """A table's figures as its look kept them, as a log row carries them."""
    figures = health.figures()
    return TableStats(
        data_files=figures["data_files"],
        data_bytes=figures["data_bytes"],
        small_files=figures["small_files"],
        delete_files=figures["delete_files"],
        snapshots=figures["snapshots"],
        rows=figures["rows"],
        manifests=figures["manifests"],
    )


def not_due_reason(operation: str, health: HealthSummary, looked_at: float) -> str:
    """Why a looked-at table's ``operation`` did not run today."""
    seen = f"health score {health.score:g}, looked at {utc(looked_at)}"
    if operation in JUDGED:
        return f"not due from the table's metadata ({seen}): the daily schedule started no run"
    if operation == "remove_orphan_files":
        return (
            f"not looked for: nothing is due on the table ({seen}), and orphan files are "
            "listed in a run only (icegate-maintain orphans lists them now)"
        )
    return f"not judged from metadata, nothing else due ({seen}): done in the table's next run"


def plan_daily_pass(
    look: LakehouseLook,
    selection: Selection,
    daily: Mapping[str, Sequence[str]],
    busy: Mapping[str, str],
    *,
    at: datetime,
) -> DailyPass:
    """The day's pass over ``look``'s tables (rules in the module docstring).

    ``selection``: the decision over ``look`` (unbounded); ``daily``: each table's daily
    pass (its full pass, in pass order); ``busy``: tables a run or a lease holds, with
    which; ``at``: the rows' instant."""
    healths = look.healths
    skipped = {s.table: s for s in selection.skipped}
    requested: list[Request] = []
    for request in selection.requested:
        due = set(healths[request.table].due_operations)
        held_back = due - set(request.operations)  # backing off
        operations = tuple(op for op in daily.get(request.table, ()) if op not in held_back)
        requested.append(
            Request(
                request.table,
                operations or request.operations,
                request.need,
                request.work_bytes,
                request.reasons,
            )
        )
    chosen = {r.table for r in requested}
    excluded = dict(selection.excluded)
    for table in look.tables:
        operations = tuple(daily.get(table, ()))
        wanted = [op for op in DAILY_OPERATIONS if op in operations]
        if table in chosen or not wanted or table in busy or table in excluded:
            continue
        health = healths.get(table)
        if health is not None and table in skipped:  # due, and the decision said wait
            continue
        requested.append(
            Request(
                table,
                operations,
                health.need if health is not None else 0.0,
                0,
                tuple(f"{op}: its rule deletes rows as they age, every day" for op in wanted),
            )
        )
        chosen.add(table)

    looked_at: list[TableResult] = []
    never: list[str] = []
    for table in look.tables:
        if table in chosen:
            continue
        seen = look.looks.get(table)
        operations = tuple(daily.get(table, ()))
        if seen is None:
            never.append(table)
            why = "not looked at: the daily schedule's look had no time left for it"
            looked_at.append(_rows(table, operations, "skipped", why, None, at))
        elif seen.error is not None or seen.health is None:
            error = f"cannot read the table: {seen.error or 'no health recorded'}"
            looked_at.append(_rows(table, operations, "failed", error, None, at))
        elif table in excluded:
            why = f"excluded from maintenance: {excluded[table]}"
            looked_at.append(_rows(table, operations, "skipped", why, stats_of(seen.health), at))
        elif table in busy:
            why = f"not asked for today: {busy[table]}"
            looked_at.append(_rows(table, operations, "skipped", why, stats_of(seen.health), at))
        elif table in skipped:
            skip = skipped[table]
            why = f"due, not asked for today: {WAIT_LABELS[skip.kind]} ({skip.reason})"
            looked_at.append(_rows(table, operations, "skipped", why, stats_of(seen.health), at))
        else:
            health, when = seen.health, seen.looked_at
            reasons = {op: not_due_reason(op, health, when) for op in operations}
            looked_at.append(_rows(table, operations, "skipped", reasons, stats_of(health), at))
    return DailyPass(tuple(requested), tuple(looked_at), tuple(never))


def _rows(
    table: str,
    operations: Sequence[str],
    status: Status,
    reason: str | Mapping[str, str],
    stats: TableStats | None,
    at: datetime,
) -> TableResult:
    """One table's rows: each operation with ``status`` and ``reason`` (one for all, or
    one per operation)."""
    why = {op: reason if isinstance(reason, str) else reason[op] for op in operations}
    ops = [
        OpResult(
            table,
            op,
            status,
            why[op],
            stats,
            stats,
            0.0,
            error=why[op] if status == "failed" else None,
            finished_at=at,
        )
        for op in operations
    ]
    return TableResult(table, stats, stats, ops, 0.0)
