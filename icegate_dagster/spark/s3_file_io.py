"""Spark's S3 client for a catalog whose files live in S3: Iceberg's ``S3FileIO``.

A catalog keeps its files in S3 when its warehouse is ``s3://...``, its ``io-impl`` is
``S3FileIO`` or it sets ``s3.*`` properties and names no warehouse elsewhere
(:func:`s3_usage`). Spark's catalog then gets ``S3FileIO`` with the catalog's endpoint,
region, path-style access and keys (:func:`s3_catalog_properties`), and Iceberg's AWS
bundle (the AWS SDK ``S3FileIO`` needs) joins the class path: set-up's jar
(:func:`~icegate_dagster.spark.jars.default_jars`) unless the user's ``spark.conf`` brings
its own Iceberg runtime or S3 jars. With no S3 client at all the session is refused
before the JVM starts (:func:`check_s3_support`).

``s3.*`` keys beside a warehouse elsewhere (on local disk, there for an ``s3://`` WAL or
a table placed in S3) give Spark's catalog Iceberg's ``ResolvingFileIO`` instead, which
opens each path with the FileIO of its scheme: ``S3FileIO`` (with those keys) for
``s3://``, Hadoop's file systems for the rest. One FileIO for every table would fail on
the others' paths, and Iceberg retries a table's metadata read that fails for minutes
before it gives up. The keys and the REST credential reach the JVM only after it starts
(:mod:`.secret_settings`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from icegate_dagster.config import CatalogSettings, IcegateConfig
from icegate_dagster.errors import SparkStartError

S3_FILE_IO = "org.apache.iceberg.aws.s3.S3FileIO"
#: Iceberg's FileIO that opens each path with the FileIO of its scheme.
RESOLVING_FILE_IO = "org.apache.iceberg.io.ResolvingFileIO"
_AWS_BUNDLE_GLOB = "iceberg-aws-bundle-*.jar"
#: What gives ``S3FileIO`` its AWS SDK: Iceberg's bundle, or the SDK's own jars.
_S3_FILE_IO_JARS = ("iceberg-aws-bundle", "software.amazon.awssdk")
#: What gives Spark some S3 file system: the above, or Hadoop's S3A connector (for a
#: user's own ``io-impl``, such as ``HadoopFileIO`` over ``s3a://``).
_S3_SUPPORT = (*_S3_FILE_IO_JARS, "hadoop-aws", "aws-java-sdk-bundle")
#: Where such a jar may be named.
CLASSPATH_KEYS = (
    "spark.jars",
    "spark.jars.packages",
    "spark.driver.extraClassPath",
    "spark.executor.extraClassPath",
)
#: Locations Iceberg's Java side reads through an S3 file system.
S3_SCHEMES = ("s3://", "s3a://", "s3n://")
#: The region an S3-compatible store (one named by ``s3.endpoint``) gets when the
#: catalog names none: the AWS SDK would otherwise look for one in the environment and
#: the instance metadata service, and fail. pyarrow (pyiceberg's side) assumes the same.
DEFAULT_REGION = "us-east-1"


def s3_keys(settings: CatalogSettings) -> list[str]:
    """The catalog's ``s3.*`` properties (their names), sorted."""
    return sorted(key for key in settings.properties if key.startswith("s3."))


def s3_usage(settings: CatalogSettings) -> str | None:
    """Why the catalog's files live in S3, for messages (``its warehouse is s3://...``), or
    None. Judged from the properties alone: the warehouse, ``io-impl`` or any ``s3.*`` key
    (unless the warehouse is elsewhere: :func:`mixed_storage`)."""
    props = settings.properties
    warehouse = props.get("warehouse", "")
    if warehouse.lower().startswith(S3_SCHEMES):
        return f"its warehouse is {warehouse}"
    io_impl = props.get("io-impl", "")
    if io_impl.endswith("S3FileIO"):
        return f"its io-impl is {io_impl}"
    if warehouse:  # on local disk (made a file: URI at load) or in another store
        return None
    keys = s3_keys(settings)
    if keys:
        return f"it sets {'s3.endpoint' if 's3.endpoint' in keys else keys[0]}"
    return None


def mixed_storage(settings: CatalogSettings) -> bool:
    """Whether the catalog sets ``s3.*`` keys beside a warehouse that is not in S3 (its
    tables on local disk, say, and the WAL or some table in S3): its tables' paths then
    need the FileIO of their own scheme (:data:`RESOLVING_FILE_IO`)."""
    return s3_usage(settings) is None and bool(s3_keys(settings))


def s3_catalog_properties(settings: CatalogSettings) -> dict[str, str]:
    """What Spark's catalog needs beyond the catalog's own properties to reach its S3:
    ``S3FileIO`` (:data:`RESOLVING_FILE_IO` for :func:`mixed_storage`; neither when
    ``io-impl`` is set), ``client.region`` (pyiceberg's ``s3.region``, else
    :data:`DEFAULT_REGION` for an ``s3.endpoint``), and path-style access for an
    ``s3.endpoint`` (pyiceberg's default there; S3-compatible stores need it)."""
    mixed = mixed_storage(settings)
    if s3_usage(settings) is None and not mixed:
        return {}
    props = settings.properties
    extra: dict[str, str] = {}
    if "io-impl" not in props:
        extra["io-impl"] = RESOLVING_FILE_IO if mixed else S3_FILE_IO
    endpoint = "s3.endpoint" in props
    if "client.region" not in props:
        region = props.get("s3.region") or (DEFAULT_REGION if endpoint else None)
        if region:
            extra["client.region"] = region
    if endpoint and "s3.path-style-access" not in props:
        extra["s3.path-style-access"] = "true"
    return extra


def s3_jars_named(conf: Mapping[str, str], *, file_io_only: bool = False) -> bool:
    """Whether the class path settings in ``conf`` name a jar that gives Spark an S3
    client (``file_io_only``: one that ``S3FileIO`` can use)."""
    named = " ".join(conf.get(key, "") for key in CLASSPATH_KEYS)
    return any(jar in named for jar in (_S3_FILE_IO_JARS if file_io_only else _S3_SUPPORT))


def check_s3_support(
    config: IcegateConfig,
    conf: Mapping[str, str],
    version: str,
    *,
    own_runtime: bool,
    jars_folder: Path,
) -> None:
    """Refuse, before the JVM starts, a catalog in S3 when Spark's class path has no S3
    client for its ``io-impl`` (``version``: the Iceberg runtime's, for the message;
    ``own_runtime``: ``spark.conf`` brings its own, so set-up's bundle was not added;
    ``jars_folder``: where set-up's jars are looked for).

    Without one every Spark read or write of the catalog's files fails deep in Java
    (``ClassNotFoundException``, ``No FileSystem for scheme "s3"``); this says what to add.
    """
    reason = s3_usage(config.catalog)
    if reason is None:
        return
    io_impl = conf.get(f"spark.sql.catalog.{config.catalog.name}.io-impl", S3_FILE_IO)
    if s3_jars_named(conf, file_io_only=io_impl == S3_FILE_IO):
        return
    why = (
        "spark.conf brings its own Iceberg runtime and no S3 jar"
        if own_runtime
        else f"no {_AWS_BUNDLE_GLOB} in {jars_folder}, where scripts/setup.sh puts it, and "
        "none named in spark.conf"
    )
    raise SparkStartError(
        f"catalog {config.catalog.name!r} keeps its files in S3 ({reason}) but Spark has no "
        f"S3 support ({why}): add org.apache.iceberg:iceberg-aws-bundle:{version} to "
        "spark.conf spark.jars.packages (or its jar to spark.jars)"
    )
