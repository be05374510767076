"""A real SIGKILL of a running ``icegate-maintain compact``, then a re-run: every row lands once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.wal import KILL_AT_ENV
from tests.integration.test_wal_compaction import TABLE, WAL_RULES, fill_wal, spark_rows
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.servers import child_processes


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (the PySpark JVM)."""
    return child_processes().get(pid, [])


def _compact(lh: Lakehouse, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "icegate_dagster.cli", "compact"]
        + ["--config", str(lh.config_path), "--table", TABLE],
        env={**os.environ, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def _wait_gone(pids: list[int], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)


def _kill_while_writing(
    proc: subprocess.Popen[bytes], lh: Lakehouse, targets: list[int] | None
) -> list[int]:
    """SIGKILL ``targets`` (default: the compaction's JVM) as soon as Spark has written its
    first data file into the table's folder, i.e. mid-write or just after; the JVM's pids."""
    data_dir = lh.data_dir(TABLE)
    existing = set(data_dir.rglob("*.parquet"))
    jvm: list[int] = []
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        jvm = jvm or _children(proc.pid)
        if jvm and set(data_dir.rglob("*.parquet")) - existing:
            for pid in targets if targets is not None else jvm:
                os.kill(pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    return jvm


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    # A killed holder's lease runs out (no pid checks): keep it short (the shortest allowed),
    # so the re-run waits for it within lock_wait (30 s) instead of skipping.
    lakehouse = lakehouse_factory(maintain={**WAL_RULES, "locks": {"lease": "15s"}}, wal=True)
    lakehouse.add_table(TABLE, appends=1)
    return lakehouse


def test_sigkill_between_commit_and_delete_then_rerun(lh: Lakehouse) -> None:
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=6)

    proc = _compact(lh, {KILL_AT_ENV: "after_commit"})
    proc.wait(timeout=300)

    assert proc.returncode == -signal.SIGKILL
    assert len(lh.wal_files(TABLE)) == 6  # committed, nothing deleted yet
    assert spark_rows(lh, TABLE) == before + expected
    rerun = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])
    assert rerun.ok, rerun.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []


def test_sigkill_while_spark_writes_then_rerun(lh: Lakehouse) -> None:
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=40, rows_per_file=500)

    proc = _compact(lh)
    # Kill as soon as Spark has written its first data file, i.e. mid-write or just after.
    jvm = _kill_while_writing(proc, lh, [proc.pid])
    proc.wait(timeout=60)
    _wait_gone(jvm)  # the JVM exits when its Python parent is gone

    assert proc.returncode == -signal.SIGKILL, "the compaction finished before it was killed"
    rerun = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])
    assert rerun.ok, rerun.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []


def test_a_jvm_killed_while_spark_writes_quarantines_no_file(lh: Lakehouse) -> None:
    """The JVM dies (an OOM killer's pick) while the Python process lives on: the batch
    fails as a Spark failure, no WAL file is blamed for it, and a re-run ingests them all."""
    before = spark_rows(lh, TABLE)
    expected = fill_wal(lh, files=40, rows_per_file=500)

    proc = _compact(lh)
    jvm = _kill_while_writing(proc, lh, None)  # the JVM only
    _, stderr = proc.communicate(timeout=120)

    assert jvm, "the compaction finished before its JVM was killed"
    assert proc.returncode == 1, stderr.decode(errors="replace")[-2000:]
    quarantine = lh.wal_dir(TABLE) / "_quarantine"
    assert not quarantine.exists() or not any(quarantine.iterdir())
    assert len(lh.wal_files(TABLE)) == 40  # every file waits for the next run
    rerun = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["wal_compaction"])
    assert rerun.ok, rerun.as_dict()
    assert spark_rows(lh, TABLE) == before + expected
    assert lh.wal_files(TABLE) == []
