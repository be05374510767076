"""A table's health right after a pass: its ``healthy`` verdict (the health check every
maintained partition carries), read from the table's metadata now (pyiceberg, no JVM).

It reads the table through any :class:`TableSource` (a
:class:`~icegate_dagster.maintenance.Maintainer` is one), so this room does not depend on
the pass that uses it.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol

from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.health.checks import CheckOutcome, health_score_check
from icegate_dagster.maintenance.health.score import TableHealth, assess_table, thresholds_for

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from icegate_dagster.config import IcegateConfig, TableSettings
    from icegate_dagster.maintenance.identifiers import TableRef
    from icegate_dagster.maintenance.wal import WalStats


class TableSource(Protocol):
    """What reads a table and its settings (a ``Maintainer`` does)."""

    @property
    def config(self) -> IcegateConfig:
        """The configuration (its secrets are masked in errors)."""
        ...

    def settings(self, ref: TableRef) -> TableSettings:
        """The table's effective settings."""
        ...

    def load(self, ref: TableRef) -> Table:
        """The table's current metadata."""
        ...


def health_after(
    source: TableSource,
    key: str,
    ref: TableRef | None,
    wal: WalStats | None,
    table: Table | None = None,
) -> tuple[TableHealth | None, CheckOutcome, str | None]:
    """The table's health now (pyiceberg, no JVM; ``table`` when just loaded), its
    ``healthy`` verdict and the metadata file assessed; a table that cannot be assessed
    fails that check alone."""
    if ref is None:
        return None, health_score_check(None, 0.0, f"{key} could not be resolved"), None
    settings = source.settings(ref)
    min_score = settings.health.min_score
    try:
        iceberg = table if table is not None else source.load(ref)
        min_score = thresholds_for(settings, iceberg.properties).min_score
        health = assess_table(iceberg, key, settings, datetime.now(UTC), wal)
    except Exception as exc:  # this check fails; the table's other checks stand
        error = describe_error(exc, lambda text: scrub(text, source.config))
        check = health_score_check(None, min_score, f"cannot assess the health of {key}: {error}")
        return None, check, None
    return health, health_score_check(health, min_score), iceberg.metadata_location
