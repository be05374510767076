"""``icegate-maintain serve``: the exporter's HTTP server and the refresher behind it.

One thread refreshes the figures (:class:`~.snapshot.Gatherer`) and renders them
(:func:`~.metrics.render`, within the series budget unless ``operation_detail``) every
``max_age`` seconds, start to start, so what a scrape
serves is at most about ``max_age`` old; the server answers from the latest rendering:

- ``GET /metrics``: Prometheus' text format (gzip when asked for), the latest snapshot's
  families plus a few figures about the exporter rendered now;
- ``GET /health``: 200 or 503 with a JSON body naming every check and what failed
  (:mod:`.probes`): a Kubernetes liveness or readiness probe, a load balancer's check;
- ``GET /status/compaction``: per table, the WAL waiting (files, bytes, oldest file and
  its age, quarantined files) and the last ingest with its outcome, as JSON
  (``?table=ns.t``, repeatable, for some tables only);
- ``GET /``: a short index of the above.

With credentials configured (:class:`~.serving.BasicAuth`, from the environment),
``/metrics`` and ``/status/compaction`` answer 401 without them; ``/health`` answers its
status to anyone (a liveness or readiness probe, a load balancer, sends none) but names its
checks, and their errors, only to a caller with them; ``/`` stays open. The listener
(:class:`~.serving.BoundedHTTPServer`) bounds the time, threads and connections any client
can take.

Nothing here starts a JVM: every figure comes from metadata, the trigger's memory, the
log table (pyiceberg) and the Dagster instance.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client.exposition import CONTENT_TYPE_LATEST

from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.wal.files import compaction_due
from icegate_dagster.monitoring.metrics import ExporterState, render, render_live
from icegate_dagster.monitoring.probes import HealthProbes, health_document
from icegate_dagster.monitoring.serving import BasicAuth, BoundedHTTPServer, PrereadHandler
from icegate_dagster.monitoring.snapshot import Gatherer, Snapshot, TableFigures, iso

if TYPE_CHECKING:
    from dagster import DagsterInstance

#: The snapshot counts as stale (``/health``'s ``metrics`` check) after this many refresh
#: periods, plus :data:`STALE_GRACE_S`.
STALE_PERIODS = 3
STALE_GRACE_S = 30.0
#: A refresh that had no time to look at every changed table is followed by the next at
#: once (after this pause), until none waits.
CATCH_UP_PAUSE_S = 0.2


class Exporter:
    """The refresher and what it last produced; the HTTP handler reads from here."""

    def __init__(
        self,
        config: IcegateConfig,
        *,
        max_age_s: float,
        instance: DagsterInstance | None = None,
        log: Callable[[str], None] | None = None,
        operation_detail: bool = False,
    ) -> None:
        self.config = config
        self.max_age_s = max_age_s
        #: Render every series per table and operation, not only those within the budget
        #: (see :mod:`.metrics`).
        self.operation_detail = operation_detail
        self.instance = instance
        self.gatherer = Gatherer(config, instance, look_budget_s=max(1.0, 0.5 * max_age_s))
        self.probes = HealthProbes(config, instance, freshness=self.freshness)
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()
        self.snapshot: Snapshot | None = None
        #: When the latest snapshot's gathering started, by this process's monotonic clock:
        #: its age is judged by that one clock. Its ``taken_at`` is the lease store's
        #: database clock (the trigger's memory's times), which may be minutes off this
        #: host's.
        self.taken_mono: float | None = None
        self.body = b""
        self.body_gz = b""
        self.state = ExporterState(None, 0, 0)
        self.last_error: str | None = None
        self._said: dict[str, str | None] = {}

    # -- refreshing ----------------------------------------------------------------------------

    def refresh(self) -> Snapshot | None:
        """Gather and render once; the new snapshot (None when the refresh failed)."""
        started = time.monotonic()
        try:
            snapshot = self.gatherer.gather()
            body = render(snapshot, operation_detail=self.operation_detail)
            # Compressed once here, not at each scrape (Prometheus asks for gzip).
            body_gz = gzip.compress(body, compresslevel=1)
            # The whole refresh, rendering and compressing included (served live at each
            # scrape: the body cannot hold the time it took to render itself).
            took = time.monotonic() - started
        except Exception as exc:  # the last snapshot is served on; the next refresh retries
            error = describe_error(exc, lambda text: scrub(text, self.config))
            with self._lock:
                self.state.refresh_errors += 1
                self.last_error = error
            self._log(f"icegate-maintain serve: refresh failed: {error}")
            return None
        with self._lock:
            self.snapshot, self.body, self.body_gz = snapshot, body, body_gz
            self.taken_mono = started
            self.state.taken_at = snapshot.taken_at
            self.state.refresh_s = took
            self.state.refreshes += 1
            self.last_error = None
        # Said once per change, not at every refresh.
        for name, source in snapshot.sources.items():
            said = self._said.get(name)
            if not source.ok and said != source.error:
                self._log(f"icegate-maintain serve: {name} cannot be read: {source.error}")
            elif source.ok and said is not None:
                self._log(f"icegate-maintain serve: {name} can be read again")
            self._said[name] = None if source.ok else source.error
        return snapshot

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            snapshot = self.refresh()
            took = time.monotonic() - started
            if snapshot is not None and snapshot.waiting:
                pause = CATCH_UP_PAUSE_S
            else:  # start to start: the next snapshot is ready about max_age after this one
                pause = max(CATCH_UP_PAUSE_S, self.max_age_s - took)
            self._stop.wait(pause)

    def start(self) -> None:
        """Start refreshing in a thread of its own."""
        self._thread = threading.Thread(target=self._loop, name="icegate-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop refreshing (the current refresh ends first) and the checks' threads."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.probes.close()

    # -- answers -------------------------------------------------------------------------------

    def snapshot_age(self) -> float | None:
        """Seconds since the latest snapshot's gathering started (None: none yet), by this
        process's monotonic clock: no clock skew between hosts or with the database, nor a
        step of this host's clock, changes it."""
        with self._lock:
            taken = self.taken_mono
        return None if taken is None else max(0.0, time.monotonic() - taken)

    def freshness(self) -> tuple[bool, str | None, dict[str, Any]]:
        """Whether the figures are fresh enough (``/health``'s ``metrics`` check)."""
        limit = STALE_PERIODS * self.max_age_s + STALE_GRACE_S
        with self._lock:
            snapshot, error = self.snapshot, self.last_error
        age = self.snapshot_age()
        if snapshot is None or age is None:
            waited = time.monotonic() - self.started
            if waited <= limit:
                return True, None, {"first_refresh": "in progress"}
            return False, f"no figures gathered in {waited:.0f} s (last error: {error})", {}
        detail = {"age_seconds": round(age, 1), "tables": len(snapshot.tables)}
        if age > limit:
            return False, f"the figures are {age:.0f} s old (last error: {error})", detail
        return True, None, detail

    def metrics(self, gzip_ok: bool) -> bytes:
        """``/metrics``: the latest rendering plus the live figures."""
        with self._lock:
            body = self.body_gz if gzip_ok else self.body
            state = ExporterState(
                self.state.taken_at,
                self.state.refreshes,
                self.state.refresh_errors,
                self.state.refresh_s,
            )
        live = render_live(state, age_s=self.snapshot_age())
        # Concatenated gzip members are one valid gzip stream.
        return body + (gzip.compress(live, compresslevel=1) if gzip_ok else live)

    def compaction_status(self, tables: list[str] | None) -> dict[str, Any]:
        """``/status/compaction``'s JSON document."""
        with self._lock:
            snapshot = self.snapshot
        if snapshot is None:
            return {"status": "starting", "tables": []}
        wanted = set(tables) if tables else None
        rows = [
            _compaction_row(t, self.config, snapshot.taken_at)
            for t in snapshot.tables
            if wanted is None or t.table in wanted
        ]
        document: dict[str, Any] = {
            "taken_at": iso(snapshot.taken_at),
            "age_seconds": round(self.snapshot_age() or 0.0, 1),
            "wal_root": scrub(self.config.wal_root, self.config) if self.config.wal_root else None,
            "tables": rows,
        }
        if wanted:
            document["unknown_tables"] = sorted(wanted - {t.table for t in snapshot.tables})
        return document


