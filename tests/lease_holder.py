"""A second maintainer process that holds one table's lease, or keeps one run's heartbeat,
for lease and dead-run tests on any catalog."""

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
from icegate_dagster.maintenance.leases.store import LockHolder, holder_description
locks = Maintainer(load_config(sys.argv[1])).leasing.locks
with locks.hold(sys.argv[2], holder_description(sys.argv[3]), timedelta(0)) as held:
    assert not isinstance(held, LockHolder)
    print("holding", flush=True)
    sys.stdin.read()
"""

#: Keeps run ``argv[2]``'s heartbeat as a Dagster run worker does, until it is killed.
BEATER = """
import sys, threading
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.leases.store import holder_description
locks = Maintainer(load_config(sys.argv[1])).leasing.locks
locks.start_heartbeat(sys.argv[2], holder_description(sys.argv[2]), lambda: True)
print("beating", flush=True)
threading.Event().wait()
"""


#: Beats once for run ``argv[2]`` as a worker does, then never again while it lives on: a
#: worker whose lease store became unreachable.
SILENT = """
import sys, threading, uuid
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer
from icegate_dagster.maintenance.leases.process import process_identity
from icegate_dagster.maintenance.leases.store import holder_description
locks = Maintainer(load_config(sys.argv[1])).leasing.locks
locks.beat(sys.argv[2], uuid.uuid4().hex, holder_description(sys.argv[2]), process_identity())
print("beating", flush=True)
threading.Event().wait()
"""


@contextlib.contextmanager
def held_by_another_process(
    config_path: Path, table: str, run_id: str = "other-run"
) -> Iterator[int]:
    """Another maintainer process (of run ``run_id``) holds ``table``; yields its pid (named
    in skip messages as ``<host>:<pid>:<run_id>``)."""
    holder = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HOLDER, str(config_path), table, run_id],
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


@contextlib.contextmanager
def beating_in_another_process(
    config_path: Path, run_id: str, *, falls_silent: bool = False
) -> Iterator[subprocess.Popen[str]]:
    """Another process keeps run ``run_id``'s heartbeat (or, ``falls_silent``, beats once
    and then lives on without beating); yields it (kill it to make the run's worker gone)."""
    beater = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", SILENT if falls_silent else BEATER, str(config_path), run_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert beater.stdout is not None and beater.stdout.readline().strip() == "beating"
        yield beater
    finally:
        beater.kill()
        beater.wait()
