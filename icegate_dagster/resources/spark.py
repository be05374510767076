"""Spark for Dagster runs, built on dagster-pyspark and started lazily."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import dagster as dg
from dagster_pyspark import LazyPySparkResource
from pydantic import PrivateAttr

from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import config_secrets
from icegate_dagster.spark.conf import NANOS_AS_LONG, NO_SUBSTITUTION, build_spark_conf
from icegate_dagster.spark.secret_settings import (
    apply_runtime_conf,
    private_launch_settings,
    split_secret_conf,
)
from icegate_dagster.spark.session import get_spark, quiet_logs

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

#: Held while a session starts or is fetched: the process has one session.
_STARTING = threading.Lock()


class SparkResource(dg.ConfigurableResource):  # type: ignore[type-arg]
    """The run's Spark session, created on first use and shared by every step of the run.

    Settings come from ``icegate.yaml`` (``spark.master``, ``spark.conf``);
    ``spark_conf`` here is merged last, for per-deployment overrides.
    """

    spark_conf: dict[str, str] = {}
    _lazy: LazyPySparkResource | None = PrivateAttr(default=None)
    #: Set by :meth:`start_in_background` before the session starts (see there).
    _small_work: bool = PrivateAttr(default=False)

    def session(self, config: IcegateConfig) -> SparkSession:
        """The Spark session for ``config``'s catalog (no JVM starts before this call);
        with ``spark.remote``, the run's session on that Spark Connect server (no JVM here,
        ``spark_conf`` set on it as session settings)."""
        if config.spark.remote is not None:
            return get_spark(config, extra_conf=self.spark_conf)
        with _STARTING:  # one start at a time: a background start and a step's call
            # Read under the lock: a background start may be choosing the JIT right now.
            conf = {**build_spark_conf(config, small_work=self._small_work), **self.spark_conf}
            # Secrets stay off spark-submit's command line (see spark.secret_settings.SplitConf).
            split = split_secret_conf(conf, config_secrets(config))
            if self._lazy is None or self._lazy.spark_config != split.public:
                self._lazy = LazyPySparkResource(spark_config=split.public)
            with private_launch_settings(split.launch):
                session: SparkSession = self._lazy.spark_session
            apply_runtime_conf(session, split.runtime)
            quiet_logs(session)
            session.conf.set(NO_SUBSTITUTION, "false")  # see spark.conf.NO_SUBSTITUTION
            session.conf.set(NANOS_AS_LONG, "true")  # see spark.conf.NANOS_AS_LONG
        return session

    def start_in_background(
        self, config: IcegateConfig, small_work: Callable[[], bool] | None = None
    ) -> None:
        """Start the JVM in a thread while the run plans from metadata, for a run that
        knows it has Spark work (a sensor's batch run: every table it lists is due); the
        first step that needs the session waits for it. ``small_work``, asked in that
        thread before the JVM starts, says whether the run's rewrites are small (a local
        driver then uses the quicker JIT: ``spark.jvm_options.local_jit_options``). A start
        that fails is left for that step to report."""

        def start() -> None:
            with _STARTING:  # decided before any session of the run exists
                if self._lazy is None and small_work is not None:
                    try:
                        self._small_work = small_work()
                    except Exception:  # unknown: the JVM's own JIT
                        self._small_work = False
            with contextlib.suppress(Exception):
                self.session(config)

        threading.Thread(target=start, name="icegate-spark-start", daemon=True).start()
