"""The maintainer's side of table leases: hold a table for one operation, or say who does.

The lease store is deployment-wide: ``maintain.locks.uri``, else the catalog's own SQL
database, else a SQLite file beside the configuration (see :mod:`.store`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icegate_dagster.config import IcegateConfig, format_duration
from icegate_dagster.maintenance.leases.store import (
    Lease,
    LockHolder,
    TableLocks,
    commit_guard,
    holder_description,
)
from icegate_dagster.maintenance.results import Outcome
from icegate_dagster.spark.remote import is_remote

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyspark.sql import SparkSession


def lease_store(config: IcegateConfig, catalog: Catalog) -> TableLocks | None:
    """The deployment's lease store for ``config`` (see :mod:`.store`): it holds the table
    leases and the Dagster runs' heartbeats."""
    settings = config.locks
    return TableLocks.for_catalog(
        catalog,
        uri=settings.uri,
        fallback_uri=config.locks_fallback_uri,
        lease=settings.lease,
        stuck_after=settings.stuck_after,
    )


@dataclass(frozen=True)
class Hold:
    """What holding a table gave: ``elsewhere`` is the outcome when another maintainer
    holds it (the operation does not run)."""

    elsewhere: Outcome | None = None


class TableLeasing:
    """Leases of one maintainer (one run): a table is held for each operation on it."""

    def __init__(
        self,
        config: IcegateConfig,
        catalog: Callable[[], Catalog],
        run_id: str,
        *,
        started_spark: Callable[[], SparkSession | None],
        fault_hook: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.run_id = run_id
        self.fault_hook = fault_hook
        self._catalog = catalog
        self._started_spark = started_spark
        self._locks: TableLocks | None = None
        self._checked = False
        self._lock = threading.Lock()

    @property
    def locks(self) -> TableLocks | None:
        """The lease store, opened on first use (shared by the threads of a pass)."""
        with self._lock:
            if not self._checked:
                self._locks = lease_store(self.config, self._catalog())
                self._checked = True
        return self._locks

    @contextlib.contextmanager
    def hold(self, key: str, *, leased: bool = True) -> Iterator[Hold]:
        """Hold table ``key`` for the block; commits inside check the lease first.

        ``leased=False`` (a dry run) takes no lease; commits still pass the fault hook.
        """
        locks = self.locks if leased else None
        if locks is None:
            with commit_guard(self._guard(key, None)):
                yield Hold()
            return
        with locks.hold(key, holder_description(self.run_id), self.config.lock_wait) as held:
            if isinstance(held, LockHolder):
                yield Hold(elsewhere=self._held_elsewhere(key, held))
                return
            try:
                with commit_guard(self._guard(key, held)):
                    yield Hold()
            finally:
                self._untag(held)

    def _held_elsewhere(self, key: str, other: LockHolder) -> Outcome:
        """A table another maintainer holds is skipped; one held past ``stuck_after`` fails,
        naming the holder, so a stuck holder cannot make a table skip silently forever."""
        stuck_after = self.config.locks.stuck_after
        if other.held_for >= stuck_after:
            return Outcome(
                "failed",
                f"{key} has been held by {other.describe()} for "
                f"{format_duration(other.held_for)} (over maintain.locks.stuck_after "
                f"{format_duration(stuck_after)}): is that maintainer stuck? Stop it, or delete "
                f"its row from the lease table icegate_table_leases",
            )
        return Outcome.skip(
            f"{key} is being maintained by {other.describe()}; "
            f"waited {self.config.lock_wait.total_seconds():g}s, left it alone",
            held_elsewhere=True,
        )

    def _guard(self, key: str, lease: Lease | None) -> Callable[[], None]:
        """What runs right before each commit and delete of an operation: the test-only
        fault hook, then the lease check in the database. While the lease is held, losing
        it cancels the Spark jobs this thread started, so nothing commits after."""

        def guard() -> None:
            if self.fault_hook is not None:
                self.fault_hook("before_commit")
            if lease is None:
                return
            lease.verify()
            spark = self._started_spark()
            if spark is None:
                return
            if is_remote(spark):
                # Spark Connect: this thread's operations carry the lease's token as a tag;
                # losing the lease interrupts them on the server.
                if lease.token not in spark.getTags():
                    spark.addTag(lease.token)

                    def interrupt() -> None:
                        spark.interruptTag(lease.token)

                    lease.on_lost(interrupt)
                return
            context = spark.sparkContext
            context.setJobGroup(lease.token, f"icegate {key}", True)
            lease.on_lost(lambda: context.cancelJobGroup(lease.token))

        return guard

    def _untag(self, lease: Lease) -> None:
        """Once the operation ends, this thread's next operations (another table's) no
        longer carry its lease's tag (Spark Connect)."""
        spark = self._started_spark()
        if spark is not None and is_remote(spark):
            with contextlib.suppress(Exception):
                spark.removeTag(lease.token)
