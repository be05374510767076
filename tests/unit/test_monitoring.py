"""The exporter's parts without servers: the maintenance log's totals (figures from the
operations' own ``details``, read incrementally from a real Iceberg log table), the metric
families rendered from a snapshot (checked by ``promtool check metrics``), and ``serve``'s
refusals of bad options. No JVM: pyiceberg writes the log rows."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client.parser import text_string_to_metric_families

from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.config import HealthCheckSettings
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.health.score import DueOperation
from icegate_dagster.maintenance.health.summary import HealthSummary
from icegate_dagster.maintenance.leases.holder import lease_store
from icegate_dagster.maintenance.log.totals import (
    LogTotals,
    OperationTotals,
    TotalsView,
    aggregate,
    human_bytes,
)
from icegate_dagster.maintenance.log.writer import append_log_rows_without_spark, ensure_log_table
from icegate_dagster.maintenance.trigger.records import OperationMemory
from icegate_dagster.maintenance.trigger.store import StoredLook
from icegate_dagster.maintenance.wal import WalStats
from icegate_dagster.monitoring.metrics import render
from icegate_dagster.monitoring.probes import REUSE_S, HealthProbes, health_document
from icegate_dagster.monitoring.server import Exporter
from icegate_dagster.monitoring.serving import BoundedHTTPServer, PrereadHandler
from icegate_dagster.monitoring.snapshot import (
    DAEMON_TOLERANCE_S,
    DaemonBeat,
    HeartbeatAges,
    Snapshot,
    SourceState,
    TableFigures,
    daemon_problem,
)
from tests.lakehouse import make_lakehouse
from tests.servers import free_port

PROMTOOL = Path("/usr/bin/promtool")
T0 = datetime(2026, 1, 1, tzinfo=UTC)

#: ``details`` exactly as the operations write them (see each operation's ``run``).
DETAILS = {
    "optimize": "rewrote 12 data files (1234 bytes) into 1; set "
    "write.parquet.compression-codec=zstd, write.parquet.compression-level=1 first (the table "
    "set no codec)",
    "optimize_deletes": "rewrote 3 data files (100 bytes) into 1, applying their deletes "
    "(2 delete files before)",
    "rewrite_position_delete_files": "rewrote 4 position delete files (400 bytes) into 1 "
    "(4 position delete files before; rewrote every partition; rows of data files that are "
    "gone were dropped)",
    "wal_compaction": "ingested 5 WAL files (500 rows) in snapshot 123, 1 data files written",
    "expire_exact": "expired snapshots older than 2026-01-01 00:00:00 UTC (keeping the last 1); "
    "deleted 4 data files, 2 manifests, 2 manifest lists (1.2 KB freed: 9 files, 1234 bytes)",
    "expire_legacy": "expired snapshots older than 2026-01-01 00:00:00 UTC (keeping the last "
    "1); deleted 4 data files, 2 manifests, 2 manifest lists (1.5 KB freed)",
    "expire_distributed": "expired snapshots older than 2026-01-01 00:00:00 UTC (keeping the "
    "last 1); deleted 1 data files, 1 manifests, 1 manifest lists",
    "orphans": "removed 3 orphan files older than 2025-12-25 00:00:00 UTC",
    "orphans_partly": "removed 2 of 5 orphan files; 3 files could not be deleted",
    "orphans_deferred": "deleted 2 of 3 collected orphan candidates (100 bytes); kept 1: gone",
}


def _row(
    table: str, operation: str, status: str, details: str, ms: int | None, at: datetime
) -> dict[str, Any]:
    return {
        "table_name": table,
        "operation": operation,
        "status": status,
        "details": details,
        "snapshots_before": None,
        "snapshots_after": None,
        "files_before": None,
        "files_after": None,
        "bytes_before": None,
        "bytes_after": None,
        "duration_ms": ms,
        "run_id": "cli-test",
        "executed_at": at,
    }


ROWS = [
    _row("ns.a", "optimize", "completed", DETAILS["optimize"], 500, T0),
    _row("ns.a", "optimize", "completed", DETAILS["optimize_deletes"], 700, T0 + timedelta(1)),
    _row("ns.a", "optimize", "skipped", "nothing to compact: ...", 1, T0 + timedelta(2)),
    _row(
        "ns.a",
        "rewrite_position_delete_files",
        "completed",
        DETAILS["rewrite_position_delete_files"],
        10,
        T0,
    ),
    _row("ns.a", "wal_compaction", "completed", DETAILS["wal_compaction"], 900, T0),
    _row("ns.a", "expire_snapshots", "completed", DETAILS["expire_exact"], 10, T0),
    _row("ns.a", "expire_snapshots", "completed", DETAILS["expire_legacy"], 10, T0),
    _row("ns.a", "expire_snapshots", "completed", DETAILS["expire_distributed"], 10, T0),
    _row("ns.a", "remove_orphan_files", "completed", DETAILS["orphans"], 10, T0),
    _row("ns.a", "remove_orphan_files", "failed", DETAILS["orphans_partly"], 10, T0),
    _row("ns.a", "remove_orphan_files", "completed", DETAILS["orphans_deferred"], 10, T0),
    _row("ns.b", "optimize", "failed", "table ns.b: optimize.strategy is 'sort' but ...", None, T0),
]


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("table_name", pa.string()),
                ("operation", pa.string()),
                ("status", pa.string()),
                ("details", pa.string()),
                ("duration_ms", pa.int64()),
                ("executed_at", pa.timestamp("us", tz="UTC")),
            ]
        ),
    )


def test_the_log_adds_up_per_table_and_operation() -> None:
    totals = aggregate(_table([{k: r[k] for k in r if k in _COLUMNS} for r in ROWS]))
    optimize = totals[("ns.a", "optimize")]
    assert (optimize.rows, optimize.failures, optimize.duration_ms) == (3, 0, 1201)
    assert optimize.figures == {"files_rewritten": 15, "bytes_rewritten": 1334}
    # The latest row that did work: the skipped one says nothing was done.
    assert optimize.last_duration_ms == 700 and optimize.last_status == "completed"
    assert optimize.last_at == (T0 + timedelta(1)).timestamp()
    assert totals[("ns.a", "rewrite_position_delete_files")].figures == {
        "files_rewritten": 4,
        "bytes_rewritten": 400,
    }
    assert totals[("ns.a", "wal_compaction")].figures == {
        "wal_files_ingested": 5,
        "wal_rows_ingested": 500,
    }
    # Exact figures; the older rounded ones; the distributed expiry's counts, no bytes.
    assert totals[("ns.a", "expire_snapshots")].figures == {
        "files_freed": 9 + 8 + 3,
        "bytes_freed": 1234 + human_bytes("1.5 KB"),
    }
    orphans = totals[("ns.a", "remove_orphan_files")]
    assert orphans.figures == {"orphans_removed": 7, "files_freed": 7, "bytes_freed": 100}
    assert orphans.failures == 1
    failed = totals[("ns.b", "optimize")]
    assert (failed.rows, failed.failures, failed.duration_ms, failed.last_status) == (
        1,
        1,
        0,
        "failed",
    )


_COLUMNS = {"table_name", "operation", "status", "details", "duration_ms", "executed_at"}


def _latest(totals: Mapping[tuple[str, str], OperationTotals]) -> dict[Any, Any]:
    return {
        key: (v.last_at, v.last_status, v.last_duration_ms, v.last_details)
        for key, v in totals.items()
    }


def test_the_log_is_counted_from_the_start_and_read_incrementally(tmp_path: Path) -> None:
    """Appends are read alone and counted; a restart counts from 0 again (as Prometheus
    expects of a counter) but knows each table and operation's latest run; rows deleted from
    the log, or the snapshot read last expired, never lower the counters; a log table made
    anew is counted in full."""
    lake = make_lakehouse(tmp_path / "lake")
    ref = TableRef.parse(lake.config.log_table)
    ensure_log_table(lake.catalog, ref)
    clock = (T0 + timedelta(days=3)).timestamp  # the rows are within a week of it
    totals = LogTotals(lambda: lake.catalog, ref, wall_clock=clock)
    assert totals.refresh().totals == {}  # no rows yet
    append_log_rows_without_spark(lake.catalog, ref, ROWS[:4])
    first = totals.refresh()
    assert (first.rows_read, first.full_reads) == (4, 0)
    for start in range(4, len(ROWS), 3):  # three more commits
        append_log_rows_without_spark(lake.catalog, ref, ROWS[start : start + 3])
    later = totals.refresh()
    assert (later.rows_read, later.full_reads) == (len(ROWS), 0)  # only the new rows
    everything = aggregate(_table([{k: r[k] for k in r if k in _COLUMNS} for r in ROWS]))
    assert later.totals == everything
    assert totals.refresh().rows_read == len(ROWS)  # nothing new: nothing read

    # A restart: the latest run of each, no counts.
    restarted = LogTotals(lambda: lake.catalog, ref, wall_clock=clock).refresh()
    assert restarted.full_reads == 1
    assert _latest(restarted.totals) == _latest(everything)
    assert all(v.rows == 0 and not v.figures for v in restarted.totals.values())

    # The snapshot read last expired: the commits after it are read still.
    table = lake.catalog.load_table(ref.identifier)
    read_last = table.current_snapshot()
    assert read_last is not None
    append_log_rows_without_spark(lake.catalog, ref, ROWS[:1])
    table = lake.catalog.load_table(ref.identifier)
    table.maintenance.expire_snapshots().by_id(read_last.snapshot_id).commit()
    again = totals.refresh()
    assert again.totals[("ns.a", "optimize")].rows == 4
    assert again.rows_read == len(ROWS) + 1

    # Rows deleted from the log (a retention on it): the counters do not go down.
    from pyiceberg.expressions import EqualTo

    table = lake.catalog.load_table(ref.identifier)
    table.delete(EqualTo("table_name", "ns.b"))  # type: ignore[call-arg,arg-type]
    after_delete = totals.refresh()
    assert after_delete.totals[("ns.b", "optimize")].rows == 1
    assert after_delete.rows_read == len(ROWS) + 1  # a delete adds nothing to read

    # The log made anew: its rows are new, all counted.
    lake.catalog.drop_table(ref.identifier)
    ensure_log_table(lake.catalog, ref)
    append_log_rows_without_spark(lake.catalog, ref, ROWS[:2])
    anew = totals.refresh()
    assert anew.totals[("ns.a", "optimize")].rows == 4 + 2
    assert anew.rows_read == len(ROWS) + 1 + 2


def _figures(**changes: Any) -> TableFigures:
    health = HealthSummary(
        table="lakehouse.logs",
        score=61.5,
        due=(DueOperation("optimize", "14 small files"),),
        work_bytes=1000,
        penalties={"small_files": 38.5},
        kept={"data_files": 14, "snapshots": 14, "small_files": 14},
        min_interval_s=60.0,
    )
    look = StoredLook("lakehouse.logs", "m.json", None, 1000.0, None, health, due_since=1000.0)
    base = TableFigures(
        table="lakehouse.logs",
        namespace="lakehouse",
        look=look,
        wal=WalStats(3, 300, oldest="a.parquet", oldest_at=1100.0),
        operations={
            "optimize": OperationMemory(
                "lakehouse.logs", "optimize", 1150.0, "failed", failures=2, detail="boom"
            ),
            "expire_snapshots": OperationMemory(
                "lakehouse.logs", "expire_snapshots", 1100.0, "completed", succeeded_at=1100.0
            ),
        },
        totals={},
        checks=HealthCheckSettings(),
        min_score=50.0,
        min_interval_s=60.0,
    )
    return replace(base, **changes)


def test_a_table_is_unmaintained_since_it_fell_due_or_a_due_operation_last_did_its_job() -> None:
    figures = _figures()
    # optimize (the due one) failed: counted from when the table fell due.
    assert figures.unmaintained_s(1300.0) == 300.0
    done = replace(
        figures.operations["optimize"], outcome="completed", failures=0, succeeded_at=1250.0
    )
    served = _figures(operations={"optimize": done})
    assert served.unmaintained_s(1300.0) == 50.0  # due again since it was served
    ineffective = replace(done, outcome="ineffective")
    assert _figures(operations={"optimize": ineffective}).unmaintained_s(1300.0) == 300.0
    healthy = replace(figures.look, health=replace(figures.look.health, due=()))  # type: ignore[arg-type]
    assert _figures(look=healthy).unmaintained_s(1300.0) == 0.0


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def test_the_families_render_with_their_labels_and_units() -> None:
    snapshot = Snapshot(
        taken_at=1300.0,
        tables=(_figures(),),
        sources={"catalog": SourceState(True), "lease_store": SourceState(False, "down")},
        has_wal=True,
    )
    text = render(snapshot, operation_detail=True).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    sample = _samples(text)
    table = (("namespace", "lakehouse"), ("table", "lakehouse.logs"))
    assert sample[("wal_files_count", table)] == 3
    assert sample[("wal_size_bytes", table)] == 300
    assert sample[("snapshot_count", table)] == 14
    assert sample[("icegate_table_health_score", table)] == 61.5
    assert sample[("icegate_table_healthy", table)] == 1
    assert sample[("icegate_table_due_seconds", table)] == 300
    assert sample[("icegate_table_wal_oldest_age_seconds", table)] == 200
    optimize = tuple(sorted((*table, ("operation", "optimize"))))
    assert sample[("icegate_operation_consecutive_failures", optimize)] == 2
    assert sample[("icegate_operation_seconds_since_last_attempt", optimize)] == 150
    assert ("icegate_operation_last_success_timestamp_seconds", optimize) not in sample
    failed = tuple(sorted((*optimize, ("outcome", "failed"))))
    assert sample[("icegate_operation_last_outcome", failed)] == 1
    assert sample[("icegate_files_rewritten_total", optimize)] == 0  # counters start at 0
    assert sample[("icegate_dependency_up", (("dependency", "lease_store"),))] == 0
    assert families["icegate_files_rewritten"].type == "counter"
    assert families["icegate_table_data_files"].type == "gauge"
    assert PROMTOOL.exists(), "promtool is missing: run scripts/setup.sh --test"
    checked = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=text.encode(), capture_output=True, check=False
    )
    problems = sorted(
        line.split()[0] for line in (checked.stdout + checked.stderr).decode().splitlines() if line
    )
    # The seed's two names: _count is reserved for histograms by promtool's linter.
    assert problems == ["snapshot_count", "wal_files_count"], checked


def test_the_default_renders_what_the_rules_read_and_sums_the_counters() -> None:
    """Without the operation detail: the table's gauges the rules and dashboard read, an
    operation's failures in a row only while it fails, the counters summed by operation
    over the log's rows, and per operation the tables it is due on. A table dropped from
    the listing takes nothing from the sums: a counter never goes down."""
    failing = _figures()
    recovered = replace(
        failing,
        table="lakehouse.spans",
        operations={
            "optimize": replace(failing.operations["optimize"], failures=0, outcome="completed")
        },
        totals={"optimize": OperationTotals(1, 0, 500, {"files_rewritten": 4}, 1.0, "ok", 500)},
    )
    failing = replace(
        failing,
        totals={"optimize": OperationTotals(2, 1, 700, {"files_rewritten": 3}, 1.0, "ok", 300)},
    )
    log = TotalsView(
        {(t.table, op): totals for t in (failing, recovered) for op, totals in t.totals.items()},
        None,
        3,
        1,
    )
    snapshot = Snapshot(
        taken_at=1300.0, tables=(failing, recovered), sources={}, has_wal=True, log=log
    )
    sample = _samples(render(snapshot).decode())

    def at(name: str, **labels: str) -> float | None:
        return sample.get((name, tuple(sorted(labels.items()))))

    logs = {"namespace": "lakehouse", "table": "lakehouse.logs"}
    spans = {"namespace": "lakehouse", "table": "lakehouse.spans"}
    assert at("icegate_table_healthy", **logs) == 1
    assert at("wal_files_count", **logs) == 3
    assert at("icegate_table_due_seconds", **logs) is None
    assert at("icegate_operation_consecutive_failures", **logs, operation="optimize") == 2
    assert at("icegate_operation_consecutive_failures", **spans, operation="optimize") is None
    assert at("compaction_duration_seconds", **spans, operation="optimize") == 0.5
    assert at("icegate_files_rewritten_total", operation="optimize") == 7
    assert at("icegate_maintenance_operations_total", operation="optimize") == 3
    assert at("icegate_operation_due_tables", operation="optimize") == 2
    assert not [key for key in sample if key[0].startswith("icegate_operation_last_")]
    per_table = {
        t: sum(1 for _, labels in sample if ("table", t) in labels)
        for t in ("lakehouse.logs", "lakehouse.spans")
    }
    # 22 gauges; optimize failing (logs) and its last duration (both).
    assert per_table == {"lakehouse.logs": 24, "lakehouse.spans": 23}

    dropped = _samples(render(replace(snapshot, tables=(failing,))).decode())
    optimize = ("icegate_files_rewritten_total", (("operation", "optimize"),))
    assert dropped[optimize] == sample[optimize] == 7


def test_serve_refuses_bad_options_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = make_lakehouse(tmp_path / "lake")
    config = str(lake.config_path)
    assert run_cli(["serve", "--config", config, "--max-age", "soon"]) == 2
    assert "invalid --max-age = 'soon': must be a duration" in capsys.readouterr().err
    assert run_cli(["serve", "--config", config, "--port", "70000"]) == 2
    assert "invalid --port = 70000" in capsys.readouterr().err
    assert run_cli(["serve", "--config", config, "--dagster-home", str(tmp_path / "nope")]) == 2
    assert "--dagster-home" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("maintain: {checks: {max_compaction_duration: 0s}}\n")
    assert run_cli(["serve", "--config", str(tmp_path / "bad.yaml")]) == 2
    assert "maintain.checks.max_compaction_duration" in capsys.readouterr().err
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        assert run_cli(["serve", "--config", config, "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


def test_serve_refuses_credentials_it_cannot_use_without_showing_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    lake = make_lakehouse(tmp_path / "lake")
    config = str(lake.config_path)
    monkeypatch.setenv("ICEGATE_SERVE_BASIC_AUTH", "no-colon-s3cret")
    assert run_cli(["serve", "--config", config]) == 2
    err = capsys.readouterr().err
    assert "ICEGATE_SERVE_BASIC_AUTH must hold user:password" in err
    assert "no-colon-s3cret" not in err
    monkeypatch.setenv("ICEGATE_SERVE_BASIC_AUTH", "user:s3cret")
    monkeypatch.setenv("ICEGATE_SERVE_BASIC_AUTH_FILE", str(tmp_path / "nope"))
    assert run_cli(["serve", "--config", config]) == 2
    assert "not both" in capsys.readouterr().err
    monkeypatch.delenv("ICEGATE_SERVE_BASIC_AUTH")
    assert run_cli(["serve", "--config", config]) == 2
    assert "ICEGATE_SERVE_BASIC_AUTH_FILE = " in capsys.readouterr().err
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("ICEGATE_SERVE_BASIC_AUTH_FILE", str(tmp_path / "empty"))
    assert run_cli(["serve", "--config", config]) == 2
    assert "must hold user:password" in capsys.readouterr().err


class _Hello(PrereadHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        body = b"hello\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closes ``sock`` (end of stream, or a reset) within 10 s."""
    sock.settimeout(10)
    try:
        return sock.recv(10) == b""
    except ConnectionResetError:
        return True


