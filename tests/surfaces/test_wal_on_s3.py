"""The WAL in object storage: ``wal.root: s3://...`` on SeaweedFS's S3 on loopback.

The tables live in a SQL catalog (SQLite, local warehouse); only the WAL is in S3, opened
with the catalog's S3 settings (``s3.endpoint``, keys, region, path style) or with
``wal.storage`` of its own. The Python side (listing, sizing, quarantine, deletes, the
sensor's listing of the root) runs with no JVM; the ingest itself reads the WAL files
from S3 with Spark through Hadoop's S3A (:data:`S3A_JARS`).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pyarrow import fs

from icegate_dagster.config import IcegateConfig, load_config
from icegate_dagster.maintenance import Maintainer, TableRef
from tests.integration.test_wal_compaction import as_rows, wal_rows
from tests.lakehouse import Lakehouse, make_lakehouse
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
    server: SeaweedServer, root: Path, *, own_storage: bool, spark: dict[str, Any] | None = None
) -> S3WalLakehouse:
    """The lakehouse, its S3 settings in the catalog block or (``own_storage``) under
    ``wal.storage``, the catalog then naming no S3 at all."""
    lh = make_lakehouse(root, maintain={"compaction": {"min_files": MIN_WAL_FILES}})
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
        raw["spark"] = {**raw["spark"], **spark}
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
