"""Configuration: ``icegate.yaml`` loading, validation and per-table settings.

Where the file comes from: ``--config PATH``, else ``$ICEGATE_CONFIG``, else
``./icegate.yaml``; with none, the embedded default lakehouse in ``./.icegate/``.
Every invalid value fails at load with a :class:`ConfigError` naming the key and
the value. ``${VAR}`` in any string is replaced by the environment variable, so
secrets stay out of the file.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from icegate_dagster.errors import ConfigError

CONFIG_ENV_VAR = "ICEGATE_CONFIG"
DEFAULT_CONFIG_FILE = "icegate.yaml"
EMBEDDED_DIR = ".icegate"
DEFAULT_CATALOG_NAME = "icegate"
DEFAULT_LOG_TABLE = "lakehouse._maintenance_log"

#: How long an operation waits for another maintainer to release its table.
DEFAULT_LOCK_WAIT = timedelta(seconds=30)
#: Tables maintained at once: Spark procedures spend much of their time in the driver
#: (planning, commits), so a few tables side by side keep the executors busy.
DEFAULT_PARALLEL_TABLES = 4
#: Iceberg's own floor for orphan removal: younger files may belong to writes in flight.
MIN_ORPHAN_RETENTION = timedelta(hours=24)

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1024,
    "kib": 1024,
    "mb": 1024**2,
    "mib": 1024**2,
    "gb": 1024**3,
    "gib": 1024**3,
    "tb": 1024**4,
    "tib": 1024**4,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_DURATION_RE = re.compile(r"^\s*(-?\d+(?:\.\d+)?)\s*([smhd])\s*$")
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def parse_size(value: object) -> int:
    """Parse a size: a whole number of bytes, or a string such as ``10MB`` (1 MB = 1024**2 B)."""
    if isinstance(value, bool):
        raise ValueError("must be a size such as 10MB or a number of bytes, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()])
        if value.strip().startswith("-"):
            raise ValueError("must not be negative")
    raise ValueError("must be a size such as 10MB, 512KB, 1GB or a number of bytes")


def parse_duration(value: object) -> timedelta:
    """Parse a positive duration written as ``30s``, ``15m``, ``12h`` or ``7d``."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, str) and (match := _DURATION_RE.match(value)):
        result = timedelta(**{_DURATION_UNITS[match.group(2)]: float(match.group(1))})
    else:
        raise ValueError("must be a duration such as 30s, 15m, 12h or 7d")
    if result <= timedelta(0):
        raise ValueError("must be a positive duration")
    return result


