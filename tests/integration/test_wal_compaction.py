"""WAL -> Iceberg compaction: thresholds, exactly-once across crashes, quarantine."""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pytest
import yaml

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.wal import CHECKPOINTS, FILES_PROPERTY
from icegate_dagster.spark.session import get_spark
from tests.lakehouse import SCHEMA, Lakehouse, LakehouseFactory

TABLE = "lakehouse.logs"
WAL_RULES = {"compaction": {"min_files": 4, "min_size_bytes": "100MB"}}


def wal_rows(start: int, count: int, service: str = "api") -> pa.Table:
    """Rows as an ingester writes them, in the table's schema."""
    base = datetime(2026, 11, 20, tzinfo=UTC)
    return pa.Table.from_pydict(
        {
            "id": list(range(start, start + count)),
            "service": [service] * count,
            "timestamp": [base + timedelta(seconds=i) for i in range(start, start + count)],
            "body": [f"wal row {i}" for i in range(start, start + count)],
        },
        schema=SCHEMA.as_arrow(),
    )


def as_rows(table: pa.Table) -> Counter[tuple[Any, ...]]:
    """The multiset of rows in the table's column order, as Spark returns them."""
    return Counter(
        (r["id"], r["service"], r["timestamp"].replace(tzinfo=None), r["body"])
        for r in table.to_pylist()
    )


def spark_rows(lh: Lakehouse, key: str) -> Counter[tuple[Any, ...]]:
    return Counter(
        (r[0], r[1], r[2].replace(tzinfo=None) if r[2] else None, r[3])
        for r in lh.rows(key).elements()
    )


def fill_wal(lh: Lakehouse, files: int, rows_per_file: int = 20) -> Counter[tuple[Any, ...]]:
    """``files`` WAL files over two services; returns the rows they hold."""
    expected: Counter[tuple[Any, ...]] = Counter()
    for i in range(files):
        rows = wal_rows(10_000 + i * rows_per_file, rows_per_file, ("api", "web")[i % 2])
        lh.write_wal(TABLE, rows, f"wal-{i:04d}.parquet")
        expected += as_rows(rows)
    return expected


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lakehouse.add_table(TABLE, appends=2)
    return lakehouse


def test_below_thresholds_nothing_is_ingested(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    fill_wal(lh, files=3)
    snapshots = len(lh.table(TABLE).metadata.snapshots)

    code = run_cli(["compact", "--config", str(lh.config_path), "--table", TABLE, "--json"])

    op = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]
    assert code == 0
    assert (op["operation"], op["status"]) == ("wal_compaction", "skipped")
    assert "below thresholds: 3 files" in op["details"]
    assert len(lh.wal_files(TABLE)) == 3
    assert len(lh.table(TABLE).metadata.snapshots) == snapshots


def test_wal_rows_land_once_and_the_files_are_deleted(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    old_rows = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=5)
    # An older ingester: int32 ids, no body column, nanosecond timestamps.
    legacy = pa.Table.from_pydict(
        {
            "id": pa.array([900, 901], pa.int32()),
            "service": ["api", "api"],
            "timestamp": pa.array(
                [datetime(2026, 11, 20, 1, tzinfo=UTC)] * 2, pa.timestamp("ns", tz="UTC")
            ),
        }
    )
    lh.write_wal(TABLE, legacy, "wal-legacy.parquet")
    expected[(900, "api", datetime(2026, 11, 20, 1), None)] += 1
    expected[(901, "api", datetime(2026, 11, 20, 1), None)] += 1

    code = run_cli(["compact", "--config", str(lh.config_path), "--table", TABLE, "--json"])

    op = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]
    assert code == 0, op
    assert op["status"] == "completed", op
    assert op["output"]["wal_files_ingested"] == 6
    assert op["output"]["rows_added"] == sum(expected.values())
    assert spark_rows(lh, TABLE) == old_rows + expected
    assert lh.wal_files(TABLE) == []
    current = lh.table(TABLE).current_snapshot()
    assert current is not None and current.summary is not None
    recorded = {entry[0] for entry in json.loads(current.summary[FILES_PROPERTY])}
    assert recorded == {f"wal-{i:04d}.parquet" for i in range(5)} | {"wal-legacy.parquet"}
    log = [r for r in lh.log_rows() if r["operation"] == "wal_compaction"]
    assert [r["status"] for r in log] == ["completed"]

    # A second run finds nothing to do and changes nothing.
    assert run_cli(["compact", "--config", str(lh.config_path), "--table", TABLE]) == 0
    assert spark_rows(lh, TABLE) == old_rows + expected


