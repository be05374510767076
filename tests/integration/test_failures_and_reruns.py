"""Failures stay with their table and op; a second pass over a healthy table changes nothing."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import Maintainer
from tests.lakehouse import LakehouseFactory


def test_missing_data_file_fails_alone(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.broken", appends=6, services=("api",))
    lh.add_table("lakehouse.healthy", appends=6, services=("api",))
    lost = lh.data_file_paths("lakehouse.broken")[0]
    lost.unlink()

    code = run_cli(["run", "--config", str(lh.config_path), "--json"])
    report = json.loads(capsys.readouterr().out)

    assert code == 1
    tables = {t["table"]: t for t in report["tables"]}
    broken = {op["operation"]: op for op in tables["lakehouse.broken"]["ops"]}
    assert broken["optimize"]["status"] == "failed"
    assert lost.name in broken["optimize"]["error"]
    # Its other ops still ran, and the other table was maintained.
    assert broken["rewrite_manifests"]["status"] == "completed", broken["rewrite_manifests"]
    # Nothing is old enough to expire or be an orphan: planned from metadata, no Spark job.
    for name in ("expire_snapshots", "remove_orphan_files"):
        assert broken[name]["status"] == "skipped", broken[name]
    healthy = tables["lakehouse.healthy"]
    assert healthy["ok"] is True
    assert healthy["before"]["data_files"] == 6 and healthy["after"]["data_files"] == 1

    log = lh.log_rows()
    failed = [r for r in log if r["status"] == "failed"]
    assert [(r["table_name"], r["operation"]) for r in failed] == [("lakehouse.broken", "optimize")]
    assert lost.name in failed[0]["details"]
    assert len([r for r in log if r["table_name"] == "lakehouse.broken"]) == 5
    assert len([r for r in log if r["table_name"] == "lakehouse.healthy"]) == 5


def test_second_pass_changes_nothing_but_appends_log_rows(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.events", appends=7, services=("a", "b"))
    first = Maintainer(lh.config)
    [result] = first.maintain(first.discover())
    assert result.ok and result.after is not None and result.after.data_files == 2
    table = lh.table("lakehouse.events")
    state = (table.metadata.current_snapshot_id, len(table.metadata.snapshots))
    rows = lh.rows("lakehouse.events")
    log_count = len(lh.log_rows())

    second = Maintainer(lh.config)
    [again] = second.maintain(second.discover())

    table = lh.table("lakehouse.events")
    assert again.ok, again.as_dict()
    assert (table.metadata.current_snapshot_id, len(table.metadata.snapshots)) == state
    assert lh.rows("lakehouse.events") == rows
    assert again.before == again.after
    assert len(lh.log_rows()) == log_count + 5


def test_orphans_dry_run_lists_exactly_what_a_real_run_removes(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.t", appends=2)
    old = [lh.plant_file("lakehouse.t", f"old-{i}.parquet", timedelta(days=9)) for i in range(2)]
    young = lh.plant_file("lakehouse.t", "young.parquet", timedelta(days=2))
    args = ["orphans", "--table", "lakehouse.t", "--config", str(lh.config_path), "--json"]

    assert run_cli([*args, "--dry-run"]) == 0
    dry = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]["output"]
    assert all(p.exists() for p in old)
    assert run_cli(args) == 0
    real = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]["output"]

    assert dry["dry_run"] is True and dry["orphans_removed"] == 0
    assert sorted(dry["orphan_files"]) == sorted(real["orphan_files"])
    assert sorted(p.rsplit("/", 1)[-1] for p in real["orphan_files"]) == [
        "old-0.parquet",
        "old-1.parquet",
    ]
    assert not any(p.exists() for p in old)
    assert young.exists()
