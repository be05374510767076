"""The trigger's memory on a real SQLite store: what a pass settles, decision numbers, passes
kept in one batch, and what a steady tick reads."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from icegate_dagster.maintenance.sql_store import engine_for
from icegate_dagster.maintenance.trigger.records import OperationAttempt, PassRecord
from icegate_dagster.maintenance.trigger.store import TriggerMemory

NOW = 1_800_000_000.0
BACKOFF = {"backoff": timedelta(minutes=1), "backoff_max": timedelta(hours=1)}


@pytest.fixture
def memory(tmp_path: Path) -> TriggerMemory:
    return TriggerMemory(engine_for(f"sqlite:///{tmp_path / 'store.db'}"))


def _pass(*attempts: OperationAttempt, still_due: dict[str, str]) -> PassRecord:
    return PassRecord(
        "ns.t",
        "run",
        attempts,
        requested=tuple(a.operation for a in attempts),
        still_due=still_due,
        settled_state="state-after",
    )


def test_a_state_settles_only_when_the_pass_did_all_it_could_about_it(
    memory: TriggerMemory,
) -> None:
    due = {"optimize": "13 small files"}
    # A WAL ingest alone leaves optimize due: it settles nothing.
    memory.record_pass(
        _pass(OperationAttempt("wal_compaction", "completed"), still_due=due), now=NOW, **BACKOFF
    )
    assert memory.tables_memory()["ns.t"].settled_state is None
    # An optimize that failed settles nothing either: it is tried again after its back-off.
    memory.record_pass(
        _pass(OperationAttempt("optimize", "failed", error="x"), still_due=due), now=NOW, **BACKOFF
    )
    assert memory.tables_memory()["ns.t"].settled_state is None
    # Nor one another maintainer kept from the table.
    held = OperationAttempt("optimize", "skipped", held_elsewhere=True)
    memory.record_pass(_pass(held, still_due=due), now=NOW, **BACKOFF)
    assert memory.tables_memory()["ns.t"].settled_state is None
    # An optimize that ran and left it due: that state is settled.
    memory.record_pass(
        _pass(OperationAttempt("optimize", "completed"), still_due=due), now=NOW, **BACKOFF
    )
    assert memory.tables_memory()["ns.t"].settled_state == "state-after"


def test_decisions_are_numbered_up_and_passes_are_kept_in_one_batch(
    memory: TriggerMemory,
) -> None:
    assert memory.record_requests([("a.x", ["optimize"]), ("a.y", ["optimize"])], "h", NOW) == {
        "a.x": 1,
        "a.y": 1,
    }
    assert memory.record_requests([("a.x", ["optimize"])], "w", NOW + 1) == {"a.x": 2}
    kept = memory.record_passes(
        [
            PassRecord("a.x", "r", (OperationAttempt("optimize", "completed"),)),
            PassRecord("a.y", "r", (OperationAttempt("optimize", "failed", error="e"),)),
        ],
        now=NOW + 5,
        **BACKOFF,
    )
    assert [m.outcome for m in kept["a.x"]] == ["completed"]
    assert [m.failures for m in kept["a.y"]] == [1]
    remembered = memory.tables_memory()
    assert remembered["a.x"].recorded_at == NOW + 5 and remembered["a.x"].decisions == 2
    assert remembered["a.x"].unanswered() == ()


def test_a_steady_tick_reads_the_operations_of_due_and_failing_tables_only(
    memory: TriggerMemory,
) -> None:
    for table, status in (("a.ok", "completed"), ("a.bad", "failed"), ("a.due", "completed")):
        memory.record_requests([(table, ["optimize"])], "h", NOW)
        memory.record_pass(
            PassRecord(table, "r", (OperationAttempt("optimize", status, error="e"),)),
            now=NOW + 1,
            **BACKOFF,
        )
    read = memory.tables_memory(operations_of=["a.due"])
    assert set(read["a.due"].operations) == {"optimize"}
    assert set(read["a.bad"].operations) == {"optimize"}  # failing: always read
    assert read["a.ok"].operations == {} and not read["a.ok"].operations_read
    # What was not read is not mistaken for a request nobody answered.
    assert read["a.ok"].unanswered() == ()


def test_one_sensors_request_never_hides_anothers_unanswered_one(memory: TriggerMemory) -> None:
    """The health sensor asks for optimize; the WAL sensor for the ingest while that run
    waits; only the ingest is answered: optimize is still unanswered."""
    memory.record_requests(
        [("ns.t", ["optimize"])], "table_health_sensor", NOW, run_keys={"ns.t": "health:k"}
    )
    memory.record_requests(
        [("ns.t", ["wal_compaction"])], "wal_size_sensor", NOW + 1, run_keys={"ns.t": "wal:k"}
    )
    memory.record_pass(
        PassRecord(
            "ns.t",
            "wal-run",
            (OperationAttempt("wal_compaction", "completed"),),
            requested=("wal_compaction",),
        ),
        now=NOW + 5,
        **BACKOFF,
    )
    [(request, unanswered)] = memory.tables_memory()["ns.t"].unanswered()
    assert (request.by, request.run_key, unanswered) == (
        "table_health_sensor",
        "health:k",
        ("optimize",),
    )


def test_a_request_that_never_reached_dagster_is_forgotten_unless_a_newer_one_took_its_slot(
    memory: TriggerMemory,
) -> None:
    memory.record_requests([("ns.t", ["optimize"])], "h", NOW, run_keys={"ns.t": "h:1"})
    memory.record_requests([("ns.u", ["optimize"])], "h", NOW, run_keys={"ns.u": "h:2"})
    memory.record_requests([("ns.u", ["optimize"])], "h", NOW + 9, run_keys={"ns.u": "h:3"})
    memory.drop_requests([("ns.t", "h", "h:1"), ("ns.u", "h", "h:2")])
    remembered = memory.tables_memory()
    assert remembered["ns.t"].requests == {} and remembered["ns.t"].requested_at is None
    assert remembered["ns.u"].requests["h"].run_key == "h:3"
    # A table discovery confirms gone leaves no request behind.
    memory.forget(["ns.u"])
    assert "ns.u" not in memory.tables_memory()
