"""Orphan removal decided from metadata alone gives Iceberg's own answer, file for file.

``remove_orphan_files`` works out, without Spark, what Iceberg's procedure would delete
from a small table (``orphans.listing.iceberg_orphans``) and deletes that itself. Every
shape here is asked of both: Iceberg's procedure as a dry run in the suite's Spark
session, and the driver-side listing, on files back-dated so that only being referenced
(or hidden, or outside the listed folders) can keep them.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pyiceberg.partitioning import PartitionField, PartitionSpec
from pyiceberg.transforms import IdentityTransform

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.orphans import listing
from icegate_dagster.maintenance.orphans.listing import iceberg_orphans
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import SCHEMA, Lakehouse, LakehouseFactory, batch

MONTH = timedelta(days=30)


def _back_date(folder: Path, age: timedelta) -> None:
    """Every file under ``folder`` made ``age`` old."""
    stamp = time.time() - age.total_seconds()
    for path in folder.rglob("*"):
        if path.is_file():
            os.utime(path, (stamp, stamp))


def _plant(path: Path, age: timedelta = MONTH) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"PAR1" + os.urandom(64) + b"PAR1")
    stamp = time.time() - age.total_seconds()
    os.utime(path, (stamp, stamp))
    return path


def _icebergs_answer(lh: Lakehouse, key: str, older_than: datetime) -> list[str]:
    """Iceberg's own ``remove_orphan_files`` as a dry run: the files it would delete."""
    spark = get_spark(lh.config)
    ref = TableRef.parse(key)
    stamp = older_than.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    rows = spark.sql(
        f"CALL {lh.config.catalog.name}.system.remove_orphan_files("
        f"table => '{ref.namespace}.{ref.name}', "
        f"older_than => TIMESTAMP '{stamp}', dry_run => true)"
    ).collect()
    return sorted(row["orphan_file_location"] for row in rows)


def _location(lh: Lakehouse, key: str) -> Path:
    return Path(lh.table(key).location().removeprefix("file://").removeprefix("file:"))


