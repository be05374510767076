"""The WAL folder lock: one compaction per table at a time on a host, never waiting.

Real files, real threads and real processes; a holder that runs the plain ``fcntl.flock``
of earlier versions counts too, so old and new maintainers exclude each other.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from icegate_dagster.config import CompactionSettings
from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.wal import (
    LOCK_FILE,
    compact_wal,
    resolve_wal_root,
    wal_folder_lock,
)

REF = TableRef("lakehouse", "logs")

#: Holds the lock the way earlier versions did (``flock`` on the file opened for append)
#: until its stdin closes.
OLD_HOLDER = """
import fcntl, sys
with open(sys.argv[1], "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("held", flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def wal_root(tmp_path: Path) -> str:
    (tmp_path / "wal" / REF.namespace / REF.name).mkdir(parents=True)
    return (tmp_path / "wal").as_uri()


def _lock_path(wal_root: str) -> str:
    return os.path.join(wal_root.removeprefix("file://"), REF.namespace, REF.name, LOCK_FILE)


@pytest.fixture
def other_process(wal_root: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the table's WAL lock."""
    holder = subprocess.Popen(
        [sys.executable, "-c", OLD_HOLDER, _lock_path(wal_root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    yield holder
    if holder.poll() is None:
        holder.communicate("", timeout=30)


def test_a_free_lock_is_taken_for_the_block_and_released_after(wal_root: str) -> None:
    with wal_folder_lock(resolve_wal_root(wal_root), REF) as held_by:
        assert held_by is None
        assert os.path.isfile(_lock_path(wal_root))
    with wal_folder_lock(resolve_wal_root(wal_root), REF) as held_by:
        assert held_by is None
    assert os.path.isfile(_lock_path(wal_root))  # left in place, as a flock file should


def test_a_second_run_in_this_process_finds_the_lock_held(wal_root: str) -> None:
    seen: list[str | None] = []

    def other_thread() -> None:
        with wal_folder_lock(resolve_wal_root(wal_root), REF) as held_by:
            seen.append(held_by)

    with wal_folder_lock(resolve_wal_root(wal_root), REF) as first:
        assert first is None
        with wal_folder_lock(resolve_wal_root(wal_root), REF) as nested:
            assert nested == _lock_path(wal_root)
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join(timeout=30)
    assert seen == [_lock_path(wal_root)]


def test_a_lock_held_by_another_process_is_reported_not_waited_for(
    wal_root: str, other_process: subprocess.Popen[str]
) -> None:
    with wal_folder_lock(resolve_wal_root(wal_root), REF) as held_by:
        assert held_by == _lock_path(wal_root)


def test_a_killed_holder_leaves_no_stale_lock(
    wal_root: str, other_process: subprocess.Popen[str]
) -> None:
    other_process.send_signal(signal.SIGKILL)
    other_process.wait(timeout=30)
    with wal_folder_lock(resolve_wal_root(wal_root), REF) as held_by:
        assert held_by is None


def test_no_lock_without_a_local_wal_folder(tmp_path: Path) -> None:
    """A remote root, and a folder that does not exist yet: no lock, and no folder made."""
    with wal_folder_lock(resolve_wal_root("mock:///wal"), REF) as held_by:
        assert held_by is None
    missing = tmp_path / "nowhere"
    with wal_folder_lock(resolve_wal_root(missing.as_uri()), REF) as held_by:
        assert held_by is None
    assert not missing.exists()


def test_compaction_leaves_a_locked_wal_to_the_holder(
    wal_root: str, other_process: subprocess.Popen[str]
) -> None:
    def no_spark() -> NoReturn:
        raise AssertionError("Spark must not start")

    outcome = compact_wal(
        no_spark,
        "lakehouse",
        REF,
        None,  # type: ignore[arg-type]  # never read: the lock is checked first
        resolve_wal_root(wal_root),
        CompactionSettings(),
        force=True,
    )

    assert outcome.status == "skipped" and outcome.output == {}
    assert outcome.details == (
        f"another WAL compaction of lakehouse.logs is running (it holds {_lock_path(wal_root)}); "
        "its WAL is left to that run"
    )
