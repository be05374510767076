"""One picture of the lakehouse for the exporter, gathered from what already lasts (no JVM,
no run needed): every figure a scrape shows comes from the latest :class:`Snapshot`.

Where each part comes from, and what a refresh costs (``N`` tables):

- **the tables and their health**: the catalog's listing (one SQL query on a SQL catalog,
  one call per namespace elsewhere) and the trigger's looks (``maintenance.trigger.look``): a table
  is loaded and assessed again only where its metadata file or WAL changed (or, on other
  catalogs, its look is older than ``maintain.trigger.recheck``); every other table keeps
  its stored look. New looks are stored in the trigger's memory, where the health sensor
  finds them too. The first refresh of a process reads every look (one query);
- **the WAL backlog**: one recursive listing of ``wal.root``;
- **what each operation did last**: the trigger's memory (one query for every table's
  row, one for every operation's), and the live leases (one query);
- **the counters**: the maintenance log's totals (``maintenance.log.totals``): the data
  files appended since the last refresh, counted from the exporter's start (which reads
  only the last week of the log, for each table and operation's latest run);
- **the Dagster instance** (when configured): the daemons' heartbeats (one query).

A part that cannot be read keeps its previous values, and the source is reported down
(``icegate_dependency_up``); the snapshot says when each part was last read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from icegate_dagster.config import HealthCheckSettings, IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.log.totals import LogTotals, OperationTotals, TotalsView
from icegate_dagster.maintenance.trigger.look import LookCache, list_tables, look_at_lakehouse
from icegate_dagster.maintenance.trigger.records import OperationMemory
from icegate_dagster.maintenance.trigger.store import StoredLook, TriggerMemory, memory_for
from icegate_dagster.maintenance.wal import WalStats, configured_wal_root, wal_backlogs

if TYPE_CHECKING:
    from dagster import DagsterInstance

#: The exporter's sources, as ``icegate_dependency_up`` and ``/health`` name them.
SOURCES = ("catalog", "lease_store", "log_table", "wal", "dagster_instance", "dagster_daemon")
#: A daemon whose last heartbeat is older than this is down (Dagster's daemons beat every
#: 30 s; its own UI waits 30 minutes, too long for a probe).
DAEMON_TOLERANCE_S = 300.0
#: Outcomes after which an operation counts as having done its job.
EFFECTIVE = ("completed", "skipped")


@dataclass(frozen=True)
class SourceState:
    """Whether a source could be read at the last refresh, and why not."""

    ok: bool
    error: str | None = None
    #: When it was last read successfully (epoch seconds).
    read_at: float | None = None


@dataclass(frozen=True)
class TableFigures:
    """Everything the exporter knows of one table."""

    table: str
    namespace: str
    #: The health trigger's latest look (None: not looked at yet).
    look: StoredLook | None
    wal: WalStats | None
    operations: Mapping[str, OperationMemory]
    totals: Mapping[str, OperationTotals]
    checks: HealthCheckSettings
    min_score: float
    min_interval_s: float
    #: Who holds the table's lease now (a maintenance in progress), if anyone.
    held_by: str | None = None

    def unmaintained_s(self, now: float) -> float:
        """How long the table has been due without one of its due operations doing its job:
        since it fell due, or since such an operation last completed (an operation that
        completed and left the table due still, a busy table fallen due again, counts from
        then). 0 when nothing is due."""
        look = self.look
        if look is None or look.health is None or not look.health.due or look.due_since is None:
            return 0.0
        since = look.due_since
        for operation in look.health.due_operations:
            memory = self.operations.get(operation)
            if memory is not None and memory.outcome in EFFECTIVE and memory.succeeded_at:
                since = max(since, memory.succeeded_at)
        return max(0.0, now - since)


@dataclass(frozen=True)
class DaemonBeat:
    """A Dagster daemon's last heartbeat."""

    daemon: str
    #: Seconds since it (None: never beat).
    age_s: float | None
    required: bool


@dataclass(frozen=True)
class Snapshot:
    """The lakehouse as of one refresh (see the module docstring)."""

    #: When it was taken: the lease store's database clock (the trigger's memory's times),
    #: else this host's.
    taken_at: float
    tables: tuple[TableFigures, ...]
    sources: Mapping[str, SourceState]
    #: Seconds the gathering took (the exporter's ``icegate_exporter_refresh_duration_seconds``
    #: adds rendering), and the tables it had no time to look at (next refresh).
    refresh_s: float = 0.0
    waiting: int = 0
    looked: int = 0
    log: TotalsView | None = None
    daemons: tuple[DaemonBeat, ...] = ()
    #: Whether ``wal.root`` is set (else no WAL figures).
    has_wal: bool = False

    def table(self, key: str) -> TableFigures | None:
        """One table's figures."""
        return next((t for t in self.tables if t.table == key), None)


