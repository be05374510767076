"""Issue 15, item 5, with real Spark and Iceberg 1.10.2: Puffin statistics after
compaction, ``clean_expired_metadata``, and an expiry dry run whose bytes are the bytes
the real expiry then frees on disk."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml
from pyiceberg.types import StringType

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer, TableRef, iceberg_java
from icegate_dagster.maintenance.ops.compute_table_stats import NDV_BLOB
from tests.duckdb_reader import duckdb_iceberg
from tests.lakehouse import Lakehouse, LakehouseFactory, batch

STATS = "lakehouse.stats"
PLAIN = "lakehouse.plain"
TABLE = "lakehouse.logs"


def _local(uri: str) -> Path:
    return Path(uri.removeprefix("file://").removeprefix("file:"))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    code = run_cli([*args, "--json"])
    return code, json.loads(capsys.readouterr().out)


def _op(report: dict[str, Any], table: str, name: str) -> dict[str, Any]:
    [entry] = [t for t in report["tables"] if t["table"] == table]
    [op] = [op for op in entry["ops"] if op["operation"] == name]
    return op


def _files_on_disk(lh: Lakehouse, key: str) -> dict[Path, int]:
    """Every file under the table's folder and its size. Hadoop's ``.crc`` side files
    (the local file system's checksums, which object stores do not have and Iceberg's
    metadata does not list) are left out."""
    found: dict[Path, int] = {}
    for folder, _, names in os.walk(_local(lh.table(key).location())):
        for name in names:
            if not name.endswith(".crc"):
                path = Path(folder) / name
                found[path] = path.stat().st_size
    return found


# --- compute_table_stats ---------------------------------------------------------------


def test_stats_are_registered_for_the_compacted_snapshot_once_and_only_where_enabled(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(
        maintain={
            "optimize": {"min_input_files": 2},
            "tables": {STATS: {"compute_table_stats": {"enabled": True}}},
        }
    )
    lh.add_table(STATS, appends=4)
    lh.add_table(PLAIN, appends=4)
    rows = {key: lh.rows(key) for key in (STATS, PLAIN)}
    maintainer = Maintainer(lh.config)
    refs = [TableRef.parse(STATS), TableRef.parse(PLAIN)]
    assert "compute_table_stats" in maintainer.operations_for(refs[0])
    assert "compute_table_stats" not in maintainer.operations_for(refs[1])

    first = {r.table: r for r in maintainer.maintain(refs)}

    assert all(r.ok for r in first.values()), [r.as_dict() for r in first.values()]
    optimize = first[STATS].op("optimize")
    assert optimize is not None and optimize.status == "completed"
    table = lh.table(STATS)
    current = table.current_snapshot()
    assert current is not None
    [stats] = table.metadata.statistics
    assert stats.snapshot_id == current.snapshot_id  # the compacted snapshot, not an older one
    sketched = {
        field for blob in stats.blob_metadata if blob.type == NDV_BLOB for field in blob.fields
    }
    assert sketched == {f.field_id for f in table.schema().fields}  # every column
    puffin = _local(stats.statistics_path)
    content = puffin.read_bytes()
    assert len(content) == stats.file_size_in_bytes
    assert content[:4] == b"PFA1" and content[-4:] == b"PFA1"  # Puffin's magic at both ends
    assert first[PLAIN].op("compute_table_stats") is None
    assert lh.table(PLAIN).metadata.statistics == []
    assert {key: lh.rows(key) for key in rows} == rows

    again = maintainer.maintain_table(refs[0])

    op = again.op("compute_table_stats")
    assert op is not None and op.status == "skipped"
    assert op.details == f"statistics already computed for snapshot {current.snapshot_id}"
    assert lh.table(STATS).metadata.statistics == [stats]


def test_stats_columns_are_the_ones_named_and_a_misnamed_one_fails_naming_it(
    lakehouse_factory: LakehouseFactory,
) -> None:
    bad = "lakehouse.bad"
    lh = lakehouse_factory(
        maintain={
            "tables": {
                STATS: {"compute_table_stats": {"enabled": True, "columns": ["service", "id"]}},
                bad: {"compute_table_stats": {"enabled": True, "columns": ["service", "tenant"]}},
            }
        }
    )
    lh.add_table(STATS, appends=1)
    lh.add_table(bad, appends=1)
    maintainer = Maintainer(lh.config)

    good = maintainer.maintain_table(TableRef.parse(STATS), ["compute_table_stats"])
    failed = maintainer.maintain_table(TableRef.parse(bad), ["compute_table_stats"])

    assert good.ok, good.as_dict()
    [stats] = lh.table(STATS).metadata.statistics
    schema = lh.table(STATS).schema()
    wanted = {schema.find_field("service").field_id, schema.find_field("id").field_id}
    assert {field for blob in stats.blob_metadata for field in blob.fields} == wanted
    assert not failed.ok
    details = failed.ops[0].details
    assert "'tenant'" in details and "not a column of lakehouse.bad" in details, details
    assert lh.table(bad).metadata.statistics == []


# --- clean_expired_metadata ------------------------------------------------------------


def _evolve_then_rewrite(lh: Lakehouse) -> None:
    """Three appends under spec 0 / schema 0, then a column added and the partition field
    dropped, every row rewritten under the new spec and schema, and one more commit: only
    snapshots that expire still use spec 0 and schema 0."""
    table = lh.add_table(TABLE, appends=3)
    with table.update_schema() as update:
        update.add_column("tenant", StringType())
    with table.update_spec() as update:
        update.remove_field("service")
    table = lh.table(TABLE)
    rows = table.scan().to_arrow().drop_columns(["tenant"])
    rows = rows.append_column("tenant", pa.array(["t1"] * rows.num_rows, pa.string()))
    table.overwrite(rows)
    lh.table(TABLE).append(rows.slice(0, 2))


def _duckdb_rows(lh: Lakehouse) -> Counter[tuple[Any, ...]]:
    """The table's rows as DuckDB's iceberg extension reads its current metadata file: a
    reader sharing no code with Spark or pyiceberg, so the trimmed metadata stays valid."""
    con = duckdb_iceberg()
    query = "SELECT id, service, body, tenant FROM iceberg_scan(?)"
    return Counter(
        tuple(r) for r in con.execute(query, [lh.table(TABLE).metadata_location]).fetchall()
    )


def _ids(lh: Lakehouse) -> tuple[list[int], list[int]]:
    metadata = lh.table(TABLE).metadata
    return [s.spec_id for s in metadata.partition_specs], [s.schema_id for s in metadata.schemas]


@pytest.mark.parametrize("clean", [True, False])
def test_expiry_drops_the_spec_and_schema_only_expired_snapshots_used(
    lakehouse_factory: LakehouseFactory, clean: bool
) -> None:
    expire = {"retention_threshold": "1s", "clean_expired_metadata": clean}
    lh = lakehouse_factory(maintain={"expire_snapshots": expire})
    _evolve_then_rewrite(lh)
    rows = lh.rows(TABLE)
    assert _ids(lh) == ([0, 1], [0, 1])
    time.sleep(1.2)
    ref = TableRef.parse(TABLE)

    result = Maintainer(lh.config).maintain_table(ref, ["expire_snapshots"])

    assert result.ok, result.as_dict()
    output = result.ops[0].output
    assert len(lh.table(TABLE).metadata.snapshots) == 1
    assert lh.rows(TABLE) == rows
    if clean:
        assert _ids(lh) == ([1], [1])
        assert (output["partition_specs_dropped"], output["schemas_dropped"]) == ([0], [0])
        # id, service, body, tenant: DuckDB types the timestamp its own way.
        expected: Counter[tuple[Any, ...]] = Counter()
        for row, count in rows.items():
            expected[(row[0], row[1], row[3], row[4])] += count
        assert _duckdb_rows(lh) == expected
        return
    assert _ids(lh) == ([0, 1], [0, 1])
    # Turned on later, it drops them at the next pass though no snapshot is left to expire.
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["maintain"]["expire_snapshots"]["clean_expired_metadata"] = True
    lh.config_path.write_text(yaml.safe_dump(raw))
    later = Maintainer(load_config(lh.config_path)).maintain_table(ref, ["expire_snapshots"])
    assert later.ops[0].status == "completed", later.as_dict()
    assert _ids(lh) == ([1], [1])
    assert lh.rows(TABLE) == rows


# --- the expiry dry run ------------------------------------------------------------------


def _history_with_compaction(lh: Lakehouse, maintainer: Maintainer, *, tag: bool) -> None:
    """Four appends (statistics computed on the last), a compaction, then two more appends:
    expired snapshots own data files, manifests, manifest lists and a statistics file."""
    ref = TableRef.parse(TABLE)
    lh.add_table(TABLE, appends=4)
    maintainer.maintain_table(ref, ["compute_table_stats", "optimize"])
    if tag:  # a tag on an early snapshot: a history that is not one line
        table = lh.table(TABLE)
        table.manage_snapshots().create_tag(table.metadata.snapshots[1].snapshot_id, "v1").commit()
    lh.table(TABLE).append(batch(90_000, ("api",)))
    lh.table(TABLE).append(batch(91_000, ("web",)))


@pytest.mark.parametrize(
    ("retain_last", "distributed", "tag"),
    [
        # The compaction expires too: its inputs go.
        (1, False, False),
        # The compaction is kept: the files it replaced are reachable from expired
        # snapshots only, so they go now on every path (the driver's incremental cleanup
        # of Iceberg 1.10 would have left them until the compaction expired).
        (3, False, False),
        (3, True, False),
        (3, False, True),
    ],
    ids=["driver-compaction-expired", "driver-compaction-kept", "procedure", "driver-tagged"],
)
def test_dry_run_reports_the_bytes_the_expiry_then_frees(
    lakehouse_factory: LakehouseFactory,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    retain_last: int,
    distributed: bool,
    tag: bool,
) -> None:
    lh = lakehouse_factory(
        maintain={
            "optimize": {"min_input_files": 2},
            "expire_snapshots": {"retention_threshold": "1s", "retain_last": retain_last},
            "compute_table_stats": {"enabled": True},
        }
    )
    _history_with_compaction(lh, Maintainer(lh.config), tag=tag)
    if distributed:  # the path large tables take: Iceberg's expire_snapshots procedure
        monkeypatch.setattr(iceberg_java, "DRIVER_SIDE_MAX_FILES", -1)
    rows = lh.rows(TABLE)
    time.sleep(1.2)  # every snapshot is now older than the threshold
    config = ["--config", str(lh.config_path), "--table", TABLE]
    before = _files_on_disk(lh, TABLE)

    code, planned = _run(capsys, "expire", "--dry-run", *config)
    assert code == 0, planned
    assert _files_on_disk(lh, TABLE) == before  # the dry run deleted nothing
    code, done = _run(capsys, "expire", *config)
    assert code == 0, done

    after = _files_on_disk(lh, TABLE)
    freed = {path: size for path, size in before.items() if path not in after}
    plan = _op(planned, TABLE, "expire_snapshots")["output"]
    assert plan["bytes_to_free"] == sum(freed.values()) > 0
    assert plan["files_to_free"] == len(freed)
    assert plan["statistics_files_to_free"] == 1
    assert plan["data_files_to_free"] > 0
    real = _op(done, TABLE, "expire_snapshots")["output"]
    assert real["deleted_data_files_count"] == plan["data_files_to_free"]
    assert real["deleted_manifest_lists_count"] == plan["manifest_lists_to_free"]
    if not distributed:
        assert real["bytes_freed"] == plan["bytes_to_free"]
    assert lh.rows(TABLE) == rows
    assert all(
        _local(p).exists() for p in lh.table(TABLE).inspect.all_files()["file_path"].to_pylist()
    )


def test_a_full_pass_dry_run_reports_the_same_expiry(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    lh = lakehouse_factory(maintain={"expire_snapshots": {"retention_threshold": "1s"}})
    lh.add_table(TABLE, appends=5)
    time.sleep(1.2)
    config = ["--config", str(lh.config_path), "--table", TABLE]
    before = _files_on_disk(lh, TABLE)

    code, single = _run(capsys, "expire", "--dry-run", *config)
    assert code == 0
    code, full = _run(capsys, "run", "--dry-run", *config)
    assert code == 0

    plan = _op(single, TABLE, "expire_snapshots")
    assert _op(full, TABLE, "expire_snapshots")["output"] == plan["output"]
    assert plan["output"]["snapshots_expiring"] == 4
    assert plan["details"].startswith("dry run: 4 of 5 snapshots would expire, deleting ")
    assert _files_on_disk(lh, TABLE) == before


def test_delete_files_off_expires_metadata_only_and_orphan_removal_frees_the_files(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Seed 002's --expire-keep-files: the expiry commits, the files wait for the orphan pass.
    lh = lakehouse_factory(
        maintain={
            "optimize": {"min_input_files": 2},
            "expire_snapshots": {"retention_threshold": "1s", "delete_files": False},
            "compute_table_stats": {"enabled": True},
        }
    )
    _history_with_compaction(lh, Maintainer(lh.config), tag=False)
    rows = lh.rows(TABLE)
    time.sleep(1.2)
    config = ["--config", str(lh.config_path), "--table", TABLE]
    code, planned = _run(capsys, "expire", "--dry-run", *config)
    assert code == 0, planned
    plan = _op(planned, TABLE, "expire_snapshots")
    assert plan["details"].startswith("dry run: 6 of 7 snapshots would expire, leaving to ")
    assert plan["output"]["files_deleted"] is False and plan["output"]["data_files_to_free"] > 0
    before = _files_on_disk(lh, TABLE)

    code, done = _run(capsys, "expire", *config)

    assert code == 0, done
    op = _op(done, TABLE, "expire_snapshots")
    assert op["status"] == "completed", op
    assert "deleted no file (delete_files: false)" in op["details"]
    assert op["output"]["files_deleted"] is False
    assert op["output"]["snapshots_expired"] == plan["output"]["snapshots_expiring"] == 6
    assert op["output"]["files_freed"] == op["output"]["deleted_data_files_count"] == 0
    assert len(lh.table(TABLE).metadata.snapshots) == 1
    assert before.keys() <= _files_on_disk(lh, TABLE).keys()  # metadata only: none deleted
    assert lh.rows(TABLE) == rows
    # remove_orphan_files then frees exactly what the expiry left (back-dated past its floor).
    month_ago = time.time() - 30 * 86400
    for path in before:
        os.utime(path, (month_ago, month_ago))
    code, orphans = _run(capsys, "orphans", *config)
    assert code == 0, orphans
    after = _files_on_disk(lh, TABLE)
    freed = {path: size for path, size in before.items() if path not in after}
    assert len(freed) == plan["output"]["files_to_free"]
    assert sum(freed.values()) == plan["output"]["bytes_to_free"]
    assert lh.rows(TABLE) == rows
