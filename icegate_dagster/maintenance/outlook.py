"""What a pass will ask of Spark, read from metadata before its JVM starts.

The outlook sums the bytes a pass's rewrites can write at most and says whether some table
certainly has Spark work (files to compact, a WAL due). A pass starts its JVM beside its
planning only then, with the quick JIT when its rewrites are small (:mod:`.spark_start`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from icegate_dagster.config import IcegateConfig
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.ops import OPERATIONS, OpContext, skip_reason
from icegate_dagster.maintenance.results import TableStats
from icegate_dagster.maintenance.wal.files import compaction_due, configured_wal_root, wal_stats

if TYPE_CHECKING:
    from pyiceberg.table import Table

#: A pass over at most this many tables sums their bytes to rewrite before its JVM starts
#: (:meth:`Maintainer.rewrites_are_small`); a longer one amortizes the JIT's start anyway.
SMALL_PASS_TABLES = 50
#: Operations whose bytes to rewrite nothing here bounds (TTL deletes rewrite any file).
_UNBOUNDED_OPERATIONS = ("retention",)


@dataclass(frozen=True)
class PassOutlook:
    """What a pass will ask of Spark, read from metadata before its JVM starts
    (:func:`pass_outlook`)."""

    #: The most its rewrites can write (data files and WAL files), or None: not bounded.
    rewrite_bytes: int | None
    #: Some table certainly has Spark work: files to compact, a WAL due.
    needs_spark: bool

    def rewrites_at_most(self, limit: int) -> bool:
        """Whether its rewrites are bounded, by ``limit`` bytes or less."""
        return self.rewrite_bytes is not None and self.rewrite_bytes <= limit


class PassTables(Protocol):
    """What the outlook reads of a pass's tables: a
    :class:`~icegate_dagster.maintenance.maintainer.Maintainer` is one."""

    config: IcegateConfig

    def operations_for(self, ref: TableRef) -> tuple[str, ...]: ...

    def load(self, ref: TableRef) -> Table: ...

    def stats(self, ref: TableRef, table: Table | None = None) -> TableStats: ...

    def op_context(
        self, ref: TableRef, table: Table, before: TableStats, *, dry_run: bool, force: bool
    ) -> OpContext: ...


def pass_outlook(
    tables: PassTables,
    refs: Sequence[TableRef],
    operations: Sequence[str] | None = None,
    *,
    max_tables: int = SMALL_PASS_TABLES,
) -> PassOutlook:
    """What a pass over ``refs`` will ask of Spark, from metadata, before its JVM starts
    (the stats are cached for the pass): the bytes its rewrites can write at most (every
    byte of a table with files to compact or deletes to apply, where the pass compacts,
    and its waiting WAL files), and whether some table certainly has Spark work (files
    to compact, a WAL due). Not looked at beyond ``max_tables`` tables; bytes not
    bounded with TTL deletes to do or a table or WAL folder that cannot be read (the
    pass reports it)."""
    if len(refs) > max_tables:
        return PassOutlook(None, needs_spark=False)
    config = tables.config
    total: int | None = 0
    needs_spark = False
    for ref in refs:
        names = operations if operations is not None else tables.operations_for(ref)
        if any(name in _UNBOUNDED_OPERATIONS for name in names):
            total = None
        try:
            table = tables.load(ref)
            stats = tables.stats(ref, table)
            ctx = tables.op_context(ref, table, stats, dry_run=False, force=False)
            if "wal_compaction" in names and config.wal_root is not None:
                # Its waiting files are written into the table.
                wal = wal_stats(configured_wal_root(config), ref)
                total = None if total is None else total + wal.bytes
                needs_spark = needs_spark or (
                    compaction_due(wal.files, wal.bytes, ctx.settings.compaction)
                    and skip_reason(OPERATIONS.get("wal_compaction"), ctx) is None
                )
            if "optimize" in names:  # the one operation that rewrites data files
                if stats.compactable_files or stats.delete_rewrite_files:
                    total = None if total is None else total + stats.data_bytes
                optimize = OPERATIONS.get("optimize")
                needs_spark = needs_spark or skip_reason(optimize, ctx) is None
        except Exception:
            total = None
    return PassOutlook(total, needs_spark)