def _compaction_row(t: TableFigures, config: IcegateConfig, now: float) -> dict[str, Any]:
    """One table of ``/status/compaction``."""
    wal = t.wal
    settings = config.for_table(t.table)
    row: dict[str, Any] = {"table": t.table, "namespace": t.namespace}
    if wal is None:
        row["wal"] = None
    else:
        row["wal"] = {
            "files": wal.files,
            "bytes": wal.bytes,
            "quarantined": wal.quarantined,
            "oldest_file": wal.oldest,
            "oldest_age_seconds": round(max(0.0, now - wal.oldest_at), 1)
            if wal.oldest_at
            else None,
            "due": compaction_due(wal.files, wal.bytes, settings.compaction),
            "min_files": settings.compaction.min_files,
            "min_size_bytes": settings.compaction.min_size_bytes,
        }
    totals = t.totals.get("wal_compaction")
    if totals is not None and totals.last_at is not None:
        row["last_ingest"] = {
            "at": iso(totals.last_at),
            "status": totals.last_status,
            "duration_seconds": (
                totals.last_duration_ms / 1000.0 if totals.last_duration_ms is not None else None
            ),
            "details": scrub(totals.last_details or "", config),
        }
    else:
        row["last_ingest"] = None
    row["ingested"] = {
        "files": totals.figures.get("wal_files_ingested", 0) if totals else 0,
        "rows": totals.figures.get("wal_rows_ingested", 0) if totals else 0,
        "runs": totals.rows if totals else 0,
        "failures": totals.failures if totals else 0,
    }
    memory = t.operations.get("wal_compaction")
    row["last_attempt"] = (
        {
            "at": iso(memory.attempted_at),
            "outcome": memory.outcome,
            "consecutive_failures": memory.failures,
            "last_success": iso(memory.succeeded_at),
            "next_attempt_after": iso(memory.not_before),
            "error": scrub(memory.detail, config) if memory.detail else None,
        }
        if memory is not None
        else None
    )
    return row


