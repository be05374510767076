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
#: Seconds one evaluation spends comparing tables it has not shown yet with what the
#: instance holds (after the assessment's 40 s, within Dagster's 60 s); the rest wait.
RECORD_SECONDS = 10.0
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


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def state_of(passed: bool, due: Iterable[str]) -> str:
    """A shown state: the verdict and the due operations (names, in pass order)."""
    return _digest(f"{'pass' if passed else 'fail'}:{','.join(due)}")


def error_state(error: str) -> str:
    """The shown state of a table that could not be assessed."""
    return _digest(f"error:{error}")


def recorded_state(event: dg.AssetMaterialization | dg.AssetObservation | None) -> str | None:
    """The state an event shows: its ``healthy`` and ``due_operations`` metadata (None when
    it carries no verdict)."""
    if event is None:
        return None
    metadata = event.metadata
    stated = metadata.get("state")
    if stated is not None:  # an error, as the sensor observed it
        return str(getattr(stated, "value", stated))
    healthy = metadata.get("healthy")
    if healthy is None:
        return None
    due_text = str(getattr(metadata.get("due_operations"), "value", "none"))
    due = [] if due_text in ("", "none") else [op.strip() for op in due_text.split(",")]
    return state_of(bool(getattr(healthy, "value", healthy)), due)


@dataclass
class HealthCursor:
    """What ``table_health_sensor`` remembers between evaluations (its Dagster cursor)."""

    #: The table the next evaluation starts at, when one ran out of time.
    resume_at: str | None = None
    #: Storage id of the newest materialization of ``maintained_table`` already read.
    after: int | None = None
    #: Per table: the state its partition shows (see :func:`state_of`).
    shown: dict[str, str] = field(default_factory=dict)
    #: Shown tables no one has materialized yet (those that could not be read).
    unmaterialized: set[str] = field(default_factory=set)
    #: Digest and time of the last ``lakehouse_health`` recorded.
    lakehouse: str | None = None
    lakehouse_at: float = 0.0

    @classmethod
    def parse(cls, raw: str | None) -> HealthCursor:
        """The cursor as stored; an older cursor (a table name) is where to resume."""
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls(resume_at=raw)
        if not isinstance(data, dict):
            return cls(resume_at=raw)
        shown = data.get("shown")
        unmaterialized = data.get("unmaterialized")
        return cls(
            resume_at=data.get("resume_at"),
            after=data.get("after"),
            shown=dict(shown) if isinstance(shown, dict) else {},
            unmaterialized=set(unmaterialized) if isinstance(unmaterialized, list) else set(),
            lakehouse=data.get("lakehouse"),
            lakehouse_at=float(data.get("lakehouse_at") or 0.0),
        )

    def serialize(self) -> str:
        """The cursor to store."""
        return json.dumps(
            {
                "resume_at": self.resume_at,
                "after": self.after,
                "shown": self.shown,
                "unmaterialized": sorted(self.unmaterialized),
                "lakehouse": self.lakehouse,
                "lakehouse_at": self.lakehouse_at,
            },
            separators=(",", ":"),
            sort_keys=True,
        )


def _new_materializations(
    instance: dg.DagsterInstance, after: int
) -> tuple[dict[str, dg.EventLogRecord], int]:
    """The newest materialization of each partition recorded since ``after``, and the
    newest storage id seen."""
    latest: dict[str, dg.EventLogRecord] = {}
    newest, page_cursor = after, None
    while True:
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


def _shown_now(instance: dg.DagsterInstance, key: str) -> str | None:
    """The state a materialized partition's page shows: that of the newer of its latest
    materialization and its latest observation."""
    where = dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key])
    materialized = instance.fetch_materializations(where, limit=1).records
    observed = instance.fetch_observations(where, limit=1).records
    newest = max([*materialized, *observed], key=lambda r: r.storage_id, default=None)
    return recorded_state(newest.asset_event) if newest is not None else None


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
    """The partition's health now: the keys a run's materialization carries, newer."""
    metadata: dict[str, Any] = {**health_metadata(health, verdict), "observed_by": OBSERVED_BY}
    if health is None:
        metadata["state"] = dg.MetadataValue.text(state)  # an error: compared as it is
    else:
        figures = verdict.metadata.get("figures")
        if figures is not None:
            metadata["figures"] = dg.MetadataValue.json(figures)
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
    busy: Iterable[str] = (),
    deadline: float | None = None,
) -> tuple[list[Event], HealthCursor]:
    """The events that bring each partition's page in line with this evaluation (see the
    module docstring), and the cursor after them. ``tables`` are the current partitions;
    ``healths`` and ``errors`` the tables assessed now, or not assessable. Tables in
    ``busy`` (requested now, or named by an unfinished run) get nothing: their run records
    them shortly, and the daemon launches the runs only after storing a tick's events.
    Past ``deadline`` (``time.monotonic()``), tables not shown yet wait for the next
    evaluation: comparing one costs two questions to the instance."""
    partitions = set(tables)
    shown = {key: state for key, state in cursor.shown.items() if key in partitions}
    unmaterialized = cursor.unmaterialized & set(shown)
    fresh: dict[str, dg.EventLogRecord] = {}
    if cursor.after is None:  # a first look: each table is compared with its latest below
        records = instance.fetch_materializations(MAINTAINED_TABLE, limit=1).records
        after = records[0].storage_id if records else 0
    else:
        fresh, after = _new_materializations(instance, cursor.after)
    for key, record in fresh.items():
        state = recorded_state(record.asset_materialization)
        if key in partitions:
            unmaterialized.discard(key)
            if state is not None:  # a run, a CLI pass or an assessment recorded it since
                shown[key] = state

    verdicts: dict[str, tuple[str, CheckOutcome, TableHealth | None]] = {}
    for key, health in healths.items():
        verdict = health_score_check(health, min_scores.get(key, 0.0))
        verdicts[key] = (state_of(verdict.passed, health.due_operations), verdict, health)
    for key, error in errors.items():
        verdicts[key] = (error_state(error), health_score_check(None, 0.0, error), None)

    events: list[Event] = []
    skipped = set(busy)
    # Tables this sensor has not shown yet (its first look, or new partitions): which ones
    # were ever materialized, in one question.
    unknown = sorted(key for key in verdicts if key not in shown and key not in skipped)
    statuses = (
        instance.get_status_by_partition(MAINTAINED_TABLE, unknown, iceberg_tables)
        if unknown
        else None
    ) or {}
    for key in sorted(verdicts):
        if key in skipped:
            continue
        state, verdict, assessed = verdicts[key]
        if key not in shown:
            if deadline is not None and time.monotonic() > deadline:
                continue  # compared at the next evaluation
            if statuses.get(key) is None:
                unmaterialized.add(key)
            elif (known := _shown_now(instance, key)) is not None:
                shown[key] = known
        if shown.get(key) == state:
            continue
        if key in unmaterialized and assessed is not None:
            events.append(assessment_event(key, assessed, verdict))
            unmaterialized.discard(key)
        else:
            events.append(observation_event(key, assessed, verdict, state))
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
