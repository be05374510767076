"""What every tick of the trigger's sensors shares: its deadline and clock, the stores it
reads (the lease store and the trigger's memory), which tables are busy, the healing of
runs whose worker is gone, and partitions for tables discovery has not added yet.

The clock is the lease store's database clock, the one every maintainer writes the
trigger's memory with; a test replaces it with :func:`simulated_clock`.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import dagster as dg

from icegate_dagster.automation.healing import fail_dead_runs
from icegate_dagster.automation.runs import run_targets, unfinished_runs
from icegate_dagster.catalog import scrub
from icegate_dagster.config import IcegateConfig
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import TableLocks
from icegate_dagster.maintenance.trigger.records import TableMemory
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for
from icegate_dagster.partitions import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.resources import LakehouseResource

_clock: contextvars.ContextVar[Callable[[], float] | None] = contextvars.ContextVar(
    "icegate_trigger_clock", default=None
)


@contextlib.contextmanager
def simulated_clock(clock: Callable[[], float]) -> Iterator[None]:
    """Make ``clock`` (epoch seconds) the trigger's clock in this thread, for a test that
    runs the sensors over simulated days."""
    token = _clock.set(clock)
    try:
        yield
    finally:
        _clock.reset(token)


@dataclass
class Tick:
    """One evaluation of a trigger sensor (or a run's look): its stores, clock and deadline."""

    instance: dg.DagsterInstance
    log: Any
    lakehouse: LakehouseResource
    config: IcegateConfig
    #: ``time.monotonic()`` by which the evaluation ends.
    deadline: float
    locks: TableLocks | None = None
    memory: TriggerMemory | None = None
    #: Why the stores could not be opened (the tick goes on with what it has).
    store_error: str | None = None
    now: float = 0.0
    #: What the tick says in the daemon's log (warnings first).
    warnings: list[str] = field(default_factory=list)
    _runs: list[Any] | None = None

    @classmethod
    def start(cls, context: dg.SensorEvaluationContext, lakehouse: LakehouseResource) -> Tick:
        """Open the stores and read the clock; the deadline starts now."""
        return cls.open(context.instance, context.log, lakehouse)

    @classmethod
    def for_run(cls, instance: dg.DagsterInstance, lakehouse: LakehouseResource) -> Tick:
        """The same for a run (``lakehouse_health``'s own materialization)."""
        return cls.open(instance, None, lakehouse)

    @classmethod
    def open(cls, instance: dg.DagsterInstance, log: Any, lakehouse: LakehouseResource) -> Tick:
        """Open the stores and read the clock; the deadline starts now."""
        started = time.monotonic()
        config = lakehouse.config()
        deadline = started + config.trigger.tick_deadline.total_seconds()
        tick = cls(instance, log, lakehouse, config, deadline)
        try:
            tick.locks = lease_store(config, lakehouse.catalog())
            if tick.locks is not None:
                tick.memory = memory_for(tick.locks.engine)
        except Exception as exc:
            tick.store_error = describe_error(exc, tick.scrub)
        clock = _clock.get()
        if clock is not None:
            tick.now = clock()
        else:
            try:
                tick.now = tick.memory.now() if tick.memory is not None else time.time()
            except Exception as exc:
                tick.store_error = tick.store_error or describe_error(exc, tick.scrub)
                tick.now = time.time()
        return tick

    def scrub(self, text: str) -> str:
        """``text`` with the configuration's secrets masked."""
        return scrub(text, self.config)

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - time.monotonic()

    def runs(self) -> list[Any]:
        """The unfinished runs' records, asked once per tick (the healing and the busy
        tables share them)."""
        if self._runs is None:
            self._runs = unfinished_runs(self.instance)
        return self._runs

    def heal(self) -> None:
        """Mark failed the ``STARTED`` runs whose worker is gone (``healing``), so queued runs
        start and their tables are asked for again. A store that cannot be read leaves
        every run as it is, saying why."""
        locks = self.locks
        if locks is None:
            return
        try:
            dead = fail_dead_runs(
                self.instance, locks.run_liveness, self.config.locks.lease, records=self.runs()
            )
        except Exception as exc:  # the sensor's own work goes on
            self.warnings.append(
                f"cannot check for runs whose worker is gone: {describe_error(exc, self.scrub)}"
            )
            return
        failed = {run.run_id for run in dead}
        self._runs = [r for r in self.runs() if r.dagster_run.run_id not in failed]
        for run in dead:
            tables = f" (tables: {', '.join(run.tables)})" if run.tables else ""
            self.warnings.append(
                f"run {run.run_id} of {run.job_name}{tables} marked failed: {run.reason}"
            )

    def busy(self, partitions: list[str], *, wal_only: bool = False) -> dict[str, str]:
        """Tables an unfinished run names or another maintainer's live lease holds (one
        question to the lease store), with which."""
        busy = run_targets(
            (record.dagster_run for record in self.runs()), partitions, wal_only=wal_only
        )
        if self.locks is not None:
            try:
                for table, holder in self.locks.live_leases().items():
                    busy.setdefault(table, f"held by {holder}")
            except Exception as exc:
                self.warnings.append(
                    f"cannot read the lease store's leases: {describe_error(exc, self.scrub)}"
                )
        return busy

    def count_lost(self, memory: dict[str, TableMemory], busy: Mapping[str, str]) -> list[str]:
        """A request whose operations no pass answered, for a table no unfinished run
        covers: its run ended without recording the table (worker gone, run failed early,
        canceled). Counted as a failure of those operations (they back off like any
        failure); ``memory`` is updated in place. Returns what was counted, for the log."""
        if self.memory is None:
            return []
        counted = []
        trigger = self.config.trigger
        for table, remembered in memory.items():
            unanswered = remembered.unanswered()
            if not unanswered or table in busy:
                continue
            why = (
                f"the run {remembered.requested_by or 'a sensor'} asked for ended without "
                "recording this table (its worker died, it failed before the table, or it "
                "was canceled)"
            )
            try:
                updated = self.memory.record_lost(
                    table,
                    unanswered,
                    why,
                    now=self.now,
                    backoff=trigger.backoff,
                    backoff_max=trigger.backoff_max,
                )
            except Exception as exc:
                self.warnings.append(
                    f"{table}: cannot count its lost request: {describe_error(exc, self.scrub)}"
                )
                continue
            operations = dict(remembered.operations)
            operations.update({m.operation: m for m in updated})
            memory[table] = replace(remembered, operations=operations)
            counted.append(f"{table} ({', '.join(unanswered)})")
        return counted


def partitions_to_add(
    instance: dg.DagsterInstance, tables: list[str]
) -> tuple[list[str], list[dg.AddDynamicPartitionsRequest]]:
    """The current partitions, and a request adding the listed tables that are not yet
    partitions: a sensor acts on a new table at once instead of waiting for discovery's
    tick (adding a partition twice is harmless)."""
    partitions = list(instance.get_dynamic_partitions(ICEBERG_TABLES))
    known = set(partitions)
    missing = [t for t in tables if t not in known]
    return partitions + missing, ([iceberg_tables.build_add_request(missing)] if missing else [])
