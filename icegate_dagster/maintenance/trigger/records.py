"""What one attempt of an operation on a table leaves in the trigger's memory (pure: no I/O).

An attempt ends one of these ways (``outcome``):

- ``completed`` / ``skipped``: the operation ran, or found nothing to do;
- ``failed``: it failed, inside a run that succeeded too (the run's status says nothing
  about one table's operation);
- ``lost``: the trigger asked for it and the run ended without recording the table (its
  worker died, the run failed before it got there, or someone canceled it);
- ``held``: another maintainer held the table: nothing was tried, nothing is counted;
- ``ineffective``: the trigger asked for it because it was due, it completed, and it is
  still due right after: the table's due state survives its operation.

``failed`` and ``lost`` count as consecutive **failures**; ``ineffective`` attempts are
counted apart. From the second of either in a row, the next attempt waits
``trigger.backoff × 2^(n−2)``, at most ``trigger.backoff_max`` (``not_before``); one is
retried at once. A completed attempt that leaves the operation no longer due resets both.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Literal

Outcome = Literal["completed", "skipped", "failed", "held", "lost", "ineffective"]
OUTCOMES: tuple[Outcome, ...] = ("completed", "skipped", "failed", "held", "lost", "ineffective")
#: Outcomes that count as failures for back-off.
FAILURES: tuple[Outcome, ...] = ("failed", "lost")
#: The stored detail (an error, why an attempt was ineffective) is cut to this length.
DETAIL_CHARS = 1000
#: The exponent of the back-off stops growing here (the cap is reached long before).
_MAX_DOUBLINGS = 32


def backoff_wait(count: int, base: timedelta, cap: timedelta) -> timedelta | None:
    """How long after the last of ``count`` failed (or ineffective) attempts in a row the
    next one waits: none for fewer than two, then ``base × 2^(count − 2)``, at most ``cap``."""
    if count < 2:
        return None
    return min(base * (1 << min(count - 2, _MAX_DOUBLINGS)), cap)


def utc(epoch: float) -> str:
    """An instant for messages: ``2026-11-25 03:00:00 UTC``."""
    return f"{datetime.fromtimestamp(epoch, UTC):%Y-%m-%d %H:%M:%S} UTC"


@dataclass(frozen=True)
class OperationAttempt:
    """One operation as a pass left it on one table."""

    operation: str
    #: ``completed``, ``skipped`` or ``failed`` (the log row's status).
    status: str
    #: Skipped because another maintainer held the table.
    held_elsewhere: bool = False
    error: str | None = None


@dataclass(frozen=True)
class PassRecord:
    """What a pass did to one table, as the trigger's memory keeps it."""

    table: str
    run_id: str
    attempts: tuple[OperationAttempt, ...]
    #: The operations the trigger asked for because they were due (a sensor's run).
    requested: tuple[str, ...] = ()
    #: Operations due right after the pass, with why (when the pass assessed the table).
    still_due: Mapping[str, str] | None = None
    #: The table's state right after the pass (metadata, WAL, due work), when assessed: a
    #: table still in that state needs no new run (see ``sensors``).
    settled_state: str | None = None
    #: What the table's partition page shows now, when the pass recorded it in Dagster.
    shown_state: str | None = None


@dataclass(frozen=True)
class OperationMemory:
    """The trigger's memory of one operation on one table (times: epoch seconds, the
    database's clock)."""

    table: str
    operation: str
    attempted_at: float
    outcome: Outcome
    #: Consecutive failed or lost attempts.
    failures: int = 0
    #: Consecutive ineffective attempts.
    ineffective: int = 0
    #: The next attempt waits until then (None: at once).
    not_before: float | None = None
    #: The last attempt that did not fail (completed, or nothing to do).
    succeeded_at: float | None = None
    #: The last error, or why the last attempt was ineffective.
    detail: str | None = None
    run_id: str | None = None
    #: Every attempt recorded.
    attempts: int = 1

    def waits(self, now: float) -> bool:
        """Whether the next attempt must wait (back-off)."""
        return self.not_before is not None and now < self.not_before

    def describe(self) -> str:
        """Why the operation waits or worries, for skip reasons, logs and the UI."""
        if self.outcome == "ineffective" or (self.ineffective and self.outcome != "failed"):
            head = f"{self.operation} still due after {self.ineffective} runs in a row"
        elif self.failures:
            head = f"{self.operation} failed {self.failures} time" + (
                "s in a row" if self.failures > 1 else ""
            )
        else:
            head = f"{self.operation} {self.outcome}"
        nxt = f"; next attempt after {utc(self.not_before)}" if self.not_before else ""
        detail = f" (last: {self.detail})" if self.detail else ""
        return head + nxt + detail


