"""The health sensor's memory between ticks, and how it reads what a partition shows."""

import dagster as dg

from icegate_dagster.assets.health_events import (
    UNASSESSED,
    HealthCursor,
    error_state,
    recorded_state,
    state_of,
    table_key,
)
from icegate_dagster.assets.partition_events import MAINTAINED_TABLE


def test_the_cursor_round_trips_and_an_older_cursor_is_where_to_resume() -> None:
    cursor = HealthCursor(
        resume_at="lakehouse.b",
        after=42,
        shown={table_key("lakehouse.a"): state_of(True, []), table_key("lakehouse.c"): "000000"},
        unmaterialized={table_key("lakehouse.c")},
        lakehouse="abcd1234",
        lakehouse_at=1.5,
    )
    assert HealthCursor.parse(cursor.serialize()) == cursor
    # Packed: 16 characters a shown table, whatever the length of its name.
    assert len(cursor.serialize()) < 200
    # Before issue 22 the cursor was only the table to resume at.
    assert HealthCursor.parse("lakehouse.b") == HealthCursor(resume_at="lakehouse.b")
    assert HealthCursor.parse(None) == HealthCursor()
    assert HealthCursor.parse("") == HealthCursor()


def test_a_state_is_the_verdict_and_the_due_operations_as_any_event_shows_them() -> None:
    unhealthy = state_of(False, ["optimize", "expire_snapshots"])
    assert unhealthy != state_of(True, ["optimize", "expire_snapshots"])
    assert unhealthy != state_of(False, ["optimize"])
    assert error_state("gone") != error_state("locked") != state_of(False, [])

    # A run's materialization and the sensor's observation carry the same keys.
    materialization = dg.AssetMaterialization(
        asset_key=MAINTAINED_TABLE,
        partition="lakehouse.a",
        metadata={
            "healthy": False,
            "health_score": 40.0,
            "due_operations": "optimize, expire_snapshots",
        },
    )
    observation = dg.AssetObservation(
        asset_key=MAINTAINED_TABLE,
        partition="lakehouse.a",
        metadata={"healthy": True, "health_score": 99.0, "due_operations": "none"},
    )
    assert recorded_state(materialization) == unhealthy
    assert recorded_state(observation) == state_of(True, [])
    # An unreadable table's observation names its state itself; an event without a
    # verdict (an older run's) says nothing.
    error = dg.AssetObservation(
        asset_key=MAINTAINED_TABLE,
        partition="lakehouse.a",
        metadata={"healthy": False, "state": error_state("gone")},
    )
    assert recorded_state(error) == error_state("gone")
    bare = dg.AssetMaterialization(asset_key=MAINTAINED_TABLE, partition="lakehouse.a")
    assert recorded_state(bare) is None and recorded_state(None) is None
    # A pass whose table could not be assessed (healthy false, no score) is not "unhealthy
    # with nothing due".
    unassessed = dg.AssetMaterialization(
        asset_key=MAINTAINED_TABLE, partition="lakehouse.a", metadata={"healthy": False}
    )
    assert recorded_state(unassessed) == UNASSESSED != state_of(False, [])
