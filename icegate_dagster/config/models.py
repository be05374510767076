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

from icegate_dagster.config.values import (
    Duration,
    Size,
    format_duration,
    parse_duration,
    validate_sort_order,
)
from icegate_dagster.errors import ConfigError

DEFAULT_CATALOG_NAME = "icegate"
DEFAULT_LOG_TABLE = "lakehouse._maintenance_log"

#: How long an operation waits for another maintainer to release its table.
DEFAULT_LOCK_WAIT = timedelta(seconds=30)
#: Tables maintained at once: Spark procedures spend much of their time in the driver
#: (planning, commits), so a few tables side by side keep the executors busy.
DEFAULT_PARALLEL_TABLES = 4
#: Prefixes of the catalog properties that configure storage (pyiceberg's FileIO names):
#: what ``wal.root`` is opened with when ``wal.storage`` is not set.
STORAGE_PREFIXES = ("s3.", "client.", "gcs.", "adls.", "hdfs.")
#: The region of a store named by ``s3.endpoint`` when none is set: what S3-compatible
#: stores expect by default (asking AWS for the bucket's region would ask about a
#: stranger's bucket of the same name).
DEFAULT_S3_REGION = "us-east-1"
#: Iceberg's own floor for orphan removal: younger files may belong to writes in flight.
MIN_ORPHAN_RETENTION = timedelta(hours=24)
#: Bounds of ``maintain.parallel_tables``.
MIN_PARALLEL_TABLES, MAX_PARALLEL_TABLES = 1, 64
#: Bounds of ``maintain.trigger.tick_deadline``: Dagster cancels a sensor evaluation at 60 s.
MIN_TICK_DEADLINE, MAX_TICK_DEADLINE = timedelta(seconds=5), timedelta(seconds=50)
#: ``json_schema_extra`` of a field the loader fills in, never a key of the file (the
#: configuration reference leaves it out).
DERIVED: dict[str, Any] = {"icegate_derived": True}


def _bounds(low: object = None, high: object = None) -> dict[str, Any]:
    """``json_schema_extra`` naming the bounds a validator enforces (one that gives its own
    message), so that the configuration reference shows them from the same constants."""

    def shown(value: object) -> object:
        return format_duration(value) if isinstance(value, timedelta) else value

    return {
        **({"minimum": shown(low)} if low is not None else {}),
        **({"maximum": shown(high)} if high is not None else {}),
    }


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


#: Catalog types whose server keeps the tables' locations (they find it without a ``uri``).
SERVER_CATALOG_TYPES = ("rest", "glue", "hive")


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

    min_files: int = Field(
        default=10, ge=1, description="a table's WAL is ingested once it has this many files..."
    )
    min_size_bytes: Size = Field(
        default=100 * 1024**2, description="...or this many bytes, whichever comes first"
    )
    target_file_size: Size = Field(
        default=128 * 1024**2,
        description="size of the data files the ingest writes (Iceberg `target-file-size-bytes`)",
    )