def test_a_full_listener_closes_the_oldest_half_sent_connection_for_a_new_one() -> None:
    """At its connection limit the listener makes room by closing the connection that has
    waited longest without sending its request: a real request is still answered."""
    server = BoundedHTTPServer(("127.0.0.1", 0), _Hello, max_connections=20, head_timeout_s=600)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    held = []
    try:
        for _ in range(40):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            sock.sendall(b"GET / HTTP/1.1\r\n")
            held.append(sock)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as answer:
            assert answer.read() == b"hello\n"
        # The oldest were closed (not the 600 s head limit: room for newer ones).
        assert _closed_by_peer(held[0])
        # A complete request on one of the newest is answered.
        held[-1].sendall(b"\r\n")
        held[-1].settimeout(10)
        assert held[-1].recv(100).startswith(b"HTTP/1.0 200")
    finally:
        for sock in held:
            sock.close()
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def _database_clock_off_by(engine: Any, seconds: float) -> Iterator[None]:
    """Every connection of ``engine`` (SQLite) reads a clock ``seconds`` off this host's,
    as a database server with a skewed clock gives: SQLite's ``julianday('now')``, the
    store's clock (``sql_store.db_now``), replaced by the real one plus ``seconds``."""
    from sqlalchemy import event

    real = sqlite3.connect(":memory:", check_same_thread=False)
    lock = threading.Lock()

    def julianday(*args: Any) -> float | None:
        marks = ", ".join("?" for _ in args)
        with lock:
            value = real.execute(f"SELECT julianday({marks})", args).fetchone()[0]
        if value is not None and args[:1] == ("now",):
            return float(value) + seconds / 86400.0
        return value

    def skew(connection: Any, record: Any) -> None:
        connection.create_function("julianday", -1, julianday)

    event.listen(engine, "connect", skew)
    engine.dispose()  # connections made before read the true clock
    try:
        yield
    finally:
        event.remove(engine, "connect", skew)
        engine.dispose()
        real.close()


