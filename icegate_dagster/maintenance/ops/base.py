"""What every maintenance operation is: an :class:`Operation`, run with an :class:`OpContext`.

An operation names itself, says which tables it applies to, plans from metadata
alone (a reason to skip, or ``None`` when there is work) and runs, returning an
:class:`~icegate_dagster.maintenance.results.Outcome`. The gates every operation
shares (GC turned off, a table with no snapshot yet) live in :func:`perform`, so an
operation's module holds only what is its own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, ClassVar

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.discovery import wal_root_conflict
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.results import Outcome, TableStats

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from icegate_dagster.config import IcegateConfig, TableSettings
    from icegate_dagster.maintenance.discovery import TableLocations

SparkProvider = Callable[[], "SparkSession"]
#: Test-only: called at each WAL compaction checkpoint (see ``maintenance.wal``).
FaultHook = Callable[[str], None]


@dataclass(frozen=True)
class OpContext:
    """Everything an operation may use on one table."""

    ref: TableRef
    #: The table's metadata as loaded right before the operation (pyiceberg).
    table: Table
    before: TableStats
    #: The table's effective settings; each operation reads its own block.
    settings: TableSettings
    config: IcegateConfig
    #: The operation's clock: cutoffs are ``now`` minus a threshold.
    now: datetime
    #: Starts (or returns) the Spark session: nothing starts a JVM until it is called.
    spark: SparkProvider
    #: Every table's location, listed once per pass (orphan removal refuses overlaps).
    locations: TableLocations
    #: Plan only: change nothing, say what would be done.
    dry_run: bool = False
    #: Run even below the operation's thresholds (``compact --force``).
    force: bool = False
    fault_hook: FaultHook | None = None

    @property
    def catalog_name(self) -> str:
        """The catalog's name in Spark (``CALL <catalog>.system...``)."""
        return self.config.catalog.name


class Operation(ABC):
    """One maintenance operation. Subclasses set the class attributes and ``run``."""

    #: The name in log rows, Dagster steps, metadata keys and ``plan.config.operations``.
    name: ClassVar[str]
    #: One sentence for the Dagster step and the CLI help.
    description: ClassVar[str]
    #: The settings block it reads (``maintain.<block>`` / ``maintain.tables.<t>.<block>``).
    settings_block: ClassVar[str]
    #: The ``icegate-maintain`` subcommand running only this operation, if any.
    cli_command: ClassVar[str | None] = None
    #: Help for ``--force`` on that subcommand; ``None``: no such flag.
    force_help: ClassVar[str | None] = None
    #: It deletes files: Iceberg refuses it where ``gc.enabled=false``, so it is skipped there.
    deletes_files: ClassVar[bool] = False
    #: A table with no snapshot yet has nothing for it (WAL ingest is the exception).
    needs_snapshot: ClassVar[bool] = True
    #: ``output`` figures summed over a table's operations into its partition metadata.
    metadata_sums: ClassVar[tuple[str, ...]] = ()

    def applies(self, config: IcegateConfig, settings: TableSettings) -> bool:
        """Whether a full pass of a table with ``settings`` runs this operation."""
        return True

    def plan(self, ctx: OpContext) -> str | None:
        """Why there is nothing to do, from metadata alone; ``None`` when there is work.

        May raise :class:`OperationError` when the operation must not run on this table.
        """
        return None

    @abstractmethod
    def run(self, ctx: OpContext) -> Outcome:
        """Do the work (under ``ctx.dry_run``: say what would be done, change nothing)."""


def gc_disabled(table: Table) -> str | None:
    """Why file-deleting operations are planned away on ``table``, or ``None`` when GC is on.

    Iceberg reads ``gc.enabled`` as Java's ``Boolean.parseBoolean``: any value other than
    ``true`` (any case) turns GC off, and then ``expire_snapshots`` and
    ``remove_orphan_files`` throw ``ValidationException: ... GC is disabled``.
    """
    value = table.properties.get("gc.enabled")
    if value is None or value.lower() == "true":
        return None
    return (
        f"gc.enabled={value} on this table: its files may be shared (Nessie sets this; so do "
        "tables that share files), so snapshots are not expired and orphans not removed here. "
        "Run the catalog owner's own GC instead (for Nessie: Nessie GC's mark-and-sweep, "
        "see README 'Tables with GC turned off'); compaction still runs"
    )


def refuse_crossing_paths(operation: str, ctx: OpContext) -> None:
    """Paths cannot cross: orphan removal would delete waiting WAL files, and WAL work
    would list the table's own files, where ``wal.root`` and the table folder overlap."""
    conflict = wal_root_conflict(ctx.ref.key, ctx.table.location(), ctx.config.wal_root)
    if conflict is not None:
        raise OperationError(f"refusing {operation} on {ctx.ref.key}: {conflict}")


def perform(operation: Operation, ctx: OpContext) -> Outcome:
    """Run ``operation`` through the gates every operation shares, then its own plan.

    Planned from metadata: an operation with nothing to do starts no Spark job.
    """
    if operation.deletes_files:
        gc_off = gc_disabled(ctx.table)
        if gc_off is not None:
            return Outcome.skip(gc_off)
    if operation.needs_snapshot and ctx.table.current_snapshot() is None:
        return Outcome.skip("table has no snapshot yet: nothing to maintain")
    reason = operation.plan(ctx)
    if reason is not None:
        return Outcome.skip(reason)
    return operation.run(ctx)
