"""The health sensor's records on change, on a real temporary Dagster instance and a real
trigger memory (SQLite), with hand-built looks (no table, no JVM): a memory that knows
nothing, the per-tick limit, an unreadable table, a table a run is about to record, a
pass recorded after the sensor looked."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.names import (
    ASSESSMENT_SOURCE,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    iceberg_tables,
)
from icegate_dagster.assets.partition_events import (
    check_target,
    health_metadata,
    latest_materialization,
)
from icegate_dagster.assets.partition_observations import partition_events
from icegate_dagster.maintenance.health.checks import health_score_check
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.sql_store import engine_for
from icegate_dagster.maintenance.trigger.look import LakehouseLook
from icegate_dagster.maintenance.trigger.records import (
    OperationAttempt,
    PassRecord,
    error_state,
    shown_state,
)
from icegate_dagster.maintenance.trigger.store import StoredLook, TriggerMemory
from tests.unit.health_builders import summary

A, B = "lakehouse.a", "lakehouse.b"
NOW = 1_800_000_000.0


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[TriggerMemory]:
    yield TriggerMemory(engine_for(f"sqlite:///{tmp_path / 'store.db'}"))


@pytest.fixture
def instance_ab(instance: dg.DagsterInstance) -> dg.DagsterInstance:
    instance.add_dynamic_partitions(iceberg_tables.name, [A, B])
    return instance


def _look(seen: dict[str, HealthSummary | str], at: float = NOW) -> LakehouseLook:
    looks = {
        table: StoredLook(
            table,
            "meta.json" if isinstance(health, HealthSummary) else None,
            None,
            at,
            None,
            health if isinstance(health, HealthSummary) else None,
            health if isinstance(health, str) else None,
        )
        for table, health in seen.items()
    }
    return LakehouseLook(tables=sorted(seen), looks=looks, now=at)


def _tick(
    instance: dg.DagsterInstance, memory: TriggerMemory, look: LakehouseLook, **kwargs: Any
) -> list[Any]:
    """One comparison, its events stored as the daemon stores them and remembered."""
    page = partition_events(instance, look, memory.tables_memory(), **kwargs)
    for event in page.events:
        instance.report_runless_asset_event(event)
    memory.show(page.shown, look.now)
    return page.events


def _kinds(events: Sequence[Any]) -> dict[str, str]:
    return {e.partition: type(e).__name__ for e in events}


def _maintained(
    instance: dg.DagsterInstance,
    memory: TriggerMemory,
    table: str,
    health: HealthSummary,
    at: float,
) -> None:
    """A pass's record, as a run stores it: its materialization with the health keys, and
    the state it shows in the trigger's memory."""
    verdict = health_score_check(health, 50.0)
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=MAINTAINED_TABLE,
            partition=table,
            metadata={**health_metadata(health, verdict), "files_after": 1},
        )
    )
    memory.record_pass(
        PassRecord(
            table,
            "run-1",
            (OperationAttempt("optimize", "completed"),),
            shown_state=shown_state(verdict.passed, health.due_operations, failing=()),
        ),
        now=at,
        backoff=timedelta(minutes=1),
        backoff_max=timedelta(hours=1),
    )


def test_a_table_never_shown_is_assessed_and_one_a_run_recorded_is_left_alone(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    _maintained(instance_ab, memory, A, summary(A), NOW - 10)

    events = _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}))

    # A shows what its pass recorded: nothing to add. B was never recorded: assessed.
    assert _kinds(events) == {B: "AssetMaterialization"}
    assert events[0].tags[SOURCE_TAG] == ASSESSMENT_SOURCE
    assert _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 30)) == []
    # A later change of B's verdict is an observation (the page shows the newer first).
    due = summary(B, 20.0, ("optimize",))
    [change] = _tick(instance_ab, memory, _look({A: summary(A), B: due}, NOW + 60))
    assert isinstance(change, dg.AssetObservation) and change.metadata["healthy"].value is False


def test_a_memory_that_knows_nothing_asks_the_instance_once_what_was_ever_materialized(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    """A lost or new store: a partition that was materialized gets an observation, one that
    never was an assessment, and both are remembered."""
    instance_ab.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=MAINTAINED_TABLE, partition=A, metadata={"x": 1})
    )
    events = _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}))
    assert _kinds(events) == {A: "AssetObservation", B: "AssetMaterialization"}
    assert _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 30)) == []


