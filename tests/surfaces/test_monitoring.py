"""``icegate-maintain serve`` in the operators' own monitoring, with real parts only: the
exporter as its own process over a real lakehouse, Debian's Prometheus scraping it every
second with the shipped alert rules, PromQL through Prometheus' HTTP API before and after a
real pass, every panel of the shipped Grafana dashboard queried, the Prometheus graph page
in Chromium; two exporters, one with the default series budget (job ``icegate-maintain``,
which the rules and the dashboard must do with) and one with ``--operation-detail`` (job
``icegate-detail``: the dashboard's per-operation row, the per-table counters);
``/health`` answering 503 when the catalog cannot be reached, and while the Dagster daemon
does not beat.

One lakehouse for the module (``lakehouse.events``: 14 small files in one partition and an
old orphan; ``lakehouse.logs``: 12 WAL files waiting; ``lakehouse.stale``: due, never
maintained; ``lakehouse.broken``: its ``optimize`` fails, twice), the two exporters and one
Prometheus for the whole story.
"""

from __future__ import annotations

import base64
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from playwright.sync_api import sync_playwright

from icegate_dagster.cli.dispatch import run_cli
from tests.lakehouse import Lakehouse, batch, make_lakehouse
from tests.servers import ServerProcess, free_port, process_tree, wait_until
from tests.surfaces.prometheus_server import (
    JOB,
    PROMTOOL,
    Prometheus,
    dashboard_queries,
    exporter_command,
    get,
    running_prometheus,
    template_queries,
)
from tests.webserver import REPO

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
EVENTS, LOGS, STALE, BROKEN = (
    "lakehouse.events",
    "lakehouse.logs",
    "lakehouse.stale",
    "lakehouse.broken",
)
WAL_FILES, WAL_ROWS_EACH = 12, 5
SMALL_FILES = 14
#: The job of the exporter started with ``--operation-detail``.
DETAIL_JOB = "icegate-detail"
#: What the default serves at most per table (issue 41), one operation failing.
SERIES_BUDGET = 25


def _artifacts() -> Path:
    folder = Path(os.environ.get("ICEGATE_TEST_ARTIFACTS", REPO / "artifacts")) / "monitoring"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory: pytest.TempPathFactory) -> Lakehouse:
    root = tmp_path_factory.mktemp("monitoring") / "lake"
    lake = make_lakehouse(
        root,
        maintain={
            # Due tables count as stale after 3 s (3 × min_interval) in the rules.
            "health": {"min_interval": "1s"},
            # The tables' snapshots are seconds old: let the expiry free their files.
            "expire_snapshots": {"retention_threshold": "1s"},
            # A sort without a sort order: optimize fails on this table, naming why.
            "tables": {BROKEN: {"optimize": {"strategy": "sort"}}},
        },
        wal=True,
    )
    for key in (EVENTS, STALE, BROKEN):
        lake.add_table(key, appends=SMALL_FILES, services=("api",))
    lake.add_table(LOGS, appends=2)
    for i in range(WAL_FILES):
        lake.write_wal(LOGS, batch(100_000 + i * 100, ("api",), WAL_ROWS_EACH), f"w{i:02d}.parquet")
    lake.planted["orphan"] = lake.plant_file(EVENTS, "orphan.parquet", timedelta(days=30))
    return lake


@pytest.fixture(scope="module")
def exporter(lakehouse: Lakehouse) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    command = exporter_command(lakehouse.config_path, port, "--max-age", "1s")
    with ServerProcess("exporter", command, lakehouse.root / "exporter.log") as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(
            lambda: b"icegate_exporter_snapshot_timestamp_seconds" in get(f"{url}/metrics")[1],
            60,
            what="the exporter's first figures",
        )
        yield process, url


@pytest.fixture(scope="module")
def detail_exporter(lakehouse: Lakehouse) -> Iterator[tuple[ServerProcess, str]]:
    port = free_port()
    command = exporter_command(lakehouse.config_path, port, "--max-age", "1s", "--operation-detail")
    with ServerProcess("detail", command, lakehouse.root / "detail.log") as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(
            lambda: (
                b"icegate_operation_last_outcome" in get(f"{url}/metrics")[1]
                or b"icegate_table_health_penalty" in get(f"{url}/metrics")[1]
            ),
            60,
            what="the detailed exporter's first figures",
        )
        yield process, url


