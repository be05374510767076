"""The Spark side of a WAL batch: its files read as one DataFrame in the table's schema.

Reading is exact whatever the session's time zone (see the timestamp conversions
below), and a path is never read as a Hadoop glob.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from icegate_dagster.errors import OperationError, describe_error
from icegate_dagster.maintenance.identifiers import quote_identifier
from icegate_dagster.spark.s3a import wal_reader_hint

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

    from icegate_dagster.maintenance.wal.files import WalFile
    from icegate_dagster.maintenance.wal.schema import GoodFile

_GLOB_CHARS = re.compile(r"([\\\[\]{}*?])")


def spark_path(uri: str) -> str:
    """``uri`` with Hadoop glob characters escaped, so Spark reads exactly that file."""
    return _GLOB_CHARS.sub(r"\\\1", uri)


# Spark's casts between TIMESTAMP (an instant) and TIMESTAMP_NTZ (a wall clock) use the
# session time zone, and so does its arithmetic on TIMESTAMP values. A WAL file may hold
# either kind (pyarrow writes naive timestamps as NTZ, zoned ones as instants), so every
# conversion goes through epoch microseconds with zone-free operations instead: a wall
# clock is that clock in UTC (Iceberg's convention for ``timestamp``), and back. Exact,
# also in the hour a daylight-saving change repeats, whatever the session time zone.
_EPOCH_NTZ = "TIMESTAMP_NTZ '1970-01-01 00:00:00'"


def _is_ltz(data_type: Any) -> bool:
    from pyspark.sql.types import TimestampType

    return isinstance(data_type, TimestampType)


def _is_ntz(data_type: Any) -> bool:
    from pyspark.sql.types import TimestampNTZType

    return isinstance(data_type, TimestampNTZType)


def _micros_of_wall_clock(ntz_sql: str) -> str:
    """SQL for the epoch microseconds of a TIMESTAMP_NTZ read as a UTC wall clock."""
    seconds = f"CAST(CAST({ntz_sql} - {_EPOCH_NTZ} AS INTERVAL SECOND) AS DECIMAL(20, 6))"
    return f"CAST({seconds} * 1000000 AS BIGINT)"


def _timestamp_of_micros(micros_sql: str, wanted: Any) -> Column:
    """Epoch microseconds as an instant (TIMESTAMP) or as its UTC wall clock (NTZ)."""
    from pyspark.sql import functions as F

    if _is_ntz(wanted):
        seconds = f"CAST(CAST({micros_sql} AS DECIMAL(20, 0)) / 1000000 AS DECIMAL(20, 6))"
        return F.expr(f"{_EPOCH_NTZ} + CAST({seconds} AS INTERVAL SECOND)")
    return F.expr(f"timestamp_micros({micros_sql})").cast(wanted)


def batch_frame(spark: SparkSession, identifier: str, good: list[GoodFile]) -> DataFrame:
    """All good files as one frame in the table's column order and types."""
    from functools import reduce

    from pyspark.sql import functions as F

    target = spark.table(identifier).schema
    groups: dict[tuple[pa.Schema, frozenset[str]], list[WalFile]] = {}
    for item in good:
        groups.setdefault((item.schema, item.nanos), []).append(item.file)
    frames = []
    for (schema, nanos), members in groups.items():
        # Corrupt or missing files must fail the read, whatever the session says.
        reader = spark.read.option("ignoreCorruptFiles", "false").option(
            "ignoreMissingFiles", "false"
        )
        frame = reader.parquet(*(spark_path(m.uri) for m in members))
        columns = []
        for spark_field in target.fields:
            name = spark_field.name
            wanted = spark_field.dataType
            quoted = quote_identifier(name)
            if name not in schema.names:
                column = F.lit(None).cast(wanted)
            elif name in nanos:
                # Read as a long (spark.sql.legacy.parquet.nanosAsLong, set for the whole
                # session): floor to microseconds in integers, since a double cannot hold
                # today's epoch nanoseconds exactly.
                column = _timestamp_of_micros(f"({quoted} - pmod({quoted}, 1000)) div 1000", wanted)
            elif _is_ntz(frame.schema[name].dataType) and _is_ltz(wanted):
                column = _timestamp_of_micros(_micros_of_wall_clock(quoted), wanted)
            elif _is_ltz(frame.schema[name].dataType) and _is_ntz(wanted):
                column = _timestamp_of_micros(f"unix_micros({quoted})", wanted)
            else:
                column = F.col(name).cast(wanted)
            columns.append(column.alias(name))
        frames.append(frame.select(*columns))
    return reduce(lambda a, b: a.unionByName(b), frames)


def require_nanos_as_long(spark: SparkSession, needed: bool) -> None:
    """Spark 3.5 reads nanosecond Parquet timestamps only as longs, behind a legacy flag.

    The session sets it once (``spark.conf.NANOS_AS_LONG``); it is only read here,
    never switched: tables share the session from several threads. Without it the files
    would look unreadable and be quarantined, so the op fails instead and they stay.
    """
    from icegate_dagster.spark.conf import NANOS_AS_LONG

    if needed and str(spark.conf.get(NANOS_AS_LONG, "false")).lower() != "true":
        raise OperationError(
            f"{NANOS_AS_LONG} is off in this Spark session, so WAL files with INT64 "
            "nanosecond timestamps cannot be read; icegate turns it on when it starts or "
            "joins a session: leave it on"
        )


def spark_failure(spark: SparkSession) -> str | None:
    """Why Spark itself cannot work now (its JVM gone, its context stopped), or None: a
    read that fails then says nothing about the file being read."""
    try:
        spark.sql("SELECT 1").collect()
    except Exception as exc:
        return describe_error(exc)
    return None


def require_wal_filesystem(spark: SparkSession, folder: str) -> None:
    """Raise when Spark cannot open the file system of the WAL ``folder`` (its connector
    missing from the class path, a setting it refuses): then every read would fail, and
    no file may be blamed (quarantined) for it.

    Spark is asked to list the folder (a text source's file index, resolved when its plan
    is analysed: no job, no file read), which opens its file system wherever Spark runs,
    also on a Spark Connect server."""
    try:
        spark.read.format("text").load(spark_path(folder)).schema  # noqa: B018 (analysis)
    except Exception as exc:
        raise OperationError(
            f"Spark cannot open the file system of the WAL folder {folder} "
            f"({describe_error(exc)}); {wal_reader_hint(folder)}. No file was quarantined: "
            "every file waits for a run that can read it"
        ) from None


#: Errors of Python code in this process (PySpark's client), never of a file Spark read.
CLIENT_FAULTS = (AssertionError, AttributeError, NameError, TypeError, ImportError)


def spark_problem(spark: SparkSession, identifier: str, item: GoodFile) -> str | None:
    """Why Spark cannot read and convert this one file, or None."""
    require_nanos_as_long(spark, bool(item.nanos))  # fails the op, quarantines nothing
    try:
        batch_frame(spark, identifier, [item]).write.format("noop").mode("overwrite").save()
    except CLIENT_FAULTS as exc:
        # Raised in this process before Spark saw the file (PySpark's client in a state it
        # does not expect): no file is to blame, so none is quarantined.
        raise OperationError(
            f"PySpark failed in this process while preparing to read {item.file.name} "
            f"({describe_error(exc)}): not the file's fault, no file was quarantined"
        ) from exc
    except Exception as exc:
        return f"Spark cannot read it: {describe_error(exc)}"
    return None
