"""Names reach Spark SQL only quoted; one catalog block gives both engines the same catalog."""

from __future__ import annotations

from pathlib import Path

import pytest

from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import config_from_dict
from icegate_dagster.config.secrets import redact_properties
from icegate_dagster.errors import CatalogUnavailableError, InvalidIdentifierError
from icegate_dagster.maintenance import TableRef
from icegate_dagster.spark.catalog_conf import spark_catalog_conf
from icegate_dagster.spark.conf import build_spark_conf
from icegate_dagster.spark.jars import POSTGRES_JDBC_JAR, SQLITE_JDBC_JAR


def test_hostile_names_are_quoted_never_sql() -> None:
    ref = TableRef("lake`house", "t'; DROP TABLE x; --")
    assert ref.spark_identifier("cat") == "`cat`.`lake``house`.`t'; DROP TABLE x; --`"
    assert ref.procedure_argument() == "'`lake``house`.`t\\'; DROP TABLE x; --`'"


def test_table_part_may_hold_dots() -> None:
    ref = TableRef.parse("lakehouse.events.v2")
    assert (ref.namespace, ref.name) == ("lakehouse", "events.v2")


@pytest.mark.parametrize("text", ["nodot", "lakehouse.", ".t", "lake\x00house.t", "ns.ta\nble"])
def test_unusable_names_are_refused(text: str) -> None:
    with pytest.raises(InvalidIdentifierError):
        TableRef.parse(text)


def test_sqlite_catalog_maps_to_jdbc_with_the_same_name(tmp_path: Path) -> None:
    config = config_from_dict(
        {"catalog": {"name": "lake", "uri": f"sqlite:///{tmp_path}/c.db", "warehouse": "wh"}},
        tmp_path,
    )
    conf = spark_catalog_conf(config.catalog)
    assert conf["spark.sql.catalog.lake"] == "org.apache.iceberg.spark.SparkCatalog"
    assert conf["spark.sql.catalog.lake.type"] == "jdbc"
    assert conf["spark.sql.catalog.lake.uri"] == f"jdbc:sqlite:{tmp_path}/c.db"
    assert conf["spark.sql.catalog.lake.jdbc.init-catalog-tables"] == "false"
    assert conf["spark.sql.catalog.lake.warehouse"] == (tmp_path / "wh").as_uri()


def test_postgres_catalog_maps_credentials_apart_and_redacts_them(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "catalog": {
                "uri": "postgresql+psycopg2://ice:pw123@127.0.0.1:5433/cat",
                "warehouse": "file:///w",
            }
        },
        tmp_path,
    )
    conf = spark_catalog_conf(config.catalog)
    assert conf["spark.sql.catalog.icegate.uri"] == "jdbc:postgresql://127.0.0.1:5433/cat"
    assert conf["spark.sql.catalog.icegate.jdbc.user"] == "ice"
    assert conf["spark.sql.catalog.icegate.jdbc.password"] == "pw123"
    assert "pw123" not in str(redact_properties(config.catalog.properties))


def test_one_session_carries_every_installed_jdbc_driver(tmp_path: Path) -> None:
    """Jars are fixed when the JVM starts: a session first opened for a PostgreSQL
    catalog must still serve a SQLite catalog registered later, and the reverse."""
    for uri in ("postgresql+psycopg2://ice@127.0.0.1/cat", f"sqlite:///{tmp_path}/c.db"):
        config = config_from_dict({"catalog": {"uri": uri, "warehouse": "wh"}}, tmp_path)
        jars = build_spark_conf(config)["spark.jars"].split(",")
        assert {str(SQLITE_JDBC_JAR), str(POSTGRES_JDBC_JAR)} <= set(jars), uri


def test_rest_properties_pass_through(tmp_path: Path) -> None:
    config = config_from_dict(
        {
            "catalog": {
                "name": "r",
                "type": "rest",
                "uri": "http://127.0.0.1:8181",
                "s3.endpoint": "http://127.0.0.1:8333",
                "credential": "id:secret",
            }
        },
        tmp_path,
    )
    conf = spark_catalog_conf(config.catalog)
    assert conf["spark.sql.catalog.r.type"] == "rest"
    assert conf["spark.sql.catalog.r.s3.endpoint"] == "http://127.0.0.1:8333"
    assert redact_properties(config.catalog.properties)["credential"] == "***"


def test_unreachable_catalog_fails_clearly(tmp_path: Path) -> None:
    config = config_from_dict(
        {"catalog": {"uri": f"sqlite:///{tmp_path}/no/such/dir/c.db", "warehouse": "wh"}},
        tmp_path,
    )
    with pytest.raises(CatalogUnavailableError, match="no/such/dir.*does not exist"):
        open_catalog(config.catalog)


def test_pyiceberg_creates_the_catalog_tables(tmp_path: Path) -> None:
    config = config_from_dict({"catalog": {"uri": "sqlite:///c.db", "warehouse": "wh"}}, tmp_path)
    catalog = open_catalog(config.catalog)
    catalog.create_namespace("lakehouse")
    assert ("lakehouse",) in catalog.list_namespaces()
    assert (tmp_path / "c.db").stat().st_size > 0


def test_a_catalog_that_cannot_be_opened_names_no_password(tmp_path: Path) -> None:
    """A real connection attempt to a port nobody listens on: the message names the URI,
    its ``?password=`` masked (it reaches /health, logs and Dagster)."""
    from tests.servers import free_port

    uri = f"postgresql+psycopg2://ice@127.0.0.1:{free_port()}/cat?password=qpw-SECRET-7e1"
    config = config_from_dict({"catalog": {"uri": uri, "warehouse": "wh"}}, tmp_path)
    with pytest.raises(CatalogUnavailableError) as info:
        open_catalog(config.catalog)
    message = str(info.value)
    assert "cannot be opened" in message and "127.0.0.1" in message
    assert "password=***" in message
    assert "qpw-SECRET-7e1" not in message