class OptimizeSettings(_Settings):
    """Small-file rewrite of the table itself (``rewrite_data_files``)."""

    file_size_threshold: Size = Field(
        default=10 * 1024**2,
        description="data files smaller than this are compaction candidates (Iceberg "
        "`min-file-size-bytes`); the table's target file size stays its own unless the "
        "threshold reaches it, then the target becomes twice the threshold",
    )
    min_input_files: int = Field(
        default=5,
        ge=1,
        description="a partition's group is rewritten once it has this many candidates "
        "(Iceberg `min-input-files`)",
    )
    strategy: Literal["binpack", "sort"] = Field(
        default="binpack",
        description="`sort` uses `sort_order` if set, else the table's sort order; a table "
        "with neither fails that operation with a clear message",
    )
    sort_order: str | None = Field(
        default=None,
        description="the order of `strategy: sort`: `zorder(a, b)` or "
        "`a ASC NULLS LAST, b DESC` (plain column names only); unset: the table's own",
    )
    compression_codec: Literal["zstd", "gzip", "snappy", "lz4", "uncompressed"] | None = Field(
        default="zstd",
        description="set as `write.parquet.compression-codec` on a table that sets none, "
        "before its first rewrite (the operation says so): Iceberg's Java writer falls back "
        "to gzip there (tables made by pyiceberg or other non-Java tools), about 3x slower "
        "to write than zstd and unlike pyiceberg's own zstd files; `zstd` goes with "
        "`write.parquet.compression-level` 1 (what pyiceberg and Arrow write; level 3, "
        "parquet-java's default, took 25 % longer) unless the table sets a level; a "
        "table's own codec and level are never changed; `null` leaves such tables to gzip",
    )
    max_file_group_size: Size | None = Field(
        default=None,
        description="Iceberg's `max-file-group-size-bytes`: a partition's small files are "
        "rewritten in groups of this size, one Spark task each, so several cores write at "
        "once; it also caps the output files at about this size (more, smaller files); "
        "unset: Iceberg's 100 GB",
    )
    delete_file_threshold: int = Field(
        default=1,
        ge=1,
        description="a data file with this many delete files (position, equality, deletion "
        "vector) is rewritten whatever its size, its deletes applied (Iceberg "
        "`delete-file-threshold`, whose own default is never: every read pays for every "
        "delete file until a rewrite applies it); see [Delete files](../concepts/"
        "delete-files.md)",
    )
    delete_ratio_threshold: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="...or whose deleted rows reach this share of its rows (Iceberg "
        "`delete-ratio-threshold`, same default; it counts deletes scoped to that one file: "
        "deletion vectors and Spark's position deletes)",
    )

    @field_validator("sort_order")
    @classmethod
    def _plain_sort_order(cls, value: str | None) -> str | None:
        return None if value is None else validate_sort_order(value)


class ExpireSnapshotsSettings(_Settings):
    """Snapshot expiry: older than ``retention_threshold``, keeping the last ``retain_last``."""

    retention_threshold: Duration = Field(
        default=timedelta(days=7), description="snapshots older than this expire..."
    )
    retain_last: int = Field(
        default=1,
        ge=1,
        description="...except the newest `retain_last`; the current snapshot and every "
        "branch and tag head always stay",
    )
    clean_expired_metadata: bool = Field(
        default=True,
        description="the expiry's commit also drops the partition specs and schemas that are "
        "not the current ones and that no remaining snapshot uses (Iceberg's "
        "`clean_expired_metadata`), so `metadata.json` stops growing with every evolution; "
        "with nothing to expire, an unused one alone makes the operation run (in a pass; the "
        "health trigger does not look for unused specs and schemas)",
    )
    delete_files: bool = Field(
        default=True,
        description="delete the files only expired snapshots reach (data, delete, manifest, "
        "manifest-list and statistics files), by reachability (see [Safety](../safety.md)); "
        "`false` expires the metadata only and leaves those files to `remove_orphan_files` "
        "(seed 002's `--expire-keep-files`): the expiry's commit is then a metadata change on "
        "the driver whatever the table's size, and its output says `files_deleted: false`; "
        "the files go once they are older than `remove_orphan_files.retention_threshold`",
    )


class RewritePositionDeletesSettings(_Settings):
    """Position delete files compacted, and the dangling ones (their data gone) dropped
    (``rewrite_position_delete_files``)."""

    min_input_files: int = Field(
        default=2,
        ge=2,
        description="a partition's position delete files are rewritten together once it has "
        "this many (Iceberg `min-input-files`; a group needs two at least); any dangling one "
        "makes every one rewritten (`rewrite-all`), since rewriting drops the rows of data "
        "files that are gone",
    )


