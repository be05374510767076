"""Orphan removal and snapshot expiry never touch a live file or a protected snapshot."""

from __future__ import annotations

import json
import os
import time
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import Lakehouse, LakehouseFactory, batch

TABLE = "lakehouse.logs"


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _live_files(lh: Lakehouse, key: str) -> set[Path]:
    """Every data file any snapshot the table keeps refers to."""
    return {_local(p) for p in lh.table(key).inspect.all_files().column("file_path").to_pylist()}


def test_orphans_go_live_files_stay_whatever_their_spelling_and_dry_run_is_exact(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    table = lh.add_table(TABLE, appends=4)
    # A live file registered with another spelling of the same place (file:/ not file:///),
    # back-dated so that only its being referenced can save it.
    added = lh.data_dir(TABLE) / "service=api" / "added-by-another-tool.parquet"
    pq.write_table(batch(90_000, ("api",)).drop_columns(["service"]), added)
    table.add_files([f"file:{added}"])
    month_ago = time.time() - timedelta(days=30).total_seconds()
    os.utime(added, (month_ago, month_ago))
    orphans = {lh.plant_file(TABLE, f"orphan-{i}.parquet", timedelta(days=30)) for i in range(3)}
    young = lh.plant_file(TABLE, "write-in-progress.parquet", timedelta(hours=1))
    rows = lh.rows(TABLE)
    config = ["--config", str(lh.config_path), "--table", TABLE, "--json"]

    assert run_cli(["orphans", "--dry-run", *config]) == 0
    planned = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]["output"]
    assert all(p.exists() for p in orphans)  # the dry run deleted nothing
    assert run_cli(["orphans", *config]) == 0
    done = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]["output"]

    assert {_local(p) for p in planned["orphan_files"]} == orphans
    assert done["orphan_files"] == planned["orphan_files"]  # exactly what the dry run listed
    assert not any(p.exists() for p in orphans)
    assert young.exists() and added.exists()
    assert all(p.exists() for p in _live_files(lh, TABLE))
    assert lh.rows(TABLE) == rows


def test_tables_sharing_a_location_keep_each_others_live_files_from_orphan_removal(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=2)
    lh.add_table_inside(TABLE, "lakehouse.inner")
    live = _live_files(lh, TABLE) | _live_files(lh, "lakehouse.inner")
    long_ago = time.time() - timedelta(days=30).total_seconds()
    for path in live:  # old enough that only being referenced keeps them
        os.utime(path, (long_ago, long_ago))

    code = run_cli(
        ["orphans", "--config", str(lh.config_path), "--table", TABLE, "--table", "lakehouse.inner"]
    )

    out = capsys.readouterr().out
    assert code == 0, out
    # The outer folder holds the inner table's files: they are its live files, not orphans.
    assert f"{TABLE} remove_orphan_files: skipped" in out
    assert "consulted lakehouse.inner (sharing this location)" in out
    assert f"consulted {TABLE} (sharing this location)" in out
    assert all(p.exists() for p in live)


def test_expiry_keeps_current_last_n_and_every_branch_and_tag_head(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(
        maintain={"expire_snapshots": {"retention_threshold": "1s", "retain_last": 2}}
    )
    table = lh.add_table(TABLE, appends=6)
    history = [s.snapshot_id for s in table.metadata.snapshots]
    tagged, branched = history[0], history[1]
    table.manage_snapshots().create_tag(tagged, "v1").create_branch(branched, "audit").commit()
    time.sleep(1.2)

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["expire_snapshots"])

    assert result.ok, result.as_dict()
    kept = {s.snapshot_id for s in lh.table(TABLE).metadata.snapshots}
    assert kept == {history[-1], history[-2], tagged, branched}
    spark = get_spark(lh.config)
    name = TableRef.parse(TABLE).spark_identifier(lh.config.catalog.name)
    assert spark.sql(f"SELECT count(*) FROM {name} VERSION AS OF 'v1'").first()[0] == 10
    assert spark.sql(f"SELECT count(*) FROM {name} VERSION AS OF {history[-2]}").first()[0] == 50
    assert all(p.exists() for p in _live_files(lh, TABLE))


def test_orphan_removal_is_planned_away_only_when_nothing_old_is_unreferenced(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.add_table(TABLE, appends=3)
    # Everything in the table's folder (data, manifests, manifest lists, metadata) is old.
    month_ago = time.time() - timedelta(days=30).total_seconds()
    location = _local(lh.table(TABLE).location())
    for path in location.rglob("*"):
        os.utime(path, (month_ago, month_ago))
    ref = TableRef.parse(TABLE)

    quiet = Maintainer(lh.config).maintain_table(ref, ["remove_orphan_files"])

    assert quiet.ops[0].status == "skipped", quiet.as_dict()  # all of it is referenced
    orphan = lh.plant_file(TABLE, "left-by-a-failed-write.parquet", timedelta(days=30))
    cleaned = Maintainer(lh.config).maintain_table(ref, ["remove_orphan_files"])
    assert cleaned.ops[0].status == "completed", cleaned.as_dict()
    assert cleaned.ops[0].output["orphans_removed"] == 1
    assert not orphan.exists()
    assert all(p.exists() for p in _live_files(lh, TABLE))
