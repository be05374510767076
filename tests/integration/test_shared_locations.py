"""Issue 28: tables that share files. No maintenance deletes a file another table still
reads; tables can opt out, and tables another optimizer owns keep their rewrites to it.

Two shapes, both written by pyiceberg (not by this project):

* **twin**: ``lakehouse.twin`` registered (``register_table``) on the metadata file of
  ``lakehouse.orders``, as catalog migrations do; ``orders`` then overwritten, so its
  expired snapshots reach files only the twin still reads;
* **nested**: ``lakehouse.inner`` in a folder inside ``lakehouse.events``', both
  referencing one Parquet file (``add_files``), which ``events`` then overwrites away.

Each goes through expiry alone, deferred orphan deletion and a full pass. After each,
every table of the catalog reads back its rows in Spark and in DuckDB (and the twin every
snapshot it had, after the expiry of ``orders``), every file any of them references is on
disk, and the files that no table references any more (only the expired snapshots of all
sharing tables reached them) are gone.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from icegate_dagster.assets.partition_events import table_record
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.sharing import table_references
from icegate_dagster.spark.session import get_spark
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, LakehouseFactory, batch

ORDERS, TWIN = "lakehouse.orders", "lakehouse.twin"
EVENTS, INNER = "lakehouse.events", "lakehouse.inner"
MAINTAIN = {
    "expire_snapshots": {"retention_threshold": "1s", "retain_last": 1},
    "remove_orphan_files": {"retention_threshold": "24h"},
}
MONTH = timedelta(days=30)


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _referenced(lh: Lakehouse, *keys: str) -> set[Path]:
    """Every file any of the tables references (metadata files, manifest lists, manifests,
    the data and delete files they list live, statistics), as local paths."""
    return {_local(p) for key in keys for p in table_references(lh.table(key))}


def _back_date(lh: Lakehouse, key: str) -> None:
    """Every file in the table's folder made a month old: only being referenced keeps it
    from orphan removal."""
    stamp = time.time() - MONTH.total_seconds()
    for path in _local(lh.table(key).location()).rglob("*"):
        if path.is_file():
            os.utime(path, (stamp, stamp))


def _spark_rows(lh: Lakehouse, key: str) -> dict[int, Counter[tuple[Any, ...]]]:
    """Each snapshot the table keeps, read by Spark (every branch and tag head among them)."""
    spark = get_spark(lh.config)
    name = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    return {
        s.snapshot_id: Counter(
            tuple(r)
            for r in spark.sql(
                f"SELECT id, service, body FROM {name} VERSION AS OF {s.snapshot_id}"
            ).collect()
        )
        for s in lh.table(key).metadata.snapshots
    }


@functools.cache
def _duckdb() -> Any:
    return duckdb_iceberg()


def _duckdb_rows(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    """The table's current rows read by DuckDB's iceberg extension (no Spark, no pyiceberg)."""
    query = "SELECT id, service, body FROM iceberg_scan(?)"
    rows = _duckdb().execute(query, [lh.table(key).metadata_location])
    return Counter(tuple(r) for r in rows.fetchall())


def _current(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    """The table's current rows, read by Spark."""
    spark = get_spark(lh.config)
    name = TableRef.parse(key).spark_identifier(lh.config.catalog.name)
    return Counter(tuple(r) for r in spark.sql(f"SELECT id, service, body FROM {name}").collect())