@pytest.mark.parametrize("skew_s", [-600.0, 600.0])
def test_figures_stamped_by_a_skewed_database_clock_are_judged_fresh(
    tmp_path: Path, skew_s: float
) -> None:
    """The lease store's database runs 10 minutes behind (or ahead of) the exporter's
    host: figures just gathered are fresh (``/health`` 200), and their age at a scrape and
    in ``/status/compaction`` is seconds, not the skew."""
    lake = make_lakehouse(tmp_path / "lake")
    lake.add_table("lakehouse.one", appends=1)
    exporter = Exporter(lake.config, max_age_s=1.0)
    locks = lease_store(lake.config, exporter.gatherer.maintainer.catalog)
    assert locks is not None
    try:
        with _database_clock_off_by(locks.engine, skew_s):
            snapshot = exporter.refresh()
            assert snapshot is not None, exporter.last_error
            # Stamped by the database's clock, as the trigger's memory's times are.
            assert abs(snapshot.taken_at - (time.time() + skew_s)) < 60
            status, document = health_document(exporter.probes.run())
            assert status == 200, document
            assert document["checks"]["metrics"]["age_seconds"] < 60
            live = {
                s.name: s.value
                for f in text_string_to_metric_families(exporter.metrics(False).decode())
                for s in f.samples
            }
            assert 0 <= live["icegate_exporter_snapshot_age_seconds"] < 60
            assert 0 <= exporter.compaction_status(None)["age_seconds"] < 60
    finally:
        exporter.stop()


