"""A pass's Spark session: started when an operation first needs it, or ahead, in a thread
beside the pass's planning, with the quick JIT when the pass's rewrites are small.

The choice is made from the pass's outlook (:mod:`.outlook`) before the JVM starts: a
local driver whose pass rewrites at most ``spark.jvm_options.QUICK_JIT_MAX_BYTES`` runs C1
alone (``spark.jvm_options.local_jit_options``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from icegate_dagster.config import IcegateConfig
from icegate_dagster.maintenance.ops import SparkProvider
from icegate_dagster.maintenance.outlook import PassOutlook
from icegate_dagster.spark.jvm_options import QUICK_JIT_MAX_BYTES

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def _start_spark(config: IcegateConfig, *, small_work: bool = False) -> SparkSession:
    from icegate_dagster.spark.session import get_spark  # imports pyspark: only when needed

    return get_spark(config, small_work=small_work)


class PassSpark:
    """The Spark session of a maintainer's passes, asked for once. ``provider`` gives it
    (a Dagster run's resource); without one, the process's own session is started here."""

    def __init__(self, config: IcegateConfig, provider: SparkProvider | None = None) -> None:
        #: Set by :meth:`prepare` before Spark starts: the pass's rewrites are small (read
        #: only where this starts Spark itself: not with a ``provider``).
        self.small_work = False
        self._starts_own = provider is None
        self._provider = provider or (lambda: _start_spark(config, small_work=self.small_work))
        self._session: SparkSession | None = None
        self._lock = threading.Lock()

    @property
    def session(self) -> SparkSession:
        """The Spark session, started on first use (once: a caller waits for a start
        under way)."""
        with self._lock:
            if self._session is None:
                self._session = self._provider()
        return self._session

    @property
    def started(self) -> SparkSession | None:
        """The session once it has been asked for (a JVM started), else None."""
        return self._session

    def prepare(self, outlook: Callable[[], PassOutlook]) -> None:
        """Before a pass, where this starts Spark itself and has not yet: choose the quick
        JIT when the pass's ``outlook`` bounds its rewrites by ``QUICK_JIT_MAX_BYTES``, and
        start the session beside the planning when some table certainly has Spark work."""
        if not self._starts_own or self._session is not None:
            return
        seen = outlook()
        self.small_work = seen.rewrites_at_most(QUICK_JIT_MAX_BYTES)
        if seen.needs_spark:  # the JVM starts beside the planning, not after it
            self.start_in_background()

    def start_in_background(self) -> None:
        """Start the Spark session in a thread while the pass plans its tables from
        metadata; the first operation that needs it waits for it. A start that fails is
        left for that operation to report."""

        def start() -> None:
            with contextlib.suppress(Exception):
                _ = self.session

        threading.Thread(target=start, name="icegate-spark-start", daemon=True).start()
