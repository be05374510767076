"""The health sensor's records on change, on a real temporary Dagster instance with
hand-built table health (no table, no JVM): a lost cursor, the deadline, an unreadable
table, a table a run is about to record, a pass recorded after the sensor looked, removed
partitions, and a cursor that does not read."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.health_events import (
    HealthCursor,
    error_state,
    table_health_events,
    table_key,
)
from icegate_dagster.assets.partition_events import (
    ASSESSMENT_SOURCE,
    MAINTAINED_TABLE,
    SOURCE_TAG,
    check_target,
    health_metadata,
    latest_materialization,
)
from icegate_dagster.maintenance.health.checks import health_score_check
from icegate_dagster.maintenance.health.score import TableHealth
from icegate_dagster.partitions import iceberg_tables
from tests.unit.health_builders import health

A, B = "lakehouse.a", "lakehouse.b"
MIN = {A: 50.0, B: 50.0}


@pytest.fixture
def instance_ab(instance: dg.DagsterInstance) -> dg.DagsterInstance:
    instance.add_dynamic_partitions(iceberg_tables.name, [A, B])
    return instance


def _tick(
    instance: dg.DagsterInstance,
    cursor: HealthCursor,
    healths: dict[str, TableHealth],
    errors: dict[str, str] | None = None,
    **kwargs: Any,
) -> tuple[list[Any], HealthCursor]:
    """One comparison, its events stored as the daemon stores them."""
    tables = list(instance.get_dynamic_partitions(iceberg_tables.name))
    events, after = table_health_events(
        instance, cursor, tables, healths, errors or {}, MIN, **kwargs
    )
    for event in events:
        instance.report_runless_asset_event(event)
    return events, after


def _kinds(events: Sequence[Any]) -> dict[str, str]:
    return {e.partition: type(e).__name__ for e in events}


def _maintained(instance: dg.DagsterInstance, table: str, table_health: TableHealth) -> None:
    """A pass's record, as a run stores it: its materialization with the health keys."""
    verdict = health_score_check(table_health, 50.0)
    instance.report_runless_asset_event(
        dg.AssetMaterialization(
            asset_key=MAINTAINED_TABLE,
            partition=table,
            metadata={**health_metadata(table_health, verdict), "files_after": 1},
        )
    )


def test_a_lost_cursor_compares_each_table_once_with_what_its_page_shows(
    instance_ab: dg.DagsterInstance,
) -> None:
    healthy = health(A)
    _maintained(instance_ab, A, healthy)

    events, cursor = _tick(instance_ab, HealthCursor(), {A: healthy, B: health(B)})

    # A shows what its pass recorded: nothing to add. B was never recorded: assessed.
    assert _kinds(events) == {B: "AssetMaterialization"}
    assert events[0].tags[SOURCE_TAG] == ASSESSMENT_SOURCE
    assert set(cursor.shown) == {table_key(A), table_key(B)}
    again, _ = _tick(instance_ab, cursor, {A: healthy, B: health(B)})
    assert again == []


def test_past_the_deadline_tables_not_shown_yet_wait_for_the_next_evaluation(
    instance_ab: dg.DagsterInstance,
) -> None:
    healths = {A: health(A), B: health(B)}
    late, cursor = _tick(instance_ab, HealthCursor(), healths, deadline=time.monotonic() - 1)
    assert late == [] and cursor.shown == {}
    events, cursor = _tick(instance_ab, cursor, healths)
    assert _kinds(events) == {A: "AssetMaterialization", B: "AssetMaterialization"}


def test_an_unreadable_table_is_observed_then_assessed_once_it_reads(
    instance_ab: dg.DagsterInstance,
) -> None:
    error = "cannot load lakehouse.a: connection to 10.0.0.7:8181 refused after 3017 ms"
    events, cursor = _tick(instance_ab, HealthCursor(), {B: health(B)}, {A: error})
    assert _kinds(events) == {A: "AssetObservation", B: "AssetMaterialization"}
    assert events[0].metadata["healthy"].value is False
    assert "refused" in events[0].metadata["why"].value
    # The same failure worded with other numbers is the same state: nothing new.
    reworded = error.replace("3017", "2990").replace("10.0.0.7", "10.0.0.8")
    assert error_state(reworded) == error_state(error)
    same, cursor = _tick(instance_ab, cursor, {B: health(B)}, {A: reworded})
    assert same == []
    # Readable again and never materialized: now it is assessed.
    readable, cursor = _tick(instance_ab, cursor, {A: health(A), B: health(B)})
    assert _kinds(readable) == {A: "AssetMaterialization"}
    status = instance_ab.get_status_by_partition(MAINTAINED_TABLE, [A], iceberg_tables)
    assert status is not None and status[A] is not None


def test_a_table_a_run_is_about_to_record_gets_nothing_until_then(
    instance_ab: dg.DagsterInstance,
) -> None:
    due = health(A, 40.0, ("optimize",))
    events, cursor = _tick(instance_ab, HealthCursor(), {A: due, B: health(B)}, busy=[A])
    assert _kinds(events) == {B: "AssetMaterialization"}
    assert table_key(A) not in cursor.shown
    # Its run recorded it: the sensor has nothing to add.
    after_run = health(A)
    _maintained(instance_ab, A, after_run)
    events, cursor = _tick(instance_ab, cursor, {A: after_run, B: health(B)})
    assert events == []


def test_a_pass_recorded_after_the_sensor_looked_is_compared_at_the_next_evaluation(
    instance_ab: dg.DagsterInstance,
) -> None:
    due = health(A, 40.0, ("optimize",))
    _maintained(instance_ab, A, due)
    _, cursor = _tick(instance_ab, HealthCursor(), {A: due, B: health(B)})
    looked = time.time()
    time.sleep(0.01)
    _maintained(instance_ab, A, health(A))  # a pass ends while the sensor assesses

    # The look (taken before the pass) is stale: no observation over the pass's record.
    events, cursor = _tick(instance_ab, cursor, {A: due, B: health(B)}, assessed_at=looked)
    assert events == []
    # The next look sees the table as the pass left it: nothing to add either.
    events, cursor = _tick(instance_ab, cursor, {A: health(A), B: health(B)})
    assert events == []


def test_removed_partitions_leave_the_cursor_and_a_garbled_cursor_starts_afresh(
    instance_ab: dg.DagsterInstance,
) -> None:
    _, cursor = _tick(instance_ab, HealthCursor(), {A: health(A), B: health(B)})
    instance_ab.delete_dynamic_partition(iceberg_tables.name, B)
    _, cursor = _tick(instance_ab, cursor, {A: health(A)})
    assert set(cursor.shown) == {table_key(A)}
    assert HealthCursor.parse(cursor.serialize()) == cursor
    for garbled in ('{"shown": "abc", "after": 1}', '{"after": "x"}', "[1, 2]"):
        assert HealthCursor.parse(garbled).shown == {}
        assert HealthCursor.parse(garbled).after is None


def test_check_evaluations_name_the_materialization_they_judge(
    instance_ab: dg.DagsterInstance,
) -> None:
    """The type of AssetCheckEvaluation's ``target_materialization_data`` is read from the
    public class (Dagster does not export it): if a Dagster upgrade moves it, this fails
    rather than every check's Partitions tab silently showing "Missing"."""
    _maintained(instance_ab, A, health(A))
    record = latest_materialization(instance_ab, A)
    target = check_target(record)
    assert record is not None and target is not None
    assert target.storage_id == record.storage_id
