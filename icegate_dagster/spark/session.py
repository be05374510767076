"""The process's Spark session: one per process, started on first use, stopped at exit.

Its settings come from :func:`~icegate_dagster.spark.conf.build_spark_conf`; the secrets
among them stay off the command line (:mod:`~icegate_dagster.spark.secret_settings`). A
later configuration's catalog is registered on the running session. With ``spark.remote``
the session is a Spark Connect server's (:mod:`~icegate_dagster.spark.remote`).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import config_secrets
from icegate_dagster.errors import SparkStartError
from icegate_dagster.spark.catalog_conf import spark_catalog_conf
from icegate_dagster.spark.conf import NANOS_AS_LONG, NO_SUBSTITUTION, build_spark_conf
from icegate_dagster.spark.remote import check_catalog, connect, is_remote, leave_connect_mode
from icegate_dagster.spark.s3a import wal_s3a_conf
from icegate_dagster.spark.secret_settings import (
    apply_runtime_conf,
    private_launch_settings,
    split_secret_conf,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_lock = threading.Lock()
_session: SparkSession | None = None
#: The process's Spark Connect sessions, by server URL (beside a local one, if any).
_remote_sessions: dict[str, SparkSession] = {}


def get_spark(
    config: IcegateConfig,
    *,
    small_work: bool = False,
    extra_conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """The process's Spark session, started on first use (``small_work``: see
    :func:`local_jit_options`); later calls register new catalogs. With ``spark.remote``, a
    session on that Spark Connect server (no JVM here: :mod:`.remote`), ``extra_conf``
    set on it too."""
    global _session
    url = config.spark.remote
    if url is not None:
        with _lock:
            remote = _remote_sessions.get(url)
            if remote is None:
                remote = _remote_sessions[url] = connect(config, extra_conf)
            elif _register_catalog(remote, config):
                check_catalog(remote, config.catalog.name, url)
            return remote
    conf = build_spark_conf(config, small_work=small_work)
    split = split_secret_conf(conf, config_secrets(config))
    with _lock:
        if _session is None:
            _session = _start(split.public, split.runtime, split.launch)
        else:
            _register_catalog(_session, config)
        return _session


def _start(
    conf: Mapping[str, str],
    runtime: Mapping[str, str] | None = None,
    launch: Mapping[str, str] | None = None,
) -> SparkSession:
    """Start (or join) the session with ``conf`` on the command line, the secrets not."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    for key, value in conf.items():
        builder = builder.config(key, value)
    try:
        with private_launch_settings(launch or {}):
            session = builder.getOrCreate()
        apply_runtime_conf(session, runtime or {})
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SparkStartError(
            f"Spark could not start (master {conf.get('spark.master')!r}): {first}. "
            "Check that Java 17 is installed (JAVA_HOME) and spark.conf is valid."
        ) from None
    quiet_logs(session)
    # Also when getOrCreate returned a session someone else started (dagster-pyspark).
    session.conf.set(NO_SUBSTITUTION, "false")
    session.conf.set(NANOS_AS_LONG, "true")
    return session


def quiet_logs(session: SparkSession) -> None:
    """Errors only from Spark: icegate reports results itself (a Connect server's log
    level is the server's own)."""
    if not is_remote(session):
        session.sparkContext.setLogLevel("ERROR")


def _register_catalog(session: SparkSession, config: IcegateConfig) -> bool:
    """Add a catalog to a running session (Spark loads catalog plugins on first use);
    whether it was new there."""
    added = False
    for key, value in spark_catalog_conf(config.catalog).items():
        current = session.conf.get(key, None)
        if current is None:
            session.conf.set(key, value)
            added = True
        elif current != value:
            raise SparkStartError(
                f"Spark catalog {config.catalog.name!r} is already registered in this process "
                f"with another setting for {key}; give each catalog its own name"
            )
    # Its WAL bucket's S3A settings too (per bucket, set at run time like any secret).
    apply_runtime_conf(session, wal_s3a_conf(config))
    return added


def stop_spark() -> None:
    """Stop the process's session, however it was started (tests and the CLI call this)."""
    global _session
    from pyspark.sql import SparkSession

    with _lock:
        session = _session or SparkSession.getActiveSession()
        if session is not None:
            session.stop()
        _session = None
        for remote in _remote_sessions.values():
            remote.stop()  # the client's; the server runs on
        _remote_sessions.clear()
        leave_connect_mode()
