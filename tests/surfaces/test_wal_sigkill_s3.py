"""Exactly-once on S3: a real SIGKILL of ``icegate-maintain compact`` at each moment of a
WAL compaction whose ``wal.root`` is in SeaweedFS's S3, then a re-run: every row lands
once and no WAL object is left.

Nothing here can rename: the WAL objects are read in place by Spark (S3A), the commit that
appends them records their names, sizes and modification times in the table, and they
are deleted only after it; a re-run deletes those the table already records without
reading them again. The lease in the shared store keeps a second run out (no ``flock``
on S3): the killed run's lease runs out, then the re-run takes the table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from icegate_dagster.maintenance.wal import CHECKPOINTS, KILL_AT_ENV
from tests.integration.test_wal_sigkill import _kill_while_writing, _wait_gone
from tests.surfaces.seaweedfs_server import SeaweedServer, seaweedfs_fixture  # noqa: F401
from tests.surfaces.test_wal_on_s3 import (
    TABLE,
    S3WalLakehouse,
    keys_in_env,  # noqa: F401
    s3_wal_lakehouse,
    s3a_jars,
    table_rows,
)


@pytest.fixture
def s3wal(
    seaweedfs: SeaweedServer,
    tmp_path: Path,
    keys_in_env: None,  # noqa: F811  # the imported fixture
) -> Iterator[S3WalLakehouse]:
    # A killed holder's lease runs out (no pid checks): the shortest allowed, so the re-run
    # waits for it within lock_wait (30 s) instead of skipping.
    lakehouse = s3_wal_lakehouse(
        seaweedfs,
        tmp_path / "lh",
        own_storage=False,
        spark={"spark.jars": s3a_jars()},
        maintain={"locks": {"lease": "15s"}},
    )
    yield lakehouse
    lakehouse.assert_no_secrets()


def _compact(s3wal: S3WalLakehouse, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``compact`` in its own process (its own JVM, with the S3A jars)."""
    return subprocess.Popen(
        [sys.executable, "-m", "icegate_dagster.cli", "compact"]
        + ["--config", str(s3wal.lh.config_path), "--table", TABLE],
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _rerun(s3wal: S3WalLakehouse) -> None:
    proc = _compact(s3wal)
    out, err = proc.communicate(timeout=600)
    s3wal.outputs += [out.decode(errors="replace"), err.decode(errors="replace")]
    assert proc.returncode == 0, (out + err).decode(errors="replace")[-3000:]


@pytest.mark.parametrize("point", CHECKPOINTS)
def test_sigkill_at_each_moment_of_a_compaction_then_rerun(
    s3wal: S3WalLakehouse, point: str
) -> None:
    before = table_rows(s3wal.lh)
    expected = s3wal.fill(TABLE, files=6)

    proc = _compact(s3wal, {KILL_AT_ENV: point})
    out, err = proc.communicate(timeout=600)
    s3wal.outputs += [out.decode(errors="replace"), err.decode(errors="replace")]

    assert proc.returncode == -signal.SIGKILL, err.decode(errors="replace")[-3000:]
    left = {"before_write": 6, "after_commit": 6, "mid_delete": 5, "after_delete": 0}[point]
    assert len(s3wal.waiting(TABLE)) == left
    committed = point != "before_write"
    assert table_rows(s3wal.lh) == (before + expected if committed else before)
    _rerun(s3wal)
    assert table_rows(s3wal.lh) == before + expected  # every row exactly once
    assert s3wal.waiting(TABLE) == []
    assert s3wal.quarantined(TABLE) == []


def test_sigkill_while_spark_reads_the_s3_wal_and_writes_then_rerun(s3wal: S3WalLakehouse) -> None:
    before = table_rows(s3wal.lh)
    expected = s3wal.fill(TABLE, files=40, rows_per_file=500)

    proc = _compact(s3wal)
    # Kill as soon as Spark has written its first data file, i.e. mid-write or just after.
    jvm = _kill_while_writing(proc, s3wal.lh, [proc.pid])
    proc.communicate(timeout=60)
    _wait_gone(jvm)  # the JVM exits when its Python parent is gone

    assert proc.returncode == -signal.SIGKILL, "the compaction finished before it was killed"
    _rerun(s3wal)
    assert table_rows(s3wal.lh) == before + expected
    assert s3wal.waiting(TABLE) == []
    assert s3wal.quarantined(TABLE) == []
