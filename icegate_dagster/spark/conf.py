"""Every setting of the session, built from the configuration before the JVM starts.

The Iceberg runtime and the catalog's JDBC driver on the class path
(:mod:`~icegate_dagster.spark.jars`), the catalog registered under its own name
(:mod:`~icegate_dagster.spark.catalog_conf`), the driver's JVM options
(:mod:`~icegate_dagster.spark.jvm_options`), and the user's ``spark.conf`` merged last.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from icegate_dagster.config import IcegateConfig
from icegate_dagster.spark.catalog_conf import spark_catalog_conf
from icegate_dagster.spark.jars import (
    POSTGRES_JDBC_JAR,
    SQLITE_JDBC_JAR,
    check_local_jars,
    default_jars,
    iceberg_version,
    jars_dir,
    jdbc_driver_jars,
    user_supplies_iceberg,
)
from icegate_dagster.spark.jvm_options import (
    class_sharing_options,
    local_gc_options,
    local_jit_options,
)
from icegate_dagster.spark.s3_file_io import check_s3_support
from icegate_dagster.spark.s3a import wal_s3a_conf

ICEBERG_EXTENSIONS = "org.apache.iceberg.spark.extensions.IcebergSparkSessionExtensions"

#: Spark SQL would expand ${var}, ${env:VAR} and ${spark:key} inside SQL text, string
#: literals included: a table named `t${env:SECRET}` would be maintained as `t<value>`.
NO_SUBSTITUTION = "spark.sql.variable.substitute"

#: WAL files may hold INT64 nanosecond timestamps, which Spark 3.5 reads only as longs
#: behind this flag (wal_compaction floors them to microseconds). It is set once for the
#: whole session, never switched per table: tables are maintained side by side in one
#: session. Only Parquet INT64 TIMESTAMP(NANOS) columns are affected, which Iceberg data
#: files never hold (Iceberg reads its own files with its own reader anyway).
NANOS_AS_LONG = "spark.sql.legacy.parquet.nanosAsLong"


def build_spark_conf(config: IcegateConfig, *, small_work: bool = False) -> dict[str, str]:
    """Every Spark setting of the session, user ``spark.conf`` merged last; ``small_work``:
    the process knows its rewrites are small (:func:`local_jit_options`)."""
    user = dict(config.spark.conf)
    own_runtime = user_supplies_iceberg(user)
    jars = [str(p) for p in default_jars(config, user)]
    jars += [str(p) for p in jdbc_driver_jars(config.catalog)]
    # The other JDBC drivers ride along when present: the process's one session must also
    # serve a catalog of the other kind registered later (jars are fixed at JVM start).
    for driver in (SQLITE_JDBC_JAR, POSTGRES_JDBC_JAR):
        if driver.is_file() and str(driver) not in jars:
            jars.append(str(driver))
    log4j = Path(str(resources.files("icegate_dagster.spark"))) / "log4j2.properties"
    conf = {
        "spark.master": config.spark.master,
        "spark.app.name": "icegate-maintain",
        "spark.sql.extensions": ICEBERG_EXTENSIONS,
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={log4j}",
    }
    if config.spark.master.startswith("local"):
        # Maintenance shuffles are small; Spark's 200 default mostly schedules empty tasks.
        conf["spark.sql.shuffle.partitions"] = "8"
    user_jars = [j for j in user.pop("spark.jars", "").split(",") if j.strip()]
    if user_jars or jars:
        conf["spark.jars"] = ",".join([*user_jars, *jars])
    conf.update(spark_catalog_conf(config.catalog))
    conf.update(wal_s3a_conf(config))  # an s3:// wal.root read by Spark through S3A
    # The driver's classes mapped from setup's archive when there is one.
    shared = class_sharing_options(user.get("spark.driver.extraJavaOptions", ""))
    master = config.spark.master
    for options in (
        shared,
        local_gc_options(master, user),
        local_jit_options(master, user, small_work=small_work),
    ):
        if options:
            conf["spark.driver.extraJavaOptions"] += " " + options
    if "spark.driver.extraJavaOptions" in user:
        user["spark.driver.extraJavaOptions"] += " " + conf["spark.driver.extraJavaOptions"]
    conf.update(user)
    conf[NO_SUBSTITUTION] = "false"  # names and messages are data, never expanded
    conf[NANOS_AS_LONG] = "true"  # WAL nanoseconds as longs, session-wide (see NANOS_AS_LONG)
    check_local_jars(conf.get("spark.jars", ""))
    check_s3_support(
        config, conf, iceberg_version(conf), own_runtime=own_runtime, jars_folder=jars_dir()
    )
    return conf
