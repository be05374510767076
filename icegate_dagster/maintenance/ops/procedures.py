"""Calling Iceberg's Spark procedures: retried on commit conflicts, only while the lease
is ours, with instants spelled so that no session time zone can shift them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.identifiers import quote_identifier, sql_string
from icegate_dagster.maintenance.leases.store import check_lease

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Commit conflicts worth retrying: another writer committed first (the procedure
#: re-reads the table on the next attempt, as the Spark catalog caches nothing).
#: An unknown commit state is never retried: the commit may have happened.
_CONFLICTS = ("CommitFailedException", "ValidationException")
#: Attempts per procedure call, and the backoff between them (seconds).
COMMIT_ATTEMPTS = 4


def is_commit_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is a commit that lost a race with another writer."""
    text = describe_error(exc)
    return any(name in text for name in _CONFLICTS) and "CommitStateUnknown" not in text


Result = TypeVar("Result")


@dataclass
class Called(Generic[Result]):
    """What a committing call returned (a procedure: its rows), how many commit
    conflicts were retried, and its time."""

    rows: Result
    retries: int
    seconds: float = 0.0

    def output(self) -> dict[str, Any]:
        """A procedure's first row, plus the retries and the time spent in Spark."""
        rows: Any = self.rows
        first = rows[0].asDict() if isinstance(rows, list) and rows else {}
        return {**first, "commit_retries": self.retries, "procedure_s": round(self.seconds, 3)}


def committing(action: Callable[[], Result]) -> Called[Result]:
    """Run ``action`` (which commits), retried when another writer committed first; the
    lease is checked before every attempt, so nothing commits once it is lost."""
    from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

    retrying = Retrying(
        stop=stop_after_attempt(COMMIT_ATTEMPTS),
        wait=wait_exponential(multiplier=0.5, max=8),
        retry=retry_if_exception(is_commit_conflict),
        reraise=True,
    )
    attempts = 0
    started = time.perf_counter()
    for attempt in retrying:
        with attempt:
            attempts += 1
            check_lease()
            result = action()
    return Called(result, attempts - 1, time.perf_counter() - started)


def call_procedure(
    spark: SparkSession, catalog: str, procedure: str, args: dict[str, str]
) -> Called[list[Any]]:
    """``CALL <catalog>.system.<procedure>(name => value, ...)``; ``args`` are SQL literals."""
    arguments = ", ".join(f"{name} => {value}" for name, value in args.items())
    sql = f"CALL {quote_identifier(catalog)}.system.{procedure}({arguments})"
    return committing(lambda: spark.sql(sql).collect())


def utc(moment: datetime) -> datetime:
    """``moment`` in UTC; a naive ``moment`` is taken to be UTC already."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def wall_clock(moment: datetime) -> str:
    """``moment``'s UTC wall clock, to the microsecond."""
    return utc(moment).strftime("%Y-%m-%d %H:%M:%S.%f")


def timestamp_literal(moment: datetime) -> str:
    """An instant as a TIMESTAMP literal: the UTC offset is spelled out.

    A zone-less literal is read in ``spark.sql.session.timeZone``, which users may set.
    Iceberg's CALL takes literals only (``TIMESTAMP_MILLIS(n)`` is refused by its
    parser), and a literal with an offset is an instant whatever the session says.
    """
    return f"TIMESTAMP {sql_string(wall_clock(moment) + '+00:00')}"


def options_map(options: dict[str, str]) -> str:
    """A procedure's ``options`` argument: ``map('k', 'v', ...)``."""
    pairs = ", ".join(f"{sql_string(k)}, {sql_string(v)}" for k, v in options.items())
    return f"map({pairs})"
