"""The log table's own upkeep: every pass appends to it, so it would rot like any table.

Its small files, snapshots and manifests are compacted, expired and rewritten once they
pass bounds, planned from metadata (most passes start no Spark job for it). Its
outcomes are returned, not logged into itself.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from icegate_dagster.config import TableSettings

if TYPE_CHECKING:
    from icegate_dagster.maintenance.results import TableStats

#: The log table keeps this many snapshots; it is expired once it has twice as many.
LOG_TABLE_SNAPSHOTS = 20
#: Small log files compacted together, and manifests above which they are rewritten.
LOG_TABLE_SMALL_FILES = 20
LOG_TABLE_MAX_MANIFESTS = 20


def log_table_settings(defaults: TableSettings) -> TableSettings:
    """Nobody time-travels the log table, so it keeps its last ``LOG_TABLE_SNAPSHOTS``
    snapshots whatever their age, and compacts its one-file appends in groups of
    ``LOG_TABLE_SMALL_FILES`` (``maintain.tables.<log table>`` overrides all of this).
    Every pass appends to it, so ``maintain.enabled: false`` does not stop its upkeep
    (only its own entry, or its ``icegate.maintenance.enabled`` property, does)."""
    return defaults.model_copy(
        update={
            "enabled": True,
            "optimize": defaults.optimize.model_copy(
                update={"min_input_files": LOG_TABLE_SMALL_FILES}
            ),
            "expire_snapshots": defaults.expire_snapshots.model_copy(
                update={
                    "retention_threshold": timedelta(seconds=1),
                    "retain_last": LOG_TABLE_SNAPSHOTS,
                }
            ),
            "retention": None,
        }
    )


def due_operations(stats: TableStats) -> list[str]:
    """The operations the log table is due for, in pass order (orphan removal is planned
    from one listing when it runs, so it is usually skipped then)."""
    due = []
    if stats.compactable_files:
        due.append("optimize")
    if stats.manifests > LOG_TABLE_MAX_MANIFESTS:
        due.append("rewrite_manifests")
    if stats.snapshots > 2 * LOG_TABLE_SNAPSHOTS:
        due.append("expire_snapshots")
    due.append("remove_orphan_files")
    return due