def format_duration(value: timedelta) -> str:
    """Render a duration back in the config's own notation (``7d``, ``36h``, ``90s``)."""
    seconds = int(value.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


Size = Annotated[int, BeforeValidator(parse_size)]
Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class _Block(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class CompactionSettings(_Block):
    """WAL -> Iceberg compaction thresholds (IceGate's names)."""

    min_files: int = Field(10, ge=1)
    min_size_bytes: Size = 100 * 1024**2
    target_file_size: Size = 128 * 1024**2


class OptimizeSettings(_Block):
    """Small-file rewrite of the table itself (``rewrite_data_files``)."""

    file_size_threshold: Size = 10 * 1024**2
    min_input_files: int = Field(5, ge=1)
    strategy: Literal["binpack", "sort"] = "binpack"
    sort_order: str | None = None


class ExpireSnapshotsSettings(_Block):
    """Snapshot expiry: older than ``retention_threshold``, keeping the last ``retain_last``."""

    retention_threshold: Duration = timedelta(days=7)
    retain_last: int = Field(1, ge=1)


class RemoveOrphanFilesSettings(_Block):
    """Orphan-file removal; never below Iceberg's 24 h floor."""

    retention_threshold: Duration = timedelta(days=7)
    dry_run: bool = False


class HealthCheckSettings(_Block):
    """Thresholds of the asset checks (IceGate's alert levels)."""

    max_snapshots: int = Field(100, ge=1)
    max_wal_files: int = Field(1000, ge=1)
    max_wal_bytes: Size = 10 * 1024**3


class LockSettings(_Block):
    """Where the per-table leases live, and how long one lasts (``maintain.locks``)."""

    #: SQLAlchemy URL of the lease store every maintainer shares; unset: the catalog's own
    #: SQL database, else a SQLite file beside the configuration (one host only).
    uri: str | None = None
    lease: Duration = timedelta(minutes=2)
    #: A holder that has kept a table this long is reported (``ops_succeeded`` fails).
    stuck_after: Duration = timedelta(hours=6)


class RetentionSettings(_Block):
    """TTL: rows whose ``column`` is older than ``days`` are deleted."""

    days: int = Field(ge=1)
    column: str = "timestamp"


_BLOCKS: dict[str, type[_Block]] = {
    "compaction": CompactionSettings,
    "optimize": OptimizeSettings,
    "expire_snapshots": ExpireSnapshotsSettings,
    "remove_orphan_files": RemoveOrphanFilesSettings,
    "checks": HealthCheckSettings,
}


@dataclass(frozen=True)
class TableSettings:
    """The effective maintenance settings of one table: defaults with its overrides applied."""

    compaction: CompactionSettings
    optimize: OptimizeSettings
    expire_snapshots: ExpireSnapshotsSettings
    remove_orphan_files: RemoveOrphanFilesSettings
    checks: HealthCheckSettings
    retention: RetentionSettings | None = None


@dataclass(frozen=True)
class CatalogSettings:
    """The ``catalog:`` block: a name plus pyiceberg properties passed through untouched."""

    name: str
    properties: Mapping[str, str]
    #: True for the embedded default, whose folder is created on first use.
    embedded: bool = False


@dataclass(frozen=True)
class SparkSettings:
    """The ``spark:`` block."""

    master: str = "local[*]"
    conf: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class IcegateConfig:
    """The whole, validated configuration."""

    catalog: CatalogSettings
    namespaces: tuple[str, ...] | None
    spark: SparkSettings
    wal_root: str | None
    log_table: str
    defaults: TableSettings
    table_overrides: Mapping[str, TableSettings]
    source: str
    #: How long an operation waits for another maintainer's lock on its table before skipping.
    lock_wait: timedelta = DEFAULT_LOCK_WAIT
    #: How many tables a pass maintains at once, sharing one Spark session.
    parallel_tables: int = DEFAULT_PARALLEL_TABLES
    #: The lease store (``maintain.locks``).
    locks: LockSettings = field(default_factory=LockSettings)
    #: The lease store when neither ``maintain.locks.uri`` nor a SQL catalog names one.
    locks_fallback_uri: str | None = None
    #: Every value a ``${VAR}`` put into the catalog block, ``spark.conf``, ``wal.root`` or
    #: ``maintain.locks.uri``: secrets, kept off command lines and out of every message.
    secrets: tuple[str, ...] = ()

    def for_table(self, table: str) -> TableSettings:
        """Effective settings of ``table`` (``namespace.table``)."""
        return self.table_overrides.get(table, self.defaults)

    def with_overrides(self, **blocks: Mapping[str, Any]) -> IcegateConfig:
        """A copy whose default blocks (and every table's) have ``blocks`` merged in.

        Used by the demo, which must treat freshly written snapshots as old.
        """

        def merged(settings: TableSettings) -> TableSettings:
            values: dict[str, Any] = {}
            for name, model in _BLOCKS.items():
                current: _Block = getattr(settings, name)
                extra = blocks.get(name, {})
                values[name] = model.model_validate({**current.model_dump(), **extra})
            return TableSettings(**values, retention=settings.retention)

        return IcegateConfig(
            catalog=self.catalog,
            namespaces=self.namespaces,
            spark=self.spark,
            wal_root=self.wal_root,
            log_table=self.log_table,
            defaults=merged(self.defaults),
            table_overrides={k: merged(v) for k, v in self.table_overrides.items()},
            source=self.source,
            lock_wait=self.lock_wait,
            parallel_tables=self.parallel_tables,
            locks=self.locks,
            locks_fallback_uri=self.locks_fallback_uri,
            secrets=self.secrets,
        )


_TOP_KEYS = {"catalog", "namespaces", "spark", "wal", "maintain"}
_MAINTAIN_KEYS = {
    "log_table",
    "lock_wait",
    "locks",
    "parallel_tables",
    "retention",
    "tables",
    *_BLOCKS,
}
_TABLE_OVERRIDE_KEYS = {"retention", *_BLOCKS}
#: Where a value from ``${VAR}`` counts as a secret (see ``IcegateConfig.secrets``).
_SECRET_BLOCKS = ("catalog.", "spark.conf.", "wal.root", "maintain.locks.uri")


def _fail(key: str, value: object, rule: str) -> ConfigError:
    return ConfigError(f"invalid config: {key} = {value!r}: {rule}")


def _check_keys(raw: Mapping[str, Any], allowed: set[str], prefix: str) -> None:
    for key in raw:
        if key not in allowed:
            where = f"{prefix}.{key}" if prefix else str(key)
            raise _fail(where, raw[key], f"unknown key (allowed: {', '.join(sorted(allowed))})")


def _mapping(raw: object, key: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail(key, raw, "must be a mapping")
    return dict(raw)


def _validate_block(model: type[_Block], raw: object, key: str) -> Any:
    try:
        return model.model_validate(_mapping(raw, key))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        where = f"{key}.{loc}" if loc else key
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            allowed = ", ".join(model.model_fields)
            raise _fail(where, value, f"unknown key (allowed: {allowed})") from None
        if err["type"] == "missing":
            raise ConfigError(f"invalid config: {where} is required") from None
        message = str(err.get("ctx", {}).get("error", err["msg"]))
        raise _fail(where, value, message) from None


def _interpolate_env(value: Any, key: str, found: list[tuple[str, str]] | None = None) -> Any:
    """``value`` with every ``${VAR}`` replaced; each (key, value) used is added to ``found``."""
    if isinstance(value, str):

        def repl(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in os.environ:
                raise ConfigError(
                    f"invalid config: {key} refers to environment variable ${{{name}}}, "
                    "which is not set"
                )
            if found is not None:
                found.append((key, os.environ[name]))
            return os.environ[name]

        return _ENV_RE.sub(repl, value)
    if isinstance(value, Mapping):
        return {
            k: _interpolate_env(v, f"{key}.{k}" if key else str(k), found) for k, v in value.items()
        }
    if isinstance(value, list):
        return [_interpolate_env(v, f"{key}[{i}]", found) for i, v in enumerate(value)]
    return value


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


def _catalog_settings(raw: object, base_dir: Path, embedded: bool) -> CatalogSettings:
    block = _mapping(raw, "catalog")
    name = block.pop("name", DEFAULT_CATALOG_NAME)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise _fail("catalog.name", name, "must be a plain identifier (letters, digits, _)")
    props: dict[str, str] = {}
    for key, value in block.items():
        if isinstance(value, Mapping | list) or value is None:
            raise _fail(f"catalog.{key}", value, "must be a string, number or boolean")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if key in ("uri", "warehouse"):
            text = _resolve_location(text, base_dir)
        props[str(key)] = text
    if "uri" not in props and props.get("type") not in ("rest", "glue", "hive", "in-memory"):
        raise ConfigError("invalid config: catalog.uri is required (e.g. sqlite:///catalog.db)")
    return CatalogSettings(name=name, properties=props, embedded=embedded)


def _spark_settings(raw: object) -> SparkSettings:
    block = _mapping(raw, "spark")
    _check_keys(block, {"master", "conf"}, "spark")
    master = block.get("master", "local[*]")
    if not isinstance(master, str) or not master:
        raise _fail("spark.master", master, "must be a non-empty string such as local[*]")
    conf_raw = _mapping(block.get("conf"), "spark.conf")
    conf: dict[str, str] = {}
    for key, value in conf_raw.items():
        if isinstance(value, Mapping | list) or value is None:
            raise _fail(f"spark.conf.{key}", value, "must be a string, number or boolean")
        conf[str(key)] = str(value).lower() if isinstance(value, bool) else str(value)
    return SparkSettings(master=master, conf=conf)


def _table_key(key: object, where: str) -> str:
    if not isinstance(key, str) or "." not in key.strip(".") or key.startswith("."):
        raise _fail(where, key, "must name a table as namespace.table")
    return key


def _table_settings(blocks: Mapping[str, Any], retention: Any, where: str) -> TableSettings:
    values = {
        name: _validate_block(model, blocks.get(name), f"{where}.{name}")
        for name, model in _BLOCKS.items()
    }
    orphan: RemoveOrphanFilesSettings = values["remove_orphan_files"]
    if orphan.retention_threshold < MIN_ORPHAN_RETENTION:
        raise _fail(
            f"{where}.remove_orphan_files.retention_threshold",
            format_duration(orphan.retention_threshold),
            "must be at least 24h (younger files may belong to writes in progress)",
        )
    optimize: OptimizeSettings = values["optimize"]
    if optimize.sort_order is not None:
        from icegate_dagster.maintenance.identifiers import validate_sort_order

        validate_sort_order(optimize.sort_order, f"{where}.optimize.sort_order")
    rule = None
    if retention is not None:
        rule = _validate_block(RetentionSettings, retention, f"{where}.retention")
    return TableSettings(**values, retention=rule)


def _deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(dict(base))
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def config_from_dict(raw: object, base_dir: Path, source: str = "<dict>") -> IcegateConfig:
    """Validate a parsed configuration; relative paths resolve against ``base_dir``."""
    top = _mapping(raw, "(top level)")
    _check_keys(top, _TOP_KEYS, "")
    interpolated: list[tuple[str, str]] = []
    top = _interpolate_env(top, "", interpolated)
    secrets = tuple(
        dict.fromkeys(v for k, v in interpolated if v.strip() and k.startswith(_SECRET_BLOCKS))
    )
    embedded = "catalog" not in top
    if embedded:
        # No catalog named: the embedded SQLite lakehouse beside the config file.
        default = embedded_default_dict(base_dir / EMBEDDED_DIR)
        top["catalog"] = default["catalog"]
        top.setdefault("wal", default["wal"])

    namespaces_raw = top.get("namespaces")
    namespaces: tuple[str, ...] | None = None
    if namespaces_raw is not None:
        if not isinstance(namespaces_raw, list) or not all(
            isinstance(n, str) and n for n in namespaces_raw
        ):
            raise _fail("namespaces", namespaces_raw, "must be a list of namespace names")
        namespaces = tuple(namespaces_raw)

    wal = _mapping(top.get("wal"), "wal")
    _check_keys(wal, {"root"}, "wal")
    wal_root = wal.get("root")
    if wal_root is not None:
        if not isinstance(wal_root, str) or not wal_root:
            raise _fail("wal.root", wal_root, "must be a path or file:// URI")
        wal_root = _resolve_location(wal_root, base_dir)

    maintain = _mapping(top.get("maintain"), "maintain")
    _check_keys(maintain, _MAINTAIN_KEYS, "maintain")
    log_table = maintain.get("log_table", DEFAULT_LOG_TABLE)
    _table_key(log_table, "maintain.log_table")
    lock_wait = DEFAULT_LOCK_WAIT
    if "lock_wait" in maintain:
        try:
            lock_wait = parse_duration(maintain["lock_wait"])
        except ValueError as exc:
            raise _fail("maintain.lock_wait", maintain["lock_wait"], str(exc)) from None
    parallel_tables = maintain.get("parallel_tables", DEFAULT_PARALLEL_TABLES)
    if isinstance(parallel_tables, bool) or not isinstance(parallel_tables, int):
        raise _fail("maintain.parallel_tables", parallel_tables, "must be a whole number")
    if not 1 <= parallel_tables <= 64:
        raise _fail("maintain.parallel_tables", parallel_tables, "must be between 1 and 64")

    locks: LockSettings = _validate_block(LockSettings, maintain.get("locks"), "maintain.locks")
    if locks.uri is not None:
        locks = locks.model_copy(update={"uri": _resolve_location(locks.uri, base_dir)})

    block_defaults = {name: _mapping(maintain.get(name), f"maintain.{name}") for name in _BLOCKS}
    defaults = _table_settings(block_defaults, None, "maintain")

    retention_rules = _mapping(maintain.get("retention"), "maintain.retention")
    overrides_raw = _mapping(maintain.get("tables"), "maintain.tables")
    overrides: dict[str, TableSettings] = {}
    for table in {*retention_rules, *overrides_raw}:
        where = f"maintain.tables.{table}"
        _table_key(table, where if table in overrides_raw else f"maintain.retention.{table}")
        own = _mapping(overrides_raw.get(table), where)
        _check_keys(own, _TABLE_OVERRIDE_KEYS, where)
        blocks = {
            name: _deep_merge(block_defaults[name], _mapping(own.get(name), f"{where}.{name}"))
            for name in _BLOCKS
        }
        retention = own.get("retention", retention_rules.get(table))
        overrides[table] = _table_settings(blocks, retention, where)

    return IcegateConfig(
        catalog=_catalog_settings(top.get("catalog"), base_dir, embedded),
        namespaces=namespaces,
        spark=_spark_settings(top.get("spark")),
        wal_root=wal_root,
        log_table=log_table,
        defaults=defaults,
        table_overrides=overrides,
        source=source,
        lock_wait=lock_wait,
        parallel_tables=parallel_tables,
        locks=locks,
        locks_fallback_uri=f"sqlite:///{(base_dir / EMBEDDED_DIR / 'locks.db').resolve()}",
        secrets=secrets,
    )


def embedded_default_dict(root: Path) -> dict[str, Any]:
    """The embedded default: a SQLite catalog, warehouse and WAL under ``root``."""
    root = root.resolve()
    return {
        "catalog": {
            "name": DEFAULT_CATALOG_NAME,
            "uri": f"sqlite:///{root / 'catalog.db'}",
            "warehouse": (root / "warehouse").as_uri(),
        },
        "wal": {"root": (root / "wal").as_uri()},
    }


def resolve_config_path(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """Find the config file: ``explicit``, else ``$ICEGATE_CONFIG``, else ``./icegate.yaml``."""
    for origin, candidate in (
        ("--config", explicit),
        (CONFIG_ENV_VAR, os.environ.get(CONFIG_ENV_VAR)),
    ):
        if candidate:
            path = Path(candidate).expanduser()
            if not path.is_file():
                raise ConfigError(f"invalid config: {origin} = {str(candidate)!r}: file not found")
            return path
    local = Path(DEFAULT_CONFIG_FILE)
    return local if local.is_file() else None


def load_config(explicit: str | os.PathLike[str] | None = None) -> IcegateConfig:
    """Load and validate the configuration (see the module docstring for where it comes from)."""
    path = resolve_config_path(explicit)
    if path is None:
        return config_from_dict({}, Path.cwd(), source="embedded default")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"invalid config: {path} is not valid YAML{where}: {problem}") from None
    except OSError as exc:
        raise ConfigError(f"invalid config: cannot read {path}: {exc.strerror}") from None
    if raw is None:
        raw = {}
    return config_from_dict(raw, path.resolve().parent, source=str(path))