#: What ``/health`` shows a caller without credentials when credentials are configured.
PUBLIC_HEALTH_KEYS = ("status", "failed")
#: Endpoints anyone may ask when credentials are configured (``/health`` in part).
OPEN_PATHS = ("/", "/health")


class _Handler(PrereadHandler):
    """The endpoints (see the module docstring)."""

    exporter: Exporter
    auth: BasicAuth | None = None
    server_version = "icegate-maintain"

    def log_message(self, format: str, *args: Any) -> None:
        # Scrapes every few seconds would flood the log: requests are not logged.
        return

    def _send(
        self, status: int, body: bytes, content_type: str, encoding: str | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, document: Any) -> None:
        body = (json.dumps(document, indent=2) + "\n").encode()
        self._send(status, body, "application/json")

    def do_HEAD(self) -> None:  # noqa: N802 (http.server's naming)
        self.do_GET()

    def _unauthorized(self) -> None:
        body = b'{"error": "credentials required"}\n'
        self.send_response(401)
        self.send_header("WWW-Authenticate", 'Basic realm="icegate-maintain", charset="UTF-8"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        url = urlsplit(self.path)
        authorized = self.auth is None or self.auth.allows(self.headers.get("Authorization"))
        if not authorized and url.path not in OPEN_PATHS:
            self._unauthorized()
            return
        try:
            if url.path == "/metrics":
                gzip_ok = "gzip" in self.headers.get("Accept-Encoding", "")
                body = self.exporter.metrics(gzip_ok)
                self._send(200, body, CONTENT_TYPE_LATEST, "gzip" if gzip_ok else None)
            elif url.path == "/health":
                status, document = health_document(self.exporter.probes.run())
                if not authorized:  # the verdict only: errors name hosts and URIs
                    document = {key: document[key] for key in PUBLIC_HEALTH_KEYS}
                self._json(status, document)
            elif url.path == "/status/compaction":
                tables = parse_qs(url.query).get("table")
                self._json(200, self.exporter.compaction_status(tables))
            elif url.path == "/":
                self._json(
                    200,
                    {
                        "service": "icegate-maintain serve",
                        "endpoints": ["/metrics", "/health", "/status/compaction"],
                    },
                )
            else:
                self._json(404, {"error": f"no such endpoint: {url.path}"})
        except Exception as exc:  # one bad request never stops the server
            error = describe_error(exc, lambda text: scrub(text, self.exporter.config))
            self._json(500, {"error": error})


def make_server(
    exporter: Exporter, host: str, port: int, *, auth: BasicAuth | None = None
) -> BoundedHTTPServer:
    """The HTTP server of ``exporter`` bound to ``host:port`` (``OSError`` if it cannot),
    requiring ``auth`` where it is given (see the module docstring)."""
    handler = type("Handler", (_Handler,), {"exporter": exporter, "auth": auth})
    return BoundedHTTPServer((host, port), handler)
