"""Which settings are secret, how they reach Spark, and how messages are scrubbed (no JVM)."""

from __future__ import annotations

from pathlib import Path

import pytest

from icegate_dagster.config import config_from_dict
from icegate_dagster.config.secrets import config_secrets, is_secret_key, redact_uri, scrub
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark.conf import build_spark_conf
from icegate_dagster.spark.secret_settings import _properties_line, split_secret_conf


def test_config_remembers_values_from_the_environment_under_secret_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ICEGATE_T_TOKEN", "tok-4f1a")
    monkeypatch.setenv("ICEGATE_T_HADOOP", "had-77c0")
    monkeypatch.setenv("ICEGATE_T_PLAIN", "plain-5b1e")
    monkeypatch.setenv("ICEGATE_T_WAL", "walpw-0b3e")
    monkeypatch.setenv("ICEGATE_T_DAYS", "30")
    config = config_from_dict(
        {
            "catalog": {
                "name": "cat",
                "uri": f"sqlite:///{tmp_path}/c.db",
                "token": "${ICEGATE_T_TOKEN}",
            },
            "spark": {
                "conf": {
                    "spark.hadoop.some.secret": "x-${ICEGATE_T_HADOOP}",
                    "spark.hadoop.some.setting": "${ICEGATE_T_PLAIN}",
                }
            },
            "wal": {"root": "s3://AKIAWAL:${ICEGATE_T_WAL}@bucket/wal"},
            "maintain": {"retention": {"ns.t": {"days": "${ICEGATE_T_DAYS}"}}},
        },
        tmp_path,
    )
    # Each variable's own value under a secret key; the URI's password is found in the URI.
    assert set(config.secrets) == {"tok-4f1a", "had-77c0"}
    assert {"walpw-0b3e", "AKIAWAL", "x-had-77c0"} <= set(config_secrets(config))
    text = (
        "failed: token tok-4f1a, setting x-had-77c0, alone had-77c0, plain plain-5b1e, "
        "wal s3://AKIAWAL:walpw-0b3e@bucket/wal, 30 days"
    )
    assert scrub(text, config) == (
        "failed: token ***, setting ***, alone ***, plain plain-5b1e, "
        "wal s3://***:***@bucket/wal, 30 days"
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
    with pytest.raises(SparkStartError, match="spark.driver.extraJavaOptions"):
        split_secret_conf({"spark.driver.extraJavaOptions": "-Dfs.s3a.secret.key=abc"}, [])
    # A secret is found as a whole value, never inside a longer word of a path.
    options = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/x/icegate_d/l.xml"}
    assert split_secret_conf(options, ["icegate"]).public == options


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


@pytest.mark.parametrize(
    "key",
    [
        "password",
        "token",
        "credential",
        "header.Authorization",
        "header.Proxy-Authorization",
        "header.X-Api-Key",
        "header.X-Auth-Token",
        "header.Cookie",
        "s3.secret-access-key",
        "s3.access-key-id",
        "s3.session-token",
        "adls.account-key",
        "spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net",
        "spark.hadoop.fs.s3a.session.token",
        "spark.executorEnv.PGPASSWORD",
        "spark.sql.catalog.cat.header.authorization",
        "sessionToken",
    ],
)
def test_a_secret_is_known_by_its_key(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "name",
        "uri",
        "warehouse",
        "io-impl",
        "s3.endpoint",
        "header.X-Iceberg-Access-Delegation",
        "rest.sigv4-enabled",
        "spark.executorEnv.HOME",
        "spark.driver.extraJavaOptions",
    ],
)
def test_an_ordinary_key_is_no_secret(key: str) -> None:
    assert not is_secret_key(key)


