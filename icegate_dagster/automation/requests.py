"""The sensors' run requests: runs of ``maintenance_batch_job`` over the tables they chose,
up to ``maintain.trigger.tables_per_run`` tables each, and their run keys.

Dagster drops a request whose run key the sensor used before, whatever became of that run.
So a key names one **decision**: each table's decision number is counted up in the
trigger's memory whenever a sensor asks for it (``TriggerMemory.record_requests``), and a
run's key is made of its tables and their numbers. No new decision ever reuses a key,
however often a table fails, however long it stays in the same state, and whatever window
of run history Dagster keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence

import dagster as dg

from icegate_dagster.automation.runs import (
    BATCH_JOB,
    HEALTH_SENSOR,
    STATE_TAG,
    TABLE_TAG,
    TABLES_TAG,
    TRIGGER_TAG,
    WAL_SENSOR,
    BatchEntry,
    batch_run_config,
)

#: How each sensor's run keys begin.
RUN_KEY_PREFIXES = {HEALTH_SENSOR: "health", WAL_SENSOR: "wal"}


def split_evenly(count: int, per_run: int) -> list[int]:
    """Sizes of the runs that ``count`` tables make at up to ``per_run`` each, as even as
    possible (30 tables at 25 a run: 15 and 15, so side-by-side runs end together)."""
    if count <= 0:
        return []
    runs = -(-count // per_run)
    return [count // runs + (1 if i < count % runs else 0) for i in range(runs)]


def sensor_run_requests(
    entries: Sequence[BatchEntry],
    decisions: Mapping[str, int],
    *,
    trigger: str,
    tables_per_run: int,
    tags: Callable[[Sequence[BatchEntry]], Mapping[str, str]] | None = None,
    limits: Mapping[str, str] | None = None,
) -> list[dg.RunRequest]:
    """Runs of ``maintenance_batch_job`` over ``entries`` in their order, up to
    ``tables_per_run`` tables each, keyed by their tables' decision numbers
    (``decisions``: table -> number). ``tags`` adds tags to a run from its entries. A
    one-table run is keyed ``<prefix>:<table>:<decision>`` and tagged ``icegate/table``
    and ``icegate/table_state``; a batch ``<prefix>:batch:<digest of its tables' keys>``.
    """
    prefix = RUN_KEY_PREFIXES.get(trigger, trigger)
    requests, start = [], 0
    for size in split_evenly(len(entries), tables_per_run):
        chunk = entries[start : start + size]
        start += size
        run_tags = {TRIGGER_TAG: trigger, TABLES_TAG: str(len(chunk))}
        run_tags.update(tags(chunk) if tags is not None else {})
        run_tags.update(limits or {})  # e.g. runs.max_runtime_tags: a hung run is failed
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
        requests.append(
            dg.RunRequest(
                run_key=run_key,
                job_name=BATCH_JOB,
                run_config=batch_run_config(list(chunk)),
                tags=run_tags,
            )
        )
    return requests