class TableStatsSettings(_Settings):
    """Opt-in Puffin statistics (NDV sketches) for engines' cost-based planning."""

    enabled: bool = Field(
        default=False,
        description="after the pass's rewrites, compute Puffin NDV statistics for the current "
        "snapshot (see [Statistics](../concepts/statistics-and-expiry.md))",
    )
    columns: tuple[str, ...] | None = Field(
        default=None,
        description="the columns to sketch (a list, e.g. `[service, tenant_id]`; each must be "
        "a primitive column of the table, or the operation fails naming it); unset: every "
        "top-level primitive column",
    )

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

    retention_threshold: Duration = Field(
        default=timedelta(days=7),
        description="only unreferenced files older than this go (younger files may belong to "
        "writes in progress)",
        json_schema_extra=_bounds(low=MIN_ORPHAN_RETENTION),
    )
    dry_run: bool = Field(default=False, description="list what would go, delete nothing")

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

    max_snapshots: int = Field(
        default=100, ge=1, description="the `snapshot_count` check fails above this"
    )
    max_wal_files: int = Field(
        default=1000,
        ge=1,
        description="the `wal_backlog` check fails above this many WAL files (or "
        "`max_wal_bytes`), and whenever a WAL file sits in quarantine",
    )
    max_wal_bytes: Size = Field(
        default=10 * 1024**3, description="the `wal_backlog` check fails above this many bytes"
    )
    max_compaction_duration: Duration = Field(
        default=timedelta(minutes=5),
        description="a WAL ingest or compaction (`optimize`) that did work and took longer "
        "than this fires the `IcegateCompactionSlow` alert (the seed's "
        "`compaction_duration_seconds > 300`); published per table by `icegate-maintain "
        "serve` as `icegate_check_max_compaction_duration_seconds` (no asset check uses it)",
    )


class HealthSettings(_Settings):
    """When a table counts as unhealthy and which operations become due (``maintain.health``;
    a table's own ``icegate.health.<key>`` properties override these)."""

    small_files: int = Field(
        default=12,
        ge=2,
        description="small files in one partition that make `optimize` due (Amoro's minor "
        "optimizing triggers at 12 fragment files)",
    )
    delete_files: int = Field(
        default=1,
        ge=1,
        description="delete files (position, equality, deletion vectors) that make delete "
        "work due (as Gravitino: any)",
    )
    manifests: int = Field(
        default=100,
        ge=2,
        description="manifests that make `rewrite_manifests` due (Iceberg's own "
        "`commit.manifest.min-count-to-merge`)",
    )
    small_manifests: int = Field(
        default=50,
        ge=2,
        description="small manifests (under 3/4 of `commit.manifest.target-size-bytes`) that "
        "make `rewrite_manifests` due: planning opens each one, and merging them is cheap",
    )
    expirable_snapshots: int = Field(
        default=10,
        ge=1,
        description="expirable snapshots that make `expire_snapshots` due (and a tenth of the "
        "table's snapshots at least: a steady writer always has one just past retention)",
    )
    min_score: float = Field(
        default=50.0,
        ge=0,
        le=100,
        description="a partition's `healthy` check fails below this score",
    )
    min_interval: Duration = Field(
        default=timedelta(minutes=2),
        description="the health trigger maintains a table at most this often",
    )