def test_at_most_the_limit_a_tick_the_rest_at_the_next(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    look = _look({A: summary(A), B: summary(B)})
    page = partition_events(instance_ab, look, memory.tables_memory(), limit=1)
    assert len(page.events) == 1 and page.waiting == 1
    memory.show(page.shown, NOW)
    later = _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 30))
    assert len(later) == 1 and later[0].partition != page.events[0].partition


def test_an_unreadable_table_is_observed_then_assessed_once_it_reads(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    error = "cannot load lakehouse.a: connection to 10.0.0.7:8181 refused after 3017 ms"
    events = _tick(instance_ab, memory, _look({A: error, B: summary(B)}))
    assert _kinds(events) == {A: "AssetObservation", B: "AssetMaterialization"}
    observed = next(e for e in events if e.partition == A)
    assert observed.metadata["healthy"].value is False
    assert "refused" in observed.metadata["why"].value
    # The same failure worded with other numbers is the same state: nothing new.
    reworded = error.replace("3017", "2990").replace("10.0.0.7", "10.0.0.8")
    assert error_state(reworded) == error_state(error)
    assert _tick(instance_ab, memory, _look({A: reworded, B: summary(B)}, NOW + 30)) == []
    # Readable again and never materialized: now it is assessed.
    readable = _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 60))
    assert _kinds(readable) == {A: "AssetMaterialization"}
    status = instance_ab.get_status_by_partition(MAINTAINED_TABLE, [A], iceberg_tables)
    assert status is not None and status[A] is not None


def test_a_table_a_run_is_about_to_record_gets_nothing_until_then(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    due = summary(A, 40.0, ("optimize",))
    events = _tick(instance_ab, memory, _look({A: due, B: summary(B)}), busy=[A])
    assert _kinds(events) == {B: "AssetMaterialization"}
    # Its run recorded it: the sensor has nothing to add.
    _maintained(instance_ab, memory, A, summary(A), NOW + 10)
    assert _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 20)) == []


def test_a_pass_recorded_after_the_sensor_looked_is_compared_at_the_next_look(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    due = summary(A, 40.0, ("optimize",))
    _maintained(instance_ab, memory, A, due, NOW - 10)
    _tick(instance_ab, memory, _look({A: due, B: summary(B)}))
    _maintained(instance_ab, memory, A, summary(A), NOW + 5)  # a pass ends while it looks

    # The look (taken before the pass) is stale: no observation over the pass's record.
    assert _tick(instance_ab, memory, _look({A: due, B: summary(B)}, NOW + 1)) == []
    # The next look sees the table as the pass left it: nothing to add either.
    assert _tick(instance_ab, memory, _look({A: summary(A), B: summary(B)}, NOW + 30)) == []


def test_check_evaluations_name_the_materialization_they_judge(
    instance_ab: dg.DagsterInstance,
) -> None:
    """The type of AssetCheckEvaluation's ``target_materialization_data`` is read from the
    public class (Dagster does not export it): if a Dagster upgrade moves it, this fails
    rather than every check's Partitions tab silently showing "Missing"."""
    instance_ab.report_runless_asset_event(
        dg.AssetMaterialization(asset_key=MAINTAINED_TABLE, partition=A, metadata={"x": 1})
    )
    record = latest_materialization(instance_ab, A)
    target = check_target(record)
    assert record is not None and target is not None
    assert target.storage_id == record.storage_id


def test_check_verdicts_that_waited_are_recorded_at_the_next_tick_without_a_new_look(
    instance_ab: dg.DagsterInstance, memory: TriggerMemory
) -> None:
    """A tick that ran out of time recorded some tables' check evaluations and not the
    others': their pages' health keys stand, and the next tick, with no new look at them,
    brings the evaluations alone."""
    look = _look({A: summary(A), B: summary(B)})
    _tick(instance_ab, memory, look)  # assessed; their checks wait for the next tick
    page = partition_events(instance_ab, look, memory.tables_memory())
    assert sorted(page.checks) == [A, B] and page.events == []
    memory.show(page.shown_after([A]), NOW + 30)  # B's evaluations not stored in time

    later = partition_events(instance_ab, look, memory.tables_memory())
    assert list(later.checks) == [B] and later.events == []
    memory.show(later.shown_after([B]), NOW + 60)
    assert not partition_events(instance_ab, look, memory.tables_memory()).checks