class HeartbeatAges:
    """The daemons' heartbeat ages, judged on this process's clock where it can be.

    A heartbeat's timestamp is its daemon's host's clock: "now minus the timestamp" counts
    the skew between that host and this one (a daemon on a host 10 minutes behind looked
    down; one ahead and stopped looked up for 10 minutes more). Once a daemon's timestamp
    has been seen to change, its age is how long this process has seen the latest one
    unchanged (monotonic; late by at most the time between two looks). Until then, one
    timestamp cannot tell a skew from a silence: the larger of the two ages counts."""

    def __init__(self, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._monotonic = monotonic
        self._lock = threading.Lock()
        #: Daemon -> its latest timestamp and when this process first saw it (monotonic).
        self._seen: dict[str, tuple[float, float]] = {}
        #: Daemons whose timestamp changed while this process watched.
        self._beating: set[str] = set()

    def age(self, daemon: str, timestamp: float, now: float) -> float:
        """Seconds since ``daemon``'s heartbeat stamped ``timestamp``; ``now`` is this
        host's wall clock."""
        with self._lock:
            watched_at = self._monotonic()
            seen = self._seen.get(daemon)
            if seen is None or seen[0] != timestamp:
                if seen is not None:
                    self._beating.add(daemon)
                seen = self._seen[daemon] = (timestamp, watched_at)
            unchanged = max(0.0, watched_at - seen[1])
            if daemon in self._beating:
                return unchanged
            return max(unchanged, now - timestamp)


def daemon_beats(
    instance: DagsterInstance, now: float, ages: HeartbeatAges | None = None
) -> tuple[DaemonBeat, ...]:
    """Each daemon's last heartbeat, the instance's required ones first (public instance
    methods only); ``ages`` judges their ages (else ``now`` minus their timestamps)."""

    def age(daemon: str, timestamp: float) -> float:
        if ages is None:
            return max(0.0, now - timestamp)
        return ages.age(daemon, timestamp, now)

    beats = instance.get_daemon_heartbeats()
    try:
        required = list(instance.get_required_daemon_types())
    except Exception:  # an instance that cannot say: the sensor daemon is the one that matters
        required = ["SENSOR"]
    found = [
        DaemonBeat(daemon, age(daemon, beats[daemon].timestamp) if daemon in beats else None, True)
        for daemon in required
    ]
    found += [
        DaemonBeat(daemon, age(daemon, beat.timestamp), False)
        for daemon, beat in sorted(beats.items())
        if daemon not in required
    ]
    return tuple(found)


def _beat_text(age_s: float | None) -> str:
    return "no heartbeat" if age_s is None else f"last heartbeat {age_s:.0f} s ago"


def daemon_problem(beats: tuple[DaemonBeat, ...]) -> str | None:
    """Why the daemon is down (a required daemon never beat, or not lately), or None."""
    late = [
        f"{b.daemon} ("
        + ("no heartbeat" if b.age_s is None else f"last heartbeat {b.age_s:.0f} s ago")
        + ")"
        for b in beats
        if b.required and (b.age_s is None or b.age_s > DAEMON_TOLERANCE_S)
    ]
    if not late:
        return None
    return (
        f"dagster-daemon is not running: {', '.join(late)}; a daemon beats every 30 s and "
        f"counts as down after {DAEMON_TOLERANCE_S:.0f} s"
    )


class Gatherer:
    """Takes snapshots for one configuration (and Dagster instance), keeping between them
    what each source gave last: the looks, the log's totals, the WAL, the memory."""

    def __init__(
        self,
        config: IcegateConfig,
        instance: DagsterInstance | None = None,
        *,
        look_budget_s: float = 20.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.instance = instance
        self.look_budget_s = look_budget_s
        self._wall_clock = wall_clock
        self.maintainer = Maintainer(config, run_id="icegate-exporter")
        self._looks = LookCache()
        self._log = LogTotals(lambda: self.maintainer.catalog, TableRef.parse(config.log_table))
        self._beats = HeartbeatAges()
        self._resume_at: str | None = None
        self._last: Snapshot | None = None
        self._read_at: dict[str, float] = {}

    def _scrub(self, text: str) -> str:
        return scrub(text, self.config)

    def _describe(self, exc: BaseException) -> str:
        return describe_error(exc, self._scrub)

    def gather(self) -> Snapshot:
        """A new snapshot; a source that fails keeps its previous part, reported down."""
        started = time.monotonic()
        config = self.config
        last = self._last
        sources: dict[str, SourceState] = {}
        failed: dict[str, str] = {}

        def ok(name: str, now: float) -> None:
            self._read_at[name] = now
            sources[name] = SourceState(True, None, now)

        def down(name: str, exc: BaseException | str) -> None:
            error = exc if isinstance(exc, str) else self._describe(exc)
            failed[name] = error
            sources[name] = SourceState(False, error, self._read_at.get(name))

        now = self._wall_clock()
        catalog: Any = None
        try:
            catalog = self.maintainer.catalog
        except Exception as exc:
            down("catalog", exc)
        memory: TriggerMemory | None = None
        locks = None
        try:
            locks = lease_store(config, catalog)
            if locks is not None:
                memory = memory_for(locks.engine)
                now = memory.now()
            ok("lease_store", now)
        except Exception as exc:
            down("lease_store", exc)
            memory = None

        tables: list[str] = list(t.table for t in last.tables) if last else []
        looks: dict[str, StoredLook] = (
            {t.table: t.look for t in last.tables if t.look} if last else {}
        )
        wal: dict[str, WalStats] = (
            {t.table: t.wal for t in last.tables if t.wal is not None} if last else {}
        )
        waiting, looked = (last.waiting, 0) if last else (0, 0)
        if catalog is not None:
            try:
                listing = list_tables(self.maintainer)
                tables = list(listing.tables)
                ok("catalog", now)
            except Exception as exc:
                down("catalog", exc)
                listing = None
            if listing is not None:
                wal_root = configured_wal_root(config)
                if wal_root is not None:
                    try:
                        wal, _ = wal_backlogs(wal_root, [TableRef.parse(t) for t in tables])
                        ok("wal", now)
                    except Exception as exc:  # keep the last backlog: no table looks "changed"
                        down("wal", exc)
                try:
                    seen = look_at_lakehouse(
                        self.maintainer,
                        memory,
                        now,
                        until=time.monotonic() + self.look_budget_s,
                        resume_at=self._resume_at,
                        listing=listing,
                        wal=wal,
                        cache=self._looks,
                    )
                    looks = seen.looks
                    waiting, looked = seen.waiting, len(seen.fresh)
                    self._resume_at = seen.resume_at
                except Exception as exc:
                    down("catalog", exc)
        operations: dict[str, Mapping[str, OperationMemory]] = (
            {t.table: t.operations for t in last.tables} if last else {}
        )
        held: dict[str, str] = (
            {t.table: t.held_by for t in last.tables if t.held_by} if last else {}
        )
        if memory is not None and locks is not None:
            try:
                operations = {
                    table: remembered.operations
                    for table, remembered in memory.tables_memory().items()
                }
                held = locks.live_leases()
            except Exception as exc:
                down("lease_store", exc)
        log = last.log if last else None
        if catalog is not None:
            try:
                log = self._log.refresh()
                ok("log_table", now)
            except Exception as exc:
                down("log_table", exc)
        daemons: tuple[DaemonBeat, ...] = last.daemons if last else ()
        if self.instance is not None:
            try:
                daemons = daemon_beats(self.instance, self._wall_clock(), self._beats)
                ok("dagster_instance", now)
                problem = daemon_problem(daemons)
                if problem is None:
                    ok("dagster_daemon", now)
                else:
                    down("dagster_daemon", problem)
            except Exception as exc:
                down("dagster_instance", exc)
                down("dagster_daemon", "the Dagster instance cannot be read")
        by_table = log.totals if log is not None else {}
        per_table: dict[str, dict[str, OperationTotals]] = {}
        for (table, operation), value in by_table.items():
            per_table.setdefault(table, {})[operation] = value
        figures = []
        for key in tables:
            ref = TableRef.parse(key)
            settings = self.maintainer.settings(ref)
            look = looks.get(key)
            health = look.health if look is not None else None
            figures.append(
                TableFigures(
                    table=key,
                    namespace=ref.namespace,
                    look=look,
                    wal=wal.get(key) if config.wal_root else None,
                    operations=operations.get(key, {}),
                    totals=per_table.get(key, {}),
                    checks=settings.checks,
                    min_score=health.min_score if health else settings.health.min_score,
                    min_interval_s=(
                        health.min_interval_s
                        if health
                        else settings.health.min_interval.total_seconds()
                    ),
                    held_by=held.get(key),
                )
            )
        snapshot = Snapshot(
            taken_at=now,
            tables=tuple(figures),
            sources=sources,
            refresh_s=time.monotonic() - started,
            waiting=waiting,
            looked=looked,
            log=log,
            daemons=daemons,
            has_wal=bool(config.wal_root),
        )
        self._last = snapshot
        return snapshot


def iso(epoch: float | None) -> str | None:
    """An instant as ISO 8601 UTC (None stays None)."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass
class Probe:
    """One ``/health`` check's answer."""

    ok: bool
    seconds: float
    error: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