class TriggerSettings(_Settings):
    """How the sensors' runs are made: tables per run, the health trigger's budget per
    evaluation, and its back-off (``maintain.trigger``)."""

    max_tables: int = Field(
        default=100,
        ge=1,
        description="the health trigger's budget per evaluation: tables requested, "
        "longest-waiting first; the rest is reported as backlog and waits for the next one",
    )
    tables_per_run: int = Field(
        default=100,
        ge=1,
        le=1000,
        description="tables the health and WAL sensors and the daily schedule put in one run of "
        "`maintenance_batch_job`: one process and one Spark session for all of them, each "
        "table doing its own due operations; more tables than that make several runs of even "
        "size. Every run pays a cold JVM and Dagster's set-up, so fewer, larger runs cost "
        "less (see [Size the daemon](../how-to/sizing.md))",
    )
    max_bytes: Size = Field(
        default=100 * 1024**3,
        description="the health trigger's budget per evaluation: bytes the due operations of "
        "the tables requested would rewrite (the first table always fits)",
    )
    backoff: Duration = Field(
        default=timedelta(minutes=1),
        description="an operation that failed (also inside a run that succeeded), was lost "
        "with its run, or stayed due after it ran, N >= 2 times in a row, waits "
        "`backoff x 2^(N-2)`, at most `backoff_max`, before the sensors ask for it again "
        "(the trigger's memory)",
    )
    backoff_max: Duration = Field(
        default=timedelta(hours=1), description="the ceiling of that doubling back-off"
    )
    recheck: Duration = Field(
        default=timedelta(minutes=10),
        description="where the catalog cannot say which tables changed (REST, Glue, Hive), "
        "the health trigger looks at each table again at least this often; a SQL catalog "
        "tells every table's metadata file in one query, so a changed table is looked at in "
        "the next tick",
    )
    tick_deadline: Duration = Field(
        default=timedelta(seconds=30),
        description="each sensor evaluation ends within this (Dagster cancels one at 60 s and "
        "keeps nothing of it); what it had no time for waits for the next tick",
        json_schema_extra=_bounds(MIN_TICK_DEADLINE, MAX_TICK_DEADLINE),
    )

    @field_validator("tick_deadline")
    @classmethod
    def _below_dagsters_limit(cls, value: timedelta) -> timedelta:
        if not MIN_TICK_DEADLINE <= value <= MAX_TICK_DEADLINE:
            raise _broken(
                f"must be between {format_duration(MIN_TICK_DEADLINE)} and "
                f"{format_duration(MAX_TICK_DEADLINE)} (Dagster cancels a sensor evaluation "
                "at 60 s)",
                value=format_duration(value),
            )
        return value


#: The shortest ``maintain.locks.lease``. A holder tolerates a silent lease store for two
#: thirds of a lease, a commit has a third of one after its last check, and the sensors fail
#: a run of another host after three leases of silence: at 15 s that is 10 s, 5 s and 45 s
#: (more than one sensor interval of 30 s). Shorter, a store's brief pause (a failover, a
#: locked SQLite file) loses leases and fails live runs.
MIN_LEASE = timedelta(seconds=15)


class LockSettings(_Settings):
    """Where the per-table leases live, and how long one lasts (``maintain.locks``)."""

    uri: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the lease store (table `icegate_table_leases`) that "
        "every maintainer of the deployment must share; unset: the catalog's own database "
        "(SQLite, PostgreSQL catalogs), else `sqlite:///<config folder>/.icegate/locks.db` "
        "(one host only). With a REST catalog and more than one host, set it (the Dagster "
        "instance's PostgreSQL is a natural home); SQLite, PostgreSQL and MySQL keep leases",
    )
    lease: Duration = Field(
        default=timedelta(minutes=2),
        description="how long a lease lasts unless renewed; the holder renews it every sixth "
        "and stops itself (cancelling its Spark jobs, committing nothing) if it could not "
        "renew for two thirds of it. Dagster runs keep a heartbeat of the same length: a "
        "`STARTED` run whose process cannot be asked about, with neither for three leases, "
        "is failed by the sensors as having no worker",
        json_schema_extra=_bounds(low=MIN_LEASE),
    )
    stuck_after: Duration = Field(
        default=timedelta(hours=6),
        description="an operation that has held its table this long is taken for stuck: it "
        "stops renewing its lease (cancelling its Spark jobs, committing nothing), so the "
        "lease runs out a lease later; an operation that finds its table held longer than "
        "this fails (and with it `ops_succeeded`) naming the holder, instead of skipping "
        "quietly. The runs the sensors and the schedule request carry `dagster/max_runtime` "
        "= this plus one lease: Dagster's run monitoring fails a run that ran longer",
    )

    @field_validator("lease")
    @classmethod
    def _long_enough(cls, value: timedelta) -> timedelta:
        if value < MIN_LEASE:
            raise _broken(
                f"must be at least {format_duration(MIN_LEASE)} (a holder gives its lease up "
                "after two thirds of it without the store, and the sensors fail a run on "
                "another host after three leases of silence)",
                value=format_duration(value),
            )
        return value

    @model_validator(mode="after")
    def _stuck_after_a_lease(self) -> LockSettings:
        # A holder gives its lease up at stuck_after: before its first renewals it would
        # give up every lease it takes.
        if self.stuck_after <= self.lease:
            raise _broken(
                f"must be longer than maintain.locks.lease ({format_duration(self.lease)}): "
                "an operation holding its lease this long is taken for stuck",
                key="stuck_after",
                value=format_duration(self.stuck_after),
            )
        return self

    @field_validator("uri")
    @classmethod
    def _absolute_uri(cls, value: str | None, info: ValidationInfo) -> str | None:
        return None if value is None else _resolved(value, info)


