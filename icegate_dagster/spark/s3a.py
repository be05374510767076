"""Hadoop S3A settings with which Spark reads WAL files from an ``s3://`` ``wal.root``.

Spark reads the WAL's Parquet files through Hadoop (Iceberg's own S3FileIO serves only
tables), so an S3 ``wal.root`` is handed to Spark as ``s3a://`` (Hadoop's S3 connector,
``hadoop-aws`` and the AWS SDK bundle on the class path) and configured from the same
storage properties pyarrow opens it with
(:meth:`~icegate_dagster.config.IcegateConfig.wal_storage_properties`). Every setting is
per bucket (``fs.s3a.bucket.<bucket>.*``), so a table's storage or another bucket keeps
its own; the keys are secrets, which :mod:`~icegate_dagster.spark.secret_settings` sets on
the running session, never on a command line. A user's own ``spark.conf`` still wins.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.models import DEFAULT_S3_REGION

#: The schemes of an S3 ``wal.root``, all handed to Spark as ``s3a://``.
S3A_SCHEMES = frozenset({"s3", "s3a", "s3n"})
#: What gives Spark ``s3a://``: Hadoop's S3A matching PySpark 3.5's Hadoop 3.3.4, and the
#: AWS SDK it was built with (Maven coordinates).
S3A_PACKAGES = ("org.apache.hadoop:hadoop-aws:3.3.4", "com.amazonaws:aws-java-sdk-bundle:1.12.262")
_TRUE = ("true", "1", "yes")


def _first(props: Mapping[str, str], *keys: str) -> str | None:
    return next((props[key] for key in keys if props.get(key)), None)


def wal_reader_hint(folder: str) -> str:
    """What lets Spark read WAL files at ``folder`` (a Hadoop path), for messages."""
    if urlsplit(folder).scheme in S3A_SCHEMES:
        return (
            "Spark reads an S3 wal.root through Hadoop's S3A: put "
            f"{' and '.join(S3A_PACKAGES)} on its class path (spark.conf spark.jars)"
        )
    return "give Spark the Hadoop file system of wal.root's scheme"


def wal_s3a_conf(config: IcegateConfig) -> dict[str, str]:
    """``spark.hadoop.fs.s3a.bucket.<bucket>.*`` for an S3 ``wal.root`` (empty otherwise):
    endpoint, path-style access, region and keys from its storage properties."""
    if not config.wal_root:
        return {}
    root = urlsplit(config.wal_root)
    if root.scheme not in S3A_SCHEMES or not root.hostname:
        return {}
    props = config.wal_storage_properties()
    prefix = f"spark.hadoop.fs.s3a.bucket.{root.netloc}."
    conf: dict[str, str] = {}
    endpoint = props.get("s3.endpoint")
    if endpoint:
        conf[prefix + "endpoint"] = endpoint
        # An http:// endpoint (a store on loopback or in the same network) needs no TLS.
        conf[prefix + "connection.ssl.enabled"] = str(
            not endpoint.lower().startswith("http://")
        ).lower()
    # As pyarrow does: path-style addressing with an endpoint unless virtual is asked for.
    virtual = props.get("s3.force-virtual-addressing", "").strip().lower() in _TRUE
    path_style = props.get("s3.path-style-access")
    if path_style is not None:
        conf[prefix + "path.style.access"] = str(path_style.strip().lower() in _TRUE).lower()
    elif endpoint:
        conf[prefix + "path.style.access"] = str(not virtual).lower()
    region = _first(props, "s3.region", "client.region")
    if region or endpoint:
        conf[prefix + "endpoint.region"] = region or DEFAULT_S3_REGION
    access_key = _first(props, "s3.access-key-id", "client.access-key-id")
    secret_key = _first(props, "s3.secret-access-key", "client.secret-access-key")
    token = _first(props, "s3.session-token", "client.session-token")
    if access_key and secret_key:
        conf[prefix + "access.key"] = access_key
        conf[prefix + "secret.key"] = secret_key
        provider = "SimpleAWSCredentialsProvider"
        if token:
            conf[prefix + "session.token"] = token
            provider = "TemporaryAWSCredentialsProvider"
        conf[prefix + "aws.credentials.provider"] = f"org.apache.hadoop.fs.s3a.{provider}"
    return conf
