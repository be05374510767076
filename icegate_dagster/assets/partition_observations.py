"""What the health sensor records on partition pages without a run: each table's health
when it changes (``lakehouse_health``'s own event is built in :mod:`.lakehouse_health`).

A table's *shown state* is what its partition page says of it: its ``healthy`` verdict
and due operations, or the error that kept it from being read
(``trigger.records.shown_state``). Whoever records a page (a maintenance run, a CLI pass
with a Dagster instance, this sensor) remembers the state it showed in the trigger's
memory, so at each tick the sensor compares each table's state now with the one shown and
records only the differences:

* a table no one maintained gets an **assessment** when first seen: a materialization of
  its partition (tag ``icegate/source=assessment``; the figures of its metadata and its
  health keys), so the partitions view does not call an existing table "Missing". A table
  that cannot be read gets an observation only, and stays "Missing";
* later changes are **observations** with the health keys a run's materialization carries
  (``healthy``, ``health_score``, ``due_operations``, ``why``): the partition's page
  shows the newer of the two first;
* a table the trigger asks for now, or that an unfinished run names, gets nothing: its
  run records it. A look older than a pass's record waits for the next tick.

The verdicts of the checks the metadata alone can judge (``healthy``, ``small_files``,
``snapshot_count``, ``wal_backlog``: ``health.checks.metadata_checks``) are part of the
shown state: when one changes, the table's check evaluations are recorded too (in a short
run: :mod:`.partition_checks` says why), so each check's Partitions view shows every
assessed table Passed or Failed. A table assessed in this tick gets them at the next (an
evaluation judges the partition's latest materialization, which the assessment is once
the daemon stored it); a page that shows a table's health but not yet its checks' verdicts
gets only the evaluations.

At most :data:`EVENTS_PER_TICK` events a tick (Dagster stores them one by one after the
evaluation, about 10 ms each); the rest follow at the next ticks.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from icegate_dagster.assets.names import (
    ASSESSMENT_SOURCE,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    iceberg_tables,
)
from icegate_dagster.assets.partition_events import health_metadata, verdicts_metadata
from icegate_dagster.config import TableSettings
from icegate_dagster.maintenance.health.checks import (
    CheckOutcome,
    failing_checks,
    metadata_checks,
)
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.trigger.look import LakehouseLook
from icegate_dagster.maintenance.trigger.records import (
    TableMemory,
    checked,
    checks_part,
    error_state,
    page_part,
    shown_state,
    unchecked,
)
from icegate_dagster.maintenance.trigger.store import StoredLook
from icegate_dagster.maintenance.wal import WalStats

#: Events one tick records at most.
EVENTS_PER_TICK = 500
#: On the sensor's observations: who recorded them.
HEALTH_SOURCE = "table_health_sensor"
ASSESSED_BY = (
    "table_health_sensor, from Iceberg metadata: no maintenance ran; the figures are the "
    "table's state when assessed"
)
OBSERVED_BY = "table_health_sensor, from Iceberg metadata"

Event = dg.AssetMaterialization | dg.AssetObservation
#: The WAL of a table without one (no ``wal.root``, or no folder).
NO_WAL = WalStats(0, 0)


def excluded_metadata(health: HealthSummary | None) -> dict[str, Any]:
    """``excluded``, as a run's materialization says it: why the table, or some of its
    operations, are not maintained here (empty when nothing is excluded)."""
    if health is None:
        return {}
    if health.excluded is not None:
        return {"excluded": dg.MetadataValue.text(health.excluded)}
    if health.excluded_operations:
        reasons: dict[str, list[str]] = {}
        for operation, why in sorted(health.excluded_operations.items()):
            reasons.setdefault(why, []).append(operation)
        text = "; ".join(f"{', '.join(ops)}: {why}" for why, ops in reasons.items())
        return {"excluded": dg.MetadataValue.text(text)}
    return {}


def assessment_event(
    key: str, health: HealthSummary, verdict: CheckOutcome
) -> dg.AssetMaterialization:
    """The materialization recorded for a table no one maintained yet: its state now, from
    its metadata, marked as an assessment."""
    figures = health.figures()
    metadata: dict[str, Any] = {
        **health_metadata(health, verdict),
        **excluded_metadata(health),
        "recorded_by": ASSESSED_BY,
        "files_after": figures["data_files"],
        "bytes_after": figures["data_bytes"],
        "snapshots_after": figures["snapshots"],
        "records_after": figures["rows"],
        # Live rows are the records where no delete file applies.
        **({"rows_after": figures["rows"]} if figures["delete_files"] == 0 else {}),
        "delete_files_after": figures["delete_files"],
        "small_files_after": figures["small_files"],
        "wal_files_count": figures["wal_files"],
        "wal_size_bytes": figures["wal_bytes"],
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
    key: str, health: HealthSummary | None, verdict: CheckOutcome, state: str
) -> dg.AssetObservation:
    """The partition's health now: the keys a run's materialization carries, newer. Every
    observation carries the same keys (the page shows each key's newest value)."""
    metadata: dict[str, Any] = {
        "health_score": dg.MetadataValue.null(),
        "due_operations": dg.MetadataValue.text("unknown"),
        # Always present: a page shows each key's newest value, so "none" must replace a
        # table's earlier exclusion.
        "excluded": dg.MetadataValue.text("none"),
        **health_metadata(health, verdict),
        **excluded_metadata(health),
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


@dataclass
class PartitionEvents:
    """One tick's events for partition pages, and what the pages show after them."""

    events: list[Event]
    #: ``(table, state, materialized)`` to remember once the events are recorded.
    shown: list[tuple[str, str, bool]]
    #: Tables whose page differs and waits for a later tick (the per-tick limit).
    waiting: int = 0
    #: The verdicts of the metadata checks to record as check evaluations, by table (their
    #: states in :attr:`shown` count them recorded: see :meth:`shown_after`).
    checks: dict[str, list[CheckOutcome]] = field(default_factory=dict)
    #: The state to remember instead for a table of :attr:`checks` whose evaluations were
    #: not recorded: the next tick finds it changed and records them.
    unchecked: dict[str, str] = field(default_factory=dict)

    def shown_after(self, recorded: Collection[str]) -> list[tuple[str, str, bool]]:
        """:attr:`shown` once the check evaluations of ``recorded`` tables are stored."""
        return [
            (table, state if table in recorded else self.unchecked.get(table, state), done)
            for table, state, done in self.shown
        ]


def _default_settings(table: str) -> TableSettings:
    return TableSettings()


def partition_events(
    instance: dg.DagsterInstance,
    look: LakehouseLook,
    memory: Mapping[str, TableMemory],
    *,
    busy: Iterable[str] = (),
    limit: int = EVENTS_PER_TICK,
    settings_of: Callable[[str], TableSettings] = _default_settings,
) -> PartitionEvents:
    """The events that bring partition pages in line with ``look`` (module docstring).

    ``memory`` gives each table's shown state; a table with none was never shown by
    anyone this memory knows: the instance says, in one question for all of them, whether
    its partition was ever materialized. ``settings_of`` gives a table's settings (the
    checks' limits)."""
    skipped = set(busy)
    changed: list[tuple[str, StoredLook, list[CheckOutcome]]] = []
    for table in look.tables:
        seen = look.looks.get(table)
        if seen is None or table in skipped:
            continue
        remembered = memory.get(table)
        if (
            remembered is not None
            and remembered.shown_at is not None
            and remembered.shown_at > seen.looked_at
            and checked(remembered.shown_state)
        ):
            # A pass recorded the page after this look: compared at the next look. (A page
            # whose checks' verdicts wait is the sensor's own, from this very look.)
            continue
        outcomes = _verdicts(seen, look, settings_of(table))
        if remembered is not None and remembered.shown_state == _state(seen, outcomes):
            continue
        changed.append((table, seen, outcomes))
    waiting = max(0, len(changed) - limit)
    changed = changed[:limit]
    unknown = [t for t, *_ in changed if memory.get(t) is None or memory[t].shown_state is None]
    statuses = (
        instance.get_status_by_partition(MAINTAINED_TABLE, unknown, iceberg_tables)
        if unknown
        else None
    ) or {}
    page = PartitionEvents([], [], waiting)
    for table, seen, outcomes in changed:
        remembered = memory.get(table)
        verdict = outcomes[0]
        state = _state(seen, outcomes)
        materialized = (
            remembered.materialized
            if remembered is not None and remembered.shown_state is not None
            else statuses.get(table) is not None
        )
        shown = remembered.shown_state if remembered is not None else None
        if not materialized and seen.health is not None:
            # Its checks wait for the next tick: an evaluation judges the partition's
            # latest materialization, which this one is once the daemon stored it.
            page.events.append(assessment_event(table, seen.health, verdict))
            state, materialized = unchecked(state), True
        else:
            if page_part(shown) != page_part(state):
                page.events.append(observation_event(table, seen.health, verdict, state))
            if checks_part(shown) != checks_part(state):
                page.checks[table] = outcomes
                page.unchecked[table] = unchecked(state)
        page.shown.append((table, state, materialized))
    return page


def _verdicts(seen: StoredLook, look: LakehouseLook, settings: TableSettings) -> list[CheckOutcome]:
    """The metadata checks of a table as ``seen``, ``healthy`` first."""
    min_score = seen.health.min_score if seen.health is not None else 0.0
    return metadata_checks(
        seen.health,
        settings,
        look.wal.get(seen.table, NO_WAL),
        min_score=min_score,
        error=seen.error,
    )


def _state(seen: StoredLook, outcomes: list[CheckOutcome]) -> str:
    """What the table's page shows once ``outcomes`` are recorded on it."""
    failing = failing_checks(outcomes)
    if seen.health is not None:
        return shown_state(
            seen.health.healthy,
            seen.health.due_operations,
            seen.health.excluded is not None,
            failing,
        )
    return error_state(seen.error or "", failing)