def test_a_start_reads_the_last_week_of_the_log_not_all_of_it(tmp_path: Path) -> None:
    """A log of 120 days (a commit a day): a new process (a restart) reads only the data
    files of the last week, for each table and operation's latest run; what is appended
    after it started is read alone and counted."""
    lake = make_lakehouse(tmp_path / "lake")
    ref = TableRef.parse(lake.config.log_table)
    ensure_log_table(lake.catalog, ref)
    today = datetime.now(UTC).replace(microsecond=0)
    days = 120
    for age in range(days, 0, -1):
        at = today - timedelta(days=age)
        append_log_rows_without_spark(
            lake.catalog,
            ref,
            [
                _row("ns.a", "optimize", "completed", DETAILS["optimize"], age, at),
                _row("ns.b", "optimize", "failed", "boom", age, at),
            ],
        )
    started = LogTotals(lambda: lake.catalog, ref)
    view = started.refresh()
    assert view.rows_read <= 2 * 8, f"{view.rows_read} rows read at start, of {2 * days}"
    assert started.files_read <= 8, f"{started.files_read} data files read at start, of {days}"
    latest = view.totals[("ns.a", "optimize")]
    assert latest.last_at == (today - timedelta(days=1)).timestamp()
    assert (latest.last_status, latest.last_duration_ms) == ("completed", 1)
    assert view.totals[("ns.b", "optimize")].last_status == "failed"
    # Counters count from the start: what was logged before is not added up.
    assert (latest.rows, latest.failures, latest.figures.get("files_rewritten", 0)) == (0, 0, 0)
    append_log_rows_without_spark(
        lake.catalog, ref, [_row("ns.a", "optimize", "completed", DETAILS["optimize"], 5, today)]
    )
    after = started.refresh()
    latest = after.totals[("ns.a", "optimize")]
    assert after.rows_read == view.rows_read + 1  # only the new row
    assert (latest.rows, latest.figures["files_rewritten"], latest.last_at) == (
        1,
        12,
        today.timestamp(),
    )


