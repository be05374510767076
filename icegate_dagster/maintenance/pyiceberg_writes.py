"""Writes with pyiceberg (no JVM) to the project's own tables (the maintenance log, the
orphan candidates): created once whoever races, committed again after a conflict."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icegate_dagster.maintenance.identifiers import TableRef

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.schema import Schema
    from pyiceberg.table import Table
    from tenacity import Retrying


def create_table_once(catalog: Catalog, ref: TableRef, schema: Schema, **options: Any) -> Table:
    """The table ``ref``, created (with its namespace) if missing. Another maintainer
    creating it at the same moment is fine: losing that race loads the winner's."""
    for _attempt in range(3):
        try:
            catalog.create_namespace_if_not_exists(ref.namespace)
            return catalog.create_table_if_not_exists(ref.identifier, schema=schema, **options)
        except Exception:
            if catalog.table_exists(ref.identifier):
                return catalog.load_table(ref.identifier)
    return catalog.create_table_if_not_exists(ref.identifier, schema=schema, **options)


def commit_attempts() -> Retrying:
    """Attempts at one pyiceberg commit (``for attempt in commit_attempts(): with attempt:``):
    another writer committing first is retried up to five times, backing off; each
    attempt must load the table afresh."""
    from pyiceberg.exceptions import CommitFailedException
    from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

    return Retrying(
        stop=stop_after_attempt(5),
        wait=wait_exponential(multiplier=0.2, max=4),
        retry=retry_if_exception_type(CommitFailedException),
        reraise=True,
    )
