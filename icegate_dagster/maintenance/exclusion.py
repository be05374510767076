"""Which operations a table is excluded from, and why: one pure decision (no I/O) that the
maintainer, ``status``, the health assessment and the sensors all read.

A table is **excluded** from every maintenance operation by its own property
``icegate.maintenance.enabled=false`` or by the configuration (``maintain.enabled: false``,
``maintain.tables.<namespace>.*.enabled: false``, ``maintain.tables.<t>.enabled: false``);
either one is enough. A table another optimizer owns, Apache Amoro's
``self-optimizing.enabled=true``, has its **rewrites** (:data:`REWRITES`) left to that
optimizer unless ``defer_to_amoro: false``: two optimizers rewriting the same files only
make each other's commits fail. Everything else still runs there.

An excluded operation is skipped (status ``skipped``, the reason as its details), never
due in the health model, and shown as excluded rather than failing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from icegate_dagster.errors import ConfigError

if TYPE_CHECKING:
    from icegate_dagster.config import IcegateConfig, TableSettings

#: The table property that excludes a table from maintenance (``false``).
ENABLED_PROPERTY = "icegate.maintenance.enabled"
#: Apache Amoro's table property: ``true`` when Amoro optimizes the table itself.
AMORO_PROPERTY = "self-optimizing.enabled"
#: The operations that rewrite a table's data and delete files: what another optimizer
#: (Amoro's self-optimizing) does itself.
REWRITES = frozenset({"optimize", "rewrite_position_delete_files"})


@dataclass(frozen=True)
class Exclusion:
    """What a table is excluded from: ``table`` (every operation) or ``rewrites``
    (:data:`REWRITES` only), each the reason, or ``None``."""

    #: Why the table is excluded from every operation, or ``None``.
    table: str | None = None
    #: Why its rewrites are left to another optimizer, or ``None``.
    rewrites: str | None = None
    #: Who excludes it: ``property``, ``config`` or ``amoro`` (empty: nobody).
    by: str = ""

    def reason(self, operation: str) -> str | None:
        """Why ``operation`` does not run on the table, or ``None`` when it may."""
        if self.table is not None:
            return self.table
        return self.rewrites if operation in REWRITES else None

    def operations(self, names: Iterable[str]) -> dict[str, str]:
        """Each of ``names`` the table is excluded from, with the reason."""
        return {name: why for name in names if (why := self.reason(name)) is not None}

    @property
    def excluded(self) -> bool:
        """The whole table is excluded."""
        return self.table is not None

    @property
    def summary(self) -> str | None:
        """One line for a person (``status``, a partition's page, a skip reason), or
        ``None`` when nothing is excluded."""
        if self.table is not None:
            return self.table
        if self.rewrites is not None:
            return f"{', '.join(sorted(REWRITES))}: {self.rewrites}"
        return None


NOT_EXCLUDED = Exclusion()


def _flag(properties: Mapping[str, str], name: str) -> bool | None:
    value = properties.get(name)
    if value is None:
        return None
    text = value.strip().lower()
    if text in ("true", "false"):
        return text == "true"
    if name == AMORO_PROPERTY:
        return None  # Amoro's own property: anything else is Amoro's business, not ours
    raise ConfigError(f"invalid table property {name} = {value!r}: must be true or false")


def table_exclusion(settings: TableSettings, key: str, properties: Mapping[str, str]) -> Exclusion:
    """What ``key`` (with its effective ``settings`` and its table ``properties``) is
    excluded from. Pure; a value of ``icegate.maintenance.enabled`` other than
    ``true``/``false`` (any case) raises :class:`ConfigError` naming it, so no operation
    runs on a table whose owner meant something else."""
    if _flag(properties, ENABLED_PROPERTY) is False:
        return Exclusion(
            table=f"excluded from maintenance: table property {ENABLED_PROPERTY}=false on {key}",
            by="property",
        )
    if not settings.enabled:
        return Exclusion(
            table=f"excluded from maintenance by the configuration: enabled: false for {key} "
            "(maintain.enabled, maintain.tables.<namespace>.* or maintain.tables.<table>)",
            by="config",
        )
    if settings.defer_to_amoro and _flag(properties, AMORO_PROPERTY):
        return Exclusion(
            rewrites=f"left to Apache Amoro, which optimizes {key} ({AMORO_PROPERTY}=true); "
            "set maintain.defer_to_amoro: false to rewrite it here too",
            by="amoro",
        )
    return NOT_EXCLUDED


def exclusion_of(config: IcegateConfig, key: str, properties: Mapping[str, str]) -> Exclusion:
    """:func:`table_exclusion` with ``key``'s settings from ``config``: what the sensors
    and ``status`` call for a table they list (``key`` as ``namespace.table``)."""
    return table_exclusion(config.for_table(key), key, properties)
