"""One maintainer per table: a lease row in the catalog database that every process shares."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from sqlalchemy import insert

from icegate_dagster.cli import run_cli
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.locks import TableLocks
from tests.lakehouse import Lakehouse, LakehouseFactory

TABLE = "lakehouse.logs"


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(maintain={"lock_wait": "1s"})
    lakehouse.add_table(TABLE, appends=6)
    lakehouse.add_table("lakehouse.orders", appends=6)
    return lakehouse


#: A second maintainer process: takes the table's lease, says so, and keeps it until killed.
HOLDER = """
import sys, time
from datetime import timedelta
from icegate_dagster.catalog import open_catalog
from icegate_dagster.config import load_config
from icegate_dagster.maintenance.locks import TableLocks, lock_owner
locks = TableLocks.for_catalog(open_catalog(load_config(sys.argv[1]).catalog))
with locks.hold(sys.argv[2], lock_owner("other-run"), timedelta(0)) as blocked:
    assert blocked is None
    print("holding", flush=True)
    time.sleep(600)
"""


def _locks(lh: Lakehouse) -> TableLocks:
    locks = TableLocks.for_catalog(lh.catalog)
    assert locks is not None, "a SQL catalog keeps the locks"
    return locks


def test_a_table_held_by_another_maintainer_is_skipped_and_logged(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    files = len(lh.data_file_paths(TABLE))
    # Another maintainer process holds the table (through the same lock code).
    holder = subprocess.Popen(  # noqa: S603
        [sys.executable, "-c", HOLDER, str(lh.config_path), TABLE],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
    other = f"{socket.gethostname()}:{holder.pid}:other-run"
    try:
        started = time.monotonic()
        code = run_cli(["run", "--config", str(lh.config_path), "--json"])
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    report = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}

    assert code == 0
    held = report[TABLE]["ops"]
    assert {op["status"] for op in held} == {"skipped"}
    assert all(other in op["details"] for op in held)
    assert len(lh.data_file_paths(TABLE)) == files  # untouched
    # The other table was maintained meanwhile, and the skips are in the log.
    assert {op["status"] for op in report["lakehouse.orders"]["ops"]} <= {"completed", "skipped"}
    assert report["lakehouse.orders"]["after"]["data_files"] < files
    skipped = [r for r in lh.log_rows() if r["table_name"] == TABLE]
    assert skipped and {r["status"] for r in skipped} == {"skipped"}
    assert waited >= 1  # it waited lock_wait for each op before giving up

    # Released: the next run maintains it.
    assert run_cli(["optimize", "--config", str(lh.config_path), "--table", TABLE]) == 0
    assert len(lh.data_file_paths(TABLE)) < files


def test_a_dead_holders_lease_runs_out_and_the_table_is_taken_over(lh: Lakehouse) -> None:
    locks = _locks(lh)
    with locks.engine.begin() as conn:  # a holder that was SIGKILLed a while ago
        conn.execute(
            insert(locks.table).values(
                table_name=TABLE, owner="gone:1:run", expires_at=time.time() - 1
            )
        )
    assert locks.holder(TABLE) is None
    files = len(lh.data_file_paths(TABLE))

    assert run_cli(["optimize", "--config", str(lh.config_path), "--table", TABLE]) == 0

    assert len(lh.data_file_paths(TABLE)) < files
    assert locks.holder(TABLE) is None  # released after the op


def test_a_live_lease_is_exclusive_and_renewed(lh: Lakehouse) -> None:
    locks = TableLocks(_locks(lh).engine, lease=timedelta(seconds=0.6))
    with locks.hold(TABLE, "me:1:a", timedelta(0)) as mine:
        assert mine is None
        time.sleep(1.0)  # longer than the lease: only renewal keeps it ours
        other = locks.try_acquire(TABLE, "you:2:b")
        assert other is not None and other.owner == "me:1:a"
    assert locks.try_acquire(TABLE, "you:2:b") is None


def test_a_holder_killed_on_this_host_is_taken_over_without_waiting(lh: Lakehouse) -> None:
    dead = subprocess.Popen(["sleep", "0"])  # noqa: S603, S607
    dead.wait()
    locks = _locks(lh)
    with locks.engine.begin() as conn:  # SIGKILLed mid-operation, lease still running
        conn.execute(
            insert(locks.table).values(
                table_name=TABLE,
                owner=f"{socket.gethostname()}:{dead.pid}:cli-run",
                expires_at=time.time() + 3600,
            )
        )
    assert locks.holder(TABLE) is not None

    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["optimize"])

    assert [op.status for op in result.ops] == ["completed"], result.as_dict()
    assert locks.holder(TABLE) is None