@pytest.fixture(scope="module")
def prometheus(
    lakehouse: Lakehouse,
    exporter: tuple[ServerProcess, str],
    detail_exporter: tuple[ServerProcess, str],
) -> Iterator[Prometheus]:
    target = exporter[1].removeprefix("http://")
    detail = detail_exporter[1].removeprefix("http://")
    with running_prometheus(
        lakehouse.root / "prometheus", [target], {DETAIL_JOB: [detail]}
    ) as server:
        yield server


def _series_per_table(url: str) -> dict[str, int]:
    """Series per ``table`` label on a served ``/metrics``."""
    counts: dict[str, int] = {}
    for line in get(f"{url}/metrics")[1].decode().splitlines():
        if line and not line.startswith("#") and 'table="' in line:
            table = line.split('table="', 1)[1].split('"', 1)[0]
            counts[table] = counts.get(table, 0) + 1
    return counts


def _no_java(process: ServerProcess) -> None:
    names = []
    for pid in process_tree(process.process.pid):
        try:
            names.append(Path(f"/proc/{pid}/comm").read_text().strip())
        except OSError:
            continue
    assert "java" not in names, f"the exporter started a JVM: {names}"


def test_prometheus_sees_the_lakehouse_before_and_after_a_pass(
    lakehouse: Lakehouse,
    exporter: tuple[ServerProcess, str],
    detail_exporter: tuple[ServerProcess, str],
    prometheus: Prometheus,
) -> None:
    """Files before/after, the counters from the log, a stale table, a failing table, the
    rules' alerts on the default series; every dashboard panel returns series (the
    per-operation row's from the detailed exporter); at most 25 series a table by default;
    no JVM in the exporters."""
    process, url = exporter
    config = str(lakehouse.config_path)

    def at(
        metric: str, table: str | None, expr: str = "{}", job: str = JOB, **labels: str
    ) -> float | None:
        """The value of ``metric`` for ``table`` (and ``labels``) as exporter ``job``
        serves it, ``expr`` around it."""
        found = {"job": job, **({"table": table} if table else {}), **labels}
        matchers = ",".join(f'{k}="{v}"' for k, v in found.items())
        return prometheus.value(expr.format(f"{metric}{{{matchers}}}"))

    def detail(metric: str, table: str | None, expr: str = "{}", **labels: str) -> float | None:
        return at(metric, table, expr, DETAIL_JOB, **labels)

    # -- before -------------------------------------------------------------------------------
    wait_until(lambda: at("icegate_table_data_files", EVENTS) == SMALL_FILES, 30, "before")
    assert at("wal_files_count", LOGS) == WAL_FILES
    wait_until(
        lambda: detail("icegate_table_data_files", EVENTS) == SMALL_FILES, 30, "detail: before"
    )
    assert detail("icegate_table_operation_due", EVENTS, operation="optimize") == 1
    assert detail("icegate_table_operation_due", LOGS, operation="wal_compaction") == 1
    assert at("icegate_operation_due_tables", None, operation="optimize") == 3
    assert at("icegate_operation_due_tables", None, operation="wal_compaction") == 1
    assert detail("icegate_files_rewritten_total", EVENTS, operation="optimize") == 0
    assert at("icegate_files_rewritten_total", None, operation="optimize") == 0
    assert at("snapshot_count", EVENTS) == SMALL_FILES
    bytes_before = at("icegate_table_data_bytes", EVENTS)
    assert bytes_before and bytes_before > 0
    assert at("icegate_health_min_interval_seconds", EVENTS) == 1
    assert at("icegate_check_max_wal_files", LOGS) == 1000
    _no_java(process)

    # -- a pass over two tables, and a failing operation twice ---------------------------------
    assert run_cli(["run", "--config", config, "--table", EVENTS, "--table", LOGS]) == 0
    for _ in range(2):
        assert run_cli(["optimize", "--config", config, "--table", BROKEN]) == 1

    # -- after ----------------------------------------------------------------------------------
    def after(job: str) -> bool:
        return (
            at("icegate_table_data_files", EVENTS, job=job) == 1
            and at("wal_files_count", LOGS, job=job) == 0
            and at("icegate_operation_consecutive_failures", BROKEN, job=job, operation="optimize")
            == 2
        )

    wait_until(
        lambda: after(JOB) and after(DETAIL_JOB),
        30,
        "after: events compacted, the WAL ingested, broken failed twice",
    )
    # Counters summed from the maintenance log's rows: per table with the detail...
    assert detail("icegate_files_rewritten_total", EVENTS, operation="optimize") == SMALL_FILES
    assert detail("icegate_bytes_rewritten_total", EVENTS, operation="optimize") == bytes_before
    assert detail("icegate_wal_rows_ingested_total", LOGS) == WAL_FILES * WAL_ROWS_EACH
    assert detail("icegate_wal_files_ingested_total", LOGS) == WAL_FILES
    assert detail("icegate_orphan_files_removed_total", EVENTS) == 1
    # The 14 small files (and their manifests and manifest lists) once expired.
    freed = detail("icegate_files_freed_total", EVENTS, operation="expire_snapshots") or 0
    assert freed > SMALL_FILES
    assert (detail("icegate_bytes_freed_total", EVENTS, operation="expire_snapshots") or 0) > 0
    assert detail("icegate_maintenance_failures_total", BROKEN, operation="optimize") == 2
    seconds = detail("icegate_maintenance_run_seconds_total", EVENTS, operation="optimize")
    assert (seconds or 0) > 0
    # ... and by default summed over the tables, by operation (the same totals).
    assert at("icegate_files_rewritten_total", None, operation="optimize") == SMALL_FILES
    assert at("icegate_bytes_rewritten_total", None, operation="optimize") == bytes_before
    assert at("icegate_wal_rows_ingested_total", None) == WAL_FILES * WAL_ROWS_EACH
    every_table = (
        f'sum(icegate_files_freed_total{{job="{DETAIL_JOB}",operation="expire_snapshots"}})'
    )
    assert at("icegate_files_freed_total", None, operation="expire_snapshots") == (
        prometheus.value(every_table)
    )
    assert at("icegate_maintenance_failures_total", None, operation="optimize") == 2
    assert (at("compaction_duration_seconds", EVENTS, operation="optimize") or 0) > 0
    # The trigger's memory: last outcome, last success (the detail only).
    completed = {"operation": "optimize", "outcome": "completed"}
    assert detail("icegate_operation_last_outcome", EVENTS, **completed) == 1
    failed = {"operation": "optimize", "outcome": "failed"}
    assert detail("icegate_operation_last_outcome", BROKEN, **failed) == 1
    assert at("icegate_operation_last_outcome", BROKEN, **failed) is None
    success = "icegate_operation_last_success_timestamp_seconds"
    assert detail(success, BROKEN, operation="optimize") is None
    since = detail(success, EVENTS, "time() - {}", operation="optimize")
    assert since is not None and 0 <= since < 120
    # Failures in a row: 0 with the detail, no series by default, once an operation succeeds.
    assert detail("icegate_operation_consecutive_failures", EVENTS, operation="optimize") == 0
    assert at("icegate_operation_consecutive_failures", EVENTS, operation="optimize") is None
    # Health: the maintained table is healthy and due for nothing; the others are due.
    assert at("icegate_table_due_operations", EVENTS) == 0
    assert at("icegate_table_unmaintained_seconds", EVENTS) == 0
    assert detail("icegate_table_operation_due", STALE, operation="optimize") == 1
    assert at("icegate_operation_due_tables", None, operation="optimize") == 2

    # -- series per table, counted on each exporter's /metrics ---------------------------------
    default_series = _series_per_table(url)
    detail_series = _series_per_table(detail_exporter[1])
    assert set(default_series) == set(detail_series) == {EVENTS, LOGS, STALE, BROKEN}
    assert max(default_series.values()) <= SERIES_BUDGET, default_series
    # A maintained table: each operation's last attempt, success, outcome, counters.
    assert detail_series[EVENTS] > 3 * SERIES_BUDGET, detail_series

    # -- the shipped rules: a stale table, a failing table, nothing for the maintained one -------
    def alerts(name: str) -> dict[str, str]:
        """The alert's state per table, from the default exporter's series."""
        return {
            s["metric"]["table"]: s["metric"]["alertstate"]
            for s in prometheus.query(f'ALERTS{{alertname="{name}",job="{JOB}"}}')
        }

    wait_until(lambda: STALE in alerts("IcegateTableStale"), 30, "the stale table's alert")
    # The maintained table was due, and unmaintained for seconds, while the pass ran: its
    # pending alert clears at the first rule evaluation that sees the scrape after the pass.
    wait_until(
        lambda: EVENTS not in alerts("IcegateTableStale"), 30, "the maintained table's alert"
    )
    assert STALE in alerts("IcegateTableStale")
    wait_until(
        lambda: alerts("IcegateOperationFailing").get(BROKEN) == "firing", 30, "the failing alert"
    )
    assert set(alerts("IcegateOperationFailing")) == {BROKEN}

    # -- every panel of the dashboard, and its variables, return series -------------------------
    # Those of the per-operation row from the detailed exporter, the others from the default.
    substitutions = {
        "$__rate_interval": "1m",
        "$job": JOB,
        "$namespace": ".+",
        "$table": EVENTS,
    }
    panels = []
    for detailed in (False, True):
        for title, expr in dashboard_queries(detail=detailed):
            for name, value in {**substitutions, "$job": DETAIL_JOB if detailed else JOB}.items():
                expr = expr.replace(name, value)
            panels.append((title, expr))
    assert len(panels) == len(dashboard_queries())

    def panels_without_series() -> list[str]:
        return [f"{title}: {expr}" for title, expr in panels if not prometheus.query(expr)]

    # increase() over a window needs two samples of the new counter values: asked again
    # (Prometheus scrapes every second) until then.
    wait_until(
        lambda: not panels_without_series(),
        15,
        "series for every dashboard panel",
        details=lambda: "\n".join(panels_without_series()),
    )
    for name, definition in template_queries():
        selector = definition.removeprefix("label_values(").rsplit(",", 1)[0]
        for variable, value in substitutions.items():
            selector = selector.replace(variable, value)
        assert prometheus.api("series", **{"match[]": selector}), f"variable {name}: {selector}"

    # -- the exporter's own answers --------------------------------------------------------------
    status, body, headers = get(f"{url}/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    checked = subprocess.run(
        [str(PROMTOOL), "check", "metrics"], input=body, capture_output=True, check=False
    )
    problems = sorted(
        line.split()[0] for line in (checked.stdout + checked.stderr).decode().splitlines() if line
    )
    # The seed's two names end in _count, which promtool's linter reserves for histograms:
    # kept on purpose (alerts written for IceGate's Maintain service use them).
    assert problems == ["snapshot_count", "wal_files_count"], checked
    request = urllib.request.Request(f"{url}/metrics", headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(request, timeout=10) as answer:
        assert answer.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(answer.read()).startswith(body[:100])
    status, body, _ = get(f"{url}/health")
    health = json.loads(body)
    assert status == 200 and health["status"] == "ok", health
    assert set(health["checks"]) == {"catalog", "lease_store", "metrics"}
    status, body, _ = get(f"{url}/status/compaction?table={LOGS}&table=nope.nope")
    compaction = json.loads(body)
    assert status == 200 and [t["table"] for t in compaction["tables"]] == [LOGS]
    assert compaction["unknown_tables"] == ["nope.nope"]
    logs = compaction["tables"][0]
    assert logs["wal"]["files"] == 0 and logs["wal"]["bytes"] == 0
    assert logs["last_ingest"]["status"] == "completed"
    assert logs["last_ingest"]["details"].startswith(f"ingested {WAL_FILES} WAL files")
    assert logs["ingested"] == {
        "files": WAL_FILES,
        "rows": WAL_FILES * WAL_ROWS_EACH,
        "runs": 1,
        "failures": 0,
    }
    assert logs["last_attempt"]["outcome"] == "completed"
    assert get(f"{url}/nope")[0] == 404
    _no_java(process)
    _no_java(detail_exporter[0])

    # -- the Prometheus graph page, as an operator sees it ---------------------------------------
    assert CHROMIUM.exists(), "Debian's chromium is missing: run scripts/setup.sh --test"
    graph = (
        f"{prometheus.url}/graph?g0.expr=icegate_table_data_files&g0.tab=0&g0.range_input=2m"
        "&g0.stacked=0&g0.show_exemplars=0"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(graph, timeout=60_000)
            # Debian's Prometheus 2.42 serves the classic UI: a Rickshaw chart and its legend
            # (attached, not visible: a flat line's box has no height).
            page.wait_for_selector(".rickshaw_graph svg path", state="attached", timeout=60_000)
            page.get_by_text(f'table="{EVENTS}"').first.wait_for(timeout=60_000)
            page.screenshot(path=_artifacts() / "prometheus_graph.png", full_page=True)
        finally:
            browser.close()


def test_health_is_503_naming_the_catalog_it_cannot_reach(tmp_path: Path) -> None:
    """A REST catalog nobody serves: ``/health`` answers 503 naming ``catalog`` (the lease
    store, a SQLite file beside the configuration, is fine); ``/metrics`` still answers,
    with the catalog down; the catalog's credential is in no answer and no log line."""
    closed = free_port()  # nothing listens there
    secret = "s3cr3t-credential-value"
    config = tmp_path / "icegate.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "catalog": {
                    "name": "icegate",
                    "type": "rest",
                    "uri": f"http://127.0.0.1:{closed}",
                    "credential": "client:${ICEGATE_TEST_CREDENTIAL}",
                }
            }
        )
    )
    port = free_port()
    env = {**os.environ, "ICEGATE_TEST_CREDENTIAL": secret}
    command = exporter_command(config, port, "--max-age", "1s")
    with ServerProcess("exporter", command, tmp_path / "exporter.log", env=env) as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(
            lambda: b'icegate_dependency_up{dependency="catalog"} 0.0' in get(f"{url}/metrics")[1],
            30,
            what="the exporter reporting the catalog down",
        )
        status, body, headers = get(f"{url}/health")
        assert status == 503 and headers["Content-Type"] == "application/json"
        health = json.loads(body)
        assert health["status"] == "unavailable"
        assert health["failed"] == ["catalog"]
        assert health["checks"]["lease_store"]["ok"] is True
        error = health["checks"]["catalog"]["error"]
        assert "Connection refused" in error or "connect" in error.lower(), error
        assert health["message"].startswith("catalog: ")
        compaction = get(f"{url}/status/compaction")[1]
        time.sleep(1.5)
        for text in (body, get(f"{url}/metrics")[1], compaction, process.log_text().encode()):
            assert secret.encode() not in text
        assert "catalog cannot be read" in process.log_text()


