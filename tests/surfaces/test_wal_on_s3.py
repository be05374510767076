"""The WAL in object storage: ``wal.root: s3://...`` on SeaweedFS's S3 on loopback.

The tables live in a SQL catalog (SQLite, local warehouse); only the WAL is in S3, opened
with the catalog's S3 settings (``s3.endpoint``, keys, region, path style) or with
``wal.storage`` of its own. The Python side (listing, sizing, quarantine, deletes, the
sensor's listing of the root) runs with no JVM; the ingest itself reads the WAL files
from S3 with Spark through Hadoop's S3A (set-up's jars, :func:`s3a_jars`).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pyarrow import fs

from icegate_dagster.assets.names import BATCH_JOB, iceberg_tables
from icegate_dagster.assets.runs import batch_entries
from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import IcegateConfig, load_config
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.wal import LEDGER_PROPERTY, configured_wal_root, list_wal_files
from icegate_dagster.resources import LakehouseResource
from icegate_dagster.sensors.wal_sensor import wal_size_sensor
from icegate_dagster.spark.jars import JARS_DIR_ENV, iceberg_runtime_jar, jars_dir, s3_jars
from tests.integration.test_wal_compaction import as_rows, wal_rows
from tests.lakehouse import SCHEMA, SPEC, Lakehouse, batch, make_lakehouse
from tests.lease_holder import held_by_another_process
from tests.ps_sampler import PsSampler
from tests.surfaces.seaweedfs_server import (
    ACCESS_KEY_ENV,
    REGION,
    SECRET_KEY_ENV,
    SeaweedServer,
    seaweedfs_fixture,  # noqa: F401
)

TABLE = "lakehouse.logs"
MIN_WAL_FILES = 4
CLI = Path(sys.executable).parent / "icegate-maintain"
#: Hadoop's S3A connector matching PySpark's Hadoop 3.3.4, and its AWS SDK: Spark reads the
#: WAL's Parquet from S3 with them. Set-up fetches both from Maven Central (jars.lock).
S3A_ARTIFACTS = ("hadoop-aws", "aws-java-sdk-bundle")


def s3a_jars() -> str:
    """``spark.jars`` naming set-up's S3A connector and its SDK (a lakehouse whose
    ``wal.root`` is in S3 gets them anyway; naming them keeps the test's class path
    explicit); fails (never skips) when set-up's jars are missing."""
    jars = [jar for jar in s3_jars() if jar.name.startswith(S3A_ARTIFACTS)]
    if len(jars) != len(S3A_ARTIFACTS):
        pytest.fail(f"Hadoop's S3A jars are missing from {jars_dir()}: run scripts/setup.sh")
    return ",".join(str(jar) for jar in jars)


def runtime_only(folder: Path) -> Path:
    """A folder of jars holding Iceberg's runtime and no S3 jar: Spark without S3A."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / iceberg_runtime_jar().name).symlink_to(iceberg_runtime_jar())
    return folder


def s3_client(server: SeaweedServer) -> fs.S3FileSystem:
    """The test's own S3 client (pyarrow), independent of the code under test."""
    return fs.S3FileSystem(
        endpoint_override=server.s3_endpoint.removeprefix("http://"),
        scheme="http",
        access_key=server.access_key,
        secret_key=server.secret_key,
        region=REGION,
        force_virtual_addressing=False,
        allow_bucket_creation=True,
        allow_bucket_deletion=True,
    )


def storage_block(server: SeaweedServer) -> dict[str, str]:
    """S3 settings as a config file writes them: the keys through ``${VAR}``."""
    return {
        "s3.endpoint": server.s3_endpoint,
        "s3.access-key-id": f"${{{ACCESS_KEY_ENV}}}",
        "s3.secret-access-key": f"${{{SECRET_KEY_ENV}}}",
        "s3.region": REGION,
        "s3.path-style-access": "true",
    }


