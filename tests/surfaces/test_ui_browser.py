"""The Dagster UI in headless Chromium, over a lakehouse maintained once through Dagster.

The webserver runs on loopback over this code location and a persistent temp
instance; Playwright drives Debian's Chromium (no browser download). Every page
is saved as a screenshot under ``artifacts/ui/`` (or ``$ICEGATE_TEST_ARTIFACTS/ui``).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from playwright.sync_api import Browser, Locator, Page, expect, sync_playwright

from icegate_dagster.assets.names import MAINTAINED_TABLE
from icegate_dagster.cli.dispatch import run_cli
from icegate_dagster.maintenance.health.checks import CHECK_NAMES
from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import discovery_tick, health_tick, run_maintenance
from tests.lakehouse import Lakehouse, batch, make_lakehouse
from tests.webserver import REPO, make_dagster_home, running_webserver

CHROMIUM = Path("/usr/bin/chromium")
# Headless on a closed network: without the background-networking flags Chromium keeps
# dialling Google's hosts. --no-sandbox because CI runs as root.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TABLES = ["lakehouse.logs", "lakehouse.spans"]
UI_TIMEOUT_MS = 60_000


def _artifacts() -> Path:
    folder = Path(os.environ.get("ICEGATE_TEST_ARTIFACTS", REPO / "artifacts")) / "ui"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture(scope="module")
def lakehouse(tmp_path_factory: pytest.TempPathFactory) -> Lakehouse:
    """Two tables of small files, each 12 files in 2 partitions."""
    lh = make_lakehouse(tmp_path_factory.mktemp("ui") / "lake")
    lh.add_table("lakehouse.logs", appends=6)  # 12 small files -> compacted to 2
    lh.add_table("lakehouse.spans", appends=6)
    return lh


@pytest.fixture(scope="module")
def webserver_port(lakehouse: Lakehouse) -> Iterator[int]:
    """The lakehouse maintained once by ``maintenance_job``, and the UI serving its instance."""
    root = lakehouse.root.parent
    home = make_dagster_home(root / "dagster_home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert run_maintenance(lakehouse, instance, TABLES).success
    with running_webserver(home, lakehouse.config_path, root / "webserver.log") as (port, _):
        yield port


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "Debian's chromium is missing: run scripts/setup.sh --test"
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield launched
        launched.close()


def _browse(browser: Browser, port: int, height: int = 1000) -> Iterator[Page]:
    """A fresh browser page on the webserver at ``port``, closed afterwards."""
    context = browser.new_context(
        base_url=f"http://127.0.0.1:{port}", viewport={"width": 1600, "height": height}
    )
    context.set_default_timeout(UI_TIMEOUT_MS)
    yield context.new_page()
    context.close()


@pytest.fixture
def page(browser: Browser, webserver_port: int) -> Iterator[Page]:
    yield from _browse(browser, webserver_port)


def _open(page: Page, path: str) -> None:
    """Go to ``path`` and dismiss Dagster's first-visit newsletter dialog if it shows."""
    page.goto(path)
    skip = page.get_by_role("button", name="Skip")
    try:
        skip.wait_for(state="visible", timeout=5_000)
        skip.click()
    except Exception:  # the dialog only shows on a first visit; nothing to dismiss
        pass


def _metadata_value(page: Page, key: str) -> str:
    """The value of ``key`` in the visible metadata table (its last non-empty cell)."""
    row = page.locator("tr", has=page.get_by_text(key, exact=True)).first
    expect(row).to_be_visible()
    cells = [c.strip() for c in row.locator("td").all_inner_texts() if c.strip()]
    return cells[-1]


def test_partitions_tab_lists_every_table_with_its_metadata(page: Page) -> None:
    _open(page, "/assets/maintained_table?view=partitions")
    for table in TABLES:
        expect(page.get_by_text(table, exact=True).first).to_be_visible()
    expect(page.get_by_text("Materialized (2)")).to_be_visible()

    page.get_by_text("lakehouse.logs", exact=True).first.click()
    expect(page.get_by_text("files_before", exact=True)).to_be_visible()
    assert _metadata_value(page, "files_before") == "12"
    assert _metadata_value(page, "files_after") == "2"
    assert _metadata_value(page, "rows_before") == _metadata_value(page, "rows_after") == "60"
    page.screenshot(path=_artifacts() / "partition_lakehouse.logs.png", full_page=True)