def test_health_names_a_dagster_daemon_that_does_not_beat(tmp_path: Path) -> None:
    """With ``--dagster-home``, ``/health`` checks the instance and its daemon: 503 naming
    ``dagster_daemon`` while no daemon runs, 200 once a real ``dagster-daemon`` beats."""
    lake = make_lakehouse(tmp_path / "lake")
    lake.add_table("lakehouse.one", appends=1)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs = tmp_path / "empty_defs.py"
    defs.write_text("import dagster as dg\n\ndefs = dg.Definitions()\n")
    port = free_port()
    command = exporter_command(
        lake.config_path, port, "--max-age", "1s", "--dagster-home", str(home)
    )
    with ServerProcess("exporter", command, tmp_path / "exporter.log") as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(lambda: get(f"{url}/health")[0] == 503, 30, what="/health")
        health = json.loads(get(f"{url}/health")[1])
        assert health["failed"] == ["dagster_daemon"], health
        assert "SENSOR (no heartbeat)" in health["checks"]["dagster_daemon"]["error"]
        assert health["checks"]["dagster_instance"]["ok"] is True
        daemon = [str(Path(sys.executable).parent / "dagster-daemon"), "run", "-f", str(defs)]
        env = {**os.environ, "DAGSTER_HOME": str(home)}
        with ServerProcess(
            "dagster-daemon", daemon, tmp_path / "daemon.log", env=env, own_group=True
        ) as running:
            running.wait_ready(lambda: get(f"{url}/health")[0] == 200, 90, what="/health 200")
        metrics = get(f"{url}/metrics")[1].decode()
        assert 'icegate_dagster_daemon_heartbeat_age_seconds{daemon="SENSOR"}' in metrics