def test_files_arriving_during_a_run_wait_for_the_next(lh: Lakehouse) -> None:
    expected = fill_wal(lh, files=4)
    late = wal_rows(50_000, 7)

    def ingester_writes_now(point: str) -> None:
        if point == "before_write":
            lh.write_wal(TABLE, late, "wal-late.parquet")

    before = spark_rows(lh, TABLE)
    maintainer = Maintainer(lh.config, fault_hook=ingester_writes_now)
    result = maintainer.maintain_table(TableRef.parse(TABLE), ["wal_compaction"])

    assert result.ok, result.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == ["wal-late.parquet"]


class Crash(BaseException):
    """Stands for the process dying: nothing after the checkpoint runs, no handler catches it."""


@pytest.mark.parametrize("point", CHECKPOINTS)
def test_a_crash_at_any_step_then_a_rerun_ingests_exactly_once(lh: Lakehouse, point: str) -> None:
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=4)

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    with pytest.raises(Crash):
        Maintainer(lh.config, fault_hook=crash).maintain_table(
            TableRef.parse(TABLE), ["wal_compaction"]
        )
    rerun = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])

    assert rerun.ok, rerun.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []


def test_corrupt_and_mismatched_wal_files_are_quarantined_and_the_rest_lands(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=4)
    (lh.wal_dir(TABLE) / "wal-truncated.parquet").write_bytes(b"PAR1 this is not parquet")
    mismatched = pa.Table.from_pydict(
        {"id": [1], "service": ["api"], "timestamp": ["yesterday"], "body": ["x"]}
    )
    lh.write_wal(TABLE, mismatched, "wal-mismatched.parquet")

    code = run_cli(["compact", "--config", str(lh.config_path), "--table", TABLE, "--json"])

    op = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]
    assert code == 0
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []
    quarantine = lh.wal_dir(TABLE) / "_quarantine"
    assert sorted(p.name for p in quarantine.glob("*.parquet")) == [
        "wal-mismatched.parquet",
        "wal-truncated.parquet",
    ]
    reasons = {q["file"]: q["reason"] for q in op["output"]["quarantined"]}
    assert "unreadable Parquet" in reasons["wal-truncated.parquet"]
    assert "'timestamp'" in reasons["wal-mismatched.parquet"]
    assert "wal-truncated.parquet" in op["details"] and "wal-mismatched.parquet" in op["details"]
    assert "'timestamp'" in (quarantine / "wal-mismatched.parquet.reason.txt").read_text()
    log = [r for r in lh.log_rows() if r["operation"] == "wal_compaction"]
    assert "wal-truncated.parquet" in log[0]["details"]


def test_expiry_after_a_crash_cannot_drop_the_record_and_cause_duplicates(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory(
        maintain={**WAL_RULES, "expire_snapshots": {"retention_threshold": "1s"}}, wal=True
    )
    lh.add_table(TABLE, appends=2)
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=4)

    def crash(at: str) -> None:
        if at == "after_commit":
            raise Crash(at)

    with pytest.raises(Crash):
        Maintainer(lh.config, fault_hook=crash).maintain_table(
            TableRef.parse(TABLE), ["wal_compaction"]
        )
    time.sleep(1.2)  # the WAL commit is now older than the expiry threshold
    # Snapshot expiry runs before any compaction gets to settle the crash.
    expiry = Maintainer(lh.config).maintain_table(
        TableRef.parse(TABLE), ["optimize", "expire_snapshots"]
    )
    assert expiry.ok, expiry.as_dict()
    assert "first deleted 4 WAL files already committed" in expiry.ops[1].details
    rerun = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])

    assert rerun.ok
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []


