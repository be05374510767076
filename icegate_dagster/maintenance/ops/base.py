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
from typing import TYPE_CHECKING, Any, ClassVar

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.discovery import wal_root_conflict
from icegate_dagster.maintenance.exclusion import Exclusion, table_exclusion
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.results import Outcome, TableStats
from icegate_dagster.maintenance.wal.checkpoints import FaultHook as FaultHook

if TYPE_CHECKING:
    from pyiceberg.table import Table
    from pyspark.sql import SparkSession

    from icegate_dagster.config import IcegateConfig, TableSettings
    from icegate_dagster.maintenance.discovery import TableLocations

SparkProvider = Callable[[], "SparkSession"]


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
    #: The run this operation belongs to (log rows, recorded candidates).
    run_id: str = ""

    @property
    def catalog_name(self) -> str:
        """The catalog's name in Spark (``CALL <catalog>.system...``)."""
        return self.config.catalog.name

    @property
    def exclusion(self) -> Exclusion:
        """What the table is excluded from (its properties as loaded, its settings)."""
        return table_exclusion(self.settings, self.ref.key, self.table.properties)

    @property
    def on_connect(self) -> bool:
        """Whether Spark is a Spark Connect server's (starts or joins the session): its JVM
        is out of reach, so Iceberg's Java API gives way to procedures, SQL and pyiceberg."""
        from icegate_dagster.spark.remote import is_remote

        return is_remote(self.spark())

    @property
    def small(self) -> bool:
        """Whether the table is small enough for metadata-bound work in one process (the
        Spark driver's table API, or pyiceberg here) rather than a distributed procedure."""
        from icegate_dagster.maintenance.iceberg_java import (
            DRIVER_SIDE_MAX_FILES,
            DRIVER_SIDE_MAX_MANIFESTS,
        )

        before = self.before
        return (
            before.data_files + before.delete_files <= DRIVER_SIDE_MAX_FILES
            and before.manifests <= DRIVER_SIDE_MAX_MANIFESTS
            and before.snapshots <= DRIVER_SIDE_MAX_MANIFESTS
        )

    @property
    def driver_side(self) -> bool:
        """Whether the table is :attr:`small` and Spark's driver is ours, for its table API;
        never on Spark Connect, where the driver is a server's (starts Spark when the table
        is small)."""
        return self.small and not self.on_connect

    def java_table(self) -> Any:
        """Iceberg's Java table of this table on the Spark driver (starts Spark); refused on
        Spark Connect, whose callers take their Connect equivalent instead."""
        from icegate_dagster.maintenance.iceberg_java import java_table

        identifier = self.ref.spark_identifier(self.catalog_name)
        return java_table(self.spark(), identifier, self.catalog_name)


#: What planning says: ``None`` when there is work, else why not (a reason, or a skipped
#: :class:`Outcome` that also carries figures).
Plan = str | Outcome | None


class Operation(ABC):
    """One maintenance operation. Subclasses set the class attributes and ``run``."""

    #: The name in log rows, Dagster steps, metadata keys and ``plan.config.operations``.
    name: ClassVar[str]
    #: One sentence for the Dagster step and the CLI help.
    description: ClassVar[str]
    #: The field of ``TableSettings`` it reads (``maintain.<block>``,
    #: ``maintain.tables.<t>.<block>``); ``""`` for none. The registry checks it exists.
    settings_block: ClassVar[str]
    #: The ``icegate-maintain`` subcommand running only this operation, if any.
    cli_command: ClassVar[str | None] = None
    #: Help for ``--force`` on that subcommand; ``None``: no such flag.
    force_help: ClassVar[str | None] = None
    #: Help for ``--dry-run`` on that subcommand.
    dry_run_help: ClassVar[str] = "plan only (as run --dry-run): change nothing"
    #: It deletes files: Iceberg refuses it where ``gc.enabled=false``, so it is skipped there.
    deletes_files: ClassVar[bool] = False
    #: A table excluded from maintenance (``icegate.maintenance.enabled=false``, the
    #: config's ``enabled: false``; see :mod:`..exclusion`) skips it. ``False`` only for a
    #: person's explicit command that is no maintenance (``rollback``).
    excludable: ClassVar[bool] = True
    #: It runs under the table's lease (unless a dry run); ``False`` for an operation that
    #: changes no file of the table.
    holds_lease: ClassVar[bool] = True
    #: A table with no snapshot yet has nothing for it (WAL ingest is the exception).
    needs_snapshot: ClassVar[bool] = True
    #: A dry run describes the work from settings and stats (``run`` under ``dry_run``)
    #: without planning first; ``False``: a dry run plans, then runs in dry mode.
    dry_run_describes: ClassVar[bool] = True
    #: ``output`` figures summed over a table's operations into its partition metadata and
    #: the CLI's before/after table: key -> column title.
    metadata_sums: ClassVar[dict[str, str]] = {}

    def applies(self, config: IcegateConfig, settings: TableSettings) -> bool:
        """Whether a full pass of a table with ``settings`` runs this operation."""
        return True

    def refuse(self, ctx: OpContext) -> None:  # noqa: B027 (optional hook, no-op by default)
        """Raise :class:`OperationError` when the operation must not run on this table at
        all (checked before every other gate, so a misconfiguration is never skipped)."""

    def plan(self, ctx: OpContext) -> Plan:
        """Whether there is work, from the table's metadata (and, for some operations,
        a listing of its folder); see :data:`Plan`. Changes nothing."""
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
        "see docs/concepts/sharing-and-opt-out.md); compaction still runs"
    )


def refuse_crossing_paths(operation: str, ctx: OpContext) -> None:
    """Paths cannot cross: orphan removal would delete waiting WAL files, and WAL work
    would list the table's own files, where ``wal.root`` and the table folder overlap."""
    conflict = wal_root_conflict(ctx.ref.key, ctx.table.location(), ctx.config.wal_root)
    if conflict is not None:
        raise OperationError(f"refusing {operation} on {ctx.ref.key}: {conflict}")


def skip_reason(operation: Operation, ctx: OpContext) -> Outcome | None:
    """Why ``operation`` has nothing to do on the table: the table's exclusion (nothing
    else is looked at on an excluded table), its refusal (raised), then the gates every
    operation shares, then its own plan; ``None`` when there is work."""
    if operation.excludable:
        exclusion = ctx.exclusion
        excluded = exclusion.reason(operation.name)
        if excluded is not None:
            return Outcome.skip(excluded, excluded=True, excluded_by=exclusion.by)
    operation.refuse(ctx)
    if operation.deletes_files:
        gc_off = gc_disabled(ctx.table)
        if gc_off is not None:
            return Outcome.skip(gc_off)
    if operation.needs_snapshot and ctx.table.current_snapshot() is None:
        return Outcome.skip("table has no snapshot yet: nothing to maintain")
    if ctx.dry_run and operation.dry_run_describes:
        return None
    plan = operation.plan(ctx)
    return Outcome.skip(plan) if isinstance(plan, str) else plan


def perform(operation: Operation, ctx: OpContext) -> Outcome:
    """Run ``operation`` unless planning finds nothing to do (then no Spark job starts)."""
    skipped = skip_reason(operation, ctx)
    return skipped if skipped is not None else operation.run(ctx)