#: The shortest history ``maintain.history`` keeps: a day covers the daily schedule, the
#: exporter's last look and the trigger's reading of the runs it asked for.
MIN_HISTORY = timedelta(days=1)
#: How ``maintain.history`` says "keep everything".
KEEP_FOREVER = "forever"


def _history_duration(value: object) -> object:
    """A ``maintain.history`` value: ``forever`` (None: nothing deleted) or a duration of at
    least :data:`MIN_HISTORY`."""
    if value is None or value == KEEP_FOREVER:
        return None
    try:
        duration = parse_duration(value)
    except ValueError:
        duration = None
    if duration is None or duration < MIN_HISTORY:
        raise _broken(
            f"must be a duration of at least {format_duration(MIN_HISTORY)} (such as 30d) or "
            f"`{KEEP_FOREVER}` to keep everything",
            value=value,
        )
    return duration


#: A ``maintain.history`` setting: how long to keep, None for ever.
_KeepFor = Annotated[timedelta | None, BeforeValidator(_history_duration)]


class HistorySettings(_Settings):
    """What this project keeps of its own history, which would otherwise grow with time
    (``maintain.history``): each value a duration of at least 1d, or `forever`."""

    log: _KeepFor = Field(
        default=timedelta(days=90),
        description="rows of the maintenance log (`maintain.log_table`) older than this are "
        "deleted by the log table's own upkeep at the end of a pass (Spark `DELETE` on "
        "`executed_at`, an absolute instant), once its oldest row is a day past it, then "
        "compacted and expired like the rest of its upkeep",
        json_schema_extra=_bounds(MIN_HISTORY),
    )
    orphan_candidates: _KeepFor = Field(
        default=timedelta(days=30),
        description="resolved rows of the orphan candidates table (deleted, or kept as "
        "`referenced`, `gone`, `younger`, `changed`) whose `resolved_at` is older than this "
        "are dropped when their table's candidates are next collected or deleted; `pending` "
        "rows are never dropped, whatever their age",
        json_schema_extra=_bounds(MIN_HISTORY),
    )
    runs: _KeepFor = Field(
        default=timedelta(days=30),
        description="finished runs (success, failure, canceled) of this code location's "
        "jobs that ended longer ago than this are deleted from the Dagster instance with "
        "their events by `iceberg_table_discovery` (a bounded number per tick); unfinished "
        "runs, other code locations' runs and a run holding a table's latest "
        "materialization are kept",
        json_schema_extra=_bounds(MIN_HISTORY),
    )


class RetentionSettings(_Settings):
    """TTL: rows whose ``column`` is older than ``days`` are deleted."""

    days: int = Field(
        ge=1,
        description="rows whose timestamp `column` is older than this many days are deleted, "
        "with Spark `DELETE` (a filter aligned with the partitions is a metadata-only "
        "delete); the operation reports `rows_deleted`",
    )
    column: str = Field(
        default="timestamp",
        description="the column compared with the cutoff: `timestamptz`, `timestamp` or `date`",
    )


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
    enabled: bool = Field(
        default=True,
        description="`false` excludes tables from **every** operation: set under `maintain:` "
        "for all, `maintain.tables.<namespace>.*` for a namespace, "
        "`maintain.tables.<ns.table>` for one; the table property "
        "`icegate.maintenance.enabled=false` does the same (either one is enough). An "
        "excluded table is shown as excluded, not failing (`status`, its partition page, its "
        "checks, the log: `skipped` rows saying why); `rollback`, a person's explicit repair, "
        "still runs",
    )
    defer_to_amoro: bool = Field(
        default=True,
        description="a table whose property `self-optimizing.enabled=true` says Apache Amoro "
        "optimizes it has its rewrites (`optimize`, `rewrite_position_delete_files`) left to "
        "Amoro, said so the same way; WAL ingest, manifest rewrite, expiry, orphans and TTL "
        "still run. `false` (globally or per table) rewrites it here too",
    )
    retention: RetentionSettings | None = Field(
        default=None,
        description="TTL: only tables with a rule (`maintain.retention.<ns.table>` or "
        "`maintain.tables.<ns.table>.retention`) have one",
    )

    @classmethod
    def _allowed_keys(cls) -> list[str]:
        # Listed sorted, like the other sections of the file's layout.
        return sorted(cls.model_fields)