def _assert_intact(
    lh: Lakehouse, rows: dict[str, Counter[tuple[Any, ...]]], before: set[Path]
) -> set[Path]:
    """Every table reads back its rows in Spark and DuckDB, every file any table references
    is on disk, and what no table references any more is gone; the files gone."""
    for key, expected in rows.items():
        assert _current(lh, key) == expected, key
        assert _duckdb_rows(lh, key) == expected, key
    after = _referenced(lh, *rows)
    assert [p for p in after if not p.exists()] == []
    gone = before - after
    assert [p for p in gone if p.exists() and not p.name.endswith(".metadata.json")] == []
    return gone


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = run_cli([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _op(report: dict[str, Any], key: str, operation: str) -> dict[str, Any]:
    [table] = [t for t in report["tables"] if t["table"] == key]
    [op] = [o for o in table["ops"] if o["operation"] == operation]
    return op  # type: ignore[no-any-return]


def _pyarrow_file(folder: Path, name: str, start: int) -> Path:
    """A Parquet file written by pyarrow alone (no field ids: ``add_files`` takes it)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    pq.write_table(batch(start, ("api",)), path)
    return path


def _deferred_round(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str], key: str, other: str, folders: list[Path]
) -> None:
    """Collect ``key``'s orphans with everything a month old: only the planted ones are
    candidates (``other``'s files are not); one of them is then registered in ``other``
    (``add_files``), and deleting the collected candidates keeps it, naming ``other``."""
    _back_date(lh, key)
    _back_date(lh, other)
    orphans = {lh.plant_file(key, "failed-write.parquet", MONTH)}
    orphans |= {
        _pyarrow_file(folder, f"orphan-{i}.parquet", 70_000) for i, folder in enumerate(folders)
    }
    adopted = _pyarrow_file(lh.data_dir(key) / "service=api", "adopted-later.parquet", 80_000)
    stamp = time.time() - MONTH.total_seconds()
    for path in [*orphans, adopted]:
        os.utime(path, (stamp, stamp))
    config = ["--config", str(lh.config_path), "--table", key]

    code, collected = _cli(capsys, "orphans", "--collect", *config)
    assert code == 0, collected
    [report] = collected["tables"]
    assert {_local(c["path"]) for c in report["candidates"]} == orphans | {adopted}

    lh.table(other).add_files([f"file://{adopted}"])
    rows = {k: _current(lh, k) for k in (key, other)}
    before = _referenced(lh, key, other)
    code, deleted = _cli(capsys, "orphans", "--delete-collected", *config)
    assert code == 0, deleted
    [report] = deleted["tables"]
    assert {_local(d["path"]) for d in report["deleted"]} == orphans
    [kept] = report["kept"]
    assert (_local(kept["path"]), kept["reason"]) == (adopted, "referenced")
    assert other in kept["detail"]
    assert adopted.exists() and not any(p.exists() for p in orphans)
    _assert_intact(lh, rows, before)


def test_twin_tables_registered_on_one_metadata_file_keep_each_others_files(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain=MAINTAIN)
    orders = lh.add_table(ORDERS, appends=4)
    lh.catalog.register_table(("lakehouse", "twin"), orders.metadata_location)
    twin_history = _spark_rows(lh, TWIN)
    orders.append(batch(50_000, ("api", "web")))
    orders.overwrite(batch(60_000, ("api", "web")))  # every earlier file now the twin's only
    time.sleep(1.1)
    rows = {ORDERS: _current(lh, ORDERS), TWIN: _current(lh, TWIN)}
    config = ["--config", str(lh.config_path)]

    # 1. Expiry alone: the dry run says what goes, the expiry deletes exactly that.
    before = _referenced(lh, ORDERS, TWIN)
    code, planned = _cli(capsys, "expire", "--dry-run", "--table", ORDERS, *config)
    assert code == 0
    plan = _op(planned, ORDERS, "expire_snapshots")["output"]
    assert plan["tables_consulted"] == [TWIN] and plan["files_kept_shared"] > 0
    code, expired = _cli(capsys, "expire", "--table", ORDERS, *config)
    assert code == 0, expired
    op = _op(expired, ORDERS, "expire_snapshots")
    assert op["status"] == "completed" and op["output"]["execution"] == "driver"
    assert op["output"]["tables_consulted"] == [TWIN]
    assert TWIN in op["details"]
    gone = _assert_intact(lh, rows, before)
    assert len(gone) == plan["files_to_free"] == op["output"]["files_freed"] > 0
    # The twin still reads every snapshot it had, on files that orders' expiry would
    # have deleted (its manifest lists under orders/metadata/snap-*.avro among them).
    assert _spark_rows(lh, TWIN) == twin_history
    logged = [r for r in lh.log_rows() if r["operation"] == "expire_snapshots"]
    assert TWIN in logged[-1]["details"]

    # 2. Deferred deletes: the twin's files are no orphans of orders.
    _deferred_round(lh, capsys, ORDERS, TWIN, [lh.data_dir(ORDERS)])
    rows = {ORDERS: _current(lh, ORDERS), TWIN: _current(lh, TWIN)}

    # 3. orders appended to, then a full pass over both side by side, everything a month
    # old and one orphan more.
    _back_date(lh, ORDERS)
    lh.table(ORDERS).append(batch(90_000, ("api", "web")))
    time.sleep(1.1)
    rows[ORDERS] = _current(lh, ORDERS)
    orphan = lh.plant_file(TWIN, "another-failed-write.parquet", MONTH)
    before = _referenced(lh, ORDERS, TWIN)
    maintainer = Maintainer(lh.config)
    results = maintainer.maintain(maintainer.discover())
    assert all(r.ok for r in results), [r.as_dict() for r in results]
    for result, other in zip(results, (ORDERS, TWIN)[::-1], strict=True):
        ops = {op.operation: op for op in result.ops}
        assert ops["expire_snapshots"].output["tables_consulted"] == [other], result.table
        assert ops["remove_orphan_files"].output["tables_consulted"] == [other], result.table
        metadata = table_record(maintainer, TableRef.parse(result.table), result).metadata
        assert metadata["tables_consulted"] == other
        assert other in metadata["shares_location_with"].text
        assert "gc.enabled=false" in metadata["sharing_warning"].text
    gone = _assert_intact(lh, rows, before)
    assert gone and not orphan.exists()
    assert {r.table for r in results} == {ORDERS, TWIN}


def test_a_table_nested_in_anothers_folder_keeps_the_files_it_shares(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain=MAINTAIN)
    events = lh.add_table(EVENTS, appends=3)
    inner = lh.catalog.create_table(
        ("lakehouse", "inner"),
        schema=SCHEMA,
        partition_spec=SPEC,
        location=f"{events.location()}/inner",
    )
    inner.append(batch(10_000, ("web",)))
    shared = _pyarrow_file(lh.data_dir(EVENTS) / "service=api", "shared.parquet", 20_000)
    events.add_files([f"file://{shared}"])
    lh.table(INNER).add_files([f"file://{shared}"])
    events = lh.table(EVENTS)
    events.overwrite(batch(30_000, ("api", "web")))  # events alone no longer reads it
    time.sleep(1.1)
    rows = {EVENTS: _current(lh, EVENTS), INNER: _current(lh, INNER)}
    config = ["--config", str(lh.config_path)]

    # 1. Expiry alone on the outer table: the shared file stays, its own old files go.
    before = _referenced(lh, EVENTS, INNER)
    code, expired = _cli(capsys, "expire", "--table", EVENTS, *config)
    assert code == 0, expired
    assert _op(expired, EVENTS, "expire_snapshots")["output"]["tables_consulted"] == [INNER]
    gone = _assert_intact(lh, rows, before)
    assert shared.exists() and gone
    assert any(p.suffix == ".parquet" for p in gone)  # events' own overwritten data files

    # 2. Deferred deletes from the outer folder: the inner table's live files are no
    # orphans, an orphan in the inner table's folder is.
    _deferred_round(lh, capsys, EVENTS, INNER, [_local(lh.table(INNER).location()) / "data"])
    rows = {EVENTS: _current(lh, EVENTS), INNER: _current(lh, INNER)}

    # 3. A full pass over both.
    _back_date(lh, EVENTS)
    before = _referenced(lh, EVENTS, INNER)
    code, passed = _cli(capsys, "run", *config)
    assert code == 0, passed
    assert _op(passed, INNER, "remove_orphan_files")["output"]["tables_consulted"] == [EVENTS]
    _assert_intact(lh, rows, before)
    assert shared.exists()


def test_when_a_sharing_table_cannot_be_read_expiry_commits_and_deletes_nothing(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain=MAINTAIN)
    orders = lh.add_table(ORDERS, appends=2)
    lh.catalog.register_table(("lakehouse", "twin"), orders.metadata_location)
    lh.table(TWIN).append(batch(40_000, ("api",)))
    # The twin's own newest manifest list is lost: which files it reads cannot be told.
    twin_snapshot = lh.table(TWIN).current_snapshot()
    assert twin_snapshot is not None
    _local(twin_snapshot.manifest_list).unlink()
    orders.overwrite(batch(60_000, ("api", "web")))
    time.sleep(1.1)
    snapshots = len(lh.table(ORDERS).metadata.snapshots)
    on_disk = {p for p in _local(orders.location()).rglob("*") if p.is_file()}

    code, report = _cli(capsys, "expire", "--table", ORDERS, "--config", str(lh.config_path))

    assert code == 1, report
    op = _op(report, ORDERS, "expire_snapshots")
    assert op["status"] == "failed"
    assert "deleted no file" in op["details"] and TWIN in op["details"]
    assert TWIN in op["output"]["sharing_error"]
    assert len(lh.table(ORDERS).metadata.snapshots) == 1 < snapshots  # committed
    assert all(p.exists() for p in on_disk)  # nothing deleted
    assert _current(lh, ORDERS) == _duckdb_rows(lh, ORDERS)


def test_one_unreadable_table_skips_orphan_removal_only_where_its_folder_may_lie(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37: ``lakehouse.inner`` (in ``events``' folder) has a corrupt metadata file.
    ``lakehouse.alone``, in its own folder, is maintained as usual (its orphan goes); in
    ``events``' folder, where the unreadable table's live files may lie, orphan removal is
    skipped naming it and deletes nothing; the unreadable table fails on its own."""
    lh = lakehouse_factory(maintain=MAINTAIN)
    alone = "lakehouse.alone"
    lh.add_table(alone, appends=2)
    lh.add_table(EVENTS, appends=2)
    lh.add_table_inside(EVENTS, INNER, age=MONTH)
    time.sleep(1.1)  # alone's first snapshot past its retention (1 s)
    for key in (alone, EVENTS):
        _back_date(lh, key)
    lonely = lh.plant_file(alone, "failed-write.parquet", MONTH)
    stray = lh.plant_file(EVENTS, "failed-write.parquet", MONTH)
    inner_files = {p for p in _local(lh.table(INNER).location()).rglob("*") if p.is_file()}
    _local(lh.table(INNER).metadata_location).write_text("{ not json")
    config = ["--config", str(lh.config_path)]

    code, report = _cli(capsys, "orphans", "--table", alone, "--table", EVENTS, *config)

    assert code == 0, [o for t in report["tables"] for o in t["ops"]]
    done = _op(report, alone, "remove_orphan_files")
    assert done["status"] == "completed", done
    assert not lonely.exists()
    skipped = _op(report, EVENTS, "remove_orphan_files")
    assert skipped["status"] == "skipped", skipped
    assert INNER in skipped["details"] and "cannot be read" in skipped["details"]
    assert stray.exists() and all(p.exists() for p in inner_files)  # nothing deleted there
    code, report = _cli(capsys, "orphans", "--table", INNER, *config)
    assert code == 1
    [failed] = report["tables"][0]["ops"]
    assert failed["status"] == "failed" and "cannot read its metadata" in failed["details"]
    # Expiry's deletes consult the same tables: apart from the unreadable one, they go on.
    code, report = _cli(capsys, "expire", "--table", alone, *config)
    expired = _op(report, alone, "expire_snapshots")
    assert code == 0 and expired["status"] == "completed", expired
    assert "sharing_error" not in expired["output"] and len(lh.table(alone).metadata.snapshots) == 1
