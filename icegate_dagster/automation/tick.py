"""What every tick of the trigger's sensors shares: its deadline and clock, the stores it
reads (the lease store and the trigger's memory), which tables are busy, the healing of
runs whose worker is gone, and partitions for tables discovery has not added yet.

The clock is the lease store's database clock, the one every maintainer writes the
trigger's memory with; a test replaces it with :func:`simulated_clock`. The trigger's
memory waits for another writer's lock until shortly before the deadline at most
(:data:`WRITE_RESERVE`), so a locked store ends the tick in time, saying so.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import dagster as dg

from icegate_dagster.automation.healing import fail_dead_runs
from icegate_dagster.automation.runs import run_targets, unfinished_runs
from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import TableLocks
from icegate_dagster.maintenance.trigger.records import OpenRequest, TableMemory, utc
from icegate_dagster.maintenance.trigger.store import MemoryBusy, TriggerMemory, memory_for
from icegate_dagster.partitions import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.resources import LakehouseResource

#: The share of the tick's deadline kept for ending the tick after its memory waited for a
#: lock (making the result from what it has).
WRITE_RESERVE = 0.1
#: How long after a request its run may take to appear in the instance: the evaluation
#: ends within Dagster's 60 s and the daemon makes the runs right after. A request older
#: than this with no run of its key never reached Dagster (the tick was canceled, or failed
#: after it wrote the memory): it is forgotten, not counted as a failure.
LAUNCH_GRACE_S = 180.0
#: The tag Dagster puts on a run a sensor asked for, with the request's key.
RUN_KEY_TAG = "dagster/run_key"

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
        """The same for a run (``lakehouse_health``'s own materialization): no deadline
        bounds its memory's lock waits (a run is not canceled at 60 s)."""
        return cls.open(instance, None, lakehouse, bounded=False)

    @classmethod
    def open(
        cls,
        instance: dg.DagsterInstance,
        log: Any,
        lakehouse: LakehouseResource,
        *,
        bounded: bool = True,
    ) -> Tick:
        """Open the stores and read the clock; the deadline starts now (``bounded``: the
        memory waits for a lock until shortly before it at most)."""
        started = time.monotonic()
        config = lakehouse.config()
        deadline = started + config.trigger.tick_deadline.total_seconds()
        tick = cls(instance, log, lakehouse, config, deadline)
        try:
            tick.locks = lease_store(config, lakehouse.catalog())
            if tick.locks is not None:
                tick.memory = memory_for(tick.locks.engine)
                if bounded:
                    reserve = config.trigger.tick_deadline.total_seconds() * WRITE_RESERVE
                    tick.memory = tick.memory.within(deadline - reserve)
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

    def count_lost(self, memory: dict[str, TableMemory], busy: dict[str, str]) -> list[str]:
        """Settle the requests no pass answered, of tables no unfinished run covers, by what
        the instance knows of the run with the request's key:

        - it ended (worker gone, run failed early, canceled): a failure of the operations
          (they back off like any failure); ``memory`` is updated in place;
        - it is still unfinished (a run the table's ``busy`` view leaves out): nothing;
        - there is none yet, within :data:`LAUNCH_GRACE_S` of the request: the daemon may
          still be making it; the table is ``busy`` until then;
        - there is none after that: Dagster never got the request (its tick was canceled
          or failed after it wrote the memory): the request is forgotten, no failure.

        Returns what was counted as lost, for the log."""
        if self.memory is None:
            return []
        open_requests = [
            (table, request, operations)
            for table, remembered in memory.items()
            if table not in busy
            for request, operations in remembered.unanswered()
        ]
        if not open_requests:
            return []
        try:
            runs = self._runs_by_key({r.run_key for _, r, _ in open_requests if r.run_key})
        except Exception as exc:  # judged at the next tick
            self.warnings.append(
                "cannot tell whether unanswered requests reached Dagster: "
                f"{describe_error(exc, self.scrub)}"
            )
            return []
        counted: list[str] = []
        never: list[tuple[str, OpenRequest]] = []
        for table, request, operations in open_requests:
            found = runs.get(request.run_key or "", [])
            if request.run_key is not None and not found:
                if self.now - request.requested_at < LAUNCH_GRACE_S:
                    busy.setdefault(
                        table,
                        f"requested by {request.by} at {utc(request.requested_at)}; its run "
                        "is not made yet",
                    )
                else:
                    never.append((table, request))
                continue
            if any(not run.is_finished for run in found):
                continue
            try:
                self._count_lost(memory, table, request, operations)
            except MemoryBusy as exc:
                self.warnings.append(f"cannot count lost requests: {exc}")
                break
            except Exception as exc:
                self.warnings.append(
                    f"{table}: cannot count its lost request: {describe_error(exc, self.scrub)}"
                )
                continue
            counted.append(f"{table} ({', '.join(operations)})")
        if never:
            self._forget_requests(memory, never)
        return counted

    def _runs_by_key(self, keys: set[str]) -> dict[str, list[Any]]:
        """The runs with each of ``keys`` as their run key, one question per key (as the
        sensor daemon asks: faster than one with all of them)."""
        found: dict[str, list[Any]] = {}
        for key in sorted(keys):
            runs = self.instance.get_runs(filters=dg.RunsFilter(tags={RUN_KEY_TAG: key}))
            if runs:
                found[key] = list(runs)
        return found

    def _count_lost(
        self,
        memory: dict[str, TableMemory],
        table: str,
        request: OpenRequest,
        operations: tuple[str, ...],
    ) -> None:
        assert self.memory is not None
        trigger = self.config.trigger
        why = (
            f"the run {request.by} asked for ended without recording this table (its worker "
            "died, it failed before the table, or it was canceled)"
        )
        updated = self.memory.record_lost(
            table,
            operations,
            why,
            now=self.now,
            backoff=trigger.backoff,
            backoff_max=trigger.backoff_max,
        )
        remembered = memory[table]
        ops = dict(remembered.operations)
        ops.update({m.operation: m for m in updated})
        memory[table] = replace(remembered, operations=ops)

    def _forget_requests(
        self, memory: dict[str, TableMemory], never: list[tuple[str, OpenRequest]]
    ) -> None:
        """Forget requests no run was made of: their tables are asked for again in turn."""
        assert self.memory is not None
        try:
            self.memory.drop_requests(
                [(table, request.by, request.run_key or "") for table, request in never]
            )
        except Exception as exc:
            self.warnings.append(
                "cannot forget requests that never reached Dagster: "
                f"{describe_error(exc, self.scrub)}"
            )
            return
        for table, request in never:
            remembered = memory[table]
            requests = {by: r for by, r in remembered.requests.items() if by != request.by}
            memory[table] = replace(remembered, requests=requests)
        self.warnings.append(
            f"{len(never)} requests never reached Dagster (no run has their key "
            f"{LAUNCH_GRACE_S:.0f} s later: the tick that made them was canceled or failed), "
            "forgotten without counting a failure: "
            + "; ".join(f"{t} ({r.run_key})" for t, r in never[:10])
            + (f"; and {len(never) - 10} more" if len(never) > 10 else "")
        )


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
