"""``/health``: is every part the maintenance service needs reachable right now?

Each check runs on request (answers are reused for :data:`REUSE_S`, so a storm of probes
costs one round), in a thread of its own with a deadline (:data:`TIMEOUT_S`): a database
that does not answer fails its check instead of hanging the probe.

- ``catalog``: the catalog answers a listing of its namespaces (a SQL query, or a REST call);
- ``lease_store``: the lease store's database answers ``SELECT 1`` (where the trigger's
  memory and the leases live);
- ``dagster_instance`` (when configured): the instance's storage answers;
- ``dagster_daemon`` (when configured): every daemon the instance requires beat within
  the last five minutes (judged on this process's clock once it has seen a daemon beat:
  :class:`~.snapshot.HeartbeatAges`);
- ``metrics``: the exporter's own snapshot is not older than three refresh periods (its
  refresher is alive).

The answer names each check, its time and, for a failed one, the error (secrets masked).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any

from icegate_dagster.catalog import catalog_kind, open_catalog
from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.monitoring.snapshot import (
    HeartbeatAges,
    Probe,
    daemon_beats,
    daemon_problem,
)

if TYPE_CHECKING:
    from dagster import DagsterInstance

#: Seconds a check may take before it counts as failed.
TIMEOUT_S = 5.0
#: Seconds an answer is reused for.
REUSE_S = 2.0
#: Catalogs whose database is the lease store's unless ``maintain.locks.uri`` names another.
SQL_KINDS = ("sqlite", "postgresql")


class HealthProbes:
    """The checks of one configuration (see the module docstring)."""

    def __init__(
        self,
        config: IcegateConfig,
        instance: DagsterInstance | None = None,
        *,
        freshness: Callable[[], tuple[bool, str | None, dict[str, Any]]] | None = None,
    ) -> None:
        self.config = config
        self.instance = instance
        self._freshness = freshness
        self._catalog: Any = None
        self._lock = threading.Lock()
        self._catalog_lock = threading.Lock()
        self._instance_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="icegate-probe")
        self._answer: tuple[float, dict[str, Probe]] | None = None
        self._beats = HeartbeatAges()

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc, lambda text: scrub(text, self.config))

    def _open_catalog(self) -> Any:
        # A catalog of its own (the refresher's may be busy); opened again until it opens.
        with self._catalog_lock:
            if self._catalog is None:
                self._catalog = open_catalog(self.config.catalog)
            return self._catalog

    def _check_catalog(self) -> dict[str, Any]:
        namespaces = self._open_catalog().list_namespaces()
        return {"namespaces": len(namespaces)}

    def _check_lease_store(self) -> dict[str, Any]:
        from sqlalchemy import text

        try:
            catalog = self._open_catalog()
        except Exception as exc:
            if self.config.locks.uri is None and catalog_kind(self.config.catalog) in SQL_KINDS:
                raise _Failed(
                    "the lease store is the catalog's own database, which cannot be opened: "
                    + self._describe(exc),
                    {},
                ) from exc
            catalog = None  # the lease store is a database of its own
        locks = lease_store(self.config, catalog)
        if locks is None:
            return {"configured": False}
        with locks.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return {"database": locks.engine.dialect.name}

    def _check_instance(self) -> dict[str, Any]:
        assert self.instance is not None
        with self._instance_lock:
            self.instance.get_daemon_heartbeats()
        return {}

    def _check_daemon(self) -> dict[str, Any]:
        assert self.instance is not None
        with self._instance_lock:
            beats = daemon_beats(self.instance, time.time(), self._beats)
        problem = daemon_problem(beats)
        detail = {
            "daemons": {
                b.daemon: None if b.age_s is None else round(b.age_s, 1)
                for b in beats
                if b.required
            }
        }
        if problem is not None:
            raise _Failed(problem, detail)
        return detail

    def _check_metrics(self) -> dict[str, Any]:
        assert self._freshness is not None
        fresh, problem, detail = self._freshness()
        if not fresh:
            raise _Failed(problem or "the metrics are stale", detail)
        return detail

    def checks(self) -> dict[str, Callable[[], dict[str, Any]]]:
        """The checks that apply, by name."""
        found: dict[str, Callable[[], dict[str, Any]]] = {
            "catalog": self._check_catalog,
            "lease_store": self._check_lease_store,
        }
        if self.instance is not None:
            found["dagster_instance"] = self._check_instance
            found["dagster_daemon"] = self._check_daemon
        if self._freshness is not None:
            found["metrics"] = self._check_metrics
        return found

    def run(self) -> dict[str, Probe]:
        """Every check's answer (reused for :data:`REUSE_S` seconds)."""
        with self._lock:
            if self._answer is not None and time.monotonic() - self._answer[0] < REUSE_S:
                return self._answer[1]
            started = time.monotonic()
            futures = {
                name: (self._pool.submit(self._timed, check), time.monotonic())
                for name, check in self.checks().items()
            }
            answers = {}
            for name, (future, _) in futures.items():
                left = max(0.0, started + TIMEOUT_S - time.monotonic())
                try:
                    answers[name] = future.result(timeout=left)
                except FutureTimeout:
                    answers[name] = Probe(
                        False,
                        round(time.monotonic() - started, 3),
                        f"no answer within {TIMEOUT_S:g} s",
                    )
            self._answer = (time.monotonic(), answers)
            return answers

    def _timed(self, check: Callable[[], dict[str, Any]]) -> Probe:
        started = time.monotonic()
        try:
            detail = check()
        except _Failed as exc:
            return Probe(False, round(time.monotonic() - started, 3), exc.reason, exc.detail)
        except Exception as exc:
            return Probe(False, round(time.monotonic() - started, 3), self._describe(exc))
        return Probe(True, round(time.monotonic() - started, 3), None, detail)

    def close(self) -> None:
        """Stop the checks' threads (a hung one is left to end on its own)."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class _Failed(Exception):
    """A check that answered, with a verdict of failure."""

    def __init__(self, reason: str, detail: dict[str, Any]) -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


def health_document(answers: dict[str, Probe]) -> tuple[int, dict[str, Any]]:
    """The HTTP status (200 or 503) and JSON body of ``/health``."""
    failed = [name for name, probe in answers.items() if not probe.ok]
    body: dict[str, Any] = {
        "status": "ok" if not failed else "unavailable",
        "failed": failed,
        "checks": {
            name: {
                "ok": probe.ok,
                "seconds": probe.seconds,
                **({"error": probe.error} if probe.error else {}),
                **probe.detail,
            }
            for name, probe in answers.items()
        },
    }
    if failed:
        body["message"] = "; ".join(f"{name}: {answers[name].error}" for name in failed)
    return (200 if not failed else 503), body
