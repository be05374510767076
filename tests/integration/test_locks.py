"""One maintainer per table: a lease row in a shared database, judged by the database's clock."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import insert, literal_column, update

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.leases.store import LockHolder, TableLocks
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.lease_holder import held_by_another_process

TABLE = "lakehouse.logs"
DB_NOW = literal_column("((julianday('now') - 2440587.5) * 86400.0)")


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(maintain={"lock_wait": "1s"})
    lakehouse.add_table(TABLE, appends=6)
    lakehouse.add_table("lakehouse.orders", appends=6)
    return lakehouse


def _locks(lh: Lakehouse) -> TableLocks:
    locks = Maintainer(lh.config).leasing.locks
    assert locks is not None, "every catalog gets a lease store"
    return locks


def test_a_table_held_by_another_maintainer_is_skipped_and_logged(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    files = len(lh.data_file_paths(TABLE))
    with held_by_another_process(lh.config_path, TABLE) as pid:
        started = time.monotonic()
        code = run_cli(["run", "--config", str(lh.config_path), "--json"])
        waited = time.monotonic() - started
    report = {t["table"]: t for t in json.loads(capsys.readouterr().out)["tables"]}

    assert code == 0
    held = report[TABLE]["ops"]
    assert {op["status"] for op in held} == {"skipped"}
    # The operations with work waited for the lease and name its holder; the others were
    # planned away from metadata without asking for it.
    asked = {op["operation"] for op in held if f":{pid}:other-run" in op["details"]}
    assert {"optimize", "rewrite_manifests"} <= asked
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
                table_name=TABLE,
                token="dead",
                holder="gone:1:run",
                acquired_at=DB_NOW - 600,
                expires_at=DB_NOW - 1,
            )
        )
    assert locks.holder(TABLE) is None
    files = len(lh.data_file_paths(TABLE))

    assert run_cli(["optimize", "--config", str(lh.config_path), "--table", TABLE]) == 0

    assert len(lh.data_file_paths(TABLE)) < files
    assert locks.holder(TABLE) is None  # released after the op


def test_a_live_lease_is_exclusive_and_renewed(lh: Lakehouse) -> None:
    locks = TableLocks(_locks(lh).engine, lease=timedelta(seconds=0.9))
    with locks.hold(TABLE, "me:1:a", timedelta(0)) as mine:
        assert not isinstance(mine, LockHolder)
        time.sleep(1.5)  # longer than the lease: only renewal keeps it ours
        other = locks.try_acquire(TABLE, "token-b", "you:2:b")
        assert other is not None and other.owner == "me:1:a"
        mine.verify()
    assert locks.try_acquire(TABLE, "token-b", "you:2:b") is None


def test_a_host_whose_clock_runs_fast_cannot_take_a_live_lease(
    lh: Lakehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    locks = TableLocks(_locks(lh).engine, lease=timedelta(seconds=60))
    assert locks.try_acquire(TABLE, "token-a", "host-a:1:run") is None
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 300)  # this host is 5 minutes fast

    other = locks.try_acquire(TABLE, "token-b", "host-b:2:run")

    assert other is not None and other.owner == "host-a:1:run"
    assert locks.owns(TABLE, "token-a") and not locks.owns(TABLE, "token-b")


def test_two_threads_of_one_process_never_share_a_lease(lh: Lakehouse) -> None:
    """Same host, same pid, same run: each acquisition has its own token."""
    maintainer = Maintainer(lh.config, run_id="one-run")
    ref = TableRef.parse(TABLE)
    files = len(lh.data_file_paths(TABLE))
    snapshots = len(lh.table(TABLE).metadata.snapshots)
    inside = threading.Barrier(2, timeout=60)
    results = []

    def hook(point: str) -> None:
        if point == "before_commit":
            with contextlib.suppress(threading.BrokenBarrierError):
                inside.wait(timeout=3)  # the other thread gets in too, if it can

    maintainer.fault_hook = hook
    threads = [
        threading.Thread(
            target=lambda: results.append(maintainer.run_op(ref, "optimize")), name=f"t{i}"
        )
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.status for r in results) == ["completed", "skipped"], [
        r.details for r in results
    ]
    skipped = next(r for r in results if r.status == "skipped")
    assert ":one-run" in skipped.details
    # One rewrite: exactly one new snapshot.
    assert len(lh.table(TABLE).metadata.snapshots) == snapshots + 1
    assert len(lh.data_file_paths(TABLE)) < files


def test_the_same_table_named_twice_is_maintained_once(
    lh: Lakehouse, capsys: pytest.CaptureFixture[str]
) -> None:
    code = run_cli(
        ["optimize", "--config", str(lh.config_path), "--table", TABLE, "--table", TABLE, "--json"]
    )
    report = json.loads(capsys.readouterr().out)["tables"]
    assert code == 0
    assert [t["table"] for t in report] == [TABLE]
    assert [op["status"] for op in report[0]["ops"]] == ["completed"]


def test_a_holder_whose_lease_was_taken_over_does_not_commit(lh: Lakehouse) -> None:
    locks = _locks(lh)
    table_before = lh.table(TABLE)
    snapshots = [s.snapshot_id for s in table_before.metadata.snapshots]
    rows = lh.rows(TABLE)

    def take_over(point: str) -> None:
        if point == "before_commit":  # another maintainer takes the table over right now
            with locks.engine.begin() as conn:
                conn.execute(
                    update(locks.table)
                    .where(locks.table.c.table_name == TABLE)
                    .values(token="thief", holder="thief-host:7:other-run")
                )

    maintainer = Maintainer(lh.config, fault_hook=take_over)
    result = maintainer.maintain_table(TableRef.parse(TABLE), ["optimize", "expire_snapshots"])

    optimize = result.op("optimize")
    assert optimize is not None and optimize.status == "failed"
    assert "taken over by thief-host:7:other-run" in optimize.details
    assert "before committing" in optimize.details
    # Nothing was committed: same snapshots, same files, same rows.
    table_after = lh.table(TABLE)
    assert [s.snapshot_id for s in table_after.metadata.snapshots] == snapshots
    assert lh.rows(TABLE) == rows


def test_a_stuck_holder_fails_ops_succeeded_naming_it(lakehouse_factory: LakehouseFactory) -> None:
    lh = lakehouse_factory(maintain={"lock_wait": "1s", "locks": {"stuck_after": "1h"}})
    lh.add_table(TABLE, appends=3)
    locks = _locks(lh)
    with locks.engine.begin() as conn:  # held for 2 hours and still renewing
        conn.execute(
            insert(locks.table).values(
                table_name=TABLE,
                token="stuck",
                holder="worker-3:4242:run-7",
                acquired_at=DB_NOW - 7200,
                expires_at=DB_NOW + 120,
            )
        )

    # 3 appends, 3 manifests: the rewrite has work, so it asks for the lease.
    result = Maintainer(lh.config).maintain_table(TableRef.parse(TABLE), ["rewrite_manifests"])

    [op] = result.ops
    assert op.status == "failed", op.details
    assert "worker-3:4242:run-7" in op.details and "stuck_after 1h" in op.details
    assert not result.ok


def test_a_lease_store_of_its_own_is_shared_by_every_process(
    lakehouse_factory: LakehouseFactory, tmp_path: Path
) -> None:
    """``maintain.locks.uri`` names the store: a second process holding a table there makes
    this one skip it, naming the holder."""
    store = tmp_path / "shared" / "leases.db"
    lh = lakehouse_factory(maintain={"lock_wait": "1s", "locks": {"uri": f"sqlite:///{store}"}})
    lh.add_table(TABLE, appends=3)
    with held_by_another_process(lh.config_path, TABLE) as pid:
        ref = TableRef.parse(TABLE)
        result = Maintainer(lh.config).maintain_table(ref, ["rewrite_manifests"])
    assert store.is_file()
    [op] = result.ops
    assert op.status == "skipped" and f":{pid}:other-run" in op.details