def _beat(instance: Any, at: float) -> None:
    """Every daemon the instance requires beats, stamped ``at`` by its host's clock (as
    ``dagster-daemon`` writes its heartbeats)."""
    from dagster._daemon.types import DaemonHeartbeat

    for daemon in instance.get_required_daemon_types():
        instance.add_daemon_heartbeat(DaemonHeartbeat(at, daemon, "skewed-host", None))


def test_a_daemon_on_a_host_minutes_behind_is_up_once_seen_beating(tmp_path: Path) -> None:
    """The daemon's host runs 10 minutes behind the exporter's: its heartbeats look 600 s
    old by the exporter's clock. Once a new one is seen, the daemon is up (/health's
    ``dagster_daemon`` passes): a heartbeat's age is judged by how long the exporter has
    seen it unchanged, not by two hosts' clocks."""
    from dagster import DagsterInstance

    lake = make_lakehouse(tmp_path / "lake")
    home = tmp_path / "dagster_home"
    home.mkdir()
    instance = DagsterInstance.local_temp(str(home))
    probes = HealthProbes(lake.config, instance)
    try:
        behind = time.time() - 600
        _beat(instance, behind)
        probes.run()  # one heartbeat seen: a skew cannot be told from silence yet
        _beat(instance, behind + 30)  # the daemon beats again, 30 s later by its clock
        time.sleep(REUSE_S + 0.1)  # past the reuse of /health's last answer
        answers = probes.run()
        assert answers["dagster_daemon"].ok, answers["dagster_daemon"].error
    finally:
        probes.close()
        instance.dispose()


def test_a_daemon_that_stopped_is_down_whatever_its_hosts_clock() -> None:
    """A heartbeat stamped by a host 10 minutes ahead (its age by the exporter's clock: 0)
    that stops changing: down once the exporter has seen it unchanged past the tolerance;
    one that keeps changing stays up."""
    ticks = [0.0]
    ages = HeartbeatAges(monotonic=lambda: ticks[0])
    now = 1_000_000.0
    ahead = now + 600
    assert ages.age("SENSOR", ahead, now) == 0.0
    ticks[0] = DAEMON_TOLERANCE_S + 1
    stopped = ages.age("SENSOR", ahead, now + DAEMON_TOLERANCE_S + 1)
    assert stopped > DAEMON_TOLERANCE_S
    assert daemon_problem((DaemonBeat("SENSOR", stopped, True),)) is not None
    # Seen beating (its timestamp moved): its age is the time since its latest beat was seen.
    ticks[0] += 10
    assert ages.age("SENSOR", ahead + 30, now) == 0.0
    ticks[0] += 25
    assert ages.age("SENSOR", ahead + 30, now + 3600) == 25.0
