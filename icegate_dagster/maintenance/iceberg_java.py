"""Iceberg's own Java API on the Spark driver: table updates that need no Spark job.

A procedure call plans a distributed job even for a table of a few files; for small
tables the same update through the table API costs a tenth of the time (see
docs/performance.md). Large tables keep the distributed procedures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import OperationError
from icegate_dagster.spark.remote import is_remote

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Up to this many data files and manifests, metadata-bound operations (snapshot expiry,
#: manifest rewrite) run through the table API on the driver; above, as Spark procedures,
#: whose distributed file listing and deletes scale with the table.
DRIVER_SIDE_MAX_FILES = 20_000
DRIVER_SIDE_MAX_MANIFESTS = 500


def java_table(spark: SparkSession, identifier: str, catalog: str | None = None) -> Any:
    """Iceberg's own Java ``Table`` on the Spark driver (no Spark job).

    ``catalog`` (the Spark catalog name) is initialised first, so that a catalog that
    cannot start fails with its own error (a FileIO class not found, say) rather than
    having its name misread as a namespace of ``spark_catalog``. Refused on Spark Connect,
    where the driver is a server's: callers take their Connect equivalent there.
    """
    if is_remote(spark):
        raise OperationError(
            f"{identifier}: Iceberg's Java table API is out of reach on Spark Connect "
            "(spark.remote): this step has no Connect equivalent yet; run it with a local "
            "Spark (spark.remote unset)"
        )
    jvm: Any = spark._jvm
    session: Any = spark._jsparkSession
    # Outside spark.sql() the JVM reads settings from the calling thread's active session;
    # a maintenance thread (parallel_tables) has none, so a catalog not loaded yet would
    # be "not defined" and the name misread as a spark_catalog namespace.
    jvm.org.apache.spark.sql.SparkSession.setActiveSession(session)
    if catalog is not None:
        session.sessionState().catalogManager().catalog(catalog)
    return jvm.org.apache.iceberg.spark.Spark3Util.loadIcebergTable(session, identifier)


def one_cluster(spark: SparkSession) -> Any:
    """A ``java.util.function.Function`` mapping every data file to one key: a manifest
    rewrite then packs all live entries into as few manifests as the target size allows
    (per partition spec), with no Python callback."""
    jvm: Any = spark._jvm
    handles = jvm.java.lang.invoke.MethodHandles
    anything = jvm.java.lang.Class.forName("java.lang.Object")
    gateway: Any = spark.sparkContext._gateway
    argument_types = gateway.new_array(jvm.java.lang.Class, 1)
    argument_types[0] = anything
    constant = handles.dropArguments(handles.constant(anything, "all"), 0, argument_types)
    function = jvm.java.lang.Class.forName("java.util.function.Function")
    return jvm.java.lang.invoke.MethodHandleProxies.asInterfaceInstance(function, constant)
