"""The health sensor's cursor (a position, whatever the lakehouse's size) and the shown
states a partition page is compared with."""

from icegate_dagster.maintenance.trigger.records import (
    checks_part,
    error_state,
    page_part,
    shown_state,
    unchecked,
)
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


def test_the_checks_verdicts_are_a_part_of_their_own() -> None:
    """A change of the metadata checks' verdicts alone changes the checks' part (the sensor
    records evaluations, no observation); a change of due operations alone changes the
    page's part (an observation, no evaluation)."""
    passing = shown_state(True, ["optimize"], failing=())
    failing = shown_state(True, ["optimize"], failing=("snapshot_count",))
    assert page_part(passing) == page_part(failing)
    assert checks_part(passing) != checks_part(failing)
    more_due = shown_state(True, ["optimize", "expire_snapshots"], failing=())
    assert page_part(more_due) != page_part(passing)
    assert checks_part(more_due) == checks_part(passing)
    # Not recorded yet, and a state remembered before checks were recorded (6 characters).
    assert checks_part(unchecked(passing)) not in (None, checks_part(passing))
    assert page_part(unchecked(passing)) == page_part(passing)
    assert checks_part(passing[:6]) is None and page_part(passing[:6]) == page_part(passing)
    assert error_state("gone", ("healthy",)) != error_state("gone", None)
