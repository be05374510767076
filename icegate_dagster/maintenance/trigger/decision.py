"""The health trigger's decision over one look at the lakehouse, and the lakehouse report
made from it (pure: no Dagster, no JVM; the sensor and the ``lakehouse_health`` asset both
call these, with the clock and the settings they read).

- :func:`decide`: which due tables go now (:func:`.selection.select_runs` over every
  looked-at table), and the state of each due table (its run carries it);
- :func:`failing_tables`: the tables whose operations keep failing or stay due;
- :func:`lakehouse_report`: the lakehouse's totals, least healthy, failing tables and
  unsafe sharing: ``lakehouse_health``'s content, built one way for whoever records it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from icegate_dagster.maintenance.health.summary import table_state
from icegate_dagster.maintenance.ops import OPERATIONS
from icegate_dagster.maintenance.trigger.look import LakehouseLook, unsafe_sharing
from icegate_dagster.maintenance.trigger.selection import (
    LakehouseHealth,
    Selection,
    select_runs,
    summarize,
)

if TYPE_CHECKING:
    from icegate_dagster.config import TriggerSettings
    from icegate_dagster.maintenance.sharing import Sharing
    from icegate_dagster.maintenance.trigger.records import TableMemory


def failing_tables(memory: Mapping[str, TableMemory]) -> dict[str, str]:
    """Tables whose operation failed, or stayed due after it ran, at least twice in a row,
    with what happened (the last error)."""
    failing = {}
    for table, remembered in memory.items():
        troubled = [
            m for m in remembered.operations.values() if m.failures >= 2 or m.ineffective >= 2
        ]
        if troubled:
            failing[table] = "; ".join(m.describe() for m in troubled)
    return failing


def decide(
    look: LakehouseLook,
    memory: Mapping[str, TableMemory],
    busy: Mapping[str, str],
    *,
    now: float,
    trigger: TriggerSettings,
) -> tuple[Selection, dict[str, str]]:
    """The trigger's decision at ``now`` over every looked-at table
    (:func:`.selection.select_runs`), and the state of each due table (its run carries it).
    ``busy``: tables a run or another maintainer holds, with which."""
    healths = look.healths
    states = {}
    for table, health in healths.items():
        if health.due:
            wal = look.wal.get(table)
            states[table] = table_state(
                look.looks[table].metadata_location,
                (wal.files, wal.bytes, wal.oldest) if wal is not None else None,
                health.due,
            )
    selection = select_runs(
        list(healths.values()),
        now=now,
        trigger=trigger,
        min_interval={t: timedelta(seconds=h.min_interval_s) for t, h in healths.items()},
        in_flight=busy,
        memory=memory,
        states=states,
        due_since={t: s for t, seen in look.looks.items() if (s := seen.due_since) is not None},
        runnable=OPERATIONS.names(),
    )
    return selection, states


def lakehouse_report(
    look: LakehouseLook,
    selection: Selection,
    memory: Mapping[str, TableMemory],
    *,
    sharing: Mapping[str, Sharing] | None = None,
) -> LakehouseHealth:
    """``lakehouse_health``'s content from one look and decision: the totals, the least
    healthy tables with what the trigger does with them, the failing tables and those that
    share their location unsafely (``sharing``: :func:`.look.unsafe_sharing` of ``look``,
    when the caller has it already)."""
    sharing = unsafe_sharing(look) if sharing is None else sharing
    return summarize(
        list(look.healths.values()),
        tables=len(look.tables),
        errors=look.errors,
        selection=selection,
        failing=failing_tables(memory),
        unsafe_sharing={t: sh.warning() or "" for t, sh in sharing.items()},
    )
