"""Secrets reach the JVM after it starts: never on a command line, never in an event.

PySpark hands every builder setting to ``spark-submit`` as ``--conf k=v``, which every
local user can read in ``ps``. Secrets (settings whose key names one, passwords and
secret parameters inside a URI, and every value that holds one of those) are set on the
running session instead. Where a ``${VAR}`` appears decides nothing: a variable under an
ordinary key (``catalog.name``) is no secret.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
import yaml

from icegate_dagster.assets.names import iceberg_tables
from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import load_config
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource, SparkResource
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.ps_sampler import PsSampler

SECRETS = {
    # A secret-looking key of the catalog, in spark.conf and in the catalog block.
    "ICEGATE_TEST_SPARK_TOKEN": "spark-token-SECRET-3c7d91",
    "ICEGATE_TEST_CATALOG_TOKEN": "catalog-token-SECRET-a41e08",
    # An S3 key for Hadoop's S3A (harmless for a file warehouse).
    "ICEGATE_TEST_S3A_SECRET": "s3a-SECRET-key-77b2f0",
    # Secret keys that Iceberg does not know: a Hadoop setting, and one Spark reads at start.
    "ICEGATE_TEST_HADOOP_PROBE": "hadoop-probe-SECRET-5d0c3a",
    "ICEGATE_TEST_EXECUTOR_ENV": "executor-env-SECRET-e9f614",
}
#: Written in the file as they are, no ${VAR}: secret by their key or their URI part.
LITERAL_SECRETS = {
    "header": "header-bearer-SECRET-0c5e27",
    "jdbc": "jdbc-query-SECRET-6a90f3",
}
MAINTAIN = Path(sys.executable).parent / "icegate-maintain"


def test_no_secret_on_a_command_line(
    lakehouse_factory: LakehouseFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The catalog's name from the environment, a word that is everywhere: the log4j
    # file's folder on the driver's Java options, the table property below.
    monkeypatch.setenv("ICEGATE_TEST_CATALOG_NAME", "icegate")
    for variable, value in SECRETS.items():
        monkeypatch.setenv(variable, value)
    config_path = lakehouse_factory().config_path
    raw = yaml.safe_load(config_path.read_text())
    raw["catalog"]["name"] = "${ICEGATE_TEST_CATALOG_NAME}"
    raw["catalog"]["token"] = "${ICEGATE_TEST_CATALOG_TOKEN}"
    # pyiceberg sends header.<name> as an HTTP header (a SQL catalog ignores it).
    raw["catalog"]["header.Authorization"] = f"Bearer {LITERAL_SECRETS['header']}"
    raw["spark"]["conf"] = {
        "spark.sql.catalog.icegate.some-token": "${ICEGATE_TEST_SPARK_TOKEN}",
        "spark.hadoop.fs.s3a.secret.key": "${ICEGATE_TEST_S3A_SECRET}",
        "spark.hadoop.icegate.probe.secret": "${ICEGATE_TEST_HADOOP_PROBE}",
        # Spark reads this one only at JVM start.
        "spark.executorEnv.ICEGATE_PROBE_TOKEN": "${ICEGATE_TEST_EXECUTOR_ENV}",
        # A second catalog (never used, so never loaded) with its password in its JDBC URL.
        "spark.sql.catalog.other_pg": "org.apache.iceberg.spark.SparkCatalog",
        "spark.sql.catalog.other_pg.type": "jdbc",
        "spark.sql.catalog.other_pg.uri": "jdbc:postgresql://127.0.0.1:1/cat?user=ice"
        f"&password={LITERAL_SECRETS['jdbc']}",
    }
    config_path.write_text(yaml.safe_dump(raw))
    config = load_config(config_path)
    lh = Lakehouse(config_path.parent, config_path, config, open_catalog(config.catalog))
    lh.add_table("lakehouse.logs", appends=6)
    lh.add_table("lakehouse.kept_out", appends=2)
    lh.table("lakehouse.kept_out").transaction().set_properties(
        {"icegate.maintenance.enabled": "false"}
    ).commit_transaction()
    env = dict(os.environ)
    env.pop("PYSPARK_SUBMIT_ARGS", None)

    with PsSampler() as ps:
        done = subprocess.run(  # noqa: S603
            [str(MAINTAIN), "run", "--config", str(config_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimize" in done.stdout
    # The exclusion is reported with its property's name whole.
    assert "icegate.maintenance.enabled=false on lakehouse.kept_out" in done.stdout, done.stdout
    assert "***" not in done.stdout
    assert ps.samples > 20
    spark_lines = [line for line in ps.lines if "SparkSubmit" in line or "spark-submit" in line]
    assert spark_lines, "no sample caught the Spark JVM's command line"
    assert any("spark.sql.catalog.icegate" in line for line in spark_lines)  # the real launch

    rows = lh.log_rows()
    optimized = {row["table_name"]: row["status"] for row in rows if row["operation"] == "optimize"}
    assert optimized == {"lakehouse.logs": "completed", "lakehouse.kept_out": "skipped"}
    log_table = json.dumps(rows, default=str)
    for secret in [*SECRETS.values(), *LITERAL_SECRETS.values()]:
        assert not [line for line in ps.lines if secret in line], f"{secret} is on a command line"
        assert secret not in done.stdout + done.stderr
        assert secret not in log_table


def test_failure_naming_a_secret_is_scrubbed_in_dagster(
    lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation fails with Iceberg's own message, which names a setting holding the
    catalog's token (a value that holds a secret is one wherever it is written)."""
    token = "FileIO-SECRET-b83f27"
    probe = SECRETS["ICEGATE_TEST_HADOOP_PROBE"]
    monkeypatch.setenv("ICEGATE_TEST_IO_TOKEN", token)
    monkeypatch.setenv("ICEGATE_TEST_HADOOP_PROBE", probe)
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6)
    name = lh.config.catalog.name
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["catalog"]["token"] = "${ICEGATE_TEST_IO_TOKEN}"
    raw["spark"]["conf"] = {
        # Iceberg fails to load this FileIO class, and says which one.
        f"spark.sql.catalog.{name}.io-impl": "com.example.${ICEGATE_TEST_IO_TOKEN}",
        "spark.hadoop.icegate.probe.secret": "${ICEGATE_TEST_HADOOP_PROBE}",
    }
    lh.config_path.write_text(yaml.safe_dump(raw))

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, ["lakehouse.logs"])
        spark = SparkResource()
        result = defs.resolve_job_def("maintenance_job").execute_in_process(
            instance=instance,
            partition_key="lakehouse.logs",
            resources={
                "lakehouse": LakehouseResource(config_path=str(lh.config_path)),
                "spark": spark,
            },
        )
        assert result.success
        events = "\n".join(str(e) for e in instance.all_logs(result.run_id))
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("maintained_table")), limit=10
        ).records
        metadata = "\n".join(
            str(r.asset_materialization.metadata) for r in records if r.asset_materialization
        )
    log_table = json.dumps(lh.log_rows(), default=str)

    # The failure is real and reported everywhere: Iceberg's message, the secret masked.
    assert "com.example.***" in events
    # (The log rows themselves are written through the same broken catalog: none here.)
    for where, text in {"events": events, "metadata": metadata, "log table": log_table}.items():
        assert token not in text, f"the secret leaked into the {where}"
        assert probe not in text, f"the secret leaked into the {where}"

    # The held-back settings did reach the session and Hadoop's configuration.
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    assert SparkContext._active_spark_context is not None  # the run's; getOrCreate joins it
    session = SparkSession.builder.getOrCreate()
    assert session.conf.get("spark.hadoop.icegate.probe.secret") == probe
    hadoop = session.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    assert hadoop.get("icegate.probe.secret") == probe
