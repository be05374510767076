"""The trigger's rules on hand-built table health and memory (no JVM, no Dagster, no store):
which due tables go now and in which order, within which budget, why the rest wait, how an
attempt's outcome backs an operation off, and the lakehouse's totals."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from icegate_dagster.config import TriggerSettings
from icegate_dagster.maintenance.health.checks import health_score_check
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.trigger.records import (
    OpenRequest,
    OperationAttempt,
    OperationMemory,
    TableMemory,
    backoff_wait,
    lost,
    remember,
)
from icegate_dagster.maintenance.trigger.selection import (
    Selection,
    rotation,
    select_runs,
    summarize,
)
from tests.unit.health_builders import MB, health, summary

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC).timestamp()
TRIGGER = TriggerSettings()
BASE, CAP = TRIGGER.backoff, TRIGGER.backoff_max


def select(candidates: list[HealthSummary], **kwargs: Any) -> Selection:
    kwargs.setdefault("trigger", TRIGGER)
    kwargs.setdefault("min_interval", timedelta(0))
    kwargs.setdefault("now", NOW)
    return select_runs(candidates, **kwargs)


def served(table: str, at: float, **ops: OperationMemory) -> TableMemory:
    """A table the trigger last served at ``at`` (a pass recorded it then)."""
    return TableMemory(table, recorded_at=at, operations=ops)


def failed(table: str, operation: str, times: int, last: float) -> OperationMemory:
    """``operation`` failed ``times`` in a row, the last at ``last``."""
    memory = None
    for i in range(times):
        memory = remember(
            memory,
            OperationAttempt(operation, "failed", error=f"boom {i}"),
            table=table,
            run_id=f"r{i}",
            requested=True,
            still_due=None,
            now=last,
            backoff=BASE,
            backoff_max=CAP,
        )
    assert memory is not None
    return memory


def test_only_due_tables_are_requested_neediest_first_among_the_never_served() -> None:
    tables = [
        summary("lakehouse.idle"),
        summary("lakehouse.some", 80, ("optimize",), 5 * MB),
        summary("lakehouse.worst", 30, ("optimize", "expire_snapshots"), 1 * MB),
        # The same need as ``some``: more work bytes first, then the name.
        summary("lakehouse.bigger", 80, ("rewrite_manifests",), 9 * MB),
        summary("lakehouse.a_same", 80, ("optimize",), 5 * MB),
    ]
    selection = select(tables)

    assert [(r.table, r.operations) for r in selection.requested] == [
        ("lakehouse.worst", ("optimize", "expire_snapshots")),
        ("lakehouse.bigger", ("rewrite_manifests",)),
        ("lakehouse.a_same", ("optimize",)),
        ("lakehouse.some", ("optimize",)),
    ]
    assert selection.requested[0].need == 70.0
    assert selection.requested[0].reasons == (
        "optimize: optimize threshold crossed",
        "expire_snapshots: expire_snapshots threshold crossed",
    )
    assert selection.healthy == ("lakehouse.idle",)
    assert selection.skipped == () and selection.backlog.count == 0
    assert select([summary("a.x"), summary("a.y")]).summary() == "2 tables healthy, none due"


def test_the_longest_waiting_table_goes_first_whatever_its_need() -> None:
    """Fairness: a table waits since it fell due, or since it was last served if later. The
    one waiting longest goes first, whatever its need; need orders only equals."""
    tables = [
        summary("a.needy", 10, ("optimize",)),
        summary("a.patient", 90, ("optimize",)),
        summary("a.new", 95, ("optimize",)),
    ]
    memory = {
        "a.needy": served("a.needy", NOW - 600),
        "a.patient": served("a.patient", NOW - 86_400),
    }
    due_since = {"a.needy": NOW - 7 * 86_400, "a.patient": NOW - 7 * 86_400, "a.new": NOW - 3600}
    selection = select(
        tables, memory=memory, due_since=due_since, trigger=TriggerSettings(max_tables=2)
    )
    assert [r.table for r in selection.requested] == ["a.patient", "a.new"]
    assert selection.backlog.tables == ("a.needy",)
    # A request counts as being served as much as a pass.
    asked = {
        "a.patient": TableMemory(
            "a.patient", requests={"h": OpenRequest("h", NOW - 60, ("optimize",))}
        )
    }
    again = select(
        tables,
        memory={**memory, **asked},
        due_since=due_since,
        trigger=TriggerSettings(max_tables=1),
    )
    assert [r.table for r in again.requested] == ["a.new"]


def test_a_table_that_keeps_failing_is_not_starved_by_tables_that_fall_due_after_it() -> None:
    """Served (and failed) an hour ago, it has waited longer than every table that fell due
    since: those go after it, however many there are."""
    failing = summary("a.failing", 60, ("optimize",), 10_000)
    fresh = [summary(f"a.new{i}", 30, ("optimize",), 4_000) for i in range(20)]
    memory = {"a.failing": served("a.failing", NOW - 3600)}
    due_since = {"a.failing": NOW - 30 * 86_400, **{t.table: NOW - 1800 for t in fresh}}
    selection = select(
        [*fresh, failing],
        memory=memory,
        due_since=due_since,
        trigger=TriggerSettings(max_bytes=20_000),
    )
    assert selection.requested[0].table == "a.failing"


def test_the_table_budget_takes_tables_in_turn_and_reports_the_rest_as_backlog() -> None:
    tables = [summary(f"a.t{i}", 90 - i, ("optimize",), (i + 1) * MB) for i in range(5)]
    selection = select(tables, trigger=TriggerSettings(max_tables=2))

    assert [r.table for r in selection.requested] == ["a.t4", "a.t3"]
    assert selection.backlog.tables == ("a.t2", "a.t1", "a.t0")
    assert selection.backlog.bytes == (3 + 2 + 1) * MB
    [skip] = [s for s in selection.skipped if s.table == "a.t2"]
    assert skip.kind == "budget" and "maintain.trigger.max_tables 2 reached" in skip.reason
    assert "3 due tables wait, over this evaluation's budget (backlog) (3 tables, " in (
        selection.summary()
    )


def test_the_byte_budget_always_takes_the_first_and_stops_at_the_first_that_does_not_fit() -> None:
    trigger = TriggerSettings(max_bytes=100 * MB)
    tables = [
        summary("a.huge", 10, ("optimize",), 500 * MB),  # first in turn, over the budget alone
        summary("a.mid", 20, ("optimize",), 60 * MB),
        summary("a.small", 30, ("optimize",), 1 * MB),
    ]
    selection = select(tables, trigger=trigger)
    assert [r.table for r in selection.requested] == ["a.huge"]
    assert selection.backlog.tables == ("a.mid", "a.small")
    assert "maintain.trigger.max_bytes 104857600 reached" in selection.skipped[0].reason

    # Once served, the big table goes behind the others: it cannot hold the budget forever.
    memory = {"a.huge": served("a.huge", NOW - 60)}
    after = select(tables, trigger=trigger, memory=memory)
    assert [r.table for r in after.requested] == ["a.mid", "a.small"]
    assert after.backlog.tables == ("a.huge",)


def test_a_table_with_a_run_in_flight_or_a_lease_held_elsewhere_waits_naming_it() -> None:
    tables = [summary("a.busy", 10, ("optimize",)), summary("a.free", 50, ("optimize",))]
    selection = select(tables, in_flight={"a.busy": "run 1a2b3c is started"})

    assert [r.table for r in selection.requested] == ["a.free"]
    [skip] = selection.skipped
    assert (skip.table, skip.kind, skip.reason) == ("a.busy", "in_flight", "run 1a2b3c is started")
    assert "a.busy (run 1a2b3c is started)" in selection.summary()


def test_no_table_more_often_than_its_min_interval_whoever_maintained_it() -> None:
    tables = [summary("a.recent", 10, ("optimize",)), summary("a.older", 20, ("optimize",))]
    memory = {
        "a.recent": served("a.recent", NOW - 90),
        "a.older": served("a.older", NOW - 120),  # exactly the interval: due again
    }
    selection = select(tables, memory=memory, min_interval=timedelta(minutes=2))
    assert [r.table for r in selection.requested] == ["a.older"]
    [skip] = selection.skipped
    assert skip.kind == "min_interval"
    assert skip.reason == "maintained 2026-11-21 11:58:30 UTC; next after 2026-11-21 12:00:30 UTC"

    # Per-table intervals: a table with a longer one waits, one with none never does.
    per_table = select(tables, memory=memory, min_interval={"a.older": timedelta(hours=1)})
    assert [r.table for r in per_table.requested] == ["a.recent"]
    assert [s.table for s in per_table.skipped_as("min_interval")] == ["a.older"]


@pytest.mark.parametrize(
    ("failures", "wait"),
    [
        (0, None),
        (1, None),  # one failure is retried at once
        (2, timedelta(minutes=1)),
        (3, timedelta(minutes=2)),
        (4, timedelta(minutes=4)),
        (7, timedelta(minutes=32)),
        (8, timedelta(hours=1)),  # 64 minutes, capped
        (500, timedelta(hours=1)),  # no overflow
    ],
)
def test_backoff_doubles_from_the_second_failure_up_to_the_cap(
    failures: int, wait: timedelta | None
) -> None:
    assert backoff_wait(failures, BASE, CAP) == wait
    if failures:
        memory = failed("a.t", "optimize", failures, NOW)
        assert memory.failures == failures and memory.attempts == failures
        expected = None if wait is None else NOW + wait.total_seconds()
        assert memory.not_before == expected


def test_an_operation_that_keeps_failing_backs_off_alone_and_says_why() -> None:
    """Only the failing operation waits: the table's other due work goes on."""
    flaky = failed("a.flaky", "optimize", 3, NOW - 100)  # waits 2 minutes after it
    tables = [
        summary("a.flaky", 10, ("optimize", "expire_snapshots")),
        summary("a.stuck", 20, ("optimize",)),
    ]
    memory = {
        "a.flaky": TableMemory("a.flaky", operations={"optimize": flaky}),
        "a.stuck": TableMemory(
            "a.stuck", operations={"optimize": failed("a.stuck", "optimize", 2, NOW - 10)}
        ),
    }
    selection = select(tables, memory=memory)
    assert [(r.table, r.operations) for r in selection.requested] == [
        ("a.flaky", ("expire_snapshots",))
    ]
    [skip] = selection.skipped
    assert skip.kind == "backoff" and skip.table == "a.stuck"
    assert skip.reason == (
        "optimize failed 2 times in a row; next attempt after 2026-11-21 12:00:50 UTC "
        "(last: boom 1)"
    )
    assert "backing off after failed or ineffective runs: a.stuck" in selection.summary()
    # Once the wait is over, it is tried again.
    later = select(tables, memory=memory, now=NOW + 51)
    assert {r.table: r.operations for r in later.requested} == {
        "a.flaky": ("optimize", "expire_snapshots"),
        "a.stuck": ("optimize",),
    }