def test_events_tab_shows_each_tables_materialization(page: Page) -> None:
    _open(page, "/assets/maintained_table?view=events")
    for table in TABLES:
        expect(page.get_by_text(table, exact=True).first).to_be_visible()
    expect(page.get_by_text("files_after", exact=True).first).to_be_visible()
    # The per-operation table, as the run recorded it.
    expect(page.get_by_text(re.compile(r"^rewrote \d+ data files")).first).to_be_visible()
    page.screenshot(path=_artifacts() / "events.png", full_page=True)


def test_checks_tab_shows_every_check_passed(page: Page) -> None:
    _open(page, "/assets/maintained_table?view=checks")
    expect(page.get_by_text(f"Checks ({len(CHECK_NAMES)})")).to_be_visible()
    for name in CHECK_NAMES:
        expect(page.get_by_text(name, exact=True).first).to_be_visible()
    assert page.get_by_text("Succeeded", exact=True).count() >= len(CHECK_NAMES)
    assert page.get_by_text("Failed", exact=True).count() == 0
    page.screenshot(path=_artifacts() / "checks.png", full_page=True)


def test_lineage_shows_maintenance_log_downstream(page: Page) -> None:
    _open(page, "/assets/maintained_table?view=lineage")
    expect(page.get_by_text("maintenance_log", exact=True).first).to_be_visible()
    expect(page.get_by_text(f"{len(CHECK_NAMES)} / {len(CHECK_NAMES)} Passed")).to_be_visible()
    page.screenshot(path=_artifacts() / "lineage.png", full_page=True)


def test_maintenance_log_page_shows_the_runs_log_rows(page: Page, lakehouse: Lakehouse) -> None:
    logged = lakehouse.log_rows()
    # No WAL is configured, so no wal_compaction: five operations per table.
    operations = {
        "optimize",
        "rewrite_position_delete_files",
        "rewrite_manifests",
        "expire_snapshots",
        "remove_orphan_files",
    }
    for table in TABLES:
        assert {r["operation"] for r in logged if r["table_name"] == table} == operations
    _open(page, "/assets/maintenance_log")
    expect(page.get_by_text("rows_this_run", exact=True)).to_be_visible()
    assert len(logged) == len(TABLES) * len(operations)
    assert _metadata_value(page, "rows_this_run") == str(len(logged))
    assert _metadata_value(page, "failures_this_run") == "0"
    page.screenshot(path=_artifacts() / "maintenance_log.png", full_page=True)


# -- every table's state, whoever maintained it --------------------------------------------

CLI_TABLES = ["lakehouse.orders", "lakehouse.metrics"]
CHANGED = CLI_TABLES[1]  # maintained by the CLI, unhealthy since
UNHEALTHY = "lakehouse.events"  # 13 small files in one partition, never maintained
REQUESTED = "lakehouse.spans"  # as unhealthy, more bytes: the one the trigger requests
ASSESSED = "lakehouse.idle"  # one small commit, never maintained: healthy
HISTORY_MIN_SCORE = 80


@pytest.fixture(scope="module")
def history_lakehouse(tmp_path_factory: pytest.TempPathFactory) -> Lakehouse:
    lh = make_lakehouse(
        tmp_path_factory.mktemp("ui_history") / "lake",
        # One table a tick: the other unhealthy one waits (budget), assessed meanwhile.
        maintain={"health": {"min_score": HISTORY_MIN_SCORE}, "trigger": {"max_tables": 1}},
    )
    for key in CLI_TABLES:
        lh.add_table(key, appends=6)  # 12 small files -> compacted to 2
    lh.add_table(UNHEALTHY, appends=13, services=("api",))
    lh.add_table(REQUESTED, appends=20, services=("api",))
    lh.add_table(ASSESSED, appends=1)
    return lh


@pytest.fixture(scope="module")
def history_port(history_lakehouse: Lakehouse) -> Iterator[int]:
    """Two tables maintained by ``icegate-maintain run`` with ``DAGSTER_HOME`` set, then the
    discovery sensor's tick and one of the health sensor, as the daemon runs them (the run
    it requests for REQUESTED is not launched)."""
    lh = history_lakehouse
    root = lh.root.parent
    home = make_dagster_home(root / "dagster_home")
    args = ["run", "--config", str(lh.config_path)]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("DAGSTER_HOME", str(home))
        assert run_cli([*args, *(f"--table={key}" for key in CLI_TABLES)]) == 0
    resource = LakehouseResource(config_path=str(lh.config_path))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        discovery_tick(instance, resource)
        _, cursor = health_tick(instance, resource, None)
        # CHANGED, maintained by the CLI, gets a stricter threshold of its own and a second
        # file in each partition: unhealthy now, which the next tick records.
        with lh.table(CHANGED).transaction() as change:
            change.set_properties({"icegate.health.min_score": "100"})
        lh.table(CHANGED).append(batch(90_000, ("api", "web")))
        health_tick(instance, resource, cursor)
    with running_webserver(home, lh.config_path, root / "webserver.log") as (port, _):
        yield port