def test_a_variable_under_an_ordinary_key_is_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a ``${VAR}`` appears decides nothing: ``catalog.name: ${CATALOG_NAME}`` is a
    name (Spark starts, messages keep the word), a ``${VAR}`` under a secret key is one."""
    monkeypatch.setenv("ICEGATE_T_NAME", "icegate")
    monkeypatch.setenv("ICEGATE_T_DIR", str(tmp_path))
    monkeypatch.setenv("ICEGATE_T_SECRET", "client-SECRET-91d2")
    config = config_from_dict(
        {
            "catalog": {
                "name": "${ICEGATE_T_NAME}",
                "uri": "sqlite:///${ICEGATE_T_DIR}/c.db",
                "warehouse": "file://${ICEGATE_T_DIR}/warehouse",
                "credential": "client-id:${ICEGATE_T_SECRET}",
            },
            "spark": {"conf": {"spark.hadoop.icegate.dir": "${ICEGATE_T_DIR}"}},
        },
        tmp_path,
    )
    secrets = config_secrets(config)
    assert "icegate" not in secrets and str(tmp_path) not in secrets
    assert "client-SECRET-91d2" in secrets  # the variable's own value, not only the whole
    line = "table property icegate.maintenance.enabled=false on lakehouse.logs"
    assert scrub(line, config) == line
    assert scrub("refused: client-SECRET-91d2", config) == "refused: ***"

    split = split_secret_conf(build_spark_conf(config), secrets)  # no refusal
    assert "icegate" in split.public["spark.driver.extraJavaOptions"]
    assert split.public["spark.sql.catalog.icegate.warehouse"] == f"file://{tmp_path}/warehouse"
    assert split.public["spark.hadoop.icegate.dir"] == str(tmp_path)
    assert split.runtime["spark.sql.catalog.icegate.credential"] == "client-id:client-SECRET-91d2"


def test_passwords_in_a_uri_query_are_secrets(tmp_path: Path) -> None:
    """``?password=`` in the catalog's URI, copied into Spark's JDBC URL; a JDBC URL written
    in ``spark.conf``; an ``Authorization`` header: held back from the command line and
    masked in messages."""
    config = config_from_dict(
        {
            "catalog": {
                "uri": "postgresql+psycopg2://ice@127.0.0.1:5433/cat?password=qpw-SECRET-1"
                "&sslmode=disable",
                "warehouse": "wh",
                "header.Authorization": "Bearer hdr-SECRET-2",
            },
            "spark": {
                "conf": {
                    "spark.sql.catalog.pg": "org.apache.iceberg.spark.SparkCatalog",
                    "spark.sql.catalog.pg.uri": "jdbc:postgresql://h/db?user=u&password=jpw-3",
                }
            },
        },
        tmp_path,
    )
    split = split_secret_conf(build_spark_conf(config), config_secrets(config))
    public = "\n".join(f"{k}={v}" for k, v in split.public.items())
    for secret in ("qpw-SECRET-1", "hdr-SECRET-2", "jpw-3"):
        assert secret not in public
    assert split.runtime["spark.sql.catalog.icegate.uri"] == (
        "jdbc:postgresql://127.0.0.1:5433/cat?password=qpw-SECRET-1&sslmode=disable"
    )
    assert split.runtime["spark.sql.catalog.icegate.header.Authorization"] == "Bearer hdr-SECRET-2"
    assert split.runtime["spark.sql.catalog.pg.uri"].endswith("password=jpw-3")
    assert split.public["spark.sql.catalog.pg"] == "org.apache.iceberg.spark.SparkCatalog"

    text = "failed at jdbc:postgresql://h/db?user=u&password=jpw-3 with hdr-SECRET-2 (qpw-SECRET-1)"
    assert scrub(text, config) == (
        "failed at jdbc:postgresql://h/db?user=u&password=*** with *** (***)"
    )
    assert redact_uri(config.catalog.properties["uri"]) == (
        "postgresql+psycopg2://ice@127.0.0.1:5433/cat?password=***&sslmode=disable"
    )
    assert redact_uri("jdbc:postgresql://h/db?user=u&password=jpw-3;token=t-4") == (
        "jdbc:postgresql://h/db?user=u&password=***;token=***"
    )
    assert redact_uri("https://me:restpw-3c@rest/v1?Signature=abc") == (
        "https://me:***@rest/v1?Signature=***"
    )


def test_scrub_masks_whole_values_never_pieces_of_words(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "catalog": {
                "uri": "postgresql+psycopg2://ice:p%40ss%2Fw0rd@127.0.0.1/cat",
                "warehouse": "wh",
                "token": "gate",
            }
        },
        tmp_path,
    )
    assert scrub("icegate gate, gates: gate.", config) == "icegate ***, gates: ***."
    # The password as the driver decodes it and as the URI writes it.
    assert scrub("p@ss/w0rd and u:p%40ss%2Fw0rd@", config) == "*** and u:***@"


def test_wal_storage_keys_are_secrets_and_reach_spark_per_bucket_at_run_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``wal.storage``'s keys (written in the file or through ``${VAR}``) are scrubbed from
    messages, and the S3A settings built from them for the WAL's bucket are set on the
    running session, never on the command line; the rest are public and per bucket."""
    monkeypatch.setenv("ICEGATE_T_WAL_SECRET", "walsecret-9d2c")
    config = config_from_dict(
        {
            "catalog": {"name": "cat", "uri": f"sqlite:///{tmp_path}/c.db"},
            "wal": {
                "root": "s3://wal-bucket/ingest",
                "storage": {
                    "s3.endpoint": "http://127.0.0.1:8333",
                    "s3.access-key-id": "AKIAWALKEY1",
                    "s3.secret-access-key": "${ICEGATE_T_WAL_SECRET}",
                    "s3.path-style-access": True,
                },
            },
        },
        tmp_path,
    )
    assert {"walsecret-9d2c", "AKIAWALKEY1"} <= set(config_secrets(config))
    assert scrub("denied: AKIAWALKEY1 / walsecret-9d2c", config) == "denied: *** / ***"

    split = split_secret_conf(build_spark_conf(config), config_secrets(config))

    bucket = "spark.hadoop.fs.s3a.bucket.wal-bucket."
    assert split.runtime[bucket + "access.key"] == "AKIAWALKEY1"
    assert split.runtime[bucket + "secret.key"] == "walsecret-9d2c"
    assert {key: value for key, value in split.public.items() if key.startswith(bucket)} == {
        bucket + "endpoint": "http://127.0.0.1:8333",
        bucket + "connection.ssl.enabled": "false",
        bucket + "path.style.access": "true",
        bucket + "endpoint.region": "us-east-1",
    }
    public = " ".join(f"{k}={v}" for k, v in split.public.items())
    assert "AKIAWALKEY1" not in public and "walsecret-9d2c" not in public