def test_an_attempts_outcome_counts_failures_and_ineffective_runs_apart() -> None:
    kwargs: dict[str, Any] = {
        "table": "a.t",
        "run_id": "r",
        "now": NOW,
        "backoff": BASE,
        "backoff_max": CAP,
    }
    opt = OperationAttempt("optimize", "completed")
    # Asked for because due, completed, still due right after: ineffective.
    first = remember(None, opt, requested=True, still_due="13 small files", **kwargs)
    second = remember(first, opt, requested=True, still_due="13 small files", **kwargs)
    assert (first.outcome, first.ineffective, first.not_before) == ("ineffective", 1, None)
    assert (second.ineffective, second.not_before) == (2, NOW + 60)
    assert second.detail == "still due after it: 13 small files"
    assert second.describe().startswith("optimize still due after 2 runs in a row")
    # A pass nobody asked for (the schedule) that leaves it due says nothing of the streak;
    # one that leaves it no longer due resets it.
    schedule = remember(second, opt, requested=False, still_due="13 small files", **kwargs)
    assert schedule.ineffective == 2 and schedule.not_before is None
    fixed = remember(second, opt, requested=True, still_due=None, **kwargs)
    assert (fixed.outcome, fixed.ineffective, fixed.failures) == ("completed", 0, 0)
    # Held elsewhere: nothing tried, nothing counted.
    busy = OperationAttempt("optimize", "skipped", held_elsewhere=True, error="held by x")
    held = remember(
        failed("a.t", "optimize", 3, NOW), busy, requested=True, still_due=None, **kwargs
    )
    assert (held.outcome, held.failures, held.not_before) == ("held", 3, None)
    # A request its run never answered counts as a failure.
    gone = lost(
        held,
        table="a.t",
        operation="optimize",
        why="worker died",
        now=NOW,
        backoff=BASE,
        backoff_max=CAP,
    )
    assert (gone.outcome, gone.failures, gone.detail) == ("lost", 4, "worker died")
    assert gone.not_before == NOW + 240
    # A run that dies does not cut short the back-off of an operation its table cannot fix:
    # the ineffective streak goes on (two ineffective runs and a lost one wait as three).
    died = lost(
        second,
        table="a.t",
        operation="optimize",
        why="OOM",
        now=NOW,
        **{k: kwargs[k] for k in ("backoff", "backoff_max")},
    )
    assert (died.failures, died.ineffective) == (1, 2)
    assert died.not_before == NOW + 120


