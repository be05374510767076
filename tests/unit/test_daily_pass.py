"""The daily pass from one look and decision (``trigger.daily``, pure): which tables get a
run and the log rows of every other one, including the tables the schedule's tick had no
time to look at, those it could not read, a TTL rule's daily work and a run in flight."""

from __future__ import annotations

from datetime import UTC, datetime

from icegate_dagster.config import TriggerSettings
from icegate_dagster.maintenance.health.score import DueOperation
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.trigger.daily import plan_daily_pass
from icegate_dagster.maintenance.trigger.decision import decide
from icegate_dagster.maintenance.trigger.look import LakehouseLook
from icegate_dagster.maintenance.trigger.selection import Request, Selection
from icegate_dagster.maintenance.trigger.store import StoredLook

NOW = 1_800_000_000.0
AT = datetime.fromtimestamp(NOW, UTC)
PASS = ("optimize", "rewrite_manifests", "expire_snapshots", "remove_orphan_files")
TTL_PASS = (*PASS, "retention")


def _look(table: str, *due: str, error: str | None = None) -> StoredLook:
    health = HealthSummary(
        table,
        100.0 if not due else 60.0,
        tuple(DueOperation(op, f"{op} is due") for op in due),
        1000 if due else 0,
        kept={"data_files": 3, "data_bytes": 300, "snapshots": 2},
    )
    return StoredLook(
        table, f"{table}.json", None, NOW - 60, None, None if error else health, error=error
    )


def _plan(
    looks: list[StoredLook], tables: list[str], busy: dict[str, str] | None = None
) -> tuple[Selection, LakehouseLook]:
    look = LakehouseLook(tables=tables, looks={seen.table: seen for seen in looks}, now=NOW)
    selection, _ = decide(look, {}, busy or {}, now=NOW, trigger=TriggerSettings())
    return selection, look


def test_due_and_ttl_tables_get_a_run_every_other_table_gets_its_rows() -> None:
    """``due`` has work; ``ttl`` has a retention rule (its rows age every day: a run, whatever
    its health); ``idle`` is healthy; ``broken`` could not be read; ``new`` was never looked at
    (the tick had no time); ``held`` has a TTL rule but a run holds it."""
    tables = ["l.broken", "l.due", "l.held", "l.idle", "l.new", "l.ttl"]
    looks = [
        _look("l.due", "optimize"),
        _look("l.ttl"),
        _look("l.idle"),
        _look("l.held"),
        _look("l.broken", error="HTTP 503 Service Unavailable"),
    ]
    daily = {t: TTL_PASS if t in ("l.ttl", "l.held") else PASS for t in tables}
    busy = {"l.held": "run 1a2b is started"}
    selection, look = _plan(looks, tables, busy)

    plan = plan_daily_pass(look, selection, daily, busy, at=AT)

    assert {r.table: r.operations for r in plan.requested} == {"l.due": PASS, "l.ttl": TTL_PASS}
    rows = {t.table: t.ops for t in plan.looked_at}
    assert sorted(rows) == ["l.broken", "l.held", "l.idle", "l.new"]
    assert all([op.operation for op in ops] == list(daily[t]) for t, ops in rows.items())
    assert {op.status for op in rows["l.broken"]} == {"failed"}
    assert "HTTP 503" in rows["l.broken"][0].details
    assert {op.status for t in ("l.idle", "l.new", "l.held") for op in rows[t]} == {"skipped"}
    assert rows["l.new"][0].details.startswith("not looked at")
    assert rows["l.held"][0].details == "not asked for today: run 1a2b is started"
    idle = {op.operation: op for op in rows["l.idle"]}
    assert idle["optimize"].details.startswith("not due from the table's metadata")
    assert idle["remove_orphan_files"].details.startswith("not looked for")
    assert idle["optimize"].before is not None and idle["optimize"].before.data_files == 3
    assert plan.not_looked_at == ("l.new",)
    assert plan.summary().startswith("5 tables looked at, 2 due: l.due; l.ttl")
    assert "1 could not be read: l.broken" in plan.summary()
    assert "1 never looked at" in plan.summary()


def test_an_operation_backing_off_is_left_out_of_the_tables_run() -> None:
    """The decision asks for ``optimize`` alone where ``expire_snapshots`` backs off: the
    run does the rest of the table's pass, less the operation backing off."""
    tables = ["l.t"]
    _, look = _plan([_look("l.t", "optimize", "expire_snapshots")], tables)
    selection = Selection((Request("l.t", ("optimize",), 40.0, 1000, ()),), (), ())

    plan = plan_daily_pass(look, selection, {"l.t": PASS}, {}, at=AT)

    assert [r.operations for r in plan.requested] == [
        ("optimize", "rewrite_manifests", "remove_orphan_files")
    ]


def test_an_idle_lakehouse_asks_for_nothing_and_says_how_many_tables_it_looked_at() -> None:
    tables = [f"l.t{i}" for i in range(4)]
    selection, look = _plan([_look(t) for t in tables], tables)

    plan = plan_daily_pass(look, selection, dict.fromkeys(tables, PASS), {}, at=AT)

    assert plan.requested == ()
    assert plan.summary() == "4 tables looked at, none due"
    assert sum(len(t.ops) for t in plan.looked_at) == 4 * len(PASS)