def test_the_driver_side_answer_is_icebergs_on_every_shape(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    spark_session = get_spark(lh.config)  # the dry runs below; started before any file ages
    assert spark_session is not None

    # 1. A partitioned table whose metadata log keeps 2 files: older metadata files are
    #    orphans to Iceberg, and so is a file in a folder beside data/ and metadata/ (the
    #    pinned 1.10.2 lists the whole location); hidden files and folders are not listed.
    plain = "lakehouse.plain"
    lh.add_table(plain, appends=5)
    lh.table(plain).transaction().set_properties(
        {"write.metadata.previous-versions-max": "2"}
    ).commit_transaction()
    lh.table(plain).append(batch(50_000, ("api",)))
    root = _location(lh, plain)
    expected = {
        _plant(root / "data" / "service=api" / "orphan-in-a-partition.parquet"),
        _plant(root / "data" / "orphan-at-the-top.parquet"),
        _plant(root / "metadata" / "snap-0-1-lost-manifest-list.avro"),
        _plant(root / "metadata" / "lost-manifest-m0.avro"),
        _plant(root / "beside-data" / "stray.parquet"),
    }
    kept = [
        _plant(root / "data" / "_SUCCESS"),
        _plant(root / "data" / ".orphan-at-the-top.parquet.crc"),
        _plant(root / "data" / "_temporary" / "0" / "part-0.parquet"),
        _plant(root / "data" / ".staging" / "part-1.parquet"),
        _plant(root / "data" / "write-in-progress.parquet", timedelta(hours=1)),
    ]

    # 2. A partition field whose name starts with "_": its folders look hidden, yet
    #    Iceberg lists them (and so must we).
    hidden_spec = "lakehouse.hidden_spec"
    ref = TableRef.parse(hidden_spec)
    spec = PartitionSpec(PartitionField(2, 1000, IdentityTransform(), "_service"))
    table = lh.catalog.create_table(ref.identifier, schema=SCHEMA, partition_spec=spec)
    for i in range(3):
        table.append(batch(i * 1000, ("api", "web")))
    hidden_root = _location(lh, hidden_spec)
    assert (hidden_root / "data" / "_service=api").is_dir()
    hidden_orphan = _plant(hidden_root / "data" / "_service=api" / "orphan.parquet")
    hidden_kept = _plant(hidden_root / "data" / "_other=x" / "not-listed.parquet")

    # 3. Data written to a folder of its own (write.data.path) outside the location: the
    #    pinned Iceberg does not list it, so its orphans stay (a missed clean-up, not a loss).
    custom = "lakehouse.custom_path"
    ref = TableRef.parse(custom)
    data_path = lh.root / "elsewhere" / "custom_path_data"
    table = lh.catalog.create_table(
        ref.identifier,
        schema=SCHEMA,
        properties={"write.data.path": f"file://{data_path}"},
    )
    for i in range(3):
        table.append(batch(i * 1000, ("api",)))
    assert any(data_path.rglob("*.parquet"))
    custom_unlisted = _plant(data_path / "orphan.parquet")
    custom_orphan = _plant(_location(lh, custom) / "data" / "in-the-location.parquet")

    _back_date(lh.root / "warehouse", MONTH)
    _back_date(data_path, MONTH)
    os.utime(kept[-1], None)  # the write in progress stays young
    older_than = datetime.now(UTC) - timedelta(days=1)

    answers = {}
    for key in (plain, hidden_spec, custom):
        ours = iceberg_orphans(lh.table(key), older_than)
        assert ours is not None, key  # decided here, without Spark
        theirs = _icebergs_answer(lh, key, older_than)
        assert ours == theirs, (key, set(ours) ^ set(theirs))
        answers[key] = {Path(uri.removeprefix("file:")) for uri in ours}

    # Not only equal: right. Old metadata files beyond the log are Iceberg's orphans too.
    old_metadata = {p for p in answers[plain] if p.name.endswith(".metadata.json")}
    assert old_metadata and answers[plain] == expected | old_metadata
    assert not set(kept) & answers[plain]
    assert answers[hidden_spec] == {hidden_orphan} and hidden_kept.exists()
    assert answers[custom] == {custom_orphan} and custom_unlisted.exists()
    # Every file the tables read is outside every answer.
    for key in (plain, hidden_spec, custom):
        live = {Path(p) for p in lh.data_file_paths(key)}
        assert live and not live & answers[key]


def test_a_run_deletes_icebergs_answer_without_spark_and_the_procedure_path_agrees(
    lakehouse_factory: LakehouseFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run deletes what the dry run lists, checksums with their files; with more
    manifests than the driver reads (here: any), Iceberg's procedure decides the same."""
    lh = lakehouse_factory()
    outcomes = {}
    for key, manifests_read in (("lakehouse.driver", None), ("lakehouse.procedure", 0)):
        lh.add_table(key, appends=3)
        orphan = lh.plant_file(key, "orphan.parquet", MONTH)
        checksum = _plant(orphan.with_name(f".{orphan.name}.crc"))
        young = lh.plant_file(key, "young.parquet", timedelta(hours=2))
        rows = lh.rows_without_spark(key)
        if manifests_read is not None:
            monkeypatch.setattr(listing, "MAX_MANIFESTS", manifests_read)
        args = ["orphans", "--config", str(lh.config_path), "--table", key, "--json"]
        assert run_cli([*args, "--dry-run"]) == 0
        [listed] = json.loads(capsys.readouterr().out)["tables"][0]["ops"]
        assert run_cli(args) == 0
        [done] = json.loads(capsys.readouterr().out)["tables"][0]["ops"]
        monkeypatch.undo()

        assert done["status"] == "completed", done
        assert done["output"]["orphan_files"] == listed["output"]["orphan_files"]
        assert [Path(p.removeprefix("file:")) for p in done["output"]["orphan_files"]] == [orphan]
        assert not orphan.exists() and not checksum.exists()
        assert young.exists()
        assert lh.rows_without_spark(key) == rows
        outcomes[key] = "procedure_s" in done["output"]
    # The first was decided from metadata (no procedure), the second by Iceberg's.
    assert outcomes == {"lakehouse.driver": False, "lakehouse.procedure": True}