def test_a_request_is_unanswered_until_a_pass_records_each_of_its_operations() -> None:
    attempt = OperationMemory("a.t", "optimize", NOW + 5, "completed")
    request = OpenRequest("h", NOW, ("optimize", "expire_snapshots"), "health:a.t:1-x")
    asked = TableMemory("a.t", requests={"h": request}, operations={"optimize": attempt})
    assert asked.unanswered() == ((request, ("expire_snapshots",)),)
    # An outcome recorded at the very instant of the request is an older one.
    same = OpenRequest("h", NOW + 5, ("optimize",))
    same_instant = TableMemory("a.t", requests={"h": same}, operations={"optimize": attempt})
    assert same_instant.unanswered() == ((same, ("optimize",)),)
    assert TableMemory("a.t").unanswered() == ()


def test_a_table_a_pass_left_in_its_very_state_waits_for_a_change() -> None:
    memory = {"a.same": TableMemory("a.same", recorded_at=NOW - 999, settled_state="s1")}
    selection = select(
        [summary("a.same", 40, ("optimize",))], memory=memory, states={"a.same": "s1"}
    )
    assert selection.requested == ()
    [skip] = selection.skipped
    assert skip.kind == "unchanged" and "left it in this very state" in skip.reason
    changed = select([summary("a.same", 40, ("optimize",))], memory=memory, states={"a.same": "s2"})
    assert [r.table for r in changed.requested] == ["a.same"]


