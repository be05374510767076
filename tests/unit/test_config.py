"""Configuration: parsing, defaults, per-table overrides and clear errors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import yaml

from icegate_dagster.config import (
    CONFIG_ENV_VAR,
    config_from_dict,
    load_config,
    parse_duration,
    parse_size,
)
from icegate_dagster.config.secrets import config_secrets
from icegate_dagster.errors import ConfigError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", timedelta(seconds=30)),
        ("15m", timedelta(minutes=15)),
        ("12h", timedelta(hours=12)),
        ("7d", timedelta(days=7)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1024, 1024),
        ("10MB", 10 * 1024**2),
        ("512KB", 512 * 1024),
        ("1GB", 1024**3),
        ("64 MiB", 64 * 1024**2),
        ("100", 100),
    ],
)
def test_sizes(value: object, expected: int) -> None:
    assert parse_size(value) == expected


def test_defaults_follow_the_contract(tmp_path: Path) -> None:
    config = config_from_dict({}, tmp_path)
    d = config.defaults
    assert d.optimize.file_size_threshold == 10 * 1024**2
    assert d.optimize.min_input_files == 5
    assert d.optimize.strategy == "binpack"
    assert d.expire_snapshots.retention_threshold == timedelta(days=7)
    assert d.expire_snapshots.retain_last == 1
    assert d.remove_orphan_files.retention_threshold == timedelta(days=7)
    assert d.compaction.min_files == 10
    assert config.log_table == "lakehouse._maintenance_log"
    # No catalog named: the embedded SQLite lakehouse in ./.icegate beside the config.
    assert config.catalog.properties["uri"] == f"sqlite:///{tmp_path / '.icegate' / 'catalog.db'}"
    assert config.catalog.name == "icegate"


def test_per_table_overrides_merge_onto_defaults(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "maintain": {
                "optimize": {"min_input_files": 3},
                "retention": {"lakehouse.logs": {"days": 30, "column": "timestamp"}},
                "tables": {"lakehouse.orders": {"optimize": {"file_size_threshold": "64MB"}}},
            }
        },
        tmp_path,
    )
    orders = config.for_table("lakehouse.orders")
    assert orders.optimize.file_size_threshold == 64 * 1024**2
    assert orders.optimize.min_input_files == 3  # inherited from the default block
    assert config.for_table("lakehouse.logs").retention is not None
    assert config.for_table("lakehouse.logs").retention.days == 30  # type: ignore[union-attr]
    other = config.for_table("lakehouse.other")
    assert other.optimize.file_size_threshold == 10 * 1024**2
    assert other.retention is None


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "icegate.yaml"
    path.write_text(
        yaml.safe_dump({"catalog": {"uri": "sqlite:///db/catalog.db", "warehouse": "wh"}})
    )
    config = load_config(path)
    assert (
        config.catalog.properties["uri"] == f"sqlite:///{tmp_path / 'conf' / 'db' / 'catalog.db'}"
    )
    assert config.catalog.properties["warehouse"] == (tmp_path / "conf" / "wh").as_uri()


@pytest.mark.parametrize("kind", ["rest", "glue", "hive"])
def test_a_server_catalogs_warehouse_is_a_name_not_a_path(tmp_path: Path, kind: str) -> None:
    """A REST server (Polaris, Lakekeeper, ...) takes its warehouse by name: never a local path."""
    path = tmp_path / "icegate.yaml"
    block = {"type": kind, "uri": "http://127.0.0.1:8181", "warehouse": "lake"}
    path.write_text(yaml.safe_dump({"catalog": block}))
    assert load_config(path).catalog.properties["warehouse"] == "lake"


def test_config_file_lookup_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(CONFIG_ENV_VAR, raising=False)
    assert load_config().source == "embedded default"
    Path("icegate.yaml").write_text("namespaces: [local]\n")
    assert load_config().namespaces == ("local",)
    env_file = tmp_path / "env.yaml"
    env_file.write_text("namespaces: [from_env]\n")
    monkeypatch.setenv(CONFIG_ENV_VAR, str(env_file))
    assert load_config().namespaces == ("from_env",)
    flag_file = tmp_path / "flag.yaml"
    flag_file.write_text("namespaces: [from_flag]\n")
    assert load_config(flag_file).namespaces == ("from_flag",)


def test_environment_variables_fill_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEGATE_TEST_TOKEN", "s3cr3t")
    config = config_from_dict(
        {
            "catalog": {
                "type": "rest",
                "uri": "http://127.0.0.1:1",
                "token": "${ICEGATE_TEST_TOKEN}",
            }
        },
        tmp_path,
    )
    assert config.catalog.properties["token"] == "s3cr3t"


BAD_CONFIGS = [
    (
        {"maintain": {"optimize": {"file_size_thresold": "10MB"}}},
        "maintain.optimize.file_size_thresold",
        "unknown key",
    ),
    ({"bogus": 1}, "bogus", "unknown key"),
    (
        {"maintain": {"optimize": {"min_input_files": "five"}}},
        "maintain.optimize.min_input_files",
        "'five'",
    ),
    (
        {"maintain": {"optimize": {"min_input_files": -3}}},
        "maintain.optimize.min_input_files",
        "-3",
    ),
    (
        {"maintain": {"optimize": {"file_size_threshold": "-10MB"}}},
        "maintain.optimize.file_size_threshold",
        "negative",
    ),
    (
        {"maintain": {"optimize": {"file_size_threshold": "ten megs"}}},
        "maintain.optimize.file_size_threshold",
        "'ten megs'",
    ),
    (
        {"maintain": {"optimize": {"strategy": "shuffle"}}},
        "maintain.optimize.strategy",
        "'shuffle'",
    ),
    (
        {"maintain": {"optimize": {"sort_order": "id; DROP TABLE x"}}},
        "maintain.optimize.sort_order",
        "DROP TABLE",
    ),
    (
        {"maintain": {"expire_snapshots": {"retention_threshold": "-1d"}}},
        "maintain.expire_snapshots.retention_threshold",
        "positive",
    ),
    (
        {"maintain": {"expire_snapshots": {"retention_threshold": "0s"}}},
        "maintain.expire_snapshots.retention_threshold",
        "positive",
    ),
    (
        {"maintain": {"expire_snapshots": {"retention_threshold": "7 days"}}},
        "maintain.expire_snapshots.retention_threshold",
        "'7 days'",
    ),
    (
        {"maintain": {"expire_snapshots": {"retain_last": 0}}},
        "maintain.expire_snapshots.retain_last",
        "0",
    ),
    (
        {"maintain": {"remove_orphan_files": {"retention_threshold": "12h"}}},
        "maintain.remove_orphan_files.retention_threshold",
        "at least 24h",
    ),
    (
        {"maintain": {"remove_orphan_files": {"dry_run": "maybe"}}},
        "maintain.remove_orphan_files.dry_run",
        "'maybe'",
    ),
    (
        {"maintain": {"tables": {"lakehouse.orders": {"optimize": {"min_input_files": 0}}}}},
        "maintain.tables.lakehouse.orders.optimize.min_input_files",
        "0",
    ),
    (
        {
            "maintain": {
                "tables": {
                    "lakehouse.orders": {"remove_orphan_files": {"retention_threshold": "1h"}}
                }
            }
        },
        "maintain.tables.lakehouse.orders.remove_orphan_files.retention_threshold",
        "1h",
    ),
    ({"maintain": {"tables": {"orders": {}}}}, "maintain.tables.orders", "namespace.table"),
    (
        {"maintain": {"retention": {"lakehouse.logs": {"days": 0}}}},
        "maintain.tables.lakehouse.logs.retention.days",
        "0",
    ),
    ({"namespaces": "lakehouse"}, "namespaces", "list"),
    ({"spark": {"conf": {"spark.x": {"nested": 1}}}}, "spark.conf.spark.x", "string"),
    ({"catalog": {"name": "bad name", "uri": "sqlite:///x.db"}}, "catalog.name", "'bad name'"),
    (
        {"catalog": {"uri": "sqlite:///x.db", "password": "${ICEGATE_SURELY_UNSET_VAR}"}},
        "catalog.password",
        "ICEGATE_SURELY_UNSET_VAR",
    ),
    (
        {"catalog": {"uri": "sqlite:///x.db"}, "wal": {"storage": {"s3.secret-access-key": "k"}}},
        "wal.storage",
        "['s3.secret-access-key']: wal.storage opens wal.root, which is not set",
    ),
    (
        {"catalog": {"uri": "sqlite:///x.db"}, "wal": {"root": "s3://b/w", "storage": "x"}},
        "wal.storage",
        "mapping",
    ),
    ({"wal": {"root": "s3://b/w", "stroage": {}}}, "wal.stroage", "allowed: root, storage"),
]


@pytest.mark.parametrize(("raw", "key", "value"), BAD_CONFIGS)
def test_bad_config_names_the_key_and_value(
    tmp_path: Path, raw: dict[str, object], key: str, value: str
) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_dict(raw, tmp_path)
    message = str(info.value)
    assert key in message, message
    assert value in message, message


def test_invalid_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "icegate.yaml"
    path.write_text("maintain:\n  optimize: [unclosed\n")
    with pytest.raises(ConfigError, match=r"icegate.yaml is not valid YAML at line \d+"):
        load_config(path)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--config = .*nope.yaml.*file not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        ("http://spark:15002", "must be a Spark Connect URL starting with sc://"),
        ("sc://", "is no Spark Connect URL"),
        ("sc://spark:15002/path", "is no Spark Connect URL"),
        ("sc://spark:99999", "port '99999' is no TCP port"),
        (15002, "must be a Spark Connect URL"),
    ],
)
def test_a_bad_spark_remote_names_the_key_and_the_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: object, rule: str
) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"spark": {"remote": value}}, tmp_path)
    assert str(raised.value).startswith(f"invalid config: spark.remote = {value!r}: {rule}")


def test_spark_remote_comes_from_the_file_else_spark_remote_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert config_from_dict({}, tmp_path).spark.remote is None
    good = "sc://spark-connect.internal:15002/;use_ssl=true"
    assert config_from_dict({"spark": {"remote": good}}, tmp_path).spark.remote == good
    monkeypatch.setenv("SPARK_REMOTE", "sc://from-env:15002")
    assert config_from_dict({}, tmp_path).spark.remote == "sc://from-env:15002"
    assert config_from_dict({"spark": {"remote": good}}, tmp_path).spark.remote == good
    monkeypatch.setenv("SPARK_REMOTE", "spark-connect:15002")
    with pytest.raises(ConfigError, match=r"^invalid config: spark.remote \(from \$SPARK_REMOTE\)"):
        config_from_dict({}, tmp_path)


def test_a_token_in_spark_remote_is_a_secret_never_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARK_REMOTE", raising=False)
    token = "tok-9f8e7d6c5b4a"
    with pytest.raises(ConfigError) as raised:
        config_from_dict({"spark": {"remote": f"sc://h:0/;token={token}"}}, tmp_path)
    assert token not in str(raised.value) and ";token=***" in str(raised.value)
    config = config_from_dict({"spark": {"remote": f"sc://h:15002/;token={token}"}}, tmp_path)
    assert token in config_secrets(config)