def test_file_names_are_taken_literally_and_hidden_names_are_not_wal(lh: Lakehouse) -> None:
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=3)
    glob_like = wal_rows(60_000, 5)
    lh.write_wal(TABLE, glob_like, "x[1].parquet")  # a glob pattern to Hadoop, unless escaped
    lh.write_wal(TABLE, wal_rows(61_000, 5), "x1.parquet")
    expected += as_rows(glob_like) + as_rows(wal_rows(61_000, 5))
    for hidden in ("_in-progress.parquet", ".in-progress.parquet"):
        lh.write_wal(TABLE, wal_rows(62_000, 5), hidden)

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])

    assert result.ok, result.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    left = sorted(p.name for p in lh.wal_dir(TABLE).iterdir() if p.suffix == ".parquet")
    assert left == [".in-progress.parquet", "_in-progress.parquet"]


def test_a_new_file_reusing_an_ingested_name_is_ingested_too(lh: Lakehouse) -> None:
    before = spark_rows(lh, TABLE)
    first, second = wal_rows(70_000, 8), wal_rows(71_000, 8)  # same shape, same size
    lh.write_wal(TABLE, first, "seg-1.parquet")
    ref = TableRef.parse(TABLE)
    assert Maintainer(lh.config).maintain_table(ref, ["wal_compaction"], force=True).ok
    time.sleep(0.01)
    reused = lh.write_wal(TABLE, second, "seg-1.parquet")
    current = lh.table(TABLE).current_snapshot()
    assert current is not None and current.summary is not None
    [[name, size, _mtime]] = json.loads(current.summary[FILES_PROPERTY])
    assert (name, size) == ("seg-1.parquet", reused.stat().st_size)  # name and size alike

    assert Maintainer(lh.config).maintain_table(ref, ["wal_compaction"], force=True).ok

    assert spark_rows(lh, TABLE) == before + as_rows(first) + as_rows(second)


def test_wal_types_are_converted_exactly_or_refused(lh: Lakehouse) -> None:
    before = spark_rows(lh, TABLE)
    nanos = 1_700_000_000_000_000_999  # .000000999 s: floors to .000000, not .000001
    exact = pa.Table.from_pydict(
        {
            "id": pa.array([1, 2], pa.uint16()),  # fits a long
            "service": pa.array(["api", "api"]).dictionary_encode(),
            "timestamp": pa.array([nanos, -999], pa.timestamp("ns", tz="UTC")),
        }
    )
    lh.write_wal(TABLE, exact, "exact.parquet")
    too_wide = pa.Table.from_pydict({"id": pa.array([2**63 + 5], pa.uint64())})
    lh.write_wal(TABLE, too_wide, "too-wide.parquet")

    result = Maintainer(lh.config).maintain_table(
        TableRef.parse(TABLE), ["wal_compaction"], force=True
    )

    assert result.ok, result.as_dict()
    landed = spark_rows(lh, TABLE) - before
    assert sorted(landed) == [
        (1, "api", datetime(2023, 11, 14, 22, 13, 20), None),
        (2, "api", datetime(1969, 12, 31, 23, 59, 59, 999999), None),
    ]
    [quarantined] = result.ops[0].output["quarantined"]
    assert quarantined["file"] == "too-wide.parquet"
    assert "uint64" in quarantined["reason"]


def _fill_named_wal(lh: Lakehouse, key: str, start: int) -> Counter[tuple[Any, ...]]:
    """3 WAL files of 100 rows for ``key``; returns the rows."""
    expected: Counter[tuple[Any, ...]] = Counter()
    for i in range(3):
        rows = wal_rows(start + i * 100, 100, ("api", "web")[i % 2])
        lh.write_wal(key, rows, f"wal-{i}.parquet")
        expected += as_rows(rows)
    return expected