def test_due_operations_without_a_step_are_dropped_and_a_table_left_with_none_reported() -> None:
    tables = [
        summary("a.mixed", 40, ("optimize", "rewrite_position_delete_files")),
        summary("a.only_new", 30, ("rewrite_position_delete_files",)),
    ]
    selection = select(tables, runnable=("optimize", "expire_snapshots"))

    assert [(r.table, r.operations) for r in selection.requested] == [("a.mixed", ("optimize",))]
    [skip] = selection.skipped
    assert (skip.table, skip.kind) == ("a.only_new", "not_runnable")
    assert "rewrite_position_delete_files" in skip.reason


def test_every_skipped_table_has_its_reason_and_the_summary_names_each_kind() -> None:
    tables = [
        summary("a.flight", 10, ("optimize",)),
        summary("a.backoff", 10, ("optimize",)),
        summary("a.recent", 10, ("optimize",)),
        summary("a.first", 20, ("optimize",), 1),
        summary("a.over", 30, ("optimize",), 1),
        summary("a.ok"),
    ]
    memory = {
        "a.backoff": TableMemory(
            "a.backoff", operations={"optimize": failed("a.backoff", "optimize", 2, NOW)}
        ),
        "a.recent": served("a.recent", NOW),
    }
    selection = select(
        tables,
        trigger=TriggerSettings(max_tables=1),
        min_interval=timedelta(minutes=2),
        in_flight={"a.flight": "run r1 is queued"},
        memory=memory,
    )
    assert [r.table for r in selection.requested] == ["a.first"]
    assert {s.table: s.kind for s in selection.skipped} == {
        "a.flight": "in_flight",
        "a.backoff": "backoff",
        "a.recent": "min_interval",
        "a.over": "budget",
    }
    decisions = selection.decisions()
    assert decisions["a.ok"] == "healthy" and decisions["a.first"] == "requested"
    assert decisions["a.flight"] == "waits: run r1 is queued"
    assert decisions["a.recent"] == (
        "waits: maintained 2026-11-21 12:00:00 UTC; next after 2026-11-21 12:02:00 UTC"
    )
    summary_line = selection.summary()
    for words in (
        "1 tables requested: a.first (optimize)",
        "a run in flight",
        "backing off",
        "health.min_interval",
        "backlog",
        "1 tables healthy",
    ):
        assert words in summary_line


def test_a_summary_names_at_most_ten_tables_per_reason() -> None:
    """A skip reason is stored with every tick: at 10,000 tables it must stay short."""
    tables = [summary(f"a.t{i:04d}", 10, ("optimize",)) for i in range(500)]
    selection = select(tables, in_flight={t.table: "run r is queued" for t in tables})
    line = selection.summary()
    assert "500 due tables wait" in line and "and 490 more" in line
    assert len(line) < 600


