"""Each table's health in Dagster's UI without a run, recorded by ``table_health_sensor``
when it changes, never per tick.

A table's *shown state* is what its partition's page says of it: ``healthy`` (its
``healthy`` verdict) and its due operations, or the error that kept it from being assessed.
At each evaluation the sensor compares every assessed table's state with the one shown and
records only the changes, with run-less events:

* a table no one has maintained gets an **assessment** when first seen: a materialization
  of its partition (tag ``icegate/source=assessment``; the figures of its metadata and its
  health keys), so the partitions view does not call an existing table "Missing" and its
  page says how healthy it is. (A never-materialized partition's page shows no
  observation, and no run-less event can mark a partition failed: an unhealthy table is
  told apart by its page, its ``healthy`` verdict first.) A table that cannot be read gets
  an observation only, and stays "Missing";
* later changes are **observations** of the partition with the health keys a run's
  materialization carries (``healthy``, ``health_score``, ``due_operations``, ``why``): the
  partition's page shows the newer of the two first, so it always says how the table is;
* a table a run or a CLI pass just recorded shows what that pass recorded; nothing more is
  needed unless its state differs; one the trigger requests now, or that a run in flight
  names, gets nothing: that run records it.

Why observations and not ``healthy`` check evaluations: Dagster 1.13 keeps one row per check,
run and partition, and every run-less event has the same empty run id, so a second run-less
evaluation of a partition's check fails to store (a unique index), and with it the tick. The
checks are evaluated by maintenance runs and CLI passes, which have run ids.

The shown states live in the sensor's cursor (:class:`HealthCursor`), with the storage id of
the newest materialization of ``maintained_table`` seen; a lost cursor makes the next
evaluation compare each table once with its latest materialization and observation.
``lakehouse_health`` is recorded when its figures change, and at least every
:data:`LAKEHOUSE_HEARTBEAT_S`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from icegate_dagster.assets.partition_events import (
    ASSESSMENT_SOURCE,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    health_metadata,
    verdicts_metadata,
)
from icegate_dagster.maintenance.health.checks import CheckOutcome, health_score_check
from icegate_dagster.maintenance.health.score import TableHealth
from icegate_dagster.partitions import iceberg_tables

#: ``lakehouse_health`` is recorded again after this long even when nothing changed, so
#: its plots keep a point an hour.
LAKEHOUSE_HEARTBEAT_S = 3600.0
#: Seconds from the start of an evaluation after which it compares no more tables it has
#: not shown yet with what the instance holds (Dagster cancels an evaluation at 60 s;
#: the assessment stops at 40 s); the rest wait for the next evaluation.
TICK_SECONDS = 50.0
#: New materializations of ``maintained_table`` read per query.
PAGE = 1000
#: On the sensor's observations: who recorded them.
HEALTH_SOURCE = "table_health_sensor"
ASSESSED_BY = (
    "table_health_sensor, from Iceberg metadata: no maintenance ran; the figures are the "
    "table's state when assessed"
)
OBSERVED_BY = "table_health_sensor, from Iceberg metadata"

Event = dg.AssetMaterialization | dg.AssetObservation


def _digest(text: str, size: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:size]


#: Characters of a state, and of a table's key, in the cursor.
STATE_CHARS, KEY_CHARS = 6, 10


def state_of(passed: bool, due: Iterable[str]) -> str:
    """A shown state: the verdict and the due operations (names, in pass order)."""
    return _digest(f"{'pass' if passed else 'fail'}:{','.join(due)}", STATE_CHARS)


def error_state(error: str) -> str:
    """The shown state of a table that could not be assessed: the error with its numbers
    (ports, ids, times) left out, so an error that only words itself differently each
    tick is one state."""
    return _digest("error:" + re.sub(r"\d+", "#", error)[:200], STATE_CHARS)


#: The state of a pass's record that carries no health (it could not be assessed).
UNASSESSED = _digest("unassessed", STATE_CHARS)


def recorded_state(event: dg.AssetMaterialization | dg.AssetObservation | None) -> str | None:
    """The state an event shows: its ``healthy`` and ``due_operations`` metadata (None when
    it carries no verdict)."""
    if event is None:
        return None
    metadata = event.metadata
    stated = metadata.get("state")
    if stated is not None:  # the sensor's own observations say it
        return str(getattr(stated, "value", stated))
    healthy = metadata.get("healthy")
    if healthy is None:
        return None
    if metadata.get("health_score") is None:
        return UNASSESSED
    due_text = str(getattr(metadata.get("due_operations"), "value", "none"))
    due = [] if due_text in ("", "none") else [op.strip() for op in due_text.split(",")]
    return state_of(bool(getattr(healthy, "value", healthy)), due)


def table_key(table: str) -> str:
    """A table as the cursor names it: a digest of its name, so the cursor (which Dagster
    stores with every tick) stays small."""
    return _digest(table, KEY_CHARS)


@dataclass
class HealthCursor:
    """What ``table_health_sensor`` remembers between evaluations (its Dagster cursor).

    Dagster stores the cursor with every tick, so the per-table part is packed: each shown
    table is its :func:`table_key` followed by its state (16 characters a table)."""

    #: The table the next evaluation starts at, when one ran out of time.
    resume_at: str | None = None
    #: Storage id of the newest materialization of ``maintained_table`` already read.
    after: int | None = None
    #: Per table key: the state its partition shows (see :func:`state_of`).
    shown: dict[str, str] = field(default_factory=dict)
    #: Keys of shown tables no one has materialized yet (those that could not be read).
    unmaterialized: set[str] = field(default_factory=set)
    #: Digest and time of the last ``lakehouse_health`` recorded.
    lakehouse: str | None = None
    lakehouse_at: float = 0.0

    @classmethod
    def parse(cls, raw: str | None) -> HealthCursor:
        """The cursor as stored; an older cursor (a table name) is where to resume, and one
        that does not read makes a first look."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls(resume_at=raw)
        if not isinstance(data, dict):
            return cls(resume_at=raw if isinstance(raw, str) else None)
        resume_at = data.get("resume_at")
        resume_at = resume_at if isinstance(resume_at, str) else None
        try:
            packed, unmaterialized = str(data.get("shown") or ""), str(data.get("new") or "")
            width = KEY_CHARS + STATE_CHARS
            if len(packed) % width or len(unmaterialized) % KEY_CHARS:
                raise ValueError("not a packed cursor")
            after = data.get("after")
            return cls(
                resume_at=resume_at,
                after=int(after) if after is not None else None,
                shown={
                    packed[i : i + KEY_CHARS]: packed[i + KEY_CHARS : i + width]
                    for i in range(0, len(packed), width)
                },
                unmaterialized={
                    unmaterialized[i : i + KEY_CHARS]
                    for i in range(0, len(unmaterialized), KEY_CHARS)
                },
                lakehouse=str(data["lakehouse"]) if data.get("lakehouse") else None,
                lakehouse_at=float(data.get("lakehouse_at") or 0.0),
            )
        except (TypeError, ValueError):  # edited by hand: compare every table afresh
            return cls(resume_at=resume_at)

    def serialize(self) -> str:
        """The cursor to store."""
        return json.dumps(
            {
                "resume_at": self.resume_at,
                "after": self.after,
                "shown": "".join(k + s for k, s in sorted(self.shown.items())),
                "new": "".join(sorted(self.unmaterialized)),
                "lakehouse": self.lakehouse,
                "lakehouse_at": self.lakehouse_at,
            },
            separators=(",", ":"),
            sort_keys=True,
        )