def _detail(text: str | None) -> str | None:
    return text[:DETAIL_CHARS] if text else None


def remember(
    previous: OperationMemory | None,
    attempt: OperationAttempt,
    *,
    table: str,
    run_id: str,
    requested: bool,
    still_due: str | None,
    now: float,
    backoff: timedelta,
    backoff_max: timedelta,
) -> OperationMemory:
    """The memory of an operation after ``attempt`` (rules in the module docstring).

    ``requested``: the trigger asked for it as due; ``still_due``: why it is due right
    after the pass (None: not due, or not assessed).
    """
    count = (previous.attempts if previous is not None else 0) + 1
    failures = previous.failures if previous is not None else 0
    ineffective = previous.ineffective if previous is not None else 0
    succeeded = previous.succeeded_at if previous is not None else None
    base = OperationMemory(table, attempt.operation, now, "completed", attempts=count)
    if attempt.held_elsewhere:
        return replace(
            base,
            outcome="held",
            failures=failures,
            ineffective=ineffective,
            succeeded_at=succeeded,
            detail=_detail(attempt.error),
            run_id=run_id,
        )
    if attempt.status == "failed":
        failures += 1
        wait = backoff_wait(failures, backoff, backoff_max)
        return replace(
            base,
            outcome="failed",
            failures=failures,
            not_before=now + wait.total_seconds() if wait else None,
            succeeded_at=succeeded,
            detail=_detail(attempt.error) or "failed",
            run_id=run_id,
        )
    if requested and still_due is not None:
        ineffective += 1
        wait = backoff_wait(ineffective, backoff, backoff_max)
        return replace(
            base,
            outcome="ineffective",
            ineffective=ineffective,
            not_before=now + wait.total_seconds() if wait else None,
            succeeded_at=now,
            detail=_detail(f"still due after it: {still_due}"),
            run_id=run_id,
        )
    # Still due after a pass that was not asked for it: that says nothing of the streak.
    keep = ineffective if still_due is not None else 0
    outcome: Outcome = "skipped" if attempt.status == "skipped" else "completed"
    return replace(base, outcome=outcome, ineffective=keep, succeeded_at=now, run_id=run_id)


def lost(
    previous: OperationMemory | None,
    *,
    table: str,
    operation: str,
    why: str,
    now: float,
    backoff: timedelta,
    backoff_max: timedelta,
) -> OperationMemory:
    """The memory after a requested attempt whose run ended without recording the table:
    a failure, and a step in whichever back-off was running (a run that dies never shortens
    the wait of an operation its table cannot fix)."""
    failures = (previous.failures if previous is not None else 0) + 1
    ineffective = previous.ineffective if previous is not None else 0
    wait = backoff_wait(max(failures, ineffective + 1 if ineffective else 0), backoff, backoff_max)
    return OperationMemory(
        table,
        operation,
        now,
        "lost",
        failures=failures,
        ineffective=ineffective,
        not_before=now + wait.total_seconds() if wait else None,
        succeeded_at=previous.succeeded_at if previous is not None else None,
        detail=_detail(why),
        run_id=previous.run_id if previous is not None else None,
        attempts=(previous.attempts if previous is not None else 0) + 1,
    )


@dataclass(frozen=True)
class OpenRequest:
    """A sensor's last request of a table: what it asked for, when, and the key of the run it
    asked for (each sensor has its own, so one never hides another's)."""

    by: str
    requested_at: float
    operations: tuple[str, ...]
    #: The run's key (None: a request made without one, such as by an older version).
    run_key: str | None = None