def test_summarize_totals_the_whole_lakehouse_and_names_failing_tables() -> None:
    tables = [
        summary("a.good"),
        summary("a.bad", 20, ("optimize",), 3 * MB, small_files=40, snapshots=30),
        summary(
            "a.mid",
            60,
            ("rewrite_manifests",),
            1 * MB,
            position_delete_files=2,
            deletion_vectors=1,
            wal_files=4,
            wal_bytes=4000,
        ),
    ]
    selection = select(tables, trigger=TriggerSettings(max_tables=1))
    report = summarize(
        tables,
        tables=4,
        errors={"a.broken": "NoSuchTableError: a.broken"},
        selection=selection,
        failing={"a.bad": "optimize failed 3 times in a row"},
        unsafe_sharing={"a.mid": "shares its location with a.twin; gc.enabled is not false"},
        rows=3,
    )
    assert report.numbers() == {
        "tables": 4,
        "tables_assessed": 3,
        "tables_unreadable": 1,
        "unhealthy_tables": 1,  # only a.bad is under its min_score of 50
        "failing_tables": 1,
        "mean_score": 60.0,
        "lowest_score": 20.0,
        "tables_due": 2,
        "small_files": 40,
        "delete_files": 3,
        "snapshots": 36,
        "expirable_snapshots": 0,
        "wal_files": 4,
        "wal_bytes": 4000,
        "work_bytes": 4 * MB,
        "backlog_tables": 1,
        "backlog_bytes": 1 * MB,
        "tables_requested": 1,
        "excluded_tables": 0,
        "unsafe_sharing_tables": 1,
    }
    assert report.due_by_operation == {"optimize": 1, "rewrite_manifests": 1}
    assert [row[0] for row in report.least_healthy] == ["a.bad", "a.mid", "a.good"]
    assert report.least_healthy[0][4] == "requested"
    # What is recorded again on change: verdicts, not the figures every write moves.
    moved = summarize(
        [summary("a.good", wal_files=9), *tables[1:]],
        tables=4,
        errors={"a.broken": "NoSuchTableError: a.broken"},
        failing={"a.bad": "optimize failed 4 times in a row"},
        unsafe_sharing={"a.mid": "shares its location with a.twin; gc.enabled is not false"},
    )
    assert moved.verdicts() == report.verdicts()
    assert moved.numbers()["wal_files"] == 13

    plain = summarize(tables[:1], tables=2, errors={"a.x": "gone"})
    assert "backlog_tables" not in plain.numbers()
    assert plain.least_healthy[-1] == ("a.x", "?", "-", "cannot assess: gone", "skipped")
    empty = summarize([], tables=0)
    assert "mean_score" not in empty.numbers() and empty.numbers()["tables"] == 0


def test_a_summary_round_trips_through_its_stored_form() -> None:
    kept = summary("a.t", 42.5, ("optimize",), 7 * MB, small_files=13, wal_bytes=99)
    back = HealthSummary.from_json("a.t", kept.to_json())
    assert back == kept
    assert (
        back.figures()
        == health("a.t", 42.5, ("optimize",), 7 * MB, small_files=13, wal_bytes=99).figures()
    )


def test_rotation_resumes_at_the_table_after_the_last_one_assessed() -> None:
    keys = ["a.c", "a.a", "a.b"]
    assert rotation(keys, None) == ["a.a", "a.b", "a.c"]
    assert rotation(keys, "a.b") == ["a.b", "a.c", "a.a"]
    assert rotation(keys, "a.bb") == ["a.c", "a.a", "a.b"]  # a.bb was dropped: the next one
    assert rotation(keys, "z.z") == ["a.a", "a.b", "a.c"]


def test_the_healthy_check_passes_from_min_score_and_fails_below_or_unassessed() -> None:
    at_threshold = health_score_check(health("a.x", 50.0, ("optimize",)), 50.0)
    assert at_threshold.name == "healthy" and at_threshold.passed
    assert at_threshold.description == (
        "score 50.0 (fails below 50); still due: optimize: optimize threshold crossed"
    )
    assert at_threshold.metadata == {
        "health_score": 50.0,
        "min_score": 50.0,
        "penalties": {"small_files": 50.0},
        "due_operations": ["optimize"],
        "due": [{"operation": "optimize", "reason": "optimize threshold crossed"}],
        "figures": {
            "data_files": 10,
            "small_files": 0,
            "worst_partition_small_files": 0,
            "delete_files": 0,
            "manifests": 1,
            "small_manifests": 0,
            "snapshots": 3,
            "expirable_snapshots": 0,
            "wal_files": 0,
            "wal_bytes": 0,
            "work_bytes": 0,
        },
    }
    # The kept summary gives the same verdict as the full assessment.
    kept = health_score_check(summary("a.x", 50.0, ("optimize",)), 50.0)
    assert kept == at_threshold
    assert not health_score_check(health("a.x", 49.9, ("optimize",)), 50.0).passed
    clean = health_score_check(health("a.x"), 80.0)
    assert clean.passed and clean.description.endswith("nothing due")
    unassessed = health_score_check(None, 50.0, "cannot assess the health of a.x: gone")
    assert not unassessed.passed
    assert unassessed.description == "cannot assess the health of a.x: gone"
