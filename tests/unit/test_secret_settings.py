"""Which settings are secret, how they reach Spark, and how messages are scrubbed (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icegate_dagster.catalog import config_secrets, scrub
from icegate_dagster.config import config_from_dict
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark_session import _properties_line, split_secret_conf


def test_config_remembers_values_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEGATE_T_TOKEN", "tok-4f1a")
    monkeypatch.setenv("ICEGATE_T_HADOOP", "had-77c0")
    monkeypatch.setenv("ICEGATE_T_WAL", "walpw-0b3e")
    monkeypatch.setenv("ICEGATE_T_DAYS", "30")
    config = config_from_dict(
        {
            "catalog": {
                "name": "cat",
                "uri": f"sqlite:///{tmp_path}/c.db",
                "token": "${ICEGATE_T_TOKEN}",
            },
            "spark": {"conf": {"spark.hadoop.some.setting": "x-${ICEGATE_T_HADOOP}"}},
            "wal": {"root": "s3://AKIAWAL:${ICEGATE_T_WAL}@bucket/wal"},
            "maintain": {"retention": {"ns.t": {"days": "${ICEGATE_T_DAYS}"}}},
        },
        tmp_path,
    )
    assert set(config.secrets) == {"tok-4f1a", "had-77c0", "walpw-0b3e"}  # not maintain.*
    text = (
        "failed: token tok-4f1a, setting x-had-77c0, "
        "wal s3://AKIAWAL:walpw-0b3e@bucket/wal, 30 days"
    )
    assert scrub(text, config) == (
        "failed: token ***, setting x-***, wal s3://***:***@bucket/wal, 30 days"
    )
    # The catalog alone still scrubs its own secrets (pyiceberg errors at open).
    assert scrub(text, config.catalog).startswith("failed: token ***, setting x-had-77c0")


def test_secret_keys_and_uri_secrets_without_the_environment(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "catalog": {"name": "cat", "uri": "postgresql+psycopg2://u:pgpw-91@db/ice"},
            "spark": {
                "conf": {
                    "spark.hadoop.fs.s3a.secret.key": "s3a-key-5e",
                    "spark.sql.catalog.cat.token-refresh-enabled": "true",
                    "spark.sql.catalog.other.uri": "https://me:restpw-3c@rest/v1",
                }
            },
            "wal": {"root": "s3://bucket/wal?X-Amz-Signature=sig-d2&region=eu"},
        },
        tmp_path,
    )
    secrets = config_secrets(config)
    assert {"pgpw-91", "s3a-key-5e", "restpw-3c", "sig-d2"} <= set(secrets)
    assert "true" not in secrets and "eu" not in secrets  # flags and plain values stay
    assert scrub("true: pgpw-91 s3a-key-5e restpw-3c sig-d2", config) == "true: *** *** *** ***"


def test_secret_settings_stay_off_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = {
        "spark.master": "local[2]",
        "spark.sql.catalog.cat": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.cat.jdbc.password": "pw",
        "spark.sql.catalog.cat.credential": "id:secret",
        "spark.hadoop.fs.s3a.access.key": "AKIA",
        "spark.hadoop.plain": "from-env-1",
        "spark.executorEnv.X": "from-env-2",
        "spark.authenticate.secret": "shared",
    }
    split = split_secret_conf(conf, ["from-env-1", "from-env-2"])
    assert split.public == {
        "spark.master": "local[2]",
        "spark.sql.catalog.cat": "org.apache.iceberg.spark.SparkCatalog",
    }
    assert set(split.runtime) == {
        "spark.sql.catalog.cat.jdbc.password",
        "spark.sql.catalog.cat.credential",
        "spark.hadoop.fs.s3a.access.key",
        "spark.hadoop.plain",
    }
    assert split.launch == {
        "spark.executorEnv.X": "from-env-2",
        "spark.authenticate.secret": "shared",
    }
    with pytest.raises(SparkStartError, match="spark.driver.extraJavaOptions"):
        split_secret_conf({"spark.driver.extraJavaOptions": "-Dk=from-env-1"}, ["from-env-1"])


def test_properties_lines_are_escaped() -> None:
    assert _properties_line("spark.a", "x y=z:w#!\\\n") == "spark.a=x\\ y\\=z\\:w\\#\\!\\\\\\n\n"


def test_a_secret_is_masked_before_a_long_error_is_cut() -> None:
    """A cut at 1,000 characters must not leave a piece of a secret that masking no
    longer recognises."""
    from icegate_dagster.errors import describe_error

    secret = "S3cr3tPassw0rdValue"
    text = "x" * 990 + f" postgresql://u:{secret}@db/catalog"
    described = describe_error(RuntimeError(text), lambda t: t.replace(secret, "***"))
    assert len(described) <= 1000
    assert "S3cr3t" not in described and "S3c" not in described[-30:]
