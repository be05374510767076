"""The sensors' run requests: runs of ``maintenance_batch_job`` over the tables they chose,
up to ``maintain.trigger.tables_per_run`` tables each, and their run keys.

Dagster drops a request whose run key the sensor used before, whatever became of that run.
So a key names one **decision**, and no two decisions share one: each table's key part is
its decision number (counted up in the trigger's memory) and a random nonce
(``<number>-<16 hex digits>``). The number tells people how often the table was asked for;
the nonce keeps the key unique whatever the memory went through: a table dropped and made
again starts counting at 1, a lease store restored from a backup counts from an older
number, and neither makes a key Dagster saw before. The trigger's memory keeps each
request's run key (``TriggerMemory.record_requests``): a request is counted lost only when
a run with that key ended without recording the table (``tick.Tick.count_lost``).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Mapping, Sequence

import dagster as dg

from icegate_dagster.assets.names import (
    BATCH_JOB,
    DAILY_SCHEDULE,
    HEALTH_SENSOR,
    STATE_TAG,
    TABLE_TAG,
    TABLES_TAG,
    TRIGGER_TAG,
    WAL_SENSOR,
)
from icegate_dagster.assets.runs import BatchEntry, batch_run_config
from icegate_dagster.maintenance.trigger.records import TableMemory
from icegate_dagster.maintenance.trigger.store import TriggerMemory

#: How each sensor's (and the daily schedule's) run keys begin.
RUN_KEY_PREFIXES = {HEALTH_SENSOR: "health", WAL_SENSOR: "wal", DAILY_SCHEDULE: "daily"}


def split_evenly(count: int, per_run: int) -> list[int]:
    """Sizes of the runs that ``count`` tables make at up to ``per_run`` each, as even as
    possible (30 tables at 25 a run: 15 and 15, so side-by-side runs end together)."""
    if count <= 0:
        return []
    runs = -(-count // per_run)
    return [count // runs + (1 if i < count % runs else 0) for i in range(runs)]


def new_decisions(tables: Sequence[str], memory: Mapping[str, TableMemory]) -> dict[str, str]:
    """Each table's next decision: its number (one more than the memory's count; 1 when
    the memory knows none) and a random nonce, ``<number>-<16 hex digits>``."""
    return {
        table: f"{(m.decisions if (m := memory.get(table)) else 0) + 1}-{secrets.token_hex(8)}"
        for table in tables
    }


def _planned(
    entries: Sequence[BatchEntry],
    decisions: Mapping[str, int | str],
    *,
    trigger: str,
    tables_per_run: int,
    tags: Callable[[Sequence[BatchEntry]], Mapping[str, str]] | None = None,
    limits: Mapping[str, str] | None = None,
) -> list[tuple[Sequence[BatchEntry], dg.RunRequest]]:
    prefix = RUN_KEY_PREFIXES.get(trigger, trigger)
    planned, start = [], 0
    for size in split_evenly(len(entries), tables_per_run):
        chunk = entries[start : start + size]
        start += size
        run_tags = {TRIGGER_TAG: trigger, TABLES_TAG: str(len(chunk))}
        run_tags.update(tags(chunk) if tags is not None else {})
        run_tags.update(limits or {})  # e.g. names.max_runtime_tags: a hung run is failed
        keys = [f"{entry.table}:{decisions[entry.table]}" for entry in chunk]
        if len(chunk) == 1:
            [entry] = chunk
            run_key = f"{prefix}:{keys[0]}"
            run_tags[TABLE_TAG] = entry.table
            if entry.state:
                run_tags[STATE_TAG] = entry.state
        else:
            digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()
            run_key = f"{prefix}:batch:{digest[:20]}"
        request = dg.RunRequest(
            run_key=run_key,
            job_name=BATCH_JOB,
            run_config=batch_run_config(list(chunk)),
            tags=run_tags,
        )
        planned.append((chunk, request))
    return planned


def sensor_run_requests(
    entries: Sequence[BatchEntry],
    decisions: Mapping[str, int | str],
    *,
    trigger: str,
    tables_per_run: int,
    tags: Callable[[Sequence[BatchEntry]], Mapping[str, str]] | None = None,
    limits: Mapping[str, str] | None = None,
) -> list[dg.RunRequest]:
    """Runs of ``maintenance_batch_job`` over ``entries`` in their order, up to
    ``tables_per_run`` tables each, keyed by their tables' decisions (``decisions``: table
    -> :func:`new_decisions`'s). ``tags`` adds tags to a run from its entries, ``limits``
    to every run (:func:`~icegate_dagster.assets.names.max_runtime_tags`). A one-table
    run is keyed ``<prefix>:<table>:<decision>`` and tagged ``icegate/table`` and
    ``icegate/table_state``; a batch ``<prefix>:batch:<digest of its tables' keys>``.
    """
    planned = _planned(
        entries,
        decisions,
        trigger=trigger,
        tables_per_run=tables_per_run,
        tags=tags,
        limits=limits,
    )
    return [request for _, request in planned]


def request_runs(
    memory: TriggerMemory,
    entries: Sequence[BatchEntry],
    remembered: Mapping[str, TableMemory],
    *,
    trigger: str,
    tables_per_run: int,
    now: float,
    tags: Callable[[Sequence[BatchEntry]], Mapping[str, str]] | None = None,
    limits: Mapping[str, str] | None = None,
) -> list[dg.RunRequest]:
    """The run requests of ``entries`` (:func:`sensor_run_requests`, new decisions), each
    remembered in the trigger's memory as ``trigger``'s with its run's key before it is
    returned. A memory that cannot be written raises (then nothing is requested: a run the
    memory does not know of could not be told from a lost one)."""
    decisions = new_decisions([entry.table for entry in entries], remembered)
    planned = _planned(
        entries,
        decisions,
        trigger=trigger,
        tables_per_run=tables_per_run,
        tags=tags,
        limits=limits,
    )
    run_keys = {entry.table: request.run_key for chunk, request in planned for entry in chunk}
    memory.record_requests(
        [(entry.table, entry.operations or ()) for entry in entries],
        trigger,
        now,
        run_keys={table: key for table, key in run_keys.items() if key is not None},
    )
    return [request for _, request in planned]
