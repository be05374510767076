"""select_runs and summarize on hand-built table health (no JVM, no Dagster): which tables
the health trigger requests, in which order, within which budget, and why the rest wait."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from icegate_dagster.config import TriggerSettings
from icegate_dagster.maintenance.health.checks import health_score_check
from icegate_dagster.maintenance.health.score import TableHealth
from icegate_dagster.maintenance.health.selection import (
    Selection,
    backoff_wait,
    rotation,
    select_runs,
    summarize,
)
from tests.unit.health_builders import MB, health

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)
TRIGGER = TriggerSettings()


def select(candidates: list[TableHealth], **kwargs: Any) -> Selection:
    kwargs.setdefault("trigger", TRIGGER)
    kwargs.setdefault("min_interval", timedelta(minutes=2))
    return select_runs(candidates, now=NOW, **kwargs)


def test_only_due_tables_are_requested_neediest_first_with_exactly_their_operations() -> None:
    tables = [
        health("lakehouse.idle"),
        health("lakehouse.some", 80, ("optimize",), 5 * MB),
        health("lakehouse.worst", 30, ("optimize", "expire_snapshots"), 1 * MB),
        # The same need as ``some``: more work bytes first, then the name.
        health("lakehouse.bigger", 80, ("rewrite_manifests",), 9 * MB),
        health("lakehouse.a_same", 80, ("optimize",), 5 * MB),
    ]
    selection = select_runs(tables, now=NOW, trigger=TRIGGER, min_interval=timedelta(0))

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


def test_a_lakehouse_with_nothing_due_says_how_many_tables_are_healthy() -> None:
    selection = select_runs(
        [health("a.x"), health("a.y")], now=NOW, trigger=TRIGGER, min_interval=timedelta(0)
    )
    assert selection.requested == ()
    assert selection.summary() == "2 tables healthy, none due"


def test_the_table_budget_takes_the_neediest_and_reports_the_rest_as_backlog() -> None:
    tables = [health(f"a.t{i}", 90 - i, ("optimize",), (i + 1) * MB) for i in range(5)]
    trigger = TriggerSettings(max_tables=2)
    selection = select_runs(tables, now=NOW, trigger=trigger, min_interval=timedelta(0))

    assert [r.table for r in selection.requested] == ["a.t4", "a.t3"]
    assert selection.backlog.tables == ("a.t2", "a.t1", "a.t0")
    assert selection.backlog.count == 3
    assert selection.backlog.bytes == (3 + 2 + 1) * MB
    [skip] = [s for s in selection.skipped if s.table == "a.t2"]
    assert skip.kind == "budget" and "maintain.trigger.max_tables 2 reached" in skip.reason
    summary = selection.summary()
    assert "3 due tables wait, over this evaluation's budget (backlog) (3 tables, " in summary
    assert "a.t2 (need 12.0" in summary


def test_the_byte_budget_always_takes_the_first_and_stops_at_the_first_that_does_not_fit() -> None:
    tables = [
        health("a.huge", 10, ("optimize",), 500 * MB),  # neediest, over the budget alone
        health("a.mid", 20, ("optimize",), 60 * MB),
        health("a.small", 30, ("optimize",), 1 * MB),
    ]
    trigger = TriggerSettings(max_bytes=100 * MB)
    selection = select_runs(tables, now=NOW, trigger=trigger, min_interval=timedelta(0))

    # The first always fits, even alone over the budget: nothing else does.
    assert [r.table for r in selection.requested] == ["a.huge"]
    assert selection.backlog.tables == ("a.mid", "a.small")

    without_huge = select_runs(tables[1:], now=NOW, trigger=trigger, min_interval=timedelta(0))
    assert [r.table for r in without_huge.requested] == ["a.mid", "a.small"]

    # A smaller table behind one that does not fit waits too: no jumping the queue.
    queue = [
        health("a.first", 10, ("optimize",), 60 * MB),
        health("a.second", 20, ("optimize",), 60 * MB),
        health("a.third", 30, ("optimize",), 1 * MB),
    ]
    blocked = select_runs(queue, now=NOW, trigger=trigger, min_interval=timedelta(0))
    assert [r.table for r in blocked.requested] == ["a.first"]
    assert blocked.backlog.tables == ("a.second", "a.third")
    assert blocked.backlog.bytes == 61 * MB
    assert "maintain.trigger.max_bytes 104857600 reached" in blocked.skipped[0].reason


def test_a_table_with_a_run_in_flight_is_skipped_naming_the_run() -> None:
    tables = [health("a.busy", 10, ("optimize",)), health("a.free", 50, ("optimize",))]
    selection = select(tables, in_flight={"a.busy": "run 1a2b3c is started"})

    assert [r.table for r in selection.requested] == ["a.free"]
    [skip] = selection.skipped
    assert (skip.table, skip.kind, skip.reason) == ("a.busy", "in_flight", "run 1a2b3c is started")
    assert "a.busy (run 1a2b3c is started)" in selection.summary()


def test_no_table_more_often_than_its_min_interval_whoever_maintained_it() -> None:
    tables = [health("a.recent", 10, ("optimize",)), health("a.older", 20, ("optimize",))]
    last = {
        "a.recent": NOW - timedelta(seconds=90),
        "a.older": NOW - timedelta(minutes=2),  # exactly the interval: due again
    }
    selection = select_runs(
        tables,
        now=NOW,
        trigger=TRIGGER,
        min_interval=timedelta(minutes=2),
        last_maintained=last,
    )
    assert [r.table for r in selection.requested] == ["a.older"]
    [skip] = selection.skipped
    assert skip.kind == "min_interval"
    assert skip.reason == ("maintained 2026-11-21 11:58:30 UTC; next after 2026-11-21 12:00:30 UTC")

    # Per-table intervals: a table with a longer one waits, one with none never does.
    per_table = select_runs(
        tables,
        now=NOW,
        trigger=TRIGGER,
        min_interval={"a.older": timedelta(hours=1)},
        last_maintained=last,
    )
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
    assert backoff_wait(failures, TRIGGER.backoff, TRIGGER.backoff_max) == wait


def test_a_table_that_keeps_failing_waits_out_its_backoff_and_is_reported() -> None:
    tables = [health("a.flaky", 10, ("optimize",)), health("a.once", 20, ("optimize",))]
    failures = {
        "a.flaky": (3, NOW - timedelta(seconds=100)),  # waits 2 minutes after its failure
        "a.once": (1, NOW - timedelta(seconds=1)),  # retried now
    }
    selection = select(tables, failures=failures)

    assert [r.table for r in selection.requested] == ["a.once"]
    [skip] = selection.skipped
    assert skip.kind == "backoff"
    assert skip.reason == "its last 3 runs failed; next attempt after 2026-11-21 12:00:20 UTC"
    assert "backing off after failed runs: a.flaky" in selection.summary()

    # Once the wait is over, it is tried again.
    later = select_runs(
        tables,
        now=NOW + timedelta(seconds=21),
        trigger=TRIGGER,
        min_interval=timedelta(0),
        failures=failures,
    )
    assert [r.table for r in later.requested] == ["a.flaky", "a.once"]

    # The cap: after many failures the wait is backoff_max, not more.
    capped = select_runs(
        tables[:1],
        now=NOW,
        trigger=TriggerSettings(backoff_max=timedelta(minutes=5)),
        min_interval=timedelta(0),
        failures={"a.flaky": (20, NOW - timedelta(minutes=5))},
    )
    assert [r.table for r in capped.requested] == ["a.flaky"]


def test_a_table_settled_by_a_successful_run_on_its_state_waits_for_a_change() -> None:
    selection = select(
        [health("a.same", 40, ("optimize",))],
        settled={"a.same": "run 9f9f succeeded on this table state"},
    )
    assert selection.requested == ()
    assert selection.skipped[0].kind == "unchanged"


def test_due_operations_without_a_step_are_dropped_and_a_table_left_with_none_reported() -> None:
    tables = [
        health("a.mixed", 40, ("optimize", "rewrite_position_delete_files")),
        health("a.only_new", 30, ("rewrite_position_delete_files",)),
    ]
    selection = select(tables, runnable=("optimize", "expire_snapshots"))

    assert [(r.table, r.operations) for r in selection.requested] == [("a.mixed", ("optimize",))]
    [skip] = selection.skipped
    assert (skip.table, skip.kind) == ("a.only_new", "not_runnable")
    assert "rewrite_position_delete_files" in skip.reason


def test_every_skipped_table_has_its_reason_and_the_summary_names_each_kind() -> None:
    tables = [
        health("a.flight", 10, ("optimize",)),
        health("a.backoff", 10, ("optimize",)),
        health("a.recent", 10, ("optimize",)),
        health("a.first", 20, ("optimize",), 1),
        health("a.over", 30, ("optimize",), 1),
        health("a.ok"),
    ]
    selection = select_runs(
        tables,
        now=NOW,
        trigger=TriggerSettings(max_tables=1),
        min_interval=timedelta(minutes=2),
        in_flight={"a.flight": "run r1 is queued"},
        failures={"a.backoff": (2, NOW)},
        last_maintained={"a.recent": NOW},
    )
    assert [r.table for r in selection.requested] == ["a.first"]
    assert {s.table: s.kind for s in selection.skipped} == {
        "a.flight": "in_flight",
        "a.backoff": "backoff",
        "a.recent": "min_interval",
        "a.over": "budget",
    }
    assert all(s.reason for s in selection.skipped)
    assert selection.decisions() == {
        "a.ok": "healthy",
        "a.first": "requested",
        "a.flight": "waits: run r1 is queued",
        "a.backoff": "waits: its last 2 runs failed; next attempt after 2026-11-21 12:01:00 UTC",
        "a.recent": "waits: maintained 2026-11-21 12:00:00 UTC; next after 2026-11-21 12:02:00 UTC",
        "a.over": ("waits: need 70.0, 1 work bytes; maintain.trigger.max_tables 1 reached"),
    }
    summary = selection.summary()
    for words in (
        "1 tables requested: a.first (optimize)",
        "a run in flight",
        "backing off",
        "health.min_interval",
        "backlog",
        "1 tables healthy",
    ):
        assert words in summary


def test_summarize_totals_and_the_least_healthy_tables() -> None:
    tables = [
        health("a.good"),
        health("a.bad", 20, ("optimize",), 3 * MB, small_files=40, snapshots=30),
        health(
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
    selection = select_runs(
        tables, now=NOW, trigger=TriggerSettings(max_tables=1), min_interval=timedelta(0)
    )
    report = summarize(
        tables,
        tables=4,
        default_min_score=50.0,
        errors={"a.broken": "NoSuchTableError: a.broken"},
        selection=selection,
        rows=3,
    )

    assert report.numbers() == {
        "tables": 4,
        "tables_assessed": 3,
        "tables_unreadable": 1,
        "unhealthy_tables": 1,  # only a.bad is under its min_score of 50
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
    }
    assert report.due_by_operation == {"optimize": 1, "rewrite_manifests": 1}
    assert [row[0] for row in report.least_healthy] == ["a.bad", "a.mid", "a.good"]
    assert report.least_healthy[0] == (
        "a.bad",
        "20.0",
        "optimize",
        "optimize: optimize threshold crossed",
        "requested",
    )
    assert report.least_healthy[1][4].startswith("waits: need 40.0")

    # Outside a trigger evaluation: no backlog figures, unreadable tables listed with room.
    plain = summarize(tables[:1], tables=2, default_min_score=50.0, errors={"a.x": "gone"})
    assert "backlog_tables" not in plain.numbers()
    assert plain.least_healthy[-1] == ("a.x", "?", "-", "cannot assess: gone", "skipped")
    empty = summarize([], tables=0, default_min_score=50.0)
    assert "mean_score" not in empty.numbers() and empty.numbers()["tables"] == 0


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
    below = health_score_check(health("a.x", 49.9, ("optimize",)), 50.0)
    assert not below.passed
    clean = health_score_check(health("a.x"), 80.0)
    assert clean.passed and clean.description.endswith("nothing due")
    unassessed = health_score_check(None, 50.0, "cannot assess the health of a.x: gone")
    assert not unassessed.passed
    assert unassessed.description == "cannot assess the health of a.x: gone"