class CatalogSettings(_Settings):
    """The ``catalog:`` block: a name plus pyiceberg properties passed through untouched."""

    name: str = Field(
        default=DEFAULT_CATALOG_NAME,
        description="the catalog's name; Spark registers its Iceberg catalog under this name "
        "too (a SQL catalog stores its name in every row). Letters, digits and `_`",
    )
    properties: _Properties = Field(
        default_factory=dict,
        description="every other key of the block: a pyiceberg catalog property, passed "
        "through as it is (`uri`, `warehouse`, `type`, `s3.*`, ...; `uri` and `warehouse` "
        "made absolute against the file's folder). SQLite and PostgreSQL URIs are mapped to "
        "Iceberg's JDBC catalog for Spark; other catalog types pass their properties to both "
        "sides. Required: `uri`, except for `type: rest`, `glue`, `hive`, `in-memory`",
    )
    embedded: bool = Field(
        default=False,
        description="true for the embedded default, whose folder is created on first use",
        json_schema_extra=DERIVED,
    )

    @field_validator("name", mode="before")
    @classmethod
    def _plain_name(cls, value: object) -> object:
        if not isinstance(value, str) or not _IDENTIFIER_RE.fullmatch(value):
            raise ValueError("must be a plain identifier (letters, digits, _)")
        return value

    @field_validator("properties")
    @classmethod
    def _absolute_locations(cls, value: Mapping[str, str], info: ValidationInfo) -> dict[str, str]:
        # A server's catalog (REST, Glue, Hive) takes its warehouse by name or as the
        # server's URI: only a catalog this process opens itself has a folder for it.
        served = value.get("type") in SERVER_CATALOG_TYPES
        paths = ("uri",) if served else ("uri", "warehouse")
        return {k: _resolved(v, info) if k in paths else v for k, v in value.items()}

    @model_validator(mode="after")
    def _uri_required(self) -> CatalogSettings:
        # These catalog types find their server without a uri (or need none).
        if "uri" not in self.properties and self.properties.get("type") not in (
            *SERVER_CATALOG_TYPES,
            "in-memory",
        ):
            raise PydanticCustomError(
                "missing", "Field required", {"key": "uri", "example": "sqlite:///catalog.db"}
            )
        return self


#: A Spark Connect URL: ``sc://host[:port][/;key=value;...]`` (Spark's own grammar).
_CONNECT_URL = re.compile(
    r"sc://(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s/:;\[\]]+)(?::(?P<port>[^/;]*))?"
    r"(?:/(?P<params>(?:;[^;=\s]+=[^;\s]*)*))?"
)


def connect_url_problem(value: str) -> str | None:
    """Why ``value`` is no Spark Connect URL (``sc://host:port``), or None when it is one."""
    match = _CONNECT_URL.fullmatch(value.strip())
    if not value.strip().startswith("sc://"):
        return "must be a Spark Connect URL starting with sc:// (such as sc://spark-host:15002)"
    if match is None:
        return (
            "is no Spark Connect URL: write sc://host:port, optionally followed by "
            "/;key=value parameters (such as /;use_ssl=true)"
        )
    port = match.group("port")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        return f"port {port!r} is no TCP port (1-65535)"
    return None


