"""Secrets reach the JVM after it starts: never on a command line, never in an event.

PySpark hands every builder setting to ``spark-submit`` as ``--conf k=v``, which every
local user can read in ``ps``. Secrets (secret-looking keys, and every value that came
from a ``${VAR}`` in ``icegate.yaml``) are set on the running session instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import dagster as dg
import pytest
import yaml

from icegate_dagster.definitions import defs
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource, SparkResource
from tests.lakehouse import LakehouseFactory

SECRETS = {
    # A secret-looking key of the catalog, in spark.conf and in the catalog block.
    "ICEGATE_TEST_SPARK_TOKEN": "spark-token-SECRET-3c7d91",
    "ICEGATE_TEST_CATALOG_TOKEN": "catalog-token-SECRET-a41e08",
    # An S3 key for Hadoop's S3A (harmless for a file warehouse).
    "ICEGATE_TEST_S3A_SECRET": "s3a-SECRET-key-77b2f0",
    # Plain-looking keys: secret only because their value came from ${VAR}.
    "ICEGATE_TEST_HADOOP_PROBE": "hadoop-probe-SECRET-5d0c3a",
    "ICEGATE_TEST_EXECUTOR_ENV": "executor-env-SECRET-e9f614",
}
MAINTAIN = Path(sys.executable).parent / "icegate-maintain"


class _PsSampler:
    """Every process command line on the machine, sampled every ~50 ms in a thread."""

    def __init__(self) -> None:
        self.lines: set[str] = set()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            out = subprocess.run(  # noqa: S603
                ["ps", "-ww", "-eo", "args"],  # noqa: S607
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            self.lines.update(out.splitlines())
            self.samples += 1
            self._stop.wait(0.05)

    def __enter__(self) -> _PsSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def test_no_secret_on_a_command_line(lakehouse_factory: LakehouseFactory, tmp_path: Path) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6)
    name = lh.config.catalog.name
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["catalog"]["token"] = "${ICEGATE_TEST_CATALOG_TOKEN}"
    raw["spark"]["conf"] = {
        f"spark.sql.catalog.{name}.some-token": "${ICEGATE_TEST_SPARK_TOKEN}",
        "spark.hadoop.fs.s3a.secret.key": "${ICEGATE_TEST_S3A_SECRET}",
        "spark.hadoop.icegate.probe": "${ICEGATE_TEST_HADOOP_PROBE}",
        # Spark reads this one only at JVM start.
        "spark.executorEnv.ICEGATE_PROBE": "${ICEGATE_TEST_EXECUTOR_ENV}",
    }
    lh.config_path.write_text(yaml.safe_dump(raw))
    env = {**os.environ, **SECRETS}
    env.pop("PYSPARK_SUBMIT_ARGS", None)

    with _PsSampler() as ps:
        done = subprocess.run(  # noqa: S603
            [str(MAINTAIN), "run", "--config", str(lh.config_path)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "optimize" in done.stdout
    assert ps.samples > 20
    spark_lines = [line for line in ps.lines if "SparkSubmit" in line or "spark-submit" in line]
    assert spark_lines, "no sample caught the Spark JVM's command line"
    assert any(f"spark.sql.catalog.{name}" in line for line in spark_lines)  # the real launch

    rows = lh.log_rows()
    assert rows and all(
        row["status"] == "completed" for row in rows if row["operation"] == "optimize"
    )
    log_table = json.dumps(rows, default=str)
    for secret in SECRETS.values():
        assert not [line for line in ps.lines if secret in line], "a secret is on a command line"
        assert secret not in done.stdout + done.stderr
        assert secret not in log_table


def test_failure_naming_a_secret_is_scrubbed_in_dagster(
    lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An operation fails with Iceberg's own message, which names a value from ``${VAR}``."""
    io_impl = "com.example.FileIO_SECRET_b83f27"
    probe = SECRETS["ICEGATE_TEST_HADOOP_PROBE"]
    monkeypatch.setenv("ICEGATE_TEST_IO_IMPL", io_impl)
    monkeypatch.setenv("ICEGATE_TEST_HADOOP_PROBE", probe)
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6)
    name = lh.config.catalog.name
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["spark"]["conf"] = {
        # Iceberg fails to load this FileIO class, and says which one.
        f"spark.sql.catalog.{name}.io-impl": "${ICEGATE_TEST_IO_IMPL}",
        "spark.hadoop.icegate.probe": "${ICEGATE_TEST_HADOOP_PROBE}",
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
    assert "FileIO" in events and "***" in events
    # (The log rows themselves are written through the same broken catalog: none here.)
    for where, text in {"events": events, "metadata": metadata, "log table": log_table}.items():
        assert io_impl not in text, f"the secret leaked into the {where}"
        assert probe not in text, f"the secret leaked into the {where}"

    # The held-back settings did reach the session and Hadoop's configuration.
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    assert SparkContext._active_spark_context is not None  # the run's; getOrCreate joins it
    session = SparkSession.builder.getOrCreate()
    assert session.conf.get("spark.hadoop.icegate.probe") == probe
    hadoop = session.sparkContext._jsc.hadoopConfiguration()  # type: ignore[union-attr]
    assert hadoop.get("icegate.probe") == probe
