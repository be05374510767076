"""The health trigger's state as a sensor tick or a run reads it: the stores (the lease
store and the trigger's memory), the clock, and which tables are busy (an unfinished run
names them, or another maintainer's live lease holds them).

``lakehouse_health``'s own materialization reads it to report what the trigger would do
now; the sensors' ticks (:class:`~icegate_dagster.sensors.tick.Tick`) add their deadline,
the healing of dead runs and the requests no run answered.

The clock is the lease store's database clock, the one every maintainer writes the
trigger's memory with; a test replaces it with :func:`simulated_clock`.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import dagster as dg

from icegate_dagster.assets.runs import run_targets, unfinished_runs
from icegate_dagster.config import IcegateConfig
from icegate_dagster.config.secrets import scrub
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.leases.store import TableLocks
from icegate_dagster.maintenance.trigger.store import TriggerMemory, memory_for
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
class TriggerState:
    """The trigger's stores, clock and busy tables, as one evaluation reads them."""

    instance: dg.DagsterInstance
    lakehouse: LakehouseResource
    config: IcegateConfig
    locks: TableLocks | None = None
    memory: TriggerMemory | None = None
    #: Why the stores could not be opened (the evaluation goes on with what it has).
    store_error: str | None = None
    now: float = 0.0
    #: What the evaluation says in its log (warnings first).
    warnings: list[str] = field(default_factory=list)
    _runs: list[Any] | None = None

    @classmethod
    def for_run(cls, instance: dg.DagsterInstance, lakehouse: LakehouseResource) -> Self:
        """The state for a run (``lakehouse_health``'s own materialization): no deadline
        bounds its memory's lock waits (a run is not canceled at 60 s)."""
        state = cls(instance, lakehouse, lakehouse.config())
        state.open_stores(write_until=None)
        return state

    def open_stores(self, *, write_until: float | None) -> None:
        """Open the stores and read the clock (``write_until``: ``time.monotonic()`` after
        which the memory no longer waits for another writer's lock; None: no bound)."""
        try:
            self.locks = lease_store(self.config, self.lakehouse.catalog())
            if self.locks is not None:
                self.memory = memory_for(self.locks.engine)
                if write_until is not None:
                    self.memory = self.memory.within(write_until)
        except Exception as exc:
            self.store_error = describe_error(exc, self.scrub)
        clock = _clock.get()
        if clock is not None:
            self.now = clock()
        else:
            try:
                self.now = self.memory.now() if self.memory is not None else time.time()
            except Exception as exc:
                self.store_error = self.store_error or describe_error(exc, self.scrub)
                self.now = time.time()

    def scrub(self, text: str) -> str:
        """``text`` with the configuration's secrets masked."""
        return scrub(text, self.config)

    def runs(self) -> list[Any]:
        """The unfinished runs' records, asked once per evaluation (the healing and the busy
        tables share them)."""
        if self._runs is None:
            self._runs = unfinished_runs(self.instance)
        return self._runs

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
