"""A catalog's tables as one configuration sees them, read from metadata (pyiceberg, no JVM):
which exist, and each one's settings, figures, exclusion, sharing and operations.

:class:`~icegate_dagster.maintenance.maintainer.Maintainer` is such a view that also
maintains them; ``status`` and the sensors read through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, TableSettings
from icegate_dagster.config.secrets import scrub
from icegate_dagster.maintenance.discovery import (
    TableLocations,
    discover_tables,
    load_table,
    resolve_table,
)
from icegate_dagster.maintenance.exclusion import Exclusion, table_exclusion
from icegate_dagster.maintenance.health.stats import StatsCache
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.log import upkeep
from icegate_dagster.maintenance.ops import OPERATIONS
from icegate_dagster.maintenance.orphans.candidates import candidates_table
from icegate_dagster.maintenance.results import TableStats
from icegate_dagster.maintenance.sharing import Sharing, table_sharing

if TYPE_CHECKING:
    from pyiceberg.catalog import Catalog
    from pyiceberg.table import Table


class CatalogTables:
    """The tables of one catalog under one configuration. ``known_locations`` gives the
    locations by metadata file already known (the trigger's looks), so that telling which
    tables share a location need not load every table."""

    def __init__(
        self,
        config: IcegateConfig,
        catalog: Catalog | None = None,
        *,
        known_locations: Callable[[], dict[str, str]] = dict,
    ) -> None:
        self.config = config
        self._catalog = catalog
        self._stats = StatsCache()
        self._locations = TableLocations(lambda: self.catalog, self._scrub, known_locations)

    @property
    def catalog(self) -> Catalog:
        """The pyiceberg catalog, opened on first use."""
        if self._catalog is None:
            self._catalog = open_catalog(self.config.catalog)
        return self._catalog

    @property
    def log_table(self) -> TableRef:
        """Where operation outcomes are appended."""
        return TableRef.parse(self.config.log_table)

    def own_tables(self) -> tuple[str, ...]:
        """The project's own tables, never maintained as a lakehouse table: the log table and
        the orphan-candidates table."""
        return (self.log_table.key, candidates_table(self.config).key)

    def discover(self) -> list[TableRef]:
        """Tables of the configured namespaces; ``_``-prefixed ones and :meth:`own_tables`
        left out."""
        return discover_tables(self.catalog, self.config.namespaces, self.own_tables())

    def resolve(self, name: str) -> TableRef:
        """Parse a user-given ``namespace.table`` and check that the table exists."""
        return resolve_table(self.catalog, name, self.config.catalog.name)

    def load(self, ref: TableRef) -> Table:
        """Load a table's current metadata; a clear error when it is gone or unreadable."""
        return load_table(self.catalog, ref, self.config.catalog.name, self._scrub)

    def settings(self, ref: TableRef) -> TableSettings:
        """The table's effective settings (the log table's own unless configured)."""
        if ref.key == self.config.log_table and ref.key not in self.config.table_overrides:
            return upkeep.log_table_settings(self.config.defaults, self.config.history.log)
        return self.config.for_table(ref.key)

    def exclusion(self, ref: TableRef, table: Table) -> Exclusion:
        """What ``ref`` is excluded from (its settings and ``table``'s properties); raises
        naming a bad ``icegate.maintenance.enabled`` value."""
        return table_exclusion(self.settings(ref), ref.key, table.properties)

    def sharing(self, ref: TableRef, table: Table) -> Sharing:
        """The tables whose location overlaps ``ref``'s, and whether that is unsafe
        (every table's location listed once per maintainer)."""
        return table_sharing(self._locations, ref.key, table)

    def operations_for(self, ref: TableRef) -> tuple[str, ...]:
        """The full pass for ``ref``: the registered operations that apply to it
        (``wal_compaction`` where ``wal.root`` is set, ``retention`` where a TTL rule is)."""
        settings = self.settings(ref)
        return tuple(op.name for op in OPERATIONS if op.applies(self.config, settings))

    def stats(self, ref: TableRef, table: Table | None = None) -> TableStats:
        """Files, bytes, small files, snapshots, rows and manifests of a table."""
        table = table if table is not None else self.load(ref)
        rule = self.settings(ref).optimize
        return self._stats.get(
            ref.key,
            table,
            rule.file_size_threshold,
            rule.min_input_files,
            delete_file_threshold=rule.delete_file_threshold,
            delete_ratio_threshold=rule.delete_ratio_threshold,
        )

    def _scrub(self, text: str) -> str:
        return scrub(text, self.config)