@pytest.fixture
def history_page(browser: Browser, history_port: int) -> Iterator[Page]:
    yield from _browse(browser, history_port, height=1200)


def _visible(page: Page, text: str, timeout_s: float = 30.0) -> Locator:
    """The visible element whose text is exactly ``text`` (lists keep hidden copies), once
    the page shows one: a busy host renders a tab seconds after its URL loaded."""
    found = page.get_by_text(text, exact=True)
    deadline = time.monotonic() + timeout_s
    while True:
        visible = [found.nth(i) for i in range(found.count()) if found.nth(i).is_visible()]
        if visible or time.monotonic() > deadline:
            break
        page.wait_for_timeout(250)
    assert visible, f"{text!r} is not on the page"
    return visible[-1]


def test_a_cli_pass_shows_its_tables_materialized_with_the_cli_metadata(
    history_page: Page,
) -> None:
    page = history_page
    _open(page, "/assets/maintained_table?view=partitions")
    # The CLI's two tables, and the two no one maintained (assessed), are materialized; the
    # one the trigger requested shows "Missing" until its run records it.
    expect(page.get_by_text("Materialized (4)")).to_be_visible()
    expect(page.get_by_text("Missing (1)")).to_be_visible()
    for key in CLI_TABLES:
        _visible(page, key).click()
        expect(page.get_by_text("recorded_by", exact=True)).to_be_visible()
        assert _metadata_value(page, "recorded_by").startswith("icegate-maintain, run cli-")
        assert _metadata_value(page, "files_before") == "12"
        assert _metadata_value(page, "files_after") == "2"
        expect(page.get_by_text("icegate_cli_pass", exact=True).first).to_be_visible()  # Job
        page.screenshot(path=_artifacts() / f"cli_partition_{key}.png", full_page=True)
    _visible(page, CLI_TABLES[0]).click()
    expect(page.get_by_text("recorded_by", exact=True)).to_be_visible()
    assert _metadata_value(page, "healthy") == "true"  # as the CLI's pass left it


def test_a_change_of_health_shows_above_the_last_pass(history_page: Page) -> None:
    """CHANGED turned unhealthy after the CLI's pass: its page shows the sensor's newer
    observation first, the pass's figures below it."""
    page = history_page
    _open(page, "/assets/maintained_table?view=partitions")
    _visible(page, CHANGED).click()
    expect(page.get_by_text("observed_by", exact=True)).to_be_visible()
    assert _metadata_value(page, "healthy") == "false"
    assert _metadata_value(page, "observed_by").startswith("table_health_sensor")
    expect(page.get_by_text(re.compile(r"fails below 100")).first).to_be_visible()
    assert _metadata_value(page, "files_before") == "12"  # the pass's materialization
    page.screenshot(path=_artifacts() / f"health_changed_{CHANGED}.png", full_page=True)


def test_each_tables_page_says_how_healthy_it_is_and_why(history_page: Page) -> None:
    page = history_page
    _open(page, "/assets/maintained_table?view=partitions")
    _visible(page, UNHEALTHY).click()
    expect(page.get_by_text("why", exact=True)).to_be_visible()
    assert _metadata_value(page, "healthy") == "false"
    assert _metadata_value(page, "recorded_by").startswith("table_health_sensor")
    assert _metadata_value(page, "due_operations") == "optimize"
    expect(page.get_by_text(re.compile(r"holds 13 small files")).first).to_be_visible()
    page.screenshot(path=_artifacts() / f"health_{UNHEALTHY}.png", full_page=True)

    _visible(page, ASSESSED).click()
    expect(page.get_by_text("recorded_by", exact=True)).to_be_visible()
    assert _metadata_value(page, "healthy") == "true"
    assert _metadata_value(page, "recorded_by").startswith("table_health_sensor")
    assert _metadata_value(page, "files_after") == "2"
    page.screenshot(path=_artifacts() / f"health_{ASSESSED}.png", full_page=True)