#: Pages of new materializations one evaluation reads; beyond (a sensor stopped for long),
#: it compares each table with its latest materialization instead.
MAX_PAGES = 5


def _new_materializations(
    instance: dg.DagsterInstance, after: int
) -> tuple[dict[str, dg.EventLogRecord], int] | None:
    """The newest materialization of each partition recorded since ``after``, and the
    newest storage id seen; None when there are more than :data:`MAX_PAGES` pages."""
    latest: dict[str, dg.EventLogRecord] = {}
    newest, page_cursor = after, None
    for _ in range(MAX_PAGES):
        result = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, after_storage_id=after),
            limit=PAGE,
            cursor=page_cursor,
            ascending=True,
        )
        for record in result.records:
            if record.partition_key is not None:
                latest[record.partition_key] = record
            newest = max(newest, record.storage_id)
        if not result.has_more:
            return latest, newest
        page_cursor = result.cursor
    return None


def _newest_storage_id(instance: dg.DagsterInstance) -> int:
    records = instance.fetch_materializations(MAINTAINED_TABLE, limit=1).records
    return records[0].storage_id if records else 0


def _shown_now(instance: dg.DagsterInstance, key: str) -> tuple[str | None, bool]:
    """The state a partition's page shows (that of the newer of its latest materialization
    and its latest observation), and whether it was ever materialized."""
    where = dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key])
    materialized = instance.fetch_materializations(where, limit=1).records
    observed = instance.fetch_observations(where, limit=1).records
    newest = max([*materialized, *observed], key=lambda r: r.storage_id, default=None)
    return (recorded_state(newest.asset_event) if newest else None), bool(materialized)


def assessment_event(
    key: str, health: TableHealth, verdict: CheckOutcome
) -> dg.AssetMaterialization:
    """The materialization recorded for a table no one maintained yet: its state now, from
    its metadata, marked as an assessment."""
    metrics = health.metrics
    delete_files = (
        metrics.position_delete_files + metrics.equality_delete_files + metrics.deletion_vectors
    )
    metadata: dict[str, Any] = {
        **health_metadata(health, verdict),
        "recorded_by": ASSESSED_BY,
        "files_after": metrics.data_files,
        "bytes_after": metrics.data_bytes,
        "snapshots_after": metrics.snapshots,
        "records_after": metrics.rows,
        # Live rows are the records where no delete file applies.
        **({"rows_after": metrics.rows} if delete_files == 0 else {}),
        "delete_files_after": delete_files,
        "small_files_after": metrics.small_files,
        "wal_files_count": metrics.wal_files,
        "wal_size_bytes": metrics.wal_bytes,
        "checks": verdicts_metadata([verdict]),
    }
    return dg.AssetMaterialization(
        asset_key=MAINTAINED_TABLE,
        partition=key,
        description=f"assessed, no maintenance ran: {verdict.description}",
        metadata=metadata,
        tags={SOURCE_TAG: ASSESSMENT_SOURCE},
    )


