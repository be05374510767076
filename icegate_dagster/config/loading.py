"""From a file or a dict to an :class:`~icegate_dagster.config.models.IcegateConfig`.

Finds the file, reads the YAML, replaces every ``${VAR}`` (collecting the values put
under a secret key: see :mod:`~icegate_dagster.config.secrets`), fills in the embedded
default lakehouse when no catalog is named, and maps the file's layout onto the model
tree (``maintain.tables`` and ``maintain.retention`` merged onto the defaults) for the
models to validate.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from icegate_dagster.config.models import (
    DEFAULT_CATALOG_NAME,
    FILE_KEYS,
    NAMESPACE_WILDCARD,
    IcegateConfig,
    TableSettings,
    _config_error,
    _deep_merge,
    _fail,
    namespace_key,
)
from icegate_dagster.config.secrets import is_secret_key
from icegate_dagster.errors import ConfigError

CONFIG_ENV_VAR = "ICEGATE_CONFIG"

#: The environment variable PySpark reads a Spark Connect URL from: ``spark.remote``'s default.
SPARK_REMOTE_ENV = "SPARK_REMOTE"
DEFAULT_CONFIG_FILE = "icegate.yaml"
EMBEDDED_DIR = ".icegate"

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_TOP_KEYS = ("catalog", "namespaces", "spark", "wal", "maintain")
#: The keys under ``maintain:`` that are IcegateConfig fields of their own.
_MAINTAIN_FIELDS = ("log_table", "lock_wait", "parallel_tables", "locks", "trigger", "history")
#: The blocks whose keys are settings of their own: a ``${VAR}`` under a secret key there
#: is a secret (see ``IcegateConfig.secrets``); where it appears decides nothing else.
_SETTING_BLOCKS = ("catalog.", "spark.conf.", "wal.storage.")


def _blocks() -> list[str]:
    """The keys of :class:`TableSettings` written under ``maintain:`` and per table: the
    operation blocks, ``enabled`` and ``defer_to_amoro``."""
    return [name for name in TableSettings.model_fields if name != "retention"]


def _section(raw: object, key: str, allowed: set[str] | None = None) -> dict[str, Any]:
    """A section of the file's layout that is no model of its own, checked as a mapping."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise _fail(key, raw, "must be a mapping")
    for name, value in raw.items():
        if allowed is not None and name not in allowed:
            where = f"{key}.{name}" if key != "(top level)" else str(name)
            raise _fail(where, value, f"unknown key (allowed: {', '.join(sorted(allowed))})")
    return dict(raw)


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


def _under_secret_key(path: str) -> bool:
    """Whether ``path`` (``catalog.token``, ``spark.conf.spark.hadoop.fs.s3a.secret.key``)
    is a setting whose key names a secret. Passwords inside URIs (``catalog.uri``,
    ``wal.root``, ``maintain.locks.uri``) are found in the URI itself, by their place."""
    return any(
        path.startswith(block) and is_secret_key(path.removeprefix(block))
        for block in _SETTING_BLOCKS
    )


def _merged_block(default: object, own: object) -> object:
    """One block of a table: its own keys laid over the default block's."""
    if own is None:
        return default
    if isinstance(default, Mapping) and isinstance(own, Mapping):
        return _deep_merge(default, own)
    # No default block, or a value that is no mapping (for the model to refuse).
    return own


