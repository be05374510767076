"""A second maintainer process that holds one table's lease, for lease tests on any catalog."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

#: Takes the table's lease through the package's own lease code, says so, and keeps it until
#: its standard input closes (then releases it, as a finishing maintainer does).
HOLDER = """
import sys
from datetime import timedelta
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.locks import LockHolder, holder_description
locks = Maintainer(load_config(sys.argv[1])).leasing.locks
with locks.hold(sys.argv[2], holder_description("other-run"), timedelta(0)) as held:
    assert not isinstance(held, LockHolder)
    print("holding", flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def held_by_another_process(config_path: Path, table: str) -> Iterator[int]:
    """Another maintainer process holds ``table``; yields its pid (named in skip messages
    as ``<host>:<pid>:other-run``)."""
    holder = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HOLDER, str(config_path), table],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        yield holder.pid
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        try:
            holder.wait(timeout=30)
        except subprocess.TimeoutExpired:
            holder.kill()
            holder.wait()
