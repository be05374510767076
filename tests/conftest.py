"""Suite-wide fixtures: one Spark session for the whole test session; and the guard of the
no-JVM tier: a run that selected no test marked ``spark`` fails if a JVM started anyway."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.spark.session import stop_spark
from tests.lakehouse import Lakehouse, make_lakehouse

#: The Spark-4 tier (marker ``spark4``; scripts/test.sh runs it in .venv-spark4 after the
#: default line's tiers): tests chosen for coverage of the engine on the other Spark line in
#: about three minutes on two cores. Node ids, or a file for all its tests.
SPARK4_TIER = (
    # the jars and class archive of the running line (no JVM)
    "tests/unit/test_spark_jars.py::test_the_session_takes_the_iceberg_runtime_of_the_running_pysparks_line",
    # a full pass: compaction, manifests, expiry, orphans, stats, the log table
    "tests/integration/test_full_pass.py",
    # the WAL's exactly-once, a kill -9 between Iceberg's commit and the WAL's delete
    "tests/integration/test_wal_exactly_once.py",
    "tests/integration/test_wal_sigkill.py::test_sigkill_between_commit_and_delete_then_rerun",
    # delete files: merge-on-read (v2) and deletion vectors (v3)
    "tests/integration/test_delete_files.py",
    # expiry and orphan removal
    "tests/integration/test_orphan_expiry_safety.py",
    # a Dagster batch run
    "tests/dagster/with_spark/test_batch_runs.py::test_scattered_due_tables_share_one_run_each_doing_its_own_operations",
    # Spark Connect on Spark 4's own server: README's demo, the WAL's exactly-once with the
    # client killed -9 after the commit
    "tests/surfaces/test_spark_connect.py::test_readmes_demo_on_connect_maintains_the_lakehouse_with_no_jvm_of_its_own",
    "tests/surfaces/test_wal_over_connect.py::test_the_client_killed_9_at_any_step_then_a_rerun_ingests_exactly_once",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow files first (marker ``slow``): spread over processes, the longest files start
    at once instead of ending the suite alone. Marks :data:`SPARK4_TIER`'s tests
    ``spark4``; running that tier, an entry that names no test fails the run (a renamed
    test must not leave the tier smaller unnoticed)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    unmatched = set(SPARK4_TIER)
    for item in items:
        node = item.nodeid.split("[")[0]
        entries = {entry for entry in SPARK4_TIER if node == entry or node.startswith(entry + "::")}
        if entries:
            item.add_marker(pytest.mark.spark4)
            unmatched -= entries
    # (An entry of a file not collected in this run is only checked to exist.)
    collected = {item.nodeid.split("::")[0] for item in items}
    missing = sorted(
        entry
        for entry in unmatched
        if entry.split("::")[0] in collected
        or not (config.rootpath / entry.split("::")[0]).is_file()
    )
    if config.option.markexpr == "spark4" and missing:
        raise pytest.UsageError(f"SPARK4_TIER names no test: {', '.join(missing)}")


# -- the no-JVM tier's guard --------------------------------------------------------------------
#
# Every JVM a test starts, in this process (pyspark's gateway) or in a child (a CLI pass, a
# Dagster run, a server), is started by ``spark-class`` as ``java`` found on PATH, or as
# ``$JAVA_HOME/bin/java``. In a run whose selected tests carry no ``spark`` marker, both lead
# to a stand-in that writes down the test running (PYTEST_CURRENT_TEST) and then starts the
# real java; at the end of the session a line written fails the run, naming the tests. The
# folder is made by the main process and inherited by pytest-xdist's workers.

_GUARD = "ICEGATE_TEST_JVM_GUARD"
#: The guard's folder (in the main process only) and the JVMs it saw started.
_GUARD_FOLDER = pytest.StashKey[Path]()
_JVMS = pytest.StashKey[list[str]]()
_JAVA_STAND_IN = """#!/bin/sh
echo "${{PYTEST_CURRENT_TEST:-outside a test}}" >> '{log}'
exec '{java}' "$@"
"""


def _real_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def pytest_configure(config: pytest.Config) -> None:
    if _GUARD in os.environ:  # a pytest-xdist worker: its parent made the guard
        return
    folder = Path(tempfile.mkdtemp(prefix="icegate-jvm-guard-"))
    os.environ[_GUARD] = str(folder)
    config.stash[_GUARD_FOLDER] = folder
    (folder / "jvms.log").touch()


def _install_java_stand_in(folder: Path) -> None:
    """``java`` on PATH and ``$JAVA_HOME/bin/java`` become the stand-in, in this process and
    every process it starts."""
    java = _real_java() or "java-not-installed"
    bin_dir = folder / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        stand_in = bin_dir / "java"
        stand_in.write_text(_JAVA_STAND_IN.format(log=folder / "jvms.log", java=java))
        stand_in.chmod(0o755)
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    home = os.environ.get("JAVA_HOME")
    if home:  # a JDK whose bin/java is the stand-in, the rest of it the real one's
        fake = folder / "java_home"
        if not fake.exists():
            fake.mkdir()
            for entry in Path(home).iterdir():
                if entry.name != "bin":
                    (fake / entry.name).symlink_to(entry)
            (fake / "bin").mkdir()
            for entry in (Path(home) / "bin").iterdir():
                target = bin_dir / "java" if entry.name == "java" else entry
                (fake / "bin" / entry.name).symlink_to(target)
        os.environ["JAVA_HOME"] = str(fake)


def pytest_collection_finish(session: pytest.Session) -> None:
    """With no ``spark`` test selected (``-m "not spark"``, ``tests/unit``), no JVM may start."""
    if session.items and not any(item.get_closest_marker("spark") for item in session.items):
        _install_java_stand_in(Path(os.environ[_GUARD]))


def _jvms_started(folder: Path) -> list[str]:
    return sorted(set((folder / "jvms.log").read_text().split("\n")) - {""})


def pytest_sessionfinish(session: pytest.Session) -> None:
    folder = session.config.stash.get(_GUARD_FOLDER, None)
    if folder is None:  # a worker: its parent reads the log
        return
    started = _jvms_started(folder)
    if started:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.stash[_JVMS] = started


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    started = config.stash.get(_JVMS, [])
    if started:
        terminalreporter.section("a JVM started in the no-JVM tier", sep="=", red=True)
        terminalreporter.line(
            "No selected test is marked spark, but these started a JVM (a test that starts "
            "one belongs in a folder whose tests are marked spark):"
        )
        for line in started:
            terminalreporter.line(f"  {line}")


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GUARD_FOLDER, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _one_spark_session() -> Iterator[None]:
    """Spark starts lazily on first use and is stopped once, at the end of the suite."""
    yield
    stop_spark()


@pytest.fixture(autouse=True)
def _no_dagster_home_of_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI pass records in ``$DAGSTER_HOME`` when set: the tests' passes never reach the
    instance of whoever runs them (a test that wants one sets its own)."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


@pytest.fixture
def lakehouse_factory(tmp_path: Path) -> Callable[..., Lakehouse]:
    """Make temporary lakehouses: ``lakehouse_factory(maintain={...})``."""
    count = 0

    def make(maintain: dict[str, Any] | None = None, wal: bool = False) -> Lakehouse:
        nonlocal count
        count += 1
        return make_lakehouse(tmp_path / f"lakehouse{count}", maintain, wal=wal)

    return make