def _fields_from_file(
    top: Mapping[str, Any], embedded: bool
) -> tuple[dict[str, Any], dict[tuple[str | int, ...], str]]:
    """The file's layout mapped onto IcegateConfig's fields, values left for the models to
    check; also the locations whose key in the file is not the one ``FILE_KEYS`` gives."""
    fields: dict[str, Any] = {key: top[key] for key in ("namespaces", "spark") if key in top}

    catalog = top.get("catalog")
    if catalog is None or isinstance(catalog, Mapping):
        properties = dict(catalog or {})
        catalog = {"properties": properties, "embedded": embedded}
        if "name" in properties:
            catalog["name"] = properties.pop("name")
    fields["catalog"] = catalog

    wal = _section(top.get("wal"), "wal", {"root", "storage"})
    if "root" in wal:
        fields["wal_root"] = wal["root"]
    if "storage" in wal:
        fields["wal_storage"] = wal["storage"]

    maintain = _section(
        top.get("maintain"),
        "maintain",
        {*_MAINTAIN_FIELDS, "tables", *TableSettings.model_fields},
    )
    fields.update((key, maintain[key]) for key in _MAINTAIN_FIELDS if key in maintain)
    defaults = {name: maintain[name] for name in _blocks() if name in maintain}
    fields["defaults"] = defaults

    # A table's settings: its own blocks laid over its namespace's (``ns.*``, if any) and
    # the defaults, its retention rule from maintain.tables or else maintain.retention.
    # Unknown keys are left for TableSettings.
    rules = _section(maintain.get("retention"), "maintain.retention")
    tables = _section(maintain.get("tables"), "maintain.tables")

    def laid_over(base: Mapping[str, Any], own: object, table: Any) -> object:
        if own is None:
            own = {}
        if not isinstance(own, Mapping):
            return own  # for the model to refuse
        merged = {name: _merged_block(base.get(name), own.get(name)) for name in _blocks()}
        return {
            **own,
            # Neither set (or set empty): the model's default.
            **{name: value for name, value in merged.items() if value is not None},
            "retention": own.get("retention", rules.get(table, base.get("retention"))),
        }

    namespaces: dict[str, Any] = {
        str(key): laid_over(defaults, tables.get(key), key)
        for key in tables
        if isinstance(key, str) and key.endswith(NAMESPACE_WILDCARD)
    }
    overrides: dict[Any, Any] = dict(namespaces)
    for table in dict.fromkeys([*rules, *tables]):
        if table in namespaces:
            continue
        namespace = namespaces.get(namespace_key(table)) if isinstance(table, str) else None
        base = namespace if isinstance(namespace, Mapping) else defaults
        overrides[table] = laid_over(base, tables.get(table), table)
    fields["table_overrides"] = overrides
    # A bad table name found only under maintain.retention is named there.
    file_keys: dict[tuple[str | int, ...], str] = {
        ("table_overrides", table, "[key]"): f"maintain.retention.{table}"
        for table in rules
        if table not in tables
    }
    return fields, {**FILE_KEYS, **file_keys}


def config_from_dict(raw: object, base_dir: Path, source: str = "<dict>") -> IcegateConfig:
    """Validate a parsed configuration; relative paths resolve against ``base_dir``."""
    top = _section(raw, "(top level)", set(_TOP_KEYS))
    interpolated: list[tuple[str, str]] = []
    top = _interpolate_env(top, "", interpolated)
    embedded = "catalog" not in top
    if embedded:
        # No catalog named: the embedded SQLite lakehouse beside the config file.
        default = embedded_default_dict(base_dir / EMBEDDED_DIR)
        top["catalog"] = default["catalog"]
        top.setdefault("wal", default["wal"])
    fields, file_keys = _fields_from_file(top, embedded)
    _remote_from_environment(fields, file_keys)
    fields["source"] = source
    fields["locks_fallback_uri"] = f"sqlite:///{(base_dir / EMBEDDED_DIR / 'locks.db').resolve()}"
    fields["secrets"] = tuple(
        dict.fromkeys(v for k, v in interpolated if v.strip() and _under_secret_key(k))
    )
    try:
        return IcegateConfig.model_validate(fields, context={"base_dir": base_dir})
    except ValidationError as exc:
        raise _config_error(exc, file_keys) from None


def _remote_from_environment(
    fields: dict[str, Any], file_keys: dict[tuple[str | int, ...], str]
) -> None:
    """``$SPARK_REMOTE`` (as PySpark reads it) is ``spark.remote`` when the file sets none;
    an error then names the variable."""
    remote = os.environ.get(SPARK_REMOTE_ENV, "").strip()
    spark = fields.get("spark")
    if not remote or not (spark is None or isinstance(spark, Mapping)):
        return
    if spark is not None and spark.get("remote") is not None:
        return  # the file's own wins
    fields["spark"] = {**(spark or {}), "remote": remote}
    file_keys[("spark", "remote")] = f"spark.remote (from ${SPARK_REMOTE_ENV})"


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
    """Load and validate the configuration (see the package docstring for where it comes from)."""
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