class SparkSettings(_Settings):
    """The ``spark:`` block."""

    master: str = Field(
        default="local[*]",
        description="Spark's master URL, given to the session as it is (`spark://host:7077` "
        "for a standalone cluster)",
    )
    conf: _Properties = Field(
        default_factory=dict,
        description="any Spark setting, merged last: it wins over the project's own (see "
        "[Spark settings](configuration.md#spark-settings))",
    )

    remote: str | None = Field(
        default=None,
        description="a Spark Connect server's URL, `sc://host:port` (optionally "
        "`/;use_ssl=true;token=...`): every run and pass is then a thin client of that "
        "server, with no JVM of its own (`master`, jars and JVM options are the server's "
        "business). Unset: the `SPARK_REMOTE` environment variable when set, else a Spark "
        "of the run's own. See [Spark as a service](../how-to/deploy.md#spark-as-a-service)",
    )

    @classmethod
    def _allowed_keys(cls) -> list[str]:
        # Listed sorted, like the other sections of the file's layout.
        return sorted(cls.model_fields)

    @field_validator("remote", mode="before")
    @classmethod
    def _connect_url(cls, value: object) -> object:
        if value is None:
            return None
        if not isinstance(value, str):
            raise ValueError("must be a Spark Connect URL such as sc://spark-host:15002")
        problem = connect_url_problem(value)
        if problem is not None:
            # Its parameters may hold a token: the message shows their names only.
            shown = re.sub(r"(;[^;=]+=)[^;]*", r"\1***", value)
            raise PydanticCustomError("connect_url", "{error}", {"error": problem, "value": shown})
        return value

    @field_validator("master", mode="before")
    @classmethod
    def _non_empty(cls, value: object) -> object:
        if not isinstance(value, str) or not value:
            raise ValueError("must be a non-empty string such as local[*]")
        return value


