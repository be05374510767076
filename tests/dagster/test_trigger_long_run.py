"""Thirty simulated days of the trigger over 500 tables: does it stall, spin, starve or grow?

What is real: the Dagster instance (a temporary one), both trigger sensors and their
selection, the trigger's memory (SQLite), the catalog and its 504 Iceberg tables, the WAL
folders and one recursive listing of them a tick. What stands in: the **clock** (the test's,
through ``assets.trigger_state.simulated_clock``; a tick every :data:`TICK` simulated seconds)
and the **runs**. The sensors' requests become runs in the instance, as the daemon makes
them; one worker takes them in order, and instead of Spark each table's operation has an
outcome the test chooses (a WAL ingest deletes the table's WAL files, an ``optimize`` of
``oversized`` rewrites it with pyiceberg, the others change nothing), which the test records
in the trigger's memory as a run records it, with the table's real health after the pass.
The trigger's decisions are what is under test, not maintenance.

The lakehouse: 500 ordinary tables, five of which a writer makes due at random every hour
(a burst of WAL files), and four that would break the old trigger:

* ``always_fails``: its ``optimize`` fails every time, forever;
* ``unfixable``: its ``optimize`` completes and the table stays as due as before; a
  trickle of WAL (below the ingest threshold) changes its state every six hours;
* ``oversized``: due work four times ``trigger.max_bytes``, fragmented again every three
  days;
* ``wal_failing``: WAL arrives every two hours and its ingest always fails.

One run in 40 dies with its worker (no table recorded). The writers stop for the last
three days, to measure what an idle lakehouse costs.
"""

from __future__ import annotations

import random
import shutil
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from icegate_dagster.assets.names import LAKEHOUSE_HEALTH, iceberg_tables
from icegate_dagster.assets.runs import BatchEntry, batch_entries
from icegate_dagster.assets.trigger_state import simulated_clock
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.health.checks import health_score_check
from icegate_dagster.maintenance.health.summary import table_state
from icegate_dagster.maintenance.trigger.look import look_at
from icegate_dagster.maintenance.trigger.records import (
    OperationAttempt,
    PassRecord,
    backoff_wait,
    shown_state,
)
from icegate_dagster.maintenance.wal import configured_wal_root, wal_stats
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.health_sensor import HealthCursor, table_health_sensor
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from tests.lakehouse import SCHEMA, Lakehouse, batch

pytestmark = pytest.mark.slow

DAY = 86_400.0
#: Simulated seconds between two ticks of each sensor (30 s in a deployment: the trigger's
#: own durations below are scaled with it, so the same number of ticks covers them).
TICK = 10_800.0
DAYS = 30
IDLE_DAYS = 3
TABLES = 500
#: Ordinary tables the writer makes due each simulated hour.
DUE_PER_HOUR = 2
MIN_INTERVAL = timedelta(hours=2)
BACKOFF, BACKOFF_MAX = timedelta(hours=1), timedelta(hours=16)
MAX_BYTES = 60_000
#: One worker: a run takes this, plus :data:`RUN_PER_TABLE` per table.
RUN_OVERHEAD, RUN_PER_TABLE = 120.0, 10.0
#: A run with ``oversized`` takes this much longer: the queue waits behind it.
OVERSIZED_RUN = TICK
DEATH_EVERY = 40
START = 1_790_000_000.0  # 2026-09-21

FAILS, UNFIXABLE, OVERSIZED, WAL_FAILING = (
    "lakehouse.always_fails",
    "lakehouse.unfixable",
    "lakehouse.oversized",
    "lakehouse.wal_failing",
)
SPECIAL = (FAILS, UNFIXABLE, OVERSIZED, WAL_FAILING)
WAL_ROWS = pa.Table.from_pylist(
    [{"id": 1, "service": "api", "timestamp": None, "body": "x"}], schema=SCHEMA.as_arrow()
)


@dataclass
class Queued:
    """A run the daemon made of a request: waiting for the one worker."""

    run: dg.DagsterRun
    entries: list[BatchEntry]
    sensor: str


