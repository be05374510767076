"""One WAL compaction per table at a time on a host: a lock file in the table's WAL folder."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from icegate_dagster.maintenance.identifiers import TableRef
from icegate_dagster.maintenance.wal.files import WalRoot, wal_filesystem

#: The lock file, in the table's WAL folder (``_``: never taken for a WAL file).
LOCK_FILE = "_icegate.lock"


@contextlib.contextmanager
def wal_folder_lock(wal_root: WalRoot, ref: TableRef) -> Iterator[str | None]:
    """One compaction per table at a time on this host: yields None, or the lock's holder path.

    Never waits: when another run (another thread or process) holds the lock, the
    block runs at once with the lock file's path, and the caller leaves the WAL to that
    run. The lock is an OS ``flock`` on ``_icegate.lock`` in the WAL folder; it dies
    with its process, so a crashed run never leaves a stale lock. Object stores (no
    ``flock`` there) and a WAL folder that does not exist yet get no lock here: the table's
    lease in the shared lease store keeps one ingester per table, on every host, and
    exactly-once never rests on either (the validated commit of
    :mod:`~icegate_dagster.maintenance.wal.publish`).
    """
    from filelock import FileLock, Timeout

    filesystem, folder = wal_filesystem(wal_root, ref)
    if not wal_root.is_local or not os.path.isdir(folder):
        yield None
        return
    # A new lock object per call: flock excludes other open files, so two threads of one
    # process exclude each other too. Where flock is missing (ENOSYS) the error is raised
    # rather than falling back to a marker file, which a killed run would leave behind.
    lock = FileLock(os.path.join(folder, LOCK_FILE), blocking=False, fallback_to_soft=False)
    try:
        lock.acquire()
    except Timeout:
        yield lock.lock_file
        return
    try:
        yield None
    finally:
        lock.release()