class IcegateConfig(_Settings):
    """The whole, validated configuration (built by :func:`config_from_dict`)."""

    catalog: CatalogSettings = Field(
        description="the catalog both engines use; without one, the embedded default: a "
        "SQLite catalog `icegate` in `./.icegate/catalog.db` beside the file"
    )
    namespaces: tuple[str, ...] | None = Field(
        default=None, description="the namespaces to maintain; unset: every namespace"
    )
    spark: SparkSettings = SparkSettings()
    wal_root: str | None = Field(
        default=None,
        description="where WAL files wait: `<root>/<namespace>/<table>/*.parquet` (a path, "
        "`s3://bucket/prefix` opened with `wal.storage` or the catalog's `s3.*` settings, or "
        "another URI pyarrow and Spark both read); unset in a file that names a catalog: no "
        "WAL step. The embedded default's is `./.icegate/wal`",
    )
    wal_storage: _Properties | None = Field(
        default=None,
        description="the storage properties `wal.root` is opened with, by pyarrow and by "
        "Spark, in pyiceberg's names: `s3.endpoint`, `s3.access-key-id`, "
        "`s3.secret-access-key`, `s3.session-token`, `s3.region`, `s3.path-style-access`, "
        "`s3.force-virtual-addressing`, `s3.connect-timeout`, `s3.request-timeout`. Unset: "
        "the catalog block's (its `s3.*` keys); set: these alone, the catalog's left out "
        "(a WAL in another store, or with keys of its own). Values of secret keys "
        "(`s3.secret-access-key`, `s3.session-token`...) are kept off command lines and out "
        "of every message. See [WAL ingest](../concepts/wal-ingest.md#object-storage)",
    )
    log_table: _TableName = Field(
        default=DEFAULT_LOG_TABLE,
        description="the maintenance log, an Iceberg table created on first use (see [The "
        "maintenance log](maintenance-log.md)); catalogs that refuse names starting with `_` "
        "need another name",
    )
    defaults: TableSettings = Field(
        default=TableSettings(),
        description="the blocks under `maintain:`, every table's settings unless its own entry "
        "says otherwise",
    )
    table_overrides: Mapping[_TableKey, TableSettings] = Field(
        default_factory=dict,
        description="per-table overrides of any block of `maintain:` (`enabled`, "
        "`defer_to_amoro`, `retention` and the operations' blocks), laid over the defaults. "
        "A `<namespace>.*` key holds the settings of every table of the namespace that has no "
        "entry of its own; a table's own entry is laid over it. Only `<namespace>.*` "
        "patterns exist",
    )
    source: str = Field(description="where the configuration came from", json_schema_extra=DERIVED)
    lock_wait: Duration = Field(
        default=DEFAULT_LOCK_WAIT,
        description="how long an operation waits for another maintainer's lease on its table "
        "before it is skipped (see [Safety](../safety.md))",
    )
    parallel_tables: int = Field(
        default=DEFAULT_PARALLEL_TABLES,
        description="tables maintained at once in one Spark session, by a CLI `run` and by each "
        "step of a Dagster run",
        json_schema_extra=_bounds(MIN_PARALLEL_TABLES, MAX_PARALLEL_TABLES),
    )
    locks: LockSettings = LockSettings()
    trigger: TriggerSettings = TriggerSettings()
    history: HistorySettings = HistorySettings()
    locks_fallback_uri: str | None = Field(
        default=None,
        description="the lease store when neither `maintain.locks.uri` nor a SQL catalog names one",
        json_schema_extra=DERIVED,
    )
    secrets: tuple[str, ...] = Field(
        default=(),
        description="every value a `${VAR}` put under a secret key of the catalog block or "
        "`spark.conf` (password, token, credential, `header.Authorization`...): with the "
        "values of those keys and the passwords in URIs, kept off command lines and out of "
        "every message (a `${VAR}` under another key, such as `catalog.name`, is no secret)",
        json_schema_extra=DERIVED,
    )

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

    @field_validator("wal_storage")
    @classmethod
    def _storage_needs_a_root(cls, value: object, info: ValidationInfo) -> object:
        if value is not None and not info.data.get("wal_root"):
            # Only the keys are shown: the values may be secrets.
            raise _broken(
                "wal.storage opens wal.root, which is not set: set wal.root (or remove "
                "wal.storage)",
                value=sorted(value) if isinstance(value, Mapping) else value,
            )
        return value

    @field_validator("parallel_tables", mode="before")
    @classmethod
    def _table_count(cls, value: object) -> object:
        # Strict: pydantic would take 4.0, "4" or true for a number of tables.
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError("must be a whole number")
        if not MIN_PARALLEL_TABLES <= value <= MAX_PARALLEL_TABLES:
            raise ValueError(f"must be between {MIN_PARALLEL_TABLES} and {MAX_PARALLEL_TABLES}")
        return value

    def wal_storage_properties(self) -> Mapping[str, str]:
        """The storage properties ``wal.root`` is opened with, by pyarrow and by Spark:
        ``wal.storage`` when set, else the catalog block's storage keys
        (:data:`STORAGE_PREFIXES`)."""
        if self.wal_storage is not None:
            return self.wal_storage
        props = self.catalog.properties
        return {key: value for key, value in props.items() if key.startswith(STORAGE_PREFIXES)}

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


#: Where the file writes the IcegateConfig fields that are not top-level keys of their own
#: (error messages and the configuration reference name keys as the file writes them).
FILE_KEYS: dict[tuple[str | int, ...], str] = {
    ("catalog", "properties"): "catalog",
    ("wal_root",): "wal.root",
    ("wal_storage",): "wal.storage",
    ("log_table",): "maintain.log_table",
    ("lock_wait",): "maintain.lock_wait",
    ("parallel_tables",): "maintain.parallel_tables",
    ("locks",): "maintain.locks",
    ("trigger",): "maintain.trigger",
    ("history",): "maintain.history",
    ("defaults",): "maintain",
    ("table_overrides",): "maintain.tables",
}


def _fail(key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"invalid config: {key} = {value!r}: {rule}")


def _config_error(
    exc: ValidationError, file_keys: Mapping[tuple[str | int, ...], str] = FILE_KEYS
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
