"""What every tick of the trigger's sensors shares beyond the trigger's state
(:class:`~icegate_dagster.assets.trigger_state.TriggerState`: its stores, clock and busy
tables): its deadline, the healing of runs whose worker is gone, the requests no run
answered, and partitions for tables discovery has not added yet.

The trigger's memory waits for another writer's lock until shortly before the deadline at
most (:data:`WRITE_RESERVE`), so a locked store ends the tick in time, saying so.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

import dagster as dg

from icegate_dagster.assets.names import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.assets.trigger_state import TriggerState
from icegate_dagster.errors import describe_error
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.trigger.look import Listing, list_tables
from icegate_dagster.maintenance.trigger.records import OpenRequest, TableMemory, utc
from icegate_dagster.maintenance.trigger.store import MemoryBusy
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.healing import fail_dead_runs

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


@dataclass
class Tick(TriggerState):
    """One evaluation of a trigger sensor: the trigger's state, its log and deadline."""

    log: Any = None
    #: ``time.monotonic()`` by which the evaluation ends.
    deadline: float = math.inf

    @classmethod
    def start(
        cls,
        context: dg.SensorEvaluationContext | dg.ScheduleEvaluationContext,
        lakehouse: LakehouseResource,
    ) -> Tick:
        """Open the stores and read the clock; the deadline starts now, and the memory
        waits for a lock until shortly before it at most (a sensor's tick, or the daily
        schedule's: Dagster cancels either at 60 s)."""
        started = time.monotonic()
        config = lakehouse.config()
        limit = config.trigger.tick_deadline.total_seconds()
        deadline = started + limit
        tick = cls(context.instance, lakehouse, config, log=context.log, deadline=deadline)
        tick.open_stores(write_until=deadline - limit * WRITE_RESERVE)
        return tick

    def left(self) -> float:
        """Seconds until the deadline."""
        return self.deadline - time.monotonic()

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

    def list_lakehouse(self, maintainer: Maintainer) -> Listing | dg.SkipReason:
        """Every table to maintain (:func:`list_tables`), or why the tick skips: the catalog
        cannot be listed, or has no table."""
        name = self.config.catalog.name
        try:
            listing = list_tables(maintainer)
        except Exception as exc:
            return dg.SkipReason(
                f"cannot list the tables of catalog {name!r}: {describe_error(exc, self.scrub)}"
            )
        if not listing.tables:
            return dg.SkipReason(f"catalog {name!r} has no table to maintain")
        return listing

    def read_memory(
        self, names: Collection[str] | None = None, *, operations_of: Collection[str]
    ) -> dict[str, TableMemory]:
        """The trigger's memory of ``names`` (or every table), with the operations of
        ``operations_of`` (:meth:`TriggerMemory.tables_memory`); empty, with a warning,
        when it cannot be read."""
        if self.memory is None:
            return {}
        try:
            return self.memory.tables_memory(names, operations_of=operations_of)
        except Exception as exc:
            self.warnings.append(
                f"cannot read the trigger's memory: {describe_error(exc, self.scrub)}"
            )
            return {}

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
