"""Deferred orphan deletion: ``orphans --collect`` records candidates, ``--delete-collected``
later deletes only those still unreferenced, still old and unchanged."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.ops.deferred_orphans import CollectOrphans, DeleteCollectedOrphans
from icegate_dagster.maintenance.orphans.candidates import (
    candidates_table,
    read_candidates,
    rewrite_rows,
)
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory, batch

TABLE = "lakehouse.logs"
MONTH = timedelta(days=30)


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _backdate(path: Path, age: timedelta) -> None:
    stamp = time.time() - age.total_seconds()
    os.utime(path, (stamp, stamp))


def _cli(lh: Lakehouse, capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, Any]:
    code = run_cli(["orphans", *flags, "--config", str(lh.config_path), "--table", TABLE, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _statuses(lh: Lakehouse) -> dict[Path, str]:
    rows = read_candidates(lh.catalog, candidates_table(lh.config), TABLE)
    return {_local(r["path"]): r["status"] for r in rows}


def test_collected_orphans_are_deleted_later_only_if_still_orphaned_old_and_unchanged(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table(TABLE, appends=3)
    a = lh.plant_file(TABLE, "orphan-a.parquet", MONTH)
    # B: a valid data file of the table's schema, unreferenced when collected.
    b = lh.data_dir(TABLE) / "service=api" / "registered-later.parquet"
    pq.write_table(batch(90_000, ("api",)).drop_columns(["service"]), b)
    _backdate(b, MONTH)
    gone = lh.plant_file(TABLE, "orphan-removed-by-hand.parquet", MONTH)
    touched = lh.plant_file(TABLE, "orphan-written-again.parquet", MONTH)
    changed = lh.plant_file(TABLE, "orphan-changed.parquet", MONTH)

    code, collected = _cli(lh, capsys, "--collect")

    assert code == 0, collected
    [report] = collected["tables"]
    assert report["status"] == "completed", report
    sizes = {_local(c["path"]): c["size_bytes"] for c in report["candidates"]}
    assert sizes == {p: p.stat().st_size for p in (a, b, gone, touched, changed)}
    assert all(p.exists() for p in sizes)  # collecting deletes nothing
    assert set(_statuses(lh).values()) == {"pending"}
    # Meanwhile: B becomes a live file, one candidate is removed by hand, one is written
    # again (young now), one changes size but keeps its old time, and a young file appears.
    table.add_files([f"file:{b}"])
    gone.unlink()
    os.utime(touched, None)
    changed.write_bytes(changed.read_bytes() + b"more")
    _backdate(changed, MONTH)
    young = lh.plant_file(TABLE, "write-in-progress.parquet", timedelta(hours=1))
    rows = lh.rows(TABLE)

    code, done = _cli(lh, capsys, "--delete-collected")

    assert code == 0, done
    [result] = done["tables"]
    assert [_local(f["path"]) for f in result["deleted"]] == [a]
    assert result["bytes_deleted"] == sizes[a]
    kept = {_local(k["path"]): k["reason"] for k in result["kept"]}
    assert kept == {b: "referenced", gone: "gone", touched: "younger", changed: "changed"}
    assert not a.exists()
    assert b.exists() and touched.exists() and changed.exists() and young.exists()
    assert lh.rows(TABLE) == rows
    assert all(p.exists() for p in lh.data_file_paths(TABLE))
    assert _statuses(lh) == {
        a: "deleted",
        b: "referenced",
        gone: "gone",
        touched: "younger",
        changed: "changed",
    }
    # The candidates table is an Iceberg table an operator queries like any other.
    ref = candidates_table(lh.config)
    name = ref.spark_identifier(lh.config.catalog.name)
    queried = get_spark(lh.config).sql(
        f"SELECT path, status, resolved_run_id FROM {name} WHERE table_name = '{TABLE}'"
    )
    assert {(_local(r[0]), r[1], r[2]) for r in queried.collect()} == {
        (path, status, done["run_id"]) for path, status in _statuses(lh).items()
    }
    [logged] = [r for r in lh.log_rows() if r["run_id"] == done["run_id"]]
    assert (logged["operation"], logged["status"]) == ("remove_orphan_files", "completed")
    assert "deleted 1 of 5 collected" in logged["details"]


def test_collecting_again_replaces_pending_a_vetoed_row_spares_its_file_gc_off_deletes_nothing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table(TABLE, appends=2)
    first = lh.plant_file(TABLE, "orphan-1.parquet", MONTH)
    assert _cli(lh, capsys, "--collect")[0] == 0
    first.unlink()
    second = lh.plant_file(TABLE, "orphan-2.parquet", MONTH)
    vetoed = lh.plant_file(TABLE, "keep-me.parquet", MONTH)

    code, again = _cli(lh, capsys, "--collect")

    assert code == 0
    assert again["tables"][0]["replaced"] == 1
    assert _statuses(lh) == {second: "pending", vetoed: "pending"}
    # An operator vetoes one candidate by deleting its row.
    name = candidates_table(lh.config).spark_identifier(lh.config.catalog.name)
    get_spark(lh.config).sql(f"DELETE FROM {name} WHERE path LIKE '%keep-me.parquet'")
    code, done = _cli(lh, capsys, "--delete-collected")
    assert code == 0
    assert [_local(f["path"]) for f in done["tables"][0]["deleted"]] == [second]
    assert not second.exists() and vetoed.exists()
    # GC turned off after collecting: nothing is deleted, the candidate stays pending.
    assert _cli(lh, capsys, "--collect")[0] == 0
    with table.transaction() as tx:
        tx.set_properties({"gc.enabled": "false"})
    code, refused = _cli(lh, capsys, "--delete-collected")
    assert code == 0
    assert refused["tables"][0]["status"] == "skipped"
    assert "gc.enabled=false" in refused["tables"][0]["details"]
    assert vetoed.exists()
    assert _statuses(lh) == {second: "deleted", vetoed: "pending"}
    [logged] = [r for r in lh.log_rows() if r["run_id"] == refused["run_id"]]
    assert (logged["table_name"], logged["status"]) == (TABLE, "skipped")
    # Modes exclude each other and a dry run: bad usage.
    for flags in (["--collect", "--delete-collected"], ["--collect", "--dry-run"]):
        with pytest.raises(SystemExit) as usage:
            run_cli(["orphans", *flags, "--config", str(lh.config_path), "--table", TABLE])
        assert usage.value.code == 2


def test_deferred_deletion_is_an_operation_with_the_dry_run_of_every_other(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """Collecting and deleting collected candidates run through the maintainer as any
    operation: a dry run of each says what it would do and changes nothing, neither the
    files nor the candidates table; only the real delete writes a log row."""
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=2)
    orphan = lh.plant_file(TABLE, "orphan.parquet", MONTH)
    maintainer = Maintainer(lh.config)
    ref = maintainer.resolve(TABLE)

    def logged() -> list[tuple[str, str]]:
        if not lh.catalog.table_exists(TableRef.parse(lh.config.log_table).identifier):
            return []
        return [(r["operation"], r["status"]) for r in lh.log_rows()]

    would_collect = maintainer.run_op(ref, CollectOrphans(), dry_run=True)

    assert would_collect.status == "completed", would_collect.details
    assert [_local(c["path"]) for c in would_collect.output["candidates"]] == [orphan]
    assert _statuses(lh) == {}  # nothing recorded
    [collected] = maintainer.run_each([TABLE], CollectOrphans(), write_log=False)
    assert collected.ok and _statuses(lh) == {orphan: "pending"}

    would_delete = maintainer.run_op(ref, DeleteCollectedOrphans(), dry_run=True)

    assert would_delete.status == "completed", would_delete.details
    assert "would delete 1 of 1" in would_delete.details
    assert would_delete.output["orphans_removed"] == 0
    assert orphan.exists() and _statuses(lh) == {orphan: "pending"}
    assert logged() == []

    [deleted] = maintainer.run_each([TABLE], DeleteCollectedOrphans())

    assert deleted.ok and not orphan.exists()
    assert _statuses(lh) == {orphan: "deleted"}
    assert logged() == [("remove_orphan_files", "completed")]


def _candidate(path: str, status: str, collected_days: int, resolved_days: int | None) -> Any:
    now = datetime.now(UTC)
    return {
        "table_name": TABLE,
        "path": path,
        "size_bytes": 1,
        "modified_at": now - timedelta(days=collected_days + 8),
        "age_s": 8 * 86400,
        "collected_at": now - timedelta(days=collected_days),
        "run_id": "earlier",
        "status": status,
        "reason": status,
        "resolved_at": None if resolved_days is None else now - timedelta(days=resolved_days),
        "resolved_run_id": None if resolved_days is None else "earlier",
    }


def test_resolved_candidates_older_than_the_history_setting_are_dropped_pending_ones_kept(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """``maintain.history.orphan_candidates`` (here 10d): resolved rows resolved longer ago
    are dropped when the table's candidates are next deleted or collected; newer resolved
    rows stay, and a pending row is never dropped, however old (an operator may not have
    deleted collected candidates for a year)."""
    lh = lakehouse_factory(maintain={"history": {"orphan_candidates": "10d"}})
    lh.add_table(TABLE, appends=2)
    orphan = lh.plant_file(TABLE, "orphan.parquet", MONTH)
    ref = candidates_table(lh.config)
    earlier = [
        _candidate("file:/gone/long-ago.parquet", "deleted", 400, 399),
        _candidate("file:/gone/last-month.parquet", "gone", 40, 30),
        _candidate("file:/kept/last-week.parquet", "referenced", 8, 7),
    ]
    rewrite_rows(lh.catalog, ref, TABLE, lambda old: earlier)
    assert _cli(lh, capsys, "--collect")[0] == 0
    # Collecting kept no old resolved row; its pending rows stay whatever their age.
    assert {p.name: s for p, s in _statuses(lh).items()} == {
        "last-week.parquet": "referenced",
        "orphan.parquet": "pending",
    }
    rewrite_rows(
        lh.catalog,
        ref,
        TABLE,
        lambda old: [
            {**r, "collected_at": r["collected_at"] - timedelta(days=365)} for r in old
        ]
        + earlier[:2],
    )

    code, done = _cli(lh, capsys, "--delete-collected")

    assert code == 0, done
    assert not orphan.exists()
    statuses = {p.name: s for p, s in _statuses(lh).items()}
    assert statuses == {"last-week.parquet": "referenced", "orphan.parquet": "deleted"}
    name = ref.spark_identifier(lh.config.catalog.name)
    queried = get_spark(lh.config).sql(f"SELECT path FROM {name}").collect()
    assert sorted(Path(r[0]).name for r in queried) == ["last-week.parquet", "orphan.parquet"]
