"""Issue 12, items 5, 6 and 8 through the CLI, with real Spark: tables with GC turned off,
paths that must not cross, and reports that tell the truth."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from tests.lakehouse import LakehouseFactory, batch

TABLE = "lakehouse.logs"


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = run_cli([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _ops(report: dict[str, Any], table: str) -> dict[str, dict[str, Any]]:
    [entry] = [t for t in report["tables"] if t["table"] == table]
    return {op["operation"]: op for op in entry["ops"]}


def test_gc_disabled_table_skips_expiry_and_orphans_and_still_compacts(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain={"expire_snapshots": {"retention_threshold": "1s"}})
    table = lh.add_table(TABLE, appends=6)
    with table.transaction() as t:
        t.set_properties({"gc.enabled": "false"})
    orphan = lh.plant_file(TABLE, "orphan-of-a-shared-table.parquet", timedelta(days=30))
    snapshots = {s.snapshot_id for s in lh.table(TABLE).metadata.snapshots}
    time.sleep(1.5)  # every snapshot but the current one is now old enough to expire
    config = ["--config", str(lh.config_path), "--table", TABLE]

    code, planned = _run(capsys, "run", "--dry-run", *config)
    assert code == 0
    for name in ("expire_snapshots", "remove_orphan_files"):
        op = _ops(planned, TABLE)[name]
        assert op["status"] == "skipped" and "gc.enabled=false" in op["details"], op

    code, done = _run(capsys, "run", *config)
    assert code == 0, done
    ops = _ops(done, TABLE)
    for name in ("expire_snapshots", "remove_orphan_files"):
        assert ops[name]["status"] == "skipped", ops[name]
        assert "gc.enabled=false" in ops[name]["details"]
        assert "Nessie GC" in ops[name]["details"]
    assert ops["optimize"]["status"] == "completed", ops["optimize"]
    assert orphan.exists()
    assert snapshots <= {s.snapshot_id for s in lh.table(TABLE).metadata.snapshots}
    logged = {(r["operation"], r["status"]) for r in lh.log_rows() if r["table_name"] == TABLE}
    assert ("expire_snapshots", "skipped") in logged
    assert ("remove_orphan_files", "skipped") in logged
    assert ("optimize", "completed") in logged


def test_wal_file_under_a_table_folder_survives_orphan_removal(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table(TABLE, appends=2)
    wal_root = f"{table.location()}/_wal"  # a misconfiguration: WAL inside the table's folder
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["wal"] = {"root": wal_root}
    lh.config_path.write_text(yaml.safe_dump(raw))
    lh.config = load_config(lh.config_path)
    waiting = _local(wal_root) / "lakehouse" / "logs" / "waiting-1.parquet"
    waiting.parent.mkdir(parents=True)
    import pyarrow.parquet as pq

    pq.write_table(batch(5000, ("api",)), waiting)
    month_ago = time.time() - timedelta(days=30).total_seconds()
    os.utime(waiting, (month_ago, month_ago))  # a WAL that waited long: old enough to go

    code, report = _run(capsys, "orphans", "--config", str(lh.config_path), "--table", TABLE)

    assert code == 1
    op = _ops(report, TABLE)["remove_orphan_files"]
    assert op["status"] == "failed"
    assert TABLE in op["details"] and wal_root in op["details"]
    assert table.location() in op["details"]
    assert waiting.exists()


def test_an_unreadable_table_skips_orphan_removal_where_it_lies_and_the_pass_goes_on(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=6)
    # Another table inside the first one's folder, then its metadata file is lost: its
    # location cannot be read any more, and its live files look orphaned to the outer table.
    lh.add_table_inside(TABLE, "lakehouse.inner", age=timedelta(days=30))
    inner_files = lh.data_file_paths("lakehouse.inner")
    _local(lh.table("lakehouse.inner").metadata_location).write_text("{ not json")
    rows = lh.rows_without_spark(TABLE)

    code, report = _run(capsys, "run", "--config", str(lh.config_path), "--table", TABLE)

    ops = _ops(report, TABLE)
    # Skipped, naming it: the broken table is the alert (its own pass fails), not every
    # table whose folder its files may lie in (issue 37).
    assert ops["remove_orphan_files"]["status"] == "skipped"
    assert "lakehouse.inner" in ops["remove_orphan_files"]["details"]
    assert code == 0, {op: o["status"] for op, o in ops.items()}
    assert ops["optimize"]["status"] == "completed"
    assert ops["rewrite_manifests"]["status"] in ("completed", "skipped")
    assert all(path.exists() for path in inner_files)
    assert lh.rows_without_spark(TABLE) == rows


def test_compact_exits_1_when_every_wal_file_was_quarantined(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(wal=True)
    lh.add_table(TABLE, appends=1)
    for i in range(2):
        (lh.wal_dir(TABLE) / f"broken-{i}.parquet").write_bytes(b"not parquet at all")

    code, report = _run(
        capsys, "compact", "--force", "--config", str(lh.config_path), "--table", TABLE
    )

    assert code == 1, report
    op = _ops(report, TABLE)["wal_compaction"]
    assert op["status"] == "failed"
    assert "quarantined" in op["details"]


def test_a_dropped_table_gets_a_failed_log_row_per_operation(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=2)
    lh.add_table("lakehouse.gone", appends=1)
    lh.catalog.drop_table(("lakehouse", "gone"))
    config = ["--config", str(lh.config_path), "--table", "lakehouse.gone", "--table", TABLE]

    code, report = _run(capsys, "run", *config)

    assert code == 1
    gone = _ops(report, "lakehouse.gone")
    assert set(gone) == {
        "optimize",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    }
    assert all(op["status"] == "failed" for op in gone.values())
    assert all("does not exist" in op["details"] for op in gone.values())
    logged = sorted(
        (r["operation"], r["status"]) for r in lh.log_rows() if r["table_name"] == "lakehouse.gone"
    )
    assert logged == sorted((name, "failed") for name in gone)
    assert all(op["status"] != "failed" for op in _ops(report, TABLE).values())

    code, single = _run(capsys, "expire", *config[:2], "--table", "lakehouse.gone")
    assert code == 1
    assert set(_ops(single, "lakehouse.gone")) == {"expire_snapshots"}