@dataclass
class S3WalLakehouse:
    """A SQL-catalog lakehouse whose ``wal.root`` is a prefix of a bucket of its own."""

    lh: Lakehouse
    server: SeaweedServer
    client: fs.S3FileSystem
    bucket: str
    outputs: list[str] = field(default_factory=list)

    @property
    def config(self) -> IcegateConfig:
        return load_config(self.lh.config_path)

    @property
    def wal_root(self) -> str:
        return f"s3://{self.bucket}/wal"

    def folder(self, key: str) -> str:
        ref = TableRef.parse(key)
        return f"{self.bucket}/wal/{ref.namespace}/{ref.name}"

    def put(self, key: str, rows: pa.Table, name: str) -> None:
        """One WAL file as an ingester lands it on S3: one PUT, the object appears whole."""
        pq.write_table(rows, f"{self.folder(key)}/{name}", filesystem=self.client)

    def names(self, folder: str) -> list[str]:
        infos = self.client.get_file_info(fs.FileSelector(folder, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs.FileType.File)

    def waiting(self, key: str) -> list[str]:
        return [n for n in self.names(self.folder(key)) if n.endswith(".parquet")]

    def quarantined(self, key: str) -> list[str]:
        return self.names(f"{self.folder(key)}/_quarantine")

    def fill(self, key: str, files: int, rows_per_file: int = 20) -> Counter[tuple[Any, ...]]:
        """``files`` good WAL files; the rows they hold."""
        expected: Counter[tuple[Any, ...]] = Counter()
        for i in range(files):
            rows = wal_rows(10_000 + i * rows_per_file, rows_per_file, ("api", "web")[i % 2])
            self.put(key, rows, f"wal-{i:04d}.parquet")
            expected += as_rows(rows)
        return expected

    def cli(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        clean = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        proc = subprocess.run(
            [str(CLI), *args, "--config", str(self.lh.config_path)],
            capture_output=True,
            text=True,
            timeout=600,
            env={**clean, **(env or {})},
        )
        self.outputs += [proc.stdout, proc.stderr]
        return proc

    def assert_no_secrets(self) -> None:
        for text in self.outputs:
            for value in self.server.secrets:
                assert value not in text, "a key leaked into the output"


def s3_wal_lakehouse(
    server: SeaweedServer,
    root: Path,
    *,
    own_storage: bool,
    spark: dict[str, Any] | None = None,
    maintain: dict[str, Any] | None = None,
) -> S3WalLakehouse:
    """The lakehouse, its S3 settings in the catalog block or (``own_storage``) under
    ``wal.storage``, the catalog then naming no S3 at all."""
    rules = {"compaction": {"min_files": MIN_WAL_FILES}, **(maintain or {})}
    lh = make_lakehouse(root, maintain=rules)
    bucket = f"wal-{secrets.token_hex(4)}"
    client = s3_client(server)
    client.create_dir(bucket)
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["wal"] = {"root": f"s3://{bucket}/wal"}
    if own_storage:
        raw["wal"]["storage"] = storage_block(server)
    else:
        raw["catalog"].update(storage_block(server))
    if spark:
        raw["spark"] = {**raw["spark"], "conf": spark}
    lh.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert server.access_key not in lh.config_path.read_text()
    lh = Lakehouse(lh.root, lh.config_path, load_config(lh.config_path), lh.catalog)
    lh.add_table(TABLE, appends=1)
    return S3WalLakehouse(lh, server, client, bucket)


@pytest.fixture
def keys_in_env(seaweedfs: SeaweedServer) -> Iterator[None]:
    """The keys reach icegate through the environment (``${VAR}``), never the file."""
    saved = {name: os.environ.get(name) for name in seaweedfs.env()}
    os.environ.update(seaweedfs.env())
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(params=[False, True], ids=["catalog-s3-settings", "wal-storage"])
def s3wal(
    request: pytest.FixtureRequest, seaweedfs: SeaweedServer, tmp_path: Path, keys_in_env: None
) -> Iterator[S3WalLakehouse]:
    lakehouse = s3_wal_lakehouse(seaweedfs, tmp_path / "lh", own_storage=request.param)
    yield lakehouse
    lakehouse.assert_no_secrets()


def test_files_that_do_not_fit_the_table_are_quarantined_on_s3_with_their_reason(
    s3wal: S3WalLakehouse,
) -> None:
    """No JVM: every waiting file has a column the table lacks, so the run quarantines them
    all (listing, sizing, a reason object, a move on S3) and ingests nothing."""
    bad = pa.table({"id": pa.array([1, 2], pa.int64()), "unknown": ["x", "y"]})
    for i in range(MIN_WAL_FILES):
        s3wal.put(TABLE, bad, f"bad-{i}.parquet")
    snapshots = len(s3wal.lh.table(TABLE).metadata.snapshots)

    outcome = Maintainer(s3wal.config).run_op(TableRef.parse(TABLE), "wal_compaction")
    s3wal.outputs.append(outcome.details)

    assert outcome.status == "failed", outcome.details
    assert f"all {MIN_WAL_FILES} waiting WAL files were quarantined" in outcome.details
    assert s3wal.waiting(TABLE) == []
    names = [f"bad-{i}.parquet" for i in range(MIN_WAL_FILES)]
    assert s3wal.quarantined(TABLE) == sorted([*names, *(n + ".reason.txt" for n in names)])
    reason = s3wal.client.open_input_stream(
        f"{s3wal.folder(TABLE)}/_quarantine/bad-0.parquet.reason.txt"
    ).read()
    assert b"unknown" in reason
    assert len(s3wal.lh.table(TABLE).metadata.snapshots) == snapshots  # nothing committed


def test_a_quarantine_move_cut_short_on_s3_is_finished_not_doubled(s3wal: S3WalLakehouse) -> None:
    """S3 has no rename: a move is a copy, then a delete of the source. A run killed between
    the two leaves the file in both places; the next run finishes the move (one copy in
    quarantine, none waiting) instead of quarantining a second copy of the same rows, which
    a person moving the quarantine back would ingest twice."""
    bad = pa.table({"id": pa.array([1, 2], pa.int64()), "unknown": ["x", "y"]})
    for i in range(MIN_WAL_FILES):
        s3wal.put(TABLE, bad, f"bad-{i}.parquet")
    # The crashed run's copy of bad-0 (its reason object written first, as a run does).
    quarantine = f"{s3wal.folder(TABLE)}/_quarantine"
    s3wal.client.copy_file(f"{s3wal.folder(TABLE)}/bad-0.parquet", f"{quarantine}/bad-0.parquet")
    with s3wal.client.open_output_stream(f"{quarantine}/bad-0.parquet.reason.txt") as out:
        out.write(b"bad-0.parquet: a column the table lacks\n")

    outcome = Maintainer(s3wal.config).run_op(TableRef.parse(TABLE), "wal_compaction")
    s3wal.outputs.append(outcome.details)

    assert f"all {MIN_WAL_FILES} waiting WAL files were quarantined" in outcome.details
    assert s3wal.waiting(TABLE) == []
    names = [f"bad-{i}.parquet" for i in range(MIN_WAL_FILES)]
    assert s3wal.quarantined(TABLE) == sorted([*names, *(n + ".reason.txt" for n in names)])


def test_on_s3_the_tables_lease_keeps_a_second_ingester_out(
    seaweedfs: SeaweedServer, tmp_path: Path, keys_in_env: None
) -> None:
    """No ``flock`` on S3: the table's lease in the shared store is what keeps two runs of
    one table apart. While another process holds it, a run touches no WAL object (here
    files it would quarantine); once released, the same run does its work."""
    s3wal = s3_wal_lakehouse(
        seaweedfs, tmp_path / "lh", own_storage=False, maintain={"lock_wait": "1s"}
    )
    bad = pa.table({"id": pa.array([1, 2], pa.int64()), "unknown": ["x", "y"]})
    names = [f"bad-{i}.parquet" for i in range(MIN_WAL_FILES)]
    for name in names:
        s3wal.put(TABLE, bad, name)
    ref = TableRef.parse(TABLE)

    with held_by_another_process(s3wal.lh.config_path, TABLE) as pid:
        held = Maintainer(s3wal.config).run_op(ref, "wal_compaction")

    assert held.status == "skipped", held.details
    assert f":{pid}:other-run" in held.details
    assert s3wal.waiting(TABLE) == names and s3wal.quarantined(TABLE) == []
    free = Maintainer(s3wal.config).run_op(ref, "wal_compaction")
    assert f"all {MIN_WAL_FILES} waiting WAL files were quarantined" in free.details
    assert s3wal.waiting(TABLE) == []
    s3wal.outputs += [held.details, free.details]
    s3wal.assert_no_secrets()


def test_a_dry_run_counts_and_sizes_the_wal_objects_on_s3(s3wal: S3WalLakehouse) -> None:
    """``compact --dry-run`` (its own process, no JVM) lists the table's WAL folder on S3:
    the count and bytes are the objects' as S3 reports them; names starting with ``_`` or
    ``.`` and other tables' folders do not count."""
    s3wal.fill(TABLE, files=3)
    s3wal.put(TABLE, wal_rows(1, 1), ".in-flight.parquet")
    s3wal.put("lakehouse.other", wal_rows(1, 1), "elsewhere.parquet")
    infos = s3wal.client.get_file_info(fs.FileSelector(s3wal.folder(TABLE)))
    sizes = {i.base_name: i.size for i in infos if i.type == fs.FileType.File}
    expected_bytes = sum(size for name, size in sizes.items() if name.startswith("wal-"))

    proc = s3wal.cli("compact", "--table", TABLE, "--dry-run")

    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dry run: 3 WAL files ({expected_bytes} bytes) waiting" in proc.stdout, proc.stdout
    assert s3wal.waiting(TABLE) == [
        ".in-flight.parquet",
        *(f"wal-{i:04d}.parquet" for i in range(3)),
    ]


def _ledger(*identities: tuple[str, int, int]) -> str:
    return json.dumps(sorted(list(i) for i in identities), separators=(",", ":"))


def test_wal_objects_a_commit_already_holds_are_deleted_from_s3_not_ingested_again(
    s3wal: S3WalLakehouse,
) -> None:
    """As after a crash between a WAL commit and its deletes: the table's ledger records two
    of three objects (name, size, modification time as S3 lists them). A run deletes those
    two from S3 with no JVM and leaves the third, which is new, below the threshold."""
    s3wal.fill(TABLE, files=3)
    config = s3wal.config
    ref = TableRef.parse(TABLE)
    files = list_wal_files(configured_wal_root(config), ref)
    assert [f.name for f in files] == [f"wal-{i:04d}.parquet" for i in range(3)]
    committed = [f.identity for f in files[:2]]
    with s3wal.lh.table(TABLE).transaction() as transaction:
        transaction.set_properties({LEDGER_PROPERTY: _ledger(*committed)})
    rows_before = s3wal.lh.rows_without_spark(TABLE)

    outcome = Maintainer(config).run_op(ref, "wal_compaction")
    s3wal.outputs.append(outcome.details)

    assert outcome.status == "completed", outcome.details
    assert "deleted 2 WAL files an earlier commit already holds" in outcome.details
    assert s3wal.waiting(TABLE) == ["wal-0002.parquet"]
    assert s3wal.lh.rows_without_spark(TABLE) == rows_before  # nothing ingested again


def test_the_wal_sensor_sizes_every_table_with_one_listing_of_the_s3_root(
    s3wal: S3WalLakehouse,
) -> None:
    """``wal_size_sensor``'s listing of ``wal.root`` (in its background thread) reaches the
    bucket with the configured settings: the table over ``min_files`` gets a run, with its
    backlog; nothing is requested for the table below it."""
    s3wal.lh.add_table("lakehouse.spans", appends=1)
    s3wal.fill(TABLE, files=MIN_WAL_FILES)
    s3wal.put("lakehouse.spans", wal_rows(1, 2), "one.parquet")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(iceberg_tables.name, [TABLE, "lakehouse.spans"])
    context = dg.build_sensor_context(
        instance=instance,
        resources={"lakehouse": LakehouseResource(config_path=str(s3wal.lh.config_path))},
    )

    result = wal_size_sensor(context)

    assert isinstance(result, dg.SensorResult), result
    skip = result.skip_reason.skip_message if result.skip_reason else ""
    s3wal.outputs.append(str(skip))
    [request] = result.run_requests or []
    [entry] = batch_entries(
        dg.DagsterRun(job_name=BATCH_JOB, run_id="r", run_config=request.run_config)
    )
    assert (entry.table, entry.operations) == (TABLE, ("wal_compaction",))
    s3wal.outputs.append(json.dumps(request.run_config) + json.dumps(request.tags))


#: The WAL's S3 settings in the catalog block (its tables on local disk, read by Spark
#: through ResolvingFileIO; S3FileIO alone had Iceberg retry loading their metadata for
#: minutes, issue 39) or under ``wal.storage``. One test uses it: both run.
@pytest.fixture(params=[False, True], ids=["catalog-s3-settings", "wal-storage"])
def s3wal_spark(
    request: pytest.FixtureRequest, seaweedfs: SeaweedServer, tmp_path: Path, keys_in_env: None
) -> Iterator[S3WalLakehouse]:
    """An S3 WAL lakehouse whose Spark has Hadoop's S3A connector."""
    lakehouse = s3_wal_lakehouse(
        seaweedfs, tmp_path / "lh", own_storage=request.param, spark={"spark.jars": s3a_jars()}
    )
    yield lakehouse
    lakehouse.assert_no_secrets()


def test_compact_ingests_every_wal_row_from_s3_once_and_deletes_the_objects(
    s3wal_spark: S3WalLakehouse,
) -> None:
    """``icegate-maintain compact`` in its own process: Spark reads the WAL objects through
    S3A with the configured endpoint and keys, which no command line shows (driver and
    JVM sampled with ``ps`` throughout), one commit appends every row once, and the
    objects are deleted from S3 only after it."""
    lh = s3wal_spark.lh
    before = lh.rows_without_spark(TABLE)
    expected = s3wal_spark.fill(TABLE, files=MIN_WAL_FILES + 1)

    with PsSampler() as ps:
        proc = s3wal_spark.cli("compact", "--table", TABLE)

    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert ps.samples > 20
    # The launch was seen: its public S3A settings are on spark-submit's command line.
    assert any(f"fs.s3a.bucket.{s3wal_spark.bucket}.endpoint" in line for line in ps.lines)
    s3wal_spark.outputs += sorted(ps.lines)  # checked for the keys at teardown
    assert f"ingested {MIN_WAL_FILES + 1} WAL files" in proc.stdout, proc.stdout
    assert table_rows(lh) == _rows_of(before) + expected
    assert s3wal_spark.waiting(TABLE) == []
    assert s3wal_spark.quarantined(TABLE) == []


def _stored(s3wal: S3WalLakehouse, path: str) -> bool:
    """Whether a table's file (on local disk or in S3) is still there."""
    where = urlsplit(path)
    if where.scheme == "s3":
        info = s3wal.client.get_file_info(f"{where.netloc}{where.path}")
        return bool(info.type != fs.FileType.NotFound)
    return Path(where.path).exists()


#: Every small file worth compacting, every snapshot but the current one expirable.
_FULL_PASS = {
    "optimize": {"min_input_files": 2},
    "expire_snapshots": {"retention_threshold": "1s", "retain_last": 1},
}


def test_a_cold_run_maintains_tables_on_local_disk_and_in_s3_with_the_catalogs_keys(
    seaweedfs: SeaweedServer, tmp_path: Path, keys_in_env: None
) -> None:
    """A SQL catalog on local disk whose ``s3.*`` keys serve the S3 WAL may also hold a
    table placed in S3 (created there by pyiceberg with those keys). One cold ``run``
    (its own process and JVM) maintains both: Spark's catalog opens each table's files
    with the FileIO of their scheme, so each table's WAL is ingested from S3 once, its
    files compacted and its expired snapshots' files deleted (from disk, from S3), instead
    of Iceberg retrying the S3 table's metadata for minutes through a FileIO with no S3."""
    s3wal = s3_wal_lakehouse(
        seaweedfs,
        tmp_path / "lh",
        own_storage=False,
        spark={"spark.jars": s3a_jars()},
        maintain=_FULL_PASS,
    )
    spans = "lakehouse.spans"
    catalog = open_catalog(s3wal.config.catalog)  # with the s3.* keys
    location = f"s3://{s3wal.bucket}/tables/spans"
    table = catalog.create_table(
        TableRef.parse(spans).identifier, schema=SCHEMA, partition_spec=SPEC, location=location
    )
    for i in range(3):
        table.append(batch(i * 1000, ("api",)))
    s3wal.lh.table(TABLE).append(batch(5000, ("api", "web")))  # two commits on disk too
    expected: dict[str, Counter[tuple[Any, ...]]] = {}
    old_files: dict[str, set[str]] = {}
    for key in (TABLE, spans):
        now = catalog.load_table(TableRef.parse(key).identifier)
        old_files[key] = set(now.inspect.files()["file_path"].to_pylist())
        rows = Counter(tuple(r.values()) for r in now.scan().to_arrow().to_pylist())
        expected[key] = _rows_of(rows) + s3wal.fill(key, files=MIN_WAL_FILES)
    assert all(path.startswith(f"{location}/") for path in old_files[spans])
    assert all(path.startswith("file:") for path in old_files[TABLE])
    time.sleep(1.2)  # past the expiry threshold

    proc = s3wal.cli("run", "--json")

    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    reports = {report["table"]: report for report in json.loads(proc.stdout)["tables"]}
    for key in (TABLE, spans):
        ops = {op["operation"]: op for op in reports[key]["ops"]}
        for operation in ("wal_compaction", "optimize", "expire_snapshots"):
            assert ops[operation]["status"] == "completed", (key, ops[operation])
        assert f"ingested {MIN_WAL_FILES} WAL files" in ops["wal_compaction"]["details"]
        after = catalog.load_table(TableRef.parse(key).identifier)
        assert after.location().startswith(location if key == spans else "file:")
        rows = Counter(tuple(r.values()) for r in after.scan().to_arrow().to_pylist())
        assert _rows_of(rows) == expected[key], key
        assert s3wal.waiting(key) == []
        files = set(after.inspect.files()["file_path"].to_pylist())
        assert files and not files & old_files[key], key  # every file rewritten
        folder = urlsplit(after.location())  # Hadoop writes file:/..., pyiceberg file:///...
        assert all(
            (where.scheme, where.netloc) == (folder.scheme, folder.netloc)
            and where.path.startswith(folder.path + "/")
            for where in map(urlsplit, files)
        ), (key, files)
        kept = [path for path in old_files[key] if _stored(s3wal, path)]
        assert kept == [], key  # deleted with the snapshots that expired
    s3wal.assert_no_secrets()


def test_without_s3a_in_spark_the_ingest_fails_saying_so_and_quarantines_nothing(
    seaweedfs: SeaweedServer, tmp_path: Path, keys_in_env: None
) -> None:
    """Spark without Hadoop's S3A connector cannot read an S3 WAL. That is Spark's lack,
    never the files' fault: ``compact`` fails naming the connector, every object waits for
    a run that can read it, none is quarantined."""
    s3wal = s3_wal_lakehouse(seaweedfs, tmp_path / "lh", own_storage=True)  # no spark.jars
    s3wal.fill(TABLE, files=MIN_WAL_FILES)
    rows_before = s3wal.lh.rows_without_spark(TABLE)

    # Spark's jars from a folder without S3A (as on a host whose set-up predates it).
    no_s3a = {JARS_DIR_ENV: str(runtime_only(tmp_path / "jars"))}
    proc = s3wal.cli("compact", "--table", TABLE, env=no_s3a)

    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "hadoop-aws" in proc.stdout, proc.stdout
    assert s3wal.quarantined(TABLE) == []
    assert s3wal.waiting(TABLE) == [f"wal-{i:04d}.parquet" for i in range(MIN_WAL_FILES)]
    assert s3wal.lh.rows_without_spark(TABLE) == rows_before
    s3wal.assert_no_secrets()


def _rows_of(rows: Counter[tuple[Any, ...]]) -> Counter[tuple[Any, ...]]:
    """pyiceberg's rows as :func:`as_rows` spells them (wall clock of the UTC instant)."""
    return Counter((r[0], r[1], r[2].replace(tzinfo=None), r[3]) for r in rows.elements())


def table_rows(lh: Lakehouse) -> Counter[tuple[Any, ...]]:
    """The table's rows as a multiset, read by pyiceberg (no JVM in the test's process)."""
    return _rows_of(lh.rows_without_spark(TABLE))
