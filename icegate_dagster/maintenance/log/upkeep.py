"""The log table's own upkeep: every pass appends to it, so it would rot like any table.

Its rows older than ``maintain.history.log`` are deleted (the ``retention`` operation on
``executed_at``, an absolute instant), and its small files, snapshots and manifests are
compacted, expired and rewritten once they pass bounds, all planned from metadata (most
passes start no Spark job for it): :func:`maintain_log_table`, after every pass. Its
outcomes are returned, not logged into itself.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Protocol

from icegate_dagster.config import RetentionSettings, TableSettings
from icegate_dagster.errors import TableNotFoundError

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.maintenance.identifiers import TableRef
    from icegate_dagster.maintenance.results import OpResult, TableStats

#: The log table keeps this many snapshots; it is expired once it has twice as many.
LOG_TABLE_SNAPSHOTS = 20
#: Small log files compacted together, and manifests above which they are rewritten.
LOG_TABLE_SMALL_FILES = 20
LOG_TABLE_MAX_MANIFESTS = 20
#: The log's time column, which its history rule compares with the cutoff.
LOG_TIME_COLUMN = "executed_at"
#: Rows are deleted once the oldest is this far past the rule: a delete rewrites the log's
#: files (and makes the exporter read its rows again), so once a day, not at every pass.
LOG_RETENTION_SLACK = timedelta(days=1)


def log_history_rule(keep: timedelta | None) -> RetentionSettings | None:
    """The log's TTL rule for ``maintain.history.log`` (None: kept forever), in whole days
    (the TTL rule's unit; a part of a day is dropped)."""
    if keep is None:
        return None
    return RetentionSettings(days=max(1, keep.days), column=LOG_TIME_COLUMN)


def log_table_settings(defaults: TableSettings, keep: timedelta | None = None) -> TableSettings:
    """Nobody time-travels the log table, so it keeps its last ``LOG_TABLE_SNAPSHOTS``
    snapshots whatever their age, compacts its one-file appends in groups of
    ``LOG_TABLE_SMALL_FILES``, and keeps its rows for ``keep`` (``maintain.history.log``)
    (``maintain.tables.<log table>`` overrides all of this). Every pass appends to it, so
    ``maintain.enabled: false`` does not stop its upkeep (only its own entry, or its
    ``icegate.maintenance.enabled`` property, does)."""
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
            "retention": log_history_rule(keep),
        }
    )


def rows_past_history(
    table: Table, rule: RetentionSettings | None, now: datetime
) -> datetime | None:
    """The cutoff of ``rule`` when the log holds a row older than it by more than
    :data:`LOG_RETENTION_SLACK`, read from its files' column bounds (no rows, no JVM);
    None when nothing is due."""
    from pyiceberg.expressions import LessThan

    if rule is None or table.current_snapshot() is None:
        return None
    cutoff = now - timedelta(days=rule.days)
    bound = (cutoff - LOG_RETENTION_SLACK).isoformat()
    # pyiceberg's runtime signature is (term, literal); its pydantic stub hides that from mypy.
    old = LessThan(rule.column, bound)  # type: ignore[call-arg,arg-type]
    return cutoff if any(True for _ in table.scan(row_filter=old).plan_files()) else None


def due_operations(stats: TableStats, history_due: bool = False) -> list[str]:
    """The operations the log table is due for, in pass order (orphan removal is planned
    from one listing when it runs, so it is usually skipped then); ``retention`` first when
    :func:`rows_past_history` found rows to delete."""
    due = ["retention"] if history_due else []
    if stats.compactable_files:
        due.append("optimize")
    if stats.manifests > LOG_TABLE_MAX_MANIFESTS:
        due.append("rewrite_manifests")
    if stats.snapshots > 2 * LOG_TABLE_SNAPSHOTS:
        due.append("expire_snapshots")
    due.append("remove_orphan_files")
    return due


class LogTableMaintainer(Protocol):
    """What the upkeep asks of a maintainer (a
    :class:`~icegate_dagster.maintenance.maintainer.Maintainer` is one)."""

    @property
    def log_table(self) -> TableRef: ...

    def load(self, ref: TableRef) -> Table: ...

    def stats(self, ref: TableRef, table: Table | None = None) -> TableStats: ...

    def settings(self, ref: TableRef) -> TableSettings: ...

    def run_op(self, ref: TableRef, operation: str) -> OpResult: ...


def log_table_due(maintainer: LogTableMaintainer) -> list[str] | None:
    """The operations the log table is due for (:func:`due_operations`), from its metadata
    (no JVM); None when there is no log table yet."""
    ref = maintainer.log_table
    try:
        table = maintainer.load(ref)
        stats = maintainer.stats(ref, table)
    except TableNotFoundError:
        return None
    rule = maintainer.settings(ref).retention
    try:
        history_due = rows_past_history(table, rule, datetime.now(UTC)) is not None
    except Exception:  # unreadable bounds: the retention operation finds out itself
        history_due = rule is not None
    return due_operations(stats, history_due)


def maintain_log_table(maintainer: LogTableMaintainer) -> list[OpResult]:
    """Keep the log table from rotting: run the operations it is due for
    (:func:`log_table_due`); an absent log table needs nothing."""
    due = log_table_due(maintainer)
    return [maintainer.run_op(maintainer.log_table, operation) for operation in due or ()]