def _compact(lh: Lakehouse, key: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code = run_cli(["compact", "--config", str(lh.config_path), "--table", key, "--json"])
    op: dict[str, Any] = json.loads(capsys.readouterr().out)["tables"][0]["ops"][0]
    assert code == 0 and op["status"] == "completed", op
    return op


def test_a_table_name_a_uri_parser_would_change_keeps_its_own_wal(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 37, finding 4: compacting ``lakehouse.a#b`` deleted ``lakehouse.a``'s WAL files
    unread (its folder path was cut at ``#``) and left its own files to be ingested again.
    Each table ingests its own WAL, every row exactly once, whatever its name."""
    lh = lakehouse_factory(maintain={"compaction": {"min_files": 3}}, wal=True)
    names = ["a", "a#b", "a?x=1", "a%41", "aA", "a b", "zähler"]
    expected = {}
    lh.catalog.create_namespace("lakehouse")
    for n, name in enumerate(names):
        key = f"lakehouse.{name}"
        # pyiceberg's default location would be cut at '#' too: each table gets a plain one.
        location = (lh.root / "warehouse" / "lakehouse" / f"t{n}").as_uri()
        lh.catalog.create_table(("lakehouse", name), schema=SCHEMA, location=location)
        expected[key] = _fill_named_wal(lh, key, 100_000 * (n + 1))

    op = _compact(lh, "lakehouse.a#b", capsys)

    assert op["output"]["wal_files_ingested"] == 3 and op["output"]["rows_added"] == 300
    assert spark_rows(lh, "lakehouse.a#b") == expected["lakehouse.a#b"]
    assert lh.wal_files("lakehouse.a#b") == []
    assert lh.wal_files("lakehouse.a") == ["wal-0.parquet", "wal-1.parquet", "wal-2.parquet"]
    assert spark_rows(lh, "lakehouse.a") == Counter()

    for name in names:
        key = f"lakehouse.{name}"
        if key != "lakehouse.a#b":
            assert _compact(lh, key, capsys)["output"]["rows_added"] == 300, key
    for key, rows in expected.items():
        assert spark_rows(lh, key) == rows, key
        assert lh.wal_files(key) == [], key


def test_a_wal_root_whose_path_has_a_space_or_escapes_is_read_where_it_is(
    lakehouse_factory: LakehouseFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bare ``wal.root`` path becomes a percent-escaped ``file:`` URI; Spark was given that
    URI with the names appended, read ``%20`` literally, found nothing and every WAL file was
    quarantined. The root is resolved once, and Spark gets its exact path."""
    lh = lakehouse_factory(maintain={"compaction": {"min_files": 3}}, wal=True)
    lh.add_table(TABLE, appends=0)
    expected = _fill_named_wal(lh, TABLE, 5_000)
    moved = lh.root / "my wal #1 %41 ä"
    shutil.move(lh.root / "wal", moved)
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["wal"] = {"root": str(moved)}
    lh.config_path.write_text(yaml.safe_dump(raw))

    op = _compact(lh, TABLE, capsys)

    assert op["output"]["quarantined"] == [] and op["output"]["rows_added"] == 300
    assert spark_rows(lh, TABLE) == expected
    assert list((moved / "lakehouse" / "logs").glob("*.parquet")) == []


def test_an_s3_wal_of_a_config_registered_later_reaches_the_running_session(
    lh: Lakehouse,
) -> None:
    """The process's one session serves a later configuration too: its S3 WAL's S3A
    settings (per bucket, keys included) are set on the running session's Hadoop
    configuration, which Spark's file reads use."""
    spark = get_spark(lh.config)  # running, with or without S3 settings of its own
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["catalog"]["name"] = f"{raw['catalog']['name']}_s3wal"
    raw["wal"] = {
        "root": "s3://later-wal/ingest",
        "storage": {
            "s3.endpoint": "http://127.0.0.1:9",
            "s3.access-key-id": "AKIALATER",
            "s3.secret-access-key": "later-secret",
        },
    }
    later = lh.root / "later.yaml"
    later.write_text(yaml.safe_dump(raw))

    assert get_spark(load_config(later)) is spark

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get("fs.s3a.bucket.later-wal.endpoint") == "http://127.0.0.1:9"
    assert hadoop.get("fs.s3a.bucket.later-wal.path.style.access") == "true"
    assert hadoop.get("fs.s3a.bucket.later-wal.secret.key") == "later-secret"


@pytest.mark.parametrize("existing_snapshots", [1, 0], ids=["table-with-data", "empty-table"])
def test_wal_batches_into_a_format_v3_table_land_once_with_row_lineage(
    lakehouse_factory: LakehouseFactory, existing_snapshots: int
) -> None:
    """pyiceberg writes no format-version 3 snapshot, so a v3 table's batch is published
    through Iceberg's Java API (a local session): every row once, each with its own
    ``_row_id``, and the table's next row id past all of them."""
    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    ref = TableRef.parse(TABLE)
    spark = get_spark(lh.config)
    name = ref.spark_identifier(lh.config.catalog.name)
    spark.sql(  # made by Spark: pyiceberg 0.12 writes no format-version 3 metadata
        f"CREATE TABLE {name} (id BIGINT, service STRING, timestamp TIMESTAMP, body STRING) "
        "USING iceberg PARTITIONED BY (service) TBLPROPERTIES ('format-version'='3')"
    )
    if existing_snapshots:
        spark.sql(f"INSERT INTO {name} VALUES (1, 'api', TIMESTAMP '2026-11-01 00:00:00', 'x')")
    expected = spark_rows(lh, TABLE)

    for batch in range(2):
        for i in range(4):
            rows = wal_rows(20_000 + batch * 100 + i * 10, 10, ("api", "web")[i % 2])
            lh.write_wal(TABLE, rows, f"wal-{batch}-{i}.parquet")
            expected += as_rows(rows)
        outcome = Maintainer(lh.config).run_op(ref, "wal_compaction")
        assert outcome.status == "completed", outcome.details

    assert spark_rows(lh, TABLE) == expected
    assert lh.wal_files(TABLE) == []
    row_ids = [r[0] for r in spark.sql(f"SELECT _row_id FROM {name}").collect()]
    assert None not in row_ids
    assert len(set(row_ids)) == len(row_ids) == sum(expected.values())
    table = lh.table(TABLE)
    assert table.format_version == 3
    assert table.metadata.next_row_id is not None
    assert table.metadata.next_row_id > max(row_ids)
    assert set(table.metadata.refs) == {"main"}  # no staging branch left


def test_a_stale_staging_branch_of_a_format_v3_table_is_removed_and_the_wal_lands_once(
    lakehouse_factory: LakehouseFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that died between staging and publishing leaves its branch; a later run
    removes it once it is stale, also on a format-version 3 table (whose metadata pyiceberg
    0.12 cannot write), and ingests the WAL once."""
    from icegate_dagster.maintenance.wal import STAGING_PREFIX, publish

    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    ref = TableRef.parse(TABLE)
    name = ref.spark_identifier(lh.config.catalog.name)
    get_spark(lh.config).sql(
        f"CREATE TABLE {name} (id BIGINT, service STRING, timestamp TIMESTAMP, body STRING) "
        "USING iceberg PARTITIONED BY (service) TBLPROPERTIES ('format-version'='3')"
    )
    expected = fill_wal(lh, files=4)

    def die_before_publishing(point: str) -> None:
        if point == "before_commit":
            raise Crash(point)

    with pytest.raises(Crash):
        Maintainer(lh.config, fault_hook=die_before_publishing).run_op(ref, "wal_compaction")
    left = [r for r in lh.table(TABLE).metadata.refs if r.startswith(STAGING_PREFIX)]
    assert len(left) == 1
    monkeypatch.setattr(publish, "STALE_STAGING", timedelta(0))  # an hour has passed

    rerun = Maintainer(lh.config).run_op(ref, "wal_compaction")

    assert rerun.status == "completed", rerun.details
    assert spark_rows(lh, TABLE) == expected
    assert lh.wal_files(TABLE) == []
    assert set(lh.table(TABLE).metadata.refs) == {"main"}