def test_the_healthy_checks_partitions_show_every_tables_newest_verdict(
    history_page: Page,
) -> None:
    page = history_page
    _open(page, "/assets/maintained_table?view=checks")
    _visible(page, "healthy").click()
    _visible(page, "Partitions").click()
    # The newest verdict on each table, whoever judged it: the CLI's pass on ORDERS
    # (passed); the health sensor on CHANGED (unhealthy since the pass: failed) and on
    # ASSESSED (passed); REQUESTED and UNHEALTHY, which the trigger requested at the two
    # ticks (one a tick), are "Missing" until their runs judge them.
    expect(page.get_by_text("Passed (2)", exact=True)).to_be_visible()
    expect(page.get_by_text("Failed (1)", exact=True)).to_be_visible()
    expect(page.get_by_text("Missing (2)", exact=True)).to_be_visible()
    _visible(page, CLI_TABLES[0]).click()
    expect(
        page.get_by_text(re.compile(r"^score \d+(\.\d)? \(fails below 80\)")).first
    ).to_be_visible()
    page.screenshot(path=_artifacts() / "healthy_check_partitions.png", full_page=True)


# -- a few hundred tables, a few unhealthy: the verdicts in each check's Partitions view ------

MANY = 300
#: Every 50th table: four small files in each of two partitions, a score of 88.2 under the
#: lakehouse's min_score of 90, with nothing due (so no run is requested: the health
#: sensor's own verdicts are what the view shows). The others: one file per partition.
MANY_UNHEALTHY = [f"lakehouse.t{i:03d}" for i in range(0, MANY, 50)]


@pytest.fixture(scope="module")
def many_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A lakehouse of :data:`MANY` tables nobody maintained, and the discovery and health
    sensors' ticks as the daemon runs them, until the health sensor records nothing new."""
    root = tmp_path_factory.mktemp("ui_many")
    lh = make_lakehouse(
        root / "lake", maintain={"health": {"min_score": 90}, "trigger": {"tick_deadline": "50s"}}
    )
    for i in range(MANY):
        key = f"lakehouse.t{i:03d}"
        lh.add_table(key, appends=4 if key in MANY_UNHEALTHY else 1)
    home = make_dagster_home(root / "dagster_home")
    resource = LakehouseResource(config_path=str(lh.config_path))
    with dg.DagsterInstance.from_config(str(home)) as instance:
        discovery_tick(instance, resource)
        cursor = None
        for _ in range(20):
            runs = len(instance.get_runs())
            result, cursor = health_tick(instance, resource, cursor)
            assert not result.run_requests
            pages = [e for e in result.asset_events if e.asset_key == MAINTAINED_TABLE]
            if not pages and len(instance.get_runs()) == runs:  # nothing new: settled
                break
        else:
            pytest.fail("the health sensor kept recording after 20 ticks")
    with running_webserver(home, lh.config_path, root / "webserver.log") as (port, _):
        yield port


@pytest.fixture
def many_page(browser: Browser, many_port: int) -> Iterator[Page]:
    yield from _browse(browser, many_port)


def test_the_healthy_checks_partitions_list_exactly_the_unhealthy_tables_failed(
    many_page: Page,
) -> None:
    page = many_page
    _open(page, "/assets/maintained_table?view=checks")
    _visible(page, "healthy").click()
    _visible(page, "Partitions").click()
    expect(page.get_by_text(f"Failed ({len(MANY_UNHEALTHY)})", exact=True)).to_be_visible()
    expect(page.get_by_text(f"Passed ({MANY - len(MANY_UNHEALTHY)})", exact=True)).to_be_visible()
    expect(page.get_by_text("Missing (0)", exact=True)).to_be_visible()
    page.screenshot(path=_artifacts() / "healthy_check_partitions_many.png")

    # Only the failed ones: exactly the unhealthy tables.
    _visible(page, f"Passed ({MANY - len(MANY_UNHEALTHY)})").click()
    listed = page.get_by_text(re.compile(r"^lakehouse\.t\d{3}$"))
    expect(listed.first).to_be_visible()
    names = {
        listed.nth(i).inner_text() for i in range(listed.count()) if listed.nth(i).is_visible()
    }
    assert names == set(MANY_UNHEALTHY)
    _visible(page, MANY_UNHEALTHY[1]).click()
    expect(page.get_by_text(re.compile(r"^score 88\.2 \(fails below 90\)")).first).to_be_visible()
    page.screenshot(path=_artifacts() / "healthy_check_failed_partitions.png")
