"""``retention``: TTL, delete rows whose time column is older than the table's rule.

Runs only on tables with a rule (``maintain.retention.<table>`` or
``maintain.tables.<table>.retention``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance.identifiers import TableRef, quote_identifier, sql_string
from icegate_dagster.maintenance.leases.store import check_lease
from icegate_dagster.maintenance.ops.base import OpContext, Operation
from icegate_dagster.maintenance.ops.procedures import timestamp_literal, utc, wall_clock
from icegate_dagster.maintenance.results import Outcome

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import IcegateConfig, RetentionSettings, TableSettings


def retention_condition(
    ref: TableRef, rule: RetentionSettings, cutoff: datetime, table: Table
) -> tuple[str, str]:
    """The TTL filter for ``rule.column`` from its Iceberg type, and the bound for people.

    The filter holds exactly for rows past ``cutoff`` whatever the session time zone:
    ``timestamptz`` is compared with the instant, ``timestamp`` (a UTC wall clock by
    convention) with the cutoff's UTC wall clock, and ``date`` with the cutoff's UTC
    date (a day is past once it ended, at the next midnight UTC, by the cutoff).
    """
    from pyiceberg import types as t

    try:
        field = table.schema().find_field(rule.column, case_sensitive=False)
    except ValueError:
        raise OperationError(
            f"table {ref.key}: retention column {rule.column!r} is not in the table"
        ) from None
    column = quote_identifier(rule.column)
    wall = wall_clock(cutoff)
    kind = field.field_type
    if isinstance(kind, t.TimestamptzType):
        return f"{column} < {timestamp_literal(cutoff)}", f"{wall} UTC"
    if isinstance(kind, t.TimestampType):
        return f"{column} < TIMESTAMP_NTZ {sql_string(wall)}", f"{wall} (UTC wall clock)"
    if isinstance(kind, t.DateType):
        day = utc(cutoff).date().isoformat()
        return f"{column} < DATE {sql_string(day)}", f"{day} (days that ended by the cutoff)"
    raise OperationError(
        f"table {ref.key}: retention column {rule.column!r} has type {kind}; "
        "TTL needs a timestamptz, timestamp or date column"
    )


class Retention(Operation):
    """Rows past the TTL deleted; a filter aligned with the partitions drops whole files."""

    name = "retention"
    description = "Delete rows past the table's TTL rule, where one is configured (Spark)."
    settings_block = "retention"

    def applies(self, config: IcegateConfig, settings: TableSettings) -> bool:
        return settings.retention is not None

    def plan(self, ctx: OpContext) -> str | None:
        return "no retention rule for this table" if ctx.settings.retention is None else None

    def run(self, ctx: OpContext) -> Outcome:
        rule = ctx.settings.retention
        if rule is None:  # asked for by name on a table without a rule
            return Outcome.skip(
                ("dry run: " if ctx.dry_run else "") + "no retention rule for this table"
            )
        if ctx.dry_run:
            return Outcome.skip(
                f"dry run: rows with {rule.column} older than {rule.days} days would be deleted"
            )
        cutoff = utc(ctx.now) - timedelta(days=rule.days)
        condition, bound = retention_condition(ctx.ref, rule, cutoff, ctx.table)
        spark = ctx.spark()
        name = ctx.ref.spark_identifier(ctx.catalog_name)
        doomed = int(spark.sql(f"SELECT count(*) FROM {name} WHERE {condition}").collect()[0][0])
        if doomed:
            check_lease()
            spark.sql(f"DELETE FROM {name} WHERE {condition}")
        return Outcome.done(
            f"deleted {doomed} rows with {rule.column} before {bound} ({rule.days} days)",
            rows_deleted=doomed,
            cutoff=cutoff.isoformat(),
        )
