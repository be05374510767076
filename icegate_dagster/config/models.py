"""The settings tree: frozen pydantic models, one per block of ``icegate.yaml``.

:class:`IcegateConfig` holds :class:`CatalogSettings`, :class:`SparkSettings`,
:class:`LockSettings` and :class:`TableSettings` (the defaults and each table's), and a
``TableSettings`` holds one block per operation. The validators check every value;
relative paths resolve against the ``base_dir`` passed as validation context.
:func:`_config_error` turns pydantic's ``ValidationError`` into a
:class:`~icegate_dagster.errors.ConfigError` naming the key as written in the file.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from icegate_dagster.config.values import Duration, Size, format_duration, validate_sort_order
from icegate_dagster.errors import ConfigError

DEFAULT_CATALOG_NAME = "icegate"
DEFAULT_LOG_TABLE = "lakehouse._maintenance_log"

#: How long an operation waits for another maintainer to release its table.
DEFAULT_LOCK_WAIT = timedelta(seconds=30)
#: Tables maintained at once: Spark procedures spend much of their time in the driver
#: (planning, commits), so a few tables side by side keep the executors busy.
DEFAULT_PARALLEL_TABLES = 4
#: Iceberg's own floor for orphan removal: younger files may belong to writes in flight.
MIN_ORPHAN_RETENTION = timedelta(hours=24)

_IDENTIFIER_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _broken(rule: str, **where: object) -> PydanticCustomError:
    """A validation error for :func:`_config_error`: ``key`` names a key below the
    location pydantic reports, ``value`` replaces the value the message shows."""
    return PydanticCustomError("config_rule", "{rule}", {"rule": rule, **where})


def _mapping_input(value: object) -> Mapping[Any, Any]:
    # An empty YAML block (``optimize:``) is None: nothing set.
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError("must be a mapping")
    return value


def _scalar_text(value: object) -> str:
    # Catalog properties and Spark settings are strings; a YAML boolean keeps Java's spelling.
    if isinstance(value, Mapping | list) or value is None:
        raise ValueError("must be a string, number or boolean")
    return str(value).lower() if isinstance(value, bool) else str(value)


def _table_name(value: object) -> object:
    if not isinstance(value, str) or "." not in value.strip(".") or value.startswith("."):
        raise ValueError("must name a table as namespace.table")
    return value


#: The ending of a ``maintain.tables`` key that applies to a whole namespace.
NAMESPACE_WILDCARD = ".*"


def _table_key(value: object) -> object:
    """A ``maintain.tables`` key: ``namespace.table``, or ``namespace.*`` for every table of
    the namespace (no other pattern)."""
    value = _table_name(value)
    assert isinstance(value, str)
    stem = value.removesuffix(NAMESPACE_WILDCARD) if value.endswith(NAMESPACE_WILDCARD) else value
    if "*" in stem or not stem:
        raise ValueError(
            "must name a table as namespace.table, or every table of a namespace as "
            "namespace.* (no other pattern)"
        )
    return value


def namespace_key(table: str) -> str:
    """The ``maintain.tables`` key of ``table``'s whole namespace: ``ns.t`` -> ``ns.*``."""
    return table.rpartition(".")[0] + NAMESPACE_WILDCARD


def _resolve_location(value: str, base_dir: Path) -> str:
    """Make a path-like location absolute against the config file's folder.

    A bare path becomes ``file:///abs``; ``sqlite:///relative.db`` becomes
    ``sqlite:////abs/relative.db``. URIs with a scheme are left as they are.
    """
    if value.startswith("sqlite:///") and not value.startswith("sqlite:////"):
        return "sqlite:///" + str((base_dir / value[len("sqlite:///") :]).resolve())
    if "://" not in value and not value.startswith("file:"):
        return (base_dir / value).resolve().as_uri()
    return value


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _resolved(location: str, info: ValidationInfo) -> str:
    """``location`` made absolute against the ``base_dir`` of the validation context, if any."""
    base_dir = info.context.get("base_dir") if isinstance(info.context, Mapping) else None
    return _resolve_location(location, base_dir) if base_dir is not None else location


#: String to string settings passed through (pyiceberg properties, Spark settings).
_Properties = Annotated[
    Mapping[Annotated[str, BeforeValidator(str)], Annotated[str, BeforeValidator(_scalar_text)]],
    BeforeValidator(_mapping_input),
]
_TableName = Annotated[str, BeforeValidator(_table_name)]
_TableKey = Annotated[str, BeforeValidator(_table_key)]


