"""The health sensor's cursor (a position, whatever the lakehouse's size) and the shown
states a partition page is compared with."""

from icegate_dagster.maintenance.trigger.records import error_state, shown_state
from icegate_dagster.sensors.health_sensor import HealthCursor


def test_the_cursor_round_trips_and_stays_the_same_size_for_any_lakehouse() -> None:
    cursor = HealthCursor(resume_at="lakehouse.b", lakehouse="abcd1234ef00", lakehouse_at=1.5)
    assert HealthCursor.parse(cursor.serialize()) == cursor
    # Dagster stores the cursor with every tick: it holds a position and a digest, never a
    # table's state (those are in the trigger's memory).
    longest = HealthCursor(
        resume_at="n" * 255 + "." + "t" * 255, lakehouse="f" * 12, lakehouse_at=4_102_444_800.125
    )
    assert len(longest.serialize()) < 600
    assert HealthCursor.parse(None) == HealthCursor()
    assert HealthCursor.parse("") == HealthCursor()
    # Older cursors (a table name, or the per-table form before issue 27) start afresh
    # without failing the tick.
    assert HealthCursor.parse("lakehouse.b") == HealthCursor()
    assert HealthCursor.parse('{"after": 3, "shown": "abc"}') == HealthCursor()
    assert HealthCursor.parse('{"lakehouse_at": "x"}') == HealthCursor()


def test_a_state_is_the_verdict_and_the_due_operations_as_any_record_shows_them() -> None:
    unhealthy = shown_state(False, ["optimize", "expire_snapshots"])
    assert unhealthy == shown_state(False, ("optimize", "expire_snapshots"))
    assert unhealthy != shown_state(True, ["optimize", "expire_snapshots"])
    assert unhealthy != shown_state(False, ["optimize"])
    assert error_state("gone") != error_state("locked") != shown_state(False, [])
    # An error that only words itself differently (a port, an id) is one state.
    assert error_state("refused on port 8181 (req 17)") == error_state(
        "refused on port 8182 (req 93)"
    )