def observation_event(
    key: str, health: TableHealth | None, verdict: CheckOutcome, state: str
) -> dg.AssetObservation:
    """The partition's health now: the keys a run's materialization carries, newer. Every
    observation carries the same keys (the page shows each key's newest value)."""
    metadata: dict[str, Any] = {
        "health_score": dg.MetadataValue.null(),
        "due_operations": dg.MetadataValue.text("unknown"),
        **health_metadata(health, verdict),
        "figures": dg.MetadataValue.json(verdict.metadata.get("figures") or {}),
        "state": dg.MetadataValue.text(state),
        "observed_by": OBSERVED_BY,
    }
    return dg.AssetObservation(
        asset_key=MAINTAINED_TABLE,
        partition=key,
        description=verdict.description,
        metadata=metadata,
        tags={SOURCE_TAG: HEALTH_SOURCE},
    )


def table_health_events(
    instance: dg.DagsterInstance,
    cursor: HealthCursor,
    tables: list[str],
    healths: Mapping[str, TableHealth],
    errors: Mapping[str, str],
    min_scores: Mapping[str, float],
    *,
    busy: Iterable[str] = (),
    assessed_at: float | None = None,
    deadline: float | None = None,
) -> tuple[list[Event], HealthCursor]:
    """The events that bring each partition's page in line with this evaluation (see the
    module docstring), and the cursor after them.

    ``tables`` are the current partitions; ``healths`` and ``errors`` the tables assessed
    now, or not assessable, from ``assessed_at`` (a timestamp) on: a table that a pass
    recorded after that is left to the next evaluation (this one's look may be older).
    Tables in ``busy`` (requested now, or named by an unfinished run) get nothing: their
    run records them, and the daemon launches a tick's runs only after storing its events.
    Past ``deadline`` (``time.monotonic()``), tables not shown yet wait for the next
    evaluation: comparing one costs two questions to the instance.
    """
    keys = {table: table_key(table) for table in tables}
    live = set(keys.values())
    shown = {k: state for k, state in cursor.shown.items() if k in live}
    unmaterialized = cursor.unmaterialized & set(shown)
    fresh: dict[str, dg.EventLogRecord] = {}
    read = None if cursor.after is None else _new_materializations(instance, cursor.after)
    if read is None:  # a first look, or too much since: each table is compared below
        shown.clear()
        unmaterialized.clear()
        after = _newest_storage_id(instance)
    else:
        fresh, after = read
    for table, record in fresh.items():
        if table not in keys:
            continue
        unmaterialized.discard(keys[table])
        state = recorded_state(record.asset_materialization)
        if state is not None:  # a run, a CLI pass or an assessment recorded it since
            shown[keys[table]] = state

    verdicts: dict[str, tuple[str, CheckOutcome, TableHealth | None]] = {}
    for table, health in healths.items():
        verdict = health_score_check(health, min_scores.get(table, 0.0))
        verdicts[table] = (state_of(verdict.passed, health.due_operations), verdict, health)
    for table, error in errors.items():
        verdicts[table] = (error_state(error), health_score_check(None, 0.0, error), None)

    skipped = set(busy)
    if assessed_at is not None:
        skipped |= {t for t, r in fresh.items() if r.timestamp > assessed_at}
    pending = sorted(t for t in verdicts if t in keys and t not in skipped)
    # Tables this sensor has not shown yet (a first look, or new partitions): which ones
    # were ever materialized, in one question.
    unknown = [t for t in pending if keys[t] not in shown]
    statuses = (
        instance.get_status_by_partition(MAINTAINED_TABLE, unknown, iceberg_tables)
        if unknown
        else None
    ) or {}
    events: list[Event] = []
    for table in pending:
        key = keys[table]
        state, verdict, assessed = verdicts[table]
        if key not in shown:
            if deadline is not None and time.monotonic() > deadline:
                continue  # compared at the next evaluation
            known, materialized = (
                _shown_now(instance, table) if statuses.get(table) is not None else (None, False)
            )
            if known is not None:
                shown[key] = known
            if not materialized:
                unmaterialized.add(key)
        if shown.get(key) == state:
            continue
        if key in unmaterialized and assessed is not None:
            events.append(assessment_event(table, assessed, verdict))
            unmaterialized.discard(key)
        else:
            events.append(observation_event(table, assessed, verdict, state))
        shown[key] = state
    return events, HealthCursor(
        resume_at=cursor.resume_at,
        after=after,
        shown=shown,
        unmaterialized=unmaterialized,
        lakehouse=cursor.lakehouse,
        lakehouse_at=cursor.lakehouse_at,
    )


def lakehouse_digest(numbers: Mapping[str, float | int]) -> str:
    """Names the ``lakehouse_health`` figures, to record them only when they change."""
    return _digest(json.dumps(dict(numbers), sort_keys=True))
