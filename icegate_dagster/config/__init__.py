"""Configuration: ``icegate.yaml`` loading, validation and per-table settings.

Where the file comes from: ``--config PATH``, else ``$ICEGATE_CONFIG``, else
``./icegate.yaml``; with none, the embedded default lakehouse in ``./.icegate/``.
``${VAR}`` in any string is replaced by the environment variable, so secrets stay
out of the file.

The configuration is one tree of frozen pydantic models: :class:`IcegateConfig`
holds :class:`CatalogSettings`, :class:`SparkSettings`, :class:`LockSettings` and
:class:`TableSettings` (the defaults and each table's), and a ``TableSettings``
holds one block per operation. :func:`config_from_dict` maps the file's layout
onto that tree (``maintain.tables`` and ``maintain.retention`` merged onto the
defaults) and the models' validators check every value; relative paths resolve
against the config file's folder, passed as validation context. Every invalid
value fails at load with a :class:`ConfigError` naming the key as written in the
file and the value.

The package, by concern: :mod:`~icegate_dagster.config.values` (sizes, durations,
sort orders), :mod:`~icegate_dagster.config.models` (the settings tree) and
:mod:`~icegate_dagster.config.loading` (from a file or dict to an ``IcegateConfig``).
Import from here.
"""

from __future__ import annotations

from icegate_dagster.config.loading import (
    CONFIG_ENV_VAR,
    DEFAULT_CONFIG_FILE,
    EMBEDDED_DIR,
    SPARK_REMOTE_ENV,
    config_from_dict,
    embedded_default_dict,
    load_config,
    resolve_config_path,
)
from icegate_dagster.config.models import (
    DEFAULT_CATALOG_NAME,
    DEFAULT_LOCK_WAIT,
    DEFAULT_LOG_TABLE,
    DEFAULT_PARALLEL_TABLES,
    MIN_ORPHAN_RETENTION,
    NAMESPACE_WILDCARD,
    CatalogSettings,
    CompactionSettings,
    ExpireSnapshotsSettings,
    HealthCheckSettings,
    HealthSettings,
    IcegateConfig,
    LockSettings,
    OptimizeSettings,
    RemoveOrphanFilesSettings,
    RetentionSettings,
    RewritePositionDeletesSettings,
    SparkSettings,
    TableSettings,
    TableStatsSettings,
    TriggerSettings,
    namespace_key,
)
from icegate_dagster.config.values import (
    Duration,
    Size,
    format_bytes,
    format_duration,
    parse_duration,
    parse_size,
    validate_sort_order,
)

__all__ = [
    "CONFIG_ENV_VAR",
    "DEFAULT_CATALOG_NAME",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_LOCK_WAIT",
    "DEFAULT_LOG_TABLE",
    "DEFAULT_PARALLEL_TABLES",
    "EMBEDDED_DIR",
    "MIN_ORPHAN_RETENTION",
    "NAMESPACE_WILDCARD",
    "SPARK_REMOTE_ENV",
    "CatalogSettings",
    "CompactionSettings",
    "Duration",
    "ExpireSnapshotsSettings",
    "HealthCheckSettings",
    "HealthSettings",
    "IcegateConfig",
    "LockSettings",
    "OptimizeSettings",
    "RemoveOrphanFilesSettings",
    "RetentionSettings",
    "RewritePositionDeletesSettings",
    "Size",
    "SparkSettings",
    "TableSettings",
    "TableStatsSettings",
    "TriggerSettings",
    "config_from_dict",
    "embedded_default_dict",
    "format_bytes",
    "format_duration",
    "load_config",
    "namespace_key",
    "parse_duration",
    "parse_size",
    "resolve_config_path",
    "validate_sort_order",
]