class _Settings(BaseModel):
    """Base of every settings model: immutable, built from a mapping of known keys."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    @classmethod
    def _allowed_keys(cls) -> list[str]:
        return list(cls.model_fields)

    @model_validator(mode="before")
    @classmethod
    def _known_keys(cls, data: Any) -> Any:
        # Checked here rather than by extra="forbid" so that the message lists this model's keys.
        if isinstance(data, BaseModel):
            return data
        data = _mapping_input(data)
        for key, value in data.items():
            if key not in cls.model_fields:
                allowed = ", ".join(cls._allowed_keys())
                raise _broken(f"unknown key (allowed: {allowed})", key=key, value=value)
        return data


class CompactionSettings(_Settings):
    """WAL -> Iceberg compaction thresholds (IceGate's names)."""

    min_files: int = Field(default=10, ge=1)
    min_size_bytes: Size = 100 * 1024**2
    target_file_size: Size = 128 * 1024**2


class OptimizeSettings(_Settings):
    """Small-file rewrite of the table itself (``rewrite_data_files``)."""

    file_size_threshold: Size = 10 * 1024**2
    min_input_files: int = Field(default=5, ge=1)
    strategy: Literal["binpack", "sort"] = "binpack"
    sort_order: str | None = None
    #: Set as ``write.parquet.compression-codec`` on a table that sets none before its
    #: first rewrite: Iceberg's writer would fall back to gzip there (tables made by
    #: pyiceberg and other non-Java tools), which is 3x slower to write than zstd.
    #: ``null`` leaves such tables to that fallback.
    compression_codec: Literal["zstd", "gzip", "snappy", "lz4", "uncompressed"] | None = "zstd"
    #: ``max-file-group-size-bytes`` of the rewrite: smaller groups are written in
    #: parallel (one task each) and give more, smaller files; unset: Iceberg's 100 GB.
    max_file_group_size: Size | None = None
    #: Iceberg's ``delete-file-threshold``: a data file with at least this many delete
    #: files (position, equality or a deletion vector) is rewritten, its deletes applied,
    #: whatever its size. 1 (any delete file; Iceberg's own default is never) because
    #: every read pays for every delete file until a rewrite applies it.
    delete_file_threshold: int = Field(default=1, ge=1)
    #: Iceberg's ``delete-ratio-threshold``: a data file whose deleted rows reach this
    #: share of its rows is rewritten, its deletes applied (Iceberg counts the rows of
    #: deletes scoped to that one file: deletion vectors, Spark's position deletes).
    delete_ratio_threshold: float = Field(default=0.3, gt=0, le=1)

    @field_validator("sort_order")
    @classmethod
    def _plain_sort_order(cls, value: str | None) -> str | None:
        return None if value is None else validate_sort_order(value)


class ExpireSnapshotsSettings(_Settings):
    """Snapshot expiry: older than ``retention_threshold``, keeping the last ``retain_last``."""

    retention_threshold: Duration = timedelta(days=7)
    retain_last: int = Field(default=1, ge=1)
    #: Also drop partition specs and schemas no remaining snapshot uses (Iceberg's
    #: ``clean_expired_metadata``), so ``metadata.json`` stops growing with evolution.
    clean_expired_metadata: bool = True
    #: Delete the files only expired snapshots reach (``false``: expire the metadata only
    #: and leave those files to ``remove_orphan_files``, as seed 002's
    #: ``--expire-keep-files``).
    delete_files: bool = True


class RewritePositionDeletesSettings(_Settings):
    """Position delete files compacted, and the dangling ones (their data gone) dropped
    (``rewrite_position_delete_files``)."""

    #: A partition's position delete files are rewritten together once it has this many
    #: (Iceberg's ``min-input-files``; a group needs two at least). Any dangling delete
    #: file makes every one rewritten (``rewrite-all``), since rewriting drops the rows of
    #: data files that are gone.
    min_input_files: int = Field(default=2, ge=2)


class TableStatsSettings(_Settings):
    """Opt-in Puffin statistics (NDV sketches) for engines' cost-based planning."""

    enabled: bool = False
    #: Columns to sketch (checked against each table's schema when it runs); unset: every
    #: top-level column of a primitive type.
    columns: tuple[str, ...] | None = None

    @field_validator("columns", mode="before")
    @classmethod
    def _column_list(cls, value: object) -> object:
        if isinstance(value, str):  # a YAML scalar: say what is expected, not "tuple"
            raise ValueError("must be a list of column names, e.g. [service, tenant_id]")
        return value

    @field_validator("columns")
    @classmethod
    def _named_columns(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("must name at least one column (leave it unset for every column)")
        if any(not name.strip() for name in value):
            raise ValueError("a column name cannot be empty")
        if len(set(value)) != len(value):
            raise ValueError("names a column twice")
        return value


class RemoveOrphanFilesSettings(_Settings):
    """Orphan-file removal; never below Iceberg's 24 h floor."""

    retention_threshold: Duration = timedelta(days=7)
    dry_run: bool = False

    @field_validator("retention_threshold")
    @classmethod
    def _iceberg_floor(cls, value: timedelta) -> timedelta:
        if value < MIN_ORPHAN_RETENTION:
            raise _broken(
                "must be at least 24h (younger files may belong to writes in progress)",
                value=format_duration(value),
            )
        return value


class HealthCheckSettings(_Settings):
    """Thresholds of the asset checks (IceGate's alert levels)."""

    max_snapshots: int = Field(default=100, ge=1)
    max_wal_files: int = Field(default=1000, ge=1)
    max_wal_bytes: Size = 10 * 1024**3
    #: A WAL ingest or compaction that took longer than this is alerted on (the seed's
    #: ``compaction_duration_seconds > 300``): the exporter publishes it for the alert rules.
    max_compaction_duration: Duration = timedelta(minutes=5)


class HealthSettings(_Settings):
    """When a table counts as unhealthy and which operations become due (``maintain.health``;
    a table's own ``icegate.health.<key>`` properties override these)."""

    #: Small files in one partition at which ``optimize`` becomes due (Amoro's minor
    #: optimizing triggers at 12 fragment files).
    small_files: int = Field(default=12, ge=2)
    #: Delete files (position, equality, deletion vectors) at which delete work is due.
    delete_files: int = Field(default=1, ge=1)
    #: Manifests at which ``rewrite_manifests`` is due.
    manifests: int = Field(default=100, ge=2)
    #: Small manifests (under 3/4 of ``commit.manifest.target-size-bytes``) at which
    #: ``rewrite_manifests`` is due: planning reads each one, and merging them is cheap.
    small_manifests: int = Field(default=50, ge=2)
    #: Expirable snapshots at which ``expire_snapshots`` is due (and a tenth of the
    #: table's snapshots at least: a steady writer always has one just past retention).
    expirable_snapshots: int = Field(default=10, ge=1)
    #: A partition's health check fails below this score (0-100).
    min_score: float = Field(default=50.0, ge=0, le=100)
    #: The health trigger maintains a table at most once per this interval.
    min_interval: Duration = timedelta(minutes=2)


class TriggerSettings(_Settings):
    """How the sensors' runs are made: tables per run, the health trigger's budget per
    evaluation, and its back-off (``maintain.trigger``)."""

    #: Tables requested per evaluation, neediest first; the rest wait for the next one.
    max_tables: int = Field(default=100, ge=1)
    #: Tables the sensors put in one run: one process and one Spark session for all of them.
    tables_per_run: int = Field(default=100, ge=1, le=1000)
    #: Bytes to rewrite requested per evaluation (the first table always fits).
    max_bytes: Size = 100 * 1024**3
    #: After a table's second failed run in a row its next one waits this long, doubling...
    backoff: Duration = timedelta(minutes=1)
    #: ...up to this.
    backoff_max: Duration = timedelta(hours=1)
    #: Where the catalog cannot say which tables changed (REST, Glue, Hive), the health
    #: trigger looks at each table again at least this often (a SQL catalog tells it every
    #: table's metadata file in one query, so a changed table is looked at in the next tick).
    recheck: Duration = timedelta(minutes=10)
    #: Each sensor evaluation ends within this; what it had no time for waits for the next
    #: (Dagster cancels an evaluation at 60 s, and then keeps nothing of it).
    tick_deadline: Duration = timedelta(seconds=30)

    @field_validator("tick_deadline")
    @classmethod
    def _below_dagsters_limit(cls, value: timedelta) -> timedelta:
        if not timedelta(seconds=5) <= value <= timedelta(seconds=50):
            raise _broken(
                "must be between 5s and 50s (Dagster cancels a sensor evaluation at 60 s)",
                value=format_duration(value),
            )
        return value


class LockSettings(_Settings):
    """Where the per-table leases live, and how long one lasts (``maintain.locks``)."""

    #: SQLAlchemy URL of the lease store every maintainer shares; unset: the catalog's own
    #: SQL database, else a SQLite file beside the configuration (one host only).
    uri: str | None = None
    lease: Duration = timedelta(minutes=2)
    #: A holder that has kept a table this long is reported (``ops_succeeded`` fails).
    stuck_after: Duration = timedelta(hours=6)

    @field_validator("uri")
    @classmethod
    def _absolute_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _resolved(value, info)


class RetentionSettings(_Settings):
    """TTL: rows whose ``column`` is older than ``days`` are deleted."""

    days: int = Field(ge=1)
    column: str = "timestamp"


class TableSettings(_Settings):
    """The effective maintenance settings of one table: defaults with its overrides applied.

    Every field but ``retention`` is one operation's block, written under ``maintain:``
    (the defaults) and ``maintain.tables.<table>:`` (one table's); a new block is just a
    new field here.
    """

    compaction: CompactionSettings = CompactionSettings()
    optimize: OptimizeSettings = OptimizeSettings()
    expire_snapshots: ExpireSnapshotsSettings = ExpireSnapshotsSettings()
    remove_orphan_files: RemoveOrphanFilesSettings = RemoveOrphanFilesSettings()
    checks: HealthCheckSettings = HealthCheckSettings()
    health: HealthSettings = HealthSettings()
    rewrite_position_delete_files: RewritePositionDeletesSettings = RewritePositionDeletesSettings()
    compute_table_stats: TableStatsSettings = TableStatsSettings()
    #: ``false`` excludes the table from every maintenance operation (shown as excluded,
    #: not failing); so does the table property ``icegate.maintenance.enabled=false``.
    enabled: bool = True
    #: Tables whose property ``self-optimizing.enabled=true`` says Apache Amoro optimizes
    #: them are left to Amoro for rewrites (``optimize``, ``rewrite_position_delete_files``);
    #: ``false`` rewrites them here too.
    defer_to_amoro: bool = True
    #: Only tables with a rule (``maintain.retention`` or ``maintain.tables``) have one.
    retention: RetentionSettings | None = None

    @classmethod
    def _allowed_keys(cls) -> list[str]:
        # Listed sorted, like the other sections of the file's layout.
        return sorted(cls.model_fields)


class CatalogSettings(_Settings):
    """The ``catalog:`` block: a name plus pyiceberg properties passed through untouched."""

    name: str = DEFAULT_CATALOG_NAME
    #: Every key of the block but ``name``; ``uri`` and ``warehouse`` made absolute.
    properties: _Properties = Field(default_factory=dict)
    #: True for the embedded default, whose folder is created on first use.
    embedded: bool = False

    @field_validator("name", mode="before")
    @classmethod
    def _plain_name(cls, value: object) -> object:
        if not isinstance(value, str) or not _IDENTIFIER_RE.fullmatch(value):
            raise ValueError("must be a plain identifier (letters, digits, _)")
        return value

    @field_validator("properties")
    @classmethod
    def _absolute_locations(cls, value: Mapping[str, str], info: ValidationInfo) -> dict[str, str]:
        return {k: _resolved(v, info) if k in ("uri", "warehouse") else v for k, v in value.items()}

    @model_validator(mode="after")
    def _uri_required(self) -> CatalogSettings:
        # These catalog types find their server without a uri (or need none).
        if "uri" not in self.properties and self.properties.get("type") not in (
            "rest",
            "glue",
            "hive",
            "in-memory",
        ):
            raise PydanticCustomError(
                "missing", "Field required", {"key": "uri", "example": "sqlite:///catalog.db"}
            )
        return self


class SparkSettings(_Settings):
    """The ``spark:`` block."""

    master: str = "local[*]"
    conf: _Properties = Field(default_factory=dict)

    @classmethod
    def _allowed_keys(cls) -> list[str]:
        # Listed sorted, like the other sections of the file's layout.
        return sorted(cls.model_fields)

    @field_validator("master", mode="before")
    @classmethod
    def _non_empty(cls, value: object) -> object:
        if not isinstance(value, str) or not value:
            raise ValueError("must be a non-empty string such as local[*]")
        return value


class IcegateConfig(_Settings):
    """The whole, validated configuration (built by :func:`config_from_dict`)."""

    catalog: CatalogSettings
    #: Namespaces to maintain; None: every namespace.
    namespaces: tuple[str, ...] | None = None
    spark: SparkSettings = SparkSettings()
    #: ``wal.root``, absolute.
    wal_root: str | None = None
    log_table: _TableName = DEFAULT_LOG_TABLE
    #: The blocks under ``maintain:``; ``retention`` is always None here.
    defaults: TableSettings = TableSettings()
    #: Tables named in ``maintain.tables`` or ``maintain.retention``, defaults merged in; a
    #: ``namespace.*`` key holds the settings of that namespace's other tables.
    table_overrides: Mapping[_TableKey, TableSettings] = Field(default_factory=dict)
    source: str
    #: How long an operation waits for another maintainer's lock on its table before skipping.
    lock_wait: Duration = DEFAULT_LOCK_WAIT
    #: How many tables a pass maintains at once, sharing one Spark session.
    parallel_tables: int = DEFAULT_PARALLEL_TABLES
    #: The lease store (``maintain.locks``).
    locks: LockSettings = LockSettings()
    #: The health trigger's budget and back-off (``maintain.trigger``).
    trigger: TriggerSettings = TriggerSettings()
    #: The lease store when neither ``maintain.locks.uri`` nor a SQL catalog names one.
    locks_fallback_uri: str | None = None
    #: Every value a ``${VAR}`` put into the catalog block, ``spark.conf``, ``wal.root`` or
    #: ``maintain.locks.uri``: secrets, kept off command lines and out of every message.
    secrets: tuple[str, ...] = ()

    @field_validator("namespaces", mode="before")
    @classmethod
    def _namespace_list(cls, value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not all(isinstance(n, str) and n for n in value):
            raise ValueError("must be a list of namespace names")
        return tuple(value)

    @field_validator("wal_root", mode="before")
    @classmethod
    def _absolute_wal_root(cls, value: object, info: ValidationInfo) -> object:
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ValueError("must be a path or file:// URI")
        return _resolved(value, info)

    @field_validator("parallel_tables", mode="before")
    @classmethod
    def _table_count(cls, value: object) -> object:
        # Strict: pydantic would take 4.0, "4" or true for a number of tables.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be a whole number")
        if not 1 <= value <= 64:
            raise ValueError("must be between 1 and 64")
        return value

    def for_table(self, table: str) -> TableSettings:
        """Effective settings of ``table`` (``namespace.table``): its own entry of
        ``maintain.tables`` (laid over its namespace's), else its namespace's
        (``maintain.tables.<namespace>.*``), else the defaults."""
        own = self.table_overrides.get(table)
        if own is not None:
            return own
        return self.table_overrides.get(namespace_key(table), self.defaults)

    def with_overrides(self, **blocks: Mapping[str, Any]) -> IcegateConfig:
        """A copy whose default blocks (and every table's) have ``blocks`` merged in.

        Used by the demo, which must treat freshly written snapshots as old.
        """

        def merged(settings: TableSettings) -> TableSettings:
            return TableSettings.model_validate(_deep_merge(settings.model_dump(), blocks))

        try:
            return self.model_copy(
                update={
                    "defaults": merged(self.defaults),
                    "table_overrides": {k: merged(v) for k, v in self.table_overrides.items()},
                }
            )
        except ValidationError as exc:
            raise _config_error(exc) from None


#: Where the file writes the IcegateConfig fields that are not top-level keys of their own.
_FILE_KEYS: dict[tuple[str | int, ...], str] = {
    ("catalog", "properties"): "catalog",
    ("wal_root",): "wal.root",
    ("log_table",): "maintain.log_table",
    ("lock_wait",): "maintain.lock_wait",
    ("parallel_tables",): "maintain.parallel_tables",
    ("locks",): "maintain.locks",
    ("trigger",): "maintain.trigger",
    ("defaults",): "maintain",
    ("table_overrides",): "maintain.tables",
}


def _fail(key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"invalid config: {key} = {value!r}: {rule}")


def _config_error(
    exc: ValidationError, file_keys: Mapping[tuple[str | int, ...], str] = _FILE_KEYS
) -> ConfigError:
    """The first error of ``exc`` as a ConfigError naming the key as the file writes it.

    ``file_keys`` maps a location in the model tree to its dotted key in the file (the
    longest matching prefix wins); the rest of the location is appended.
    """
    err = exc.errors()[0]
    ctx: dict[str, Any] = err.get("ctx") or {}
    loc = (*err["loc"], *((ctx["key"],) if "key" in ctx else ()))
    parts: list[object] = list(loc)
    for size in range(len(loc), 0, -1):
        if loc[:size] in file_keys:
            parts = [file_keys[loc[:size]], *loc[size:]]
            break
    # A mapping's key that broke a rule is named by its own location.
    key = ".".join(str(p) for p in parts if p != "[key]") or "(top level)"
    if err["type"] == "missing":
        example = f" (e.g. {ctx['example']})" if "example" in ctx else ""
        return ConfigError(f"invalid config: {key} is required{example}")
    value = ctx["value"] if "value" in ctx else err.get("input")
    rule = str(ctx.get("error", err["msg"]))
    return _fail(key, value, rule)