def _threads(pid: int) -> int:
    """Threads of process ``pid`` now (Python's and native ones)."""
    return len(list(Path(f"/proc/{pid}/task").iterdir()))


def _closed_by_peer(sock: socket.socket) -> bool:
    """Whether the other end closed ``sock`` (end of stream, or a reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(1024) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _small_lakehouse(root: Path) -> Lakehouse:
    lake = make_lakehouse(root)
    lake.add_table("lakehouse.one", appends=1)
    return lake


def test_half_sent_requests_neither_hold_threads_nor_stay_open(tmp_path: Path) -> None:
    """300 connections that send half a request: the exporter's threads stay bounded, a
    real scrape is still answered, and the half-sent connections are closed once their
    request head is overdue."""
    lake = _small_lakehouse(tmp_path / "lake")
    port = free_port()
    command = exporter_command(lake.config_path, port, "--max-age", "1s")
    with ServerProcess("exporter", command, tmp_path / "exporter.log") as process:
        url = f"http://127.0.0.1:{port}"
        process.wait_ready(
            lambda: b"icegate_exporter_snapshot_timestamp_seconds" in get(f"{url}/metrics")[1],
            60,
            what="the exporter's first figures",
        )
        pid = process.process.pid
        before = _threads(pid)
        held = []
        try:
            for _ in range(300):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: exporter\r\n")  # never ended
                held.append(sock)
            # A real scrape, accepted after the 300: answered (urllib's 10 s limit).
            status, body, _ = get(f"{url}/metrics")
            assert status == 200 and b"icegate_exporter_tables 1.0" in body
            during = _threads(pid)
            assert during <= before + 20, f"{before} threads before, {during} with 300 half-sent"
            wait_until(
                lambda: all(_closed_by_peer(sock) for sock in held),
                60,
                "the half-sent connections closed by the exporter",
            )
            assert get(f"{url}/metrics")[0] == 200
        finally:
            for sock in held:
                sock.close()


def _auth_header(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _get_with(url: str, headers: dict[str, str]) -> tuple[int, bytes, dict[str, str]]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


@pytest.mark.parametrize("source", ["variable", "file"])
def test_basic_auth_from_the_environment_guards_the_figures(tmp_path: Path, source: str) -> None:
    """Credentials from ``ICEGATE_SERVE_BASIC_AUTH`` (or a file named by
    ``ICEGATE_SERVE_BASIC_AUTH_FILE``): ``/metrics`` and ``/status/compaction`` answer 401
    without them or with wrong ones, 200 with them; ``/health`` answers its status to anyone
    (probes send no credentials) but its checks' details only with them; the password is
    on no command line."""
    lake = _small_lakehouse(tmp_path / "lake")
    password = "pr0m-scrape-s3cret"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ICEGATE_SERVE_BASIC_AUTH")}
    if source == "variable":
        env["ICEGATE_SERVE_BASIC_AUTH"] = f"prometheus:{password}"
    else:
        secret = tmp_path / "basic-auth"
        secret.write_text(f"prometheus:{password}\n")
        env["ICEGATE_SERVE_BASIC_AUTH_FILE"] = str(secret)
    port = free_port()
    command = exporter_command(lake.config_path, port, "--max-age", "1s")
    with ServerProcess("exporter", command, tmp_path / "exporter.log", env=env) as process:
        url = f"http://127.0.0.1:{port}"
        good = _auth_header("prometheus", password)
        process.wait_ready(
            lambda: b"icegate_exporter_tables 1.0" in _get_with(f"{url}/metrics", good)[1],
            60,
            what="the exporter's first figures",
        )
        for path in ("/metrics", "/status/compaction"):
            status, body, headers = get(f"{url}{path}")
            assert status == 401, (path, status)
            assert headers["WWW-Authenticate"].startswith('Basic realm="icegate-maintain"')
            assert b"icegate_" not in body and b"lakehouse.one" not in body
            assert _get_with(f"{url}{path}", _auth_header("prometheus", "wrong"))[0] == 401
            assert _get_with(f"{url}{path}", _auth_header("other", password))[0] == 401
            assert _get_with(f"{url}{path}", good)[0] == 200
        status, body, _ = get(f"{url}/health")
        assert status == 200 and json.loads(body) == {"status": "ok", "failed": []}
        status, body, _ = _get_with(f"{url}/health", good)
        assert status == 200 and set(json.loads(body)["checks"]) == {
            "catalog",
            "lease_store",
            "metrics",
        }
        assert get(f"{url}/")[0] == 200
        cmdline = Path(f"/proc/{process.process.pid}/cmdline").read_bytes()
        assert password.encode() not in cmdline
        assert password not in process.log_text()