@dataclass
class Simulation:
    """The lakehouse, the instance, the clock and the worker (see the module docstring)."""

    lh: Lakehouse
    instance: dg.DagsterInstance
    now: float = START
    rng: random.Random = field(default_factory=lambda: random.Random(27))
    cursors: dict[str, str | None] = field(default_factory=dict)
    queue: list[Queued] = field(default_factory=list)
    running: tuple[Queued, float] | None = None
    worker_free_at: float = START
    runs_made: int = 0
    #: Run keys each sensor asked for; Dagster drops a request whose key it used before.
    used_keys: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    dropped: list[str] = field(default_factory=list)
    #: Per ordinary table: when the writer last made it due (None once ingested).
    due_since: dict[str, float] = field(default_factory=dict)
    delays: list[float] = field(default_factory=list)
    #: Per (table, operation): when each attempt ended, and its outcome.
    attempts: dict[tuple[str, str], list[tuple[float, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    requested: Counter[str] = field(default_factory=Counter)
    tick_seconds: list[float] = field(default_factory=list)
    cursor_bytes: list[int] = field(default_factory=list)
    skip_bytes: list[int] = field(default_factory=list)
    events_per_day: Counter[int] = field(default_factory=Counter)
    lakehouse_events_per_day: Counter[int] = field(default_factory=Counter)
    runs_per_day: Counter[int] = field(default_factory=Counter)
    failing_reported: set[str] = field(default_factory=set)
    _maintainer: Maintainer | None = None

    @property
    def day(self) -> int:
        return int((self.now - START) // DAY)

    @property
    def maintainer(self) -> Maintainer:
        if self._maintainer is None:
            self._maintainer = Maintainer(self.lh.config)
        return self._maintainer

    @property
    def resource(self) -> LakehouseResource:
        return LakehouseResource(config_path=str(self.lh.config_path))

    # -- the world ---------------------------------------------------------------------------

    def write_wal(self, table: str, files: int) -> None:
        folder = self.lh.wal_dir(table)
        for _ in range(files):
            name = f"w{self.rng.getrandbits(48):012x}.parquet"
            pq.write_table(WAL_ROWS, folder / name)

    def writers(self, hour: int) -> None:
        """What the lakehouse's writers do in one simulated hour."""
        if self.day >= DAYS - IDLE_DAYS:
            return
        for index in self.rng.sample(range(TABLES), DUE_PER_HOUR):
            table = f"lakehouse.t{index:03d}"
            self.write_wal(table, 3)
            self.due_since.setdefault(table, self.now)
        if hour % 2 == 0:
            self.write_wal(WAL_FAILING, 3)
        if hour % 6 == 0:
            self.write_wal(UNFIXABLE, 1)  # below min_files: a new state, no ingest due
        if hour % 72 == 12:
            oversized = self.lh.table(OVERSIZED)
            for i in range(6):
                oversized.append(batch(i * 10_000, ("api",), rows_per_service=400))

    # -- the daemon --------------------------------------------------------------------------

    def tick(self, sensor: Any) -> None:
        """One evaluation as the daemon makes it: partitions added, events stored, runs
        made of the requests whose keys were not used before."""
        context = dg.build_sensor_context(
            instance=self.instance,
            resources={"lakehouse": self.resource},
            cursor=self.cursors.get(sensor.name),
        )
        started = time.perf_counter()
        with simulated_clock(lambda: self.now):
            result = sensor(context)
        self.tick_seconds.append(time.perf_counter() - started)
        if not isinstance(result, dg.SensorResult):
            return
        for request in result.dynamic_partitions_requests or []:
            self.instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))
        for event in result.asset_events:
            self.instance.report_runless_asset_event(event)
            self.events_per_day[self.day] += 1
            if event.asset_key == LAKEHOUSE_HEALTH:
                self.lakehouse_events_per_day[self.day] += 1
                failing = event.metadata.get("failing_tables")
                self.failing_reported |= set(getattr(failing, "value", None) or {})
        if result.cursor is not None:
            self.cursors[sensor.name] = result.cursor
            self.cursor_bytes.append(len(result.cursor))
        if result.skip_reason is not None:
            self.skip_bytes.append(len(result.skip_reason.skip_message or ""))
        for request in result.run_requests or []:
            assert request.run_key is not None
            if request.run_key in self.used_keys[sensor.name]:
                self.dropped.append(request.run_key)  # what Dagster would do with it
                continue
            self.used_keys[sensor.name].add(request.run_key)
            run = self.instance.add_run(
                dg.DagsterRun(
                    job_name=request.job_name or "",
                    run_id=str(uuid.uuid4()),
                    run_config=request.run_config,
                    tags={**request.tags, "dagster/run_key": request.run_key},
                    status=dg.DagsterRunStatus.NOT_STARTED,
                )
            )
            self.queue.append(Queued(run, batch_entries(run), sensor.name))
            self.runs_per_day[self.day] += 1
            for entry in batch_entries(run):
                self.requested[entry.table] += 1

    # -- the worker --------------------------------------------------------------------------

    def work(self, until: float) -> None:
        """The worker until ``until``: it finishes the run in progress when its time comes,
        and starts the next queued one as soon as it is free (a run may span ticks)."""
        while True:
            if self.running is not None:
                job, end = self.running
                if end > until:
                    return
                self.running = None
                self.worker_free_at = end
                self.finish(job, end)
                continue
            if not self.queue:
                return
            start = max(self.worker_free_at, self.now)
            if start >= until:
                return
            job = self.queue.pop(0)
            duration = RUN_OVERHEAD + RUN_PER_TABLE * len(job.entries)
            if any(e.table == OVERSIZED for e in job.entries):
                duration += OVERSIZED_RUN  # in flight at the next tick
            self.running = (job, start + duration)

    def finish(self, job: Queued, end: float) -> None:
        self.runs_made += 1
        if self.runs_made % DEATH_EVERY == 0:  # its worker is OOM-killed: nothing recorded
            self.instance.report_run_failed(job.run, "the worker was OOM-killed (simulated)")
            for entry in job.entries:  # the trigger counts them as failed (record_lost)
                for op in entry.operations or ():
                    self.attempts[(entry.table, op)].append((end, "lost"))
            return
        maintainer = self.maintainer
        memory = maintainer.memory
        assert memory is not None
        for entry in job.entries:
            attempts = [self.outcome(entry.table, op) for op in entry.operations or ()]
            ref = TableRef.parse(entry.table)
            wal = wal_stats(configured_wal_root(self.lh.config), ref)
            after = look_at(maintainer, entry.table, wal, end)
            assert after.health is not None, after.error
            verdict = health_score_check(after.health, after.health.min_score)
            memory.record_pass(
                PassRecord(
                    entry.table,
                    job.run.run_id,
                    tuple(attempts),
                    requested=tuple(entry.operations or ()),
                    still_due={d.operation: d.reason for d in after.health.due},
                    settled_state=table_state(
                        after.metadata_location,
                        (wal.files, wal.bytes, wal.oldest),
                        after.health.due,
                    ),
                    shown_state=shown_state(verdict.passed, after.health.due_operations),
                ),
                now=end,
                backoff=BACKOFF,
                backoff_max=BACKOFF_MAX,
            )
            for attempt in attempts:
                self.attempts[(entry.table, attempt.operation)].append((end, attempt.status))
            if entry.table in self.due_since and wal.files == 0:
                self.delays.append(end - self.due_since.pop(entry.table))
        # Done. (The trigger reads no run status but "unfinished"; a canceled run stands for
        # a finished one here, and its events are a real run's own concern.)
        self.instance.report_run_canceled(job.run)

    def outcome(self, table: str, operation: str) -> OperationAttempt:
        """What the operation would have done (see the module docstring)."""
        if operation == "wal_compaction":
            if table == WAL_FAILING:
                return OperationAttempt(operation, "failed", error="ingest failed (simulated)")
            for path in self.lh.wal_dir(table).glob("*.parquet"):
                path.unlink()
            return OperationAttempt(operation, "completed")
        if operation == "optimize" and table == FAILS:
            return OperationAttempt(operation, "failed", error="optimize failed (simulated)")
        if operation == "optimize" and table == OVERSIZED:
            oversized = self.lh.table(OVERSIZED)
            oversized.overwrite(oversized.scan().to_arrow())
        return OperationAttempt(operation, "completed")


@pytest.fixture(scope="module")
def simulation(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from tests.lakehouse import make_lakehouse

    # In memory where the machine has it: thirty days of commits, each synced to disk,
    # would be most of the test's time (the trigger's decisions are what it measures).
    shm = Path("/dev/shm")
    root = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() else tmp_path_factory.mktemp("run")
    lh = make_lakehouse(
        root / "lakehouse",
        {
            "health": {"small_files": 5, "min_interval": "2h"},
            "compaction": {"min_files": 3, "min_size_bytes": "1GB"},
            "trigger": {
                "tables_per_run": 25,
                "max_tables": 50,
                "max_bytes": MAX_BYTES,
                "backoff": "1h",
                "backoff_max": "16h",
            },
        },
        wal=True,
    )
    lh.catalog.create_namespace("lakehouse")
    for index in range(TABLES):
        lh.catalog.create_table(("lakehouse", f"t{index:03d}"), schema=SCHEMA)
    lh.add_table(FAILS, appends=6, services=("api",))
    lh.add_table(UNFIXABLE, appends=6, services=("api",))
    oversized = lh.add_table(OVERSIZED, appends=0, services=("api",))
    for i in range(6):
        oversized.append(batch(i * 10_000, ("api",), rows_per_service=400))
    lh.catalog.create_table(("lakehouse", "wal_failing"), schema=SCHEMA)
    (root / "dagster").mkdir()
    # Every run's events in one SQLite database (Dagster's consolidated event storage), as
    # on PostgreSQL, rather than a database file made for each run.
    events = {
        "module": "dagster.core.storage.event_log",
        "class": "ConsolidatedSqliteEventLogStorage",
        "config": {"base_dir": str(root / "dagster" / "events")},
    }
    with dg.instance_for_test(
        temp_dir=str(root / "dagster"), overrides={"event_log_storage": events}
    ) as instance:
        sim = Simulation(lh, instance)
        started = time.perf_counter()
        while sim.now < START + DAYS * DAY:
            hour = int((sim.now - START) // 3600)
            for writers_hour in range(hour, hour + max(1, int(TICK // 3600))):
                sim.writers(writers_hour)
            sim.tick(table_health_sensor)
            sim.tick(wal_size_sensor)
            sim.work(sim.now + TICK)
            sim.now += TICK
        sim.wall_seconds = time.perf_counter() - started  # type: ignore[attr-defined]
        yield sim
    shutil.rmtree(root, ignore_errors=True)


def _gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_no_decision_ever_reuses_a_run_key(simulation: Simulation) -> None:
    """Finding 1: every request Dagster would launch; a table that fails for 30 days is still
    asked for (more than the 25 attempts the old trigger ran out at)."""
    assert simulation.dropped == []
    assert len(simulation.attempts[(FAILS, "optimize")]) > 25
    assert len(simulation.attempts[(WAL_FAILING, "wal_compaction")]) > 25


def test_every_due_table_is_maintained_within_min_interval_and_a_stated_bound(
    simulation: Simulation,
) -> None:
    """No table starves the others: not one that always fails, one whose state survives
    its operation, one over the byte budget, nor a WAL whose ingest always fails. Bound:
    ``health.min_interval``, plus two ticks (the tick that sees it and the next, whose run
    may wait), plus the longest run the one worker may be busy with ahead of it."""
    due_events = DUE_PER_HOUR * 24 * (DAYS - IDLE_DAYS)
    assert len(simulation.delays) >= due_events * 0.95
    bound = MIN_INTERVAL.total_seconds() + 2 * TICK + OVERSIZED_RUN + RUN_OVERHEAD
    assert max(simulation.delays) <= bound, sorted(simulation.delays)[-5:]
    # What is still due at the end became due within the bound of the end, or not at all.
    assert all(START + DAYS * DAY - since <= bound for since in simulation.due_since.values())


def test_retries_follow_the_back_off(simulation: Simulation) -> None:
    """Each failure in a row waits ``backoff × 2^(n−2)`` (capped), never less, and is tried
    again within a tick and a run of its time. A table's pass also waits ``min_interval``
    for the health trigger; the WAL trigger has none."""
    for (table, operation), floor in (
        ((FAILS, "optimize"), MIN_INTERVAL.total_seconds()),
        ((WAL_FAILING, "wal_compaction"), 0.0),
    ):
        ends = [at for at, status in simulation.attempts[(table, operation)]]
        statuses = [status for _, status in simulation.attempts[(table, operation)]]
        assert "failed" in statuses and set(statuses) <= {"failed", "lost"}
        for count, gap in enumerate(_gaps(ends), start=1):
            wait = backoff_wait(count, BACKOFF, BACKOFF_MAX)
            least = max(wait.total_seconds() if wait else 0.0, floor)
            assert gap >= least - RUN_OVERHEAD, (table, count, gap, least)
        # Capped: once at the ceiling, attempts come every backoff_max plus a tick or so.
        late = _gaps(ends)[-5:]
        ceiling = BACKOFF_MAX.total_seconds()
        assert all(ceiling <= gap <= ceiling + 2 * TICK + 3 * 3600 for gap in late), late


def test_an_operation_its_table_cannot_fix_is_asked_for_rarely_and_reported(
    simulation: Simulation,
) -> None:
    """Its state changes every six hours (a trickle of WAL, ingested when three files
    wait); each change could ask for its ``optimize`` again, but the ineffective runs back
    off, doubling to the ceiling, like failures."""
    ends = [at for at, _ in simulation.attempts[(UNFIXABLE, "optimize")]]
    ceiling = BACKOFF_MAX.total_seconds()
    assert len(ends) <= DAYS * DAY / ceiling + 8
    assert all(gap >= ceiling - RUN_OVERHEAD for gap in _gaps(ends)[6:]), _gaps(ends)
    # Its WAL is ingested all the same: the backed-off operation does not hold the others.
    assert len(simulation.attempts[(UNFIXABLE, "wal_compaction")]) >= DAYS - IDLE_DAYS
    assert {FAILS, UNFIXABLE, WAL_FAILING} <= simulation.failing_reported


def test_every_tick_ends_well_within_its_deadline_and_the_cursor_stays_small(
    simulation: Simulation,
) -> None:
    assert max(simulation.tick_seconds) < 30.0
    assert max(simulation.cursor_bytes) < 400
    assert max(simulation.skip_bytes) < 3_000
    assert HealthCursor.parse(simulation.cursors["table_health_sensor"]).resume_at is None


def test_what_the_instance_stores_grows_with_changes_not_with_time(
    simulation: Simulation,
) -> None:
    """Busy days: about one run per table change, events for what changed. Idle days (no
    writer): lakehouse_health once an hour at most, hardly any page event, and only the
    retries of the tables that keep failing."""
    idle = range(DAYS - IDLE_DAYS + 1, DAYS)  # whole idle days
    for day in idle:
        # At most one lakehouse_health an hour (one a tick here, every three hours) and a
        # few page events: the tables that keep failing, as their verdicts come and go.
        assert simulation.lakehouse_events_per_day[day] <= 24
        page_events = simulation.events_per_day[day] - simulation.lakehouse_events_per_day[day]
        assert page_events <= 6, simulation.events_per_day
        # Only the retries of the tables that keep failing, at the back-off's ceiling.
        assert simulation.runs_per_day[day] <= 6, simulation.runs_per_day
    busy = range(1, DAYS - IDLE_DAYS)
    changes_per_day = DUE_PER_HOUR * 24
    for day in busy:
        assert simulation.runs_per_day[day] <= changes_per_day, simulation.runs_per_day
        assert simulation.events_per_day[day] <= 24 + changes_per_day, simulation.events_per_day
