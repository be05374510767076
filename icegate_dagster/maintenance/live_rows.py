"""The rows a reader sees, counted by Spark where metadata cannot tell (a table with delete
files), once per snapshot: what ``rows_preserved`` compares around an operation."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.results import Outcome, TableStats

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class LiveRows:
    """Live rows per (table, snapshot id), counted on ``spark`` in ``catalog``."""

    def __init__(self, spark: Callable[[], SparkSession], catalog: str) -> None:
        self._spark = spark
        self._catalog = catalog
        self._counted: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def count(self, ref: TableRef, stats: TableStats) -> TableStats:
        """``stats`` with the rows a reader sees, counted by Spark at ``stats.snapshot_id``
        (``count(*) ... VERSION AS OF``, deletes applied) where metadata cannot tell:
        only a table with delete files needs it. Counted once per snapshot."""
        if stats.live_rows is not None or stats.snapshot_id is None:
            return stats
        key = (ref.key, stats.snapshot_id)
        with self._lock:
            counted = self._counted.get(key)
        if counted is None:
            name = ref.spark_identifier(self._catalog)
            sql = f"SELECT count(*) FROM {name} VERSION AS OF {int(stats.snapshot_id)}"
            counted = int(self._spark().sql(sql).collect()[0][0])
            with self._lock:
                self._counted[key] = counted
        return stats.with_live_rows(counted)

    def around(
        self,
        ref: TableRef,
        before: TableStats,
        after: TableStats,
        outcome: Outcome,
        scrub: Callable[[str], str],
    ) -> tuple[TableStats, TableStats]:
        """Live rows before and after an operation that ran, for ``rows_preserved``:
        counted only where a table has delete files, and only when the operation committed
        (an unchanged table needs no count: no scan, no JVM). The snapshot before is
        counted now, while no expiry can have removed it yet."""
        changed = before.snapshot_id != after.snapshot_id
        unknown = before.live_rows is None or after.live_rows is None
        if not unknown or not changed:  # no commit: rows_preserved needs no count
            return before, after
        try:
            before = self.count(ref, before)
            after = self.count(ref, after)
        except Exception as exc:  # the op's own outcome stands; rows_preserved says why
            outcome.output["live_rows_error"] = describe_error(exc, scrub)
        return before, after
