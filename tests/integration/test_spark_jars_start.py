"""A real Spark start on the jars found before it: the Iceberg runtime the JVM loads is the
one the precedence names (a user's ``spark.jars`` over ``ICEGATE_SPARK_JARS_DIR`` over
set-up's folder), and it is the pinned Maven Central release."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pyiceberg.catalog.sql import SqlCatalog

from icegate_dagster.spark.jars import JARS_DIR_ENV, SETUP_JARS_DIR, pinned_jars
from tests.lakehouse import SCHEMA

#: Starts the session from a config file and prints what the JVM loaded.
PROBE = """
import json, sys
from icegate_dagster.config import load_config
from icegate_dagster.spark.session import get_spark
spark = get_spark(load_config(sys.argv[1]))
jvm = spark.sparkContext._jvm
build = jvm.java.lang.Class.forName(
    "org.apache.iceberg.IcebergBuild", True, jvm.Thread.currentThread().getContextClassLoader()
)
print(json.dumps({
    "version": jvm.org.apache.iceberg.IcebergBuild.version(),
    "from": build.getProtectionDomain().getCodeSource().getLocation().getPath(),
    "rows": spark.sql("SELECT count(*) FROM lake.ns.t").first()[0],
}))
"""


def _probe(config: Path, env: dict[str, str]) -> dict[str, object]:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_the_jvm_loads_the_runtime_the_precedence_names(tmp_path: Path) -> None:
    catalog_db, warehouse = tmp_path / "catalog.db", tmp_path / "warehouse"
    catalog = SqlCatalog("lake", uri=f"sqlite:///{catalog_db}", warehouse=warehouse.as_uri())
    catalog.create_namespace("ns")
    catalog.create_table("ns.t", SCHEMA)
    [runtime] = [pin for pin in pinned_jars() if pin.artifact.startswith("iceberg-spark-runtime")]
    setup_jar = SETUP_JARS_DIR / runtime.file_name
    # Two other folders holding copies of the same release (the JVM says which file it
    # read; a symbolic link would name set-up's file).
    air_gapped, users = tmp_path / "air-gapped", tmp_path / "users"
    for folder in (air_gapped, users):
        folder.mkdir()
        shutil.copyfile(setup_jar, folder / runtime.file_name)
    users_jar = users / runtime.file_name

    def config(spark_conf: str) -> Path:
        path = tmp_path / f"icegate-{len(spark_conf)}.yaml"
        path.write_text(
            "catalog:\n"
            "  name: lake\n"
            f"  uri: sqlite:///{catalog_db}\n"
            f"  warehouse: {warehouse.as_uri()}\n"
            "spark:\n"
            "  master: local[1]\n"
            f"{spark_conf}"
        )
        return path

    env = {k: v for k, v in os.environ.items() if k != JARS_DIR_ENV}
    env[JARS_DIR_ENV] = str(air_gapped)
    # The folder replaces set-up's...
    from_folder = _probe(config(""), env)
    assert from_folder == {
        "version": runtime.version,
        "from": str(air_gapped / runtime.file_name),
        "rows": 0,
    }
    # ...and a user's spark.jars replaces the folder's.
    from_user = _probe(config(f"  conf:\n    spark.jars: {users_jar}\n"), env)
    assert from_user == {"version": runtime.version, "from": str(users_jar), "rows": 0}
