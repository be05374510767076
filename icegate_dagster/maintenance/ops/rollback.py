"""``rollback``: make an earlier snapshot current again. Run by ``icegate-maintain
rollback`` and the ``rollback_job``, never by a pass, so it is not in the registry."""

from __future__ import annotations

from typing import TYPE_CHECKING

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import call_procedure
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from pyiceberg.table import Table


class RollbackToSnapshot(Operation):
    """``rollback_to_snapshot`` to one snapshot of the table's history."""

    name = "rollback"
    description = "Make an earlier snapshot of the table current again (Spark)."
    settings_block = ""  # no settings
    needs_snapshot = False  # a table with history but no current snapshot can roll back
    # A person's explicit repair, not maintenance: it runs on excluded tables too.
    excludable = False

    def __init__(self, snapshot_id: int) -> None:
        self.snapshot_id = int(snapshot_id)

    def require_in_history(self, key: str, table: Table) -> None:
        """Raise unless the snapshot is in ``table``'s history (checked before a lease)."""
        known = [s.snapshot_id for s in table.metadata.snapshots]
        if self.snapshot_id not in known:
            raise OperationError(
                f"snapshot {self.snapshot_id} is not in the history of {key} "
                f"(its snapshots: {', '.join(map(str, known[-10:])) or 'none'})"
            )

    def run(self, ctx: OpContext) -> Outcome:
        args = {"table": ctx.ref.procedure_argument(), "snapshot_id": str(self.snapshot_id)}
        called = call_procedure(ctx.spark(), ctx.catalog_name, "rollback_to_snapshot", args)
        out = called.rows[0].asDict()
        return Outcome(
            "completed",
            f"rolled back from snapshot {out['previous_snapshot_id']} "
            f"to {out['current_snapshot_id']}",
            out,
        )