@dataclass(frozen=True)
class TableMemory:
    """The trigger's memory of one table as a whole."""

    table: str
    #: How many runs the sensors have asked for (a run key holds the number, and a random
    #: part that keeps it unique whatever the memory went through).
    decisions: int = 0
    #: Each sensor's last request (by sensor name; read with the operations only).
    requests: Mapping[str, OpenRequest] = field(default_factory=dict)
    #: When a pass (anyone's) last recorded the table.
    recorded_at: float | None = None
    #: The state right after the last pass that assessed it.
    settled_state: str | None = None
    #: What its partition page shows, since when, and whether it was ever materialized.
    shown_state: str | None = None
    shown_at: float | None = None
    materialized: bool = False
    operations: Mapping[str, OperationMemory] = field(default_factory=dict)
    #: Whether ``operations`` was read (a steady tick reads only the due tables' ones).
    operations_read: bool = True

    @property
    def requested_at(self) -> float | None:
        """When a sensor last asked for the table (None: never, or not read)."""
        return max((r.requested_at for r in self.requests.values()), default=None)

    def unanswered(self) -> tuple[tuple[OpenRequest, tuple[str, ...]], ...]:
        """Each sensor's request with its operations that no pass answered since it was made
        (none when the operations were not read)."""
        if not self.operations_read:
            return ()
        found = []
        for by in sorted(self.requests):
            request = self.requests[by]
            ops = tuple(
                op
                for op in request.operations
                if (done := self.operations.get(op)) is None
                or done.attempted_at <= request.requested_at
            )
            if ops:
                found.append((request, ops))
        return tuple(found)


#: Characters of each part of a shown state (the page's, the checks').
STATE_CHARS = 6


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:STATE_CHARS]


def _checks_part(failing: Iterable[str] | None) -> str:
    """The checks' part of a shown state: which of the metadata checks failed, or that
    their verdicts are not recorded on the page (None)."""
    return _digest("unchecked" if failing is None else "checks:" + ",".join(failing))


def shown_state(
    passed: bool,
    due: Iterable[str],
    excluded: bool = False,
    failing: Iterable[str] | None = None,
) -> str:
    """What a table's partition page says of it, in a few characters: its ``healthy``
    verdict, its due operations (names, in pass order) and whether it is excluded from
    maintenance (:func:`page_part`), then which of the checks the metadata alone can judge
    failed (``failing``; None: their verdicts are not recorded: :func:`checks_part`).
    Whoever records the page (a run, a CLI pass, the health sensor) remembers it, so the
    sensor records again only what changed."""
    page = f"{'pass' if passed else 'fail'}:{','.join(due)}{':excluded' if excluded else ''}"
    return _digest(page) + _checks_part(failing)


def error_state(error: str, failing: Iterable[str] | None = None) -> str:
    """The shown state of a table that could not be assessed: the error with its numbers
    (ports, ids, times) left out, so an error that only words itself differently each
    tick is one state; ``failing`` as for :func:`shown_state`."""
    return _digest("error:" + re.sub(r"\d+", "#", error)[:200]) + _checks_part(failing)


def page_part(state: str | None) -> str | None:
    """What a shown state says of the page's health keys (None: nothing shown)."""
    return state[:STATE_CHARS] if state is not None else None


def checks_part(state: str | None) -> str | None:
    """What a shown state says of the checks' verdicts (None: nothing shown; a state
    remembered before the checks were recorded has none either)."""
    return state[STATE_CHARS:] or None if state is not None else None


def unchecked(state: str) -> str:
    """``state`` with the checks' verdicts not recorded."""
    return state[:STATE_CHARS] + _checks_part(None)


def checked(state: str | None) -> bool:
    """Whether a shown state includes the checks' verdicts: a run's or a CLI pass's always
    does; the health sensor's lacks them while they wait for a later tick."""
    return checks_part(state) not in (None, _checks_part(None))
