"""``bench spark_lines``: ``icegate-maintain`` on Spark 3.5 (``.venv``) against itself on
Spark 4.1 (``.venv-spark4``, ``scripts/setup.sh --spark4``), on the workloads of ``bench
peers`` and ``bench daemon``.

Each side is a fresh process of its own virtualenv's console script (the daemon: its own
``dagster-daemon``, whose code server and runs use that virtualenv's Python), on the same
lakehouse restored untouched before every process, order alternated, medians; the
outcome is checked as ``bench peers`` and ``bench daemon`` check it (every table's rows,
its files compacted, on W1 the old orphan gone and the young file kept).

* **W1**: a full pass, 12 tables x 25 small files, an old orphan and a young file each.
* **W2**: 1 GB in 400 files compacted (``ICEGATE_BENCH_GB`` sizes it).
* **the daemon**: 20 due tables x 15 small files brought to health by a cold
  ``dagster-daemon`` alone (``--daemon-tables``: its first size).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.daemon import daemon_until_healthy
from bench.daemon import describe as describe_daemon
from bench.fixtures import Template, make_lakehouse
from bench.harness import (
    REPO,
    Figure,
    Sample,
    Settings,
    Side,
    Summary,
    alternate,
    built,
    child_env,
    cold,
    note,
)
from bench.measure import ProcessRun, SideFailed
from bench.peers import Expected, big_table_lakehouse, checked, full_pass_lakehouse, ours_ok

#: The two lines' environments (``scripts/setup.sh`` and ``scripts/setup.sh --spark4``).
LINES = {"3.5": REPO / ".venv", "4.1": REPO / ".venv-spark4"}


def _script(line: str, name: str) -> Path:
    script = LINES[line] / "bin" / name
    if not script.exists():
        setup = "./scripts/setup.sh --spark4" if line == "4.1" else "./scripts/setup.sh"
        raise SideFailed(f"{name} on Spark {line}", reason=f"{script} missing (run {setup})")
    return script


def _cli_pair(
    work: Path,
    settings: Settings,
    reps: int,
    build: Callable[[Path], Expected],
    args: Callable[[Path], list[str]],
) -> tuple[Summary, Summary]:
    """Both lines' ``icegate-maintain ARGS`` over one lakehouse, restored before each."""
    lake = built("the lakehouse", lambda: Template(work / "lake", build))

    def side(line: str) -> Side:
        def run() -> Sample:
            root = lake.restore()
            check = checked(root, "bench_lines", lake.value)

            def both(done: ProcessRun) -> dict[str, Any]:
                ours_ok(done)
                return check(done)

            argv = [str(_script(line, "icegate-maintain")), *args(root)]
            return cold(settings, f"icegate-maintain on Spark {line}", argv, work, both)

        return Side(f"spark{line}", run)

    a, b = alternate([side("3.5"), side("4.1")], reps)
    lake.discard()
    return a, b


def _daemon_pair(work: Path, settings: Settings, size: int) -> tuple[Summary, Summary]:
    maintain: dict[str, Any] = {"expire_snapshots": {"retention_threshold": "1s"}}

    def make(root: Path) -> list[str]:
        lake = make_lakehouse(root, "bench_lines", maintain=maintain)
        return fixtures.small_file_tables(lake, size, 15, 200)

    dmn = built(f"the daemon's lakehouse, {size} tables", lambda: Template(work / "d", make))

    def side(line: str) -> Side:
        def run() -> Sample:
            root = dmn.restore()
            done = daemon_until_healthy(
                root / "icegate.yaml",
                dmn.value,
                work / "daemon_run",
                child_env(),
                settings.timeout,
                settings.dagster_yaml,
                bin_dir=_script(line, "dagster-daemon").parent,
            )
            print(f"      daemon on Spark {line}: {describe_daemon(done)}", flush=True)
            return Sample(done.seconds, done.peak_mb, done.jvm, {"runs": done.runs})

        return Side(f"spark{line}", run)

    a, b = alternate([side("3.5"), side("4.1")], settings.reps)
    dmn.discard()
    return a, b


def bench_spark_lines(work: Path, settings: Settings) -> list[Figure]:
    """W1, W2 and the daemon's row on Spark 3.5 against Spark 4.1: wall time and peak memory
    of fresh processes, order alternated (``--peer-reps`` for W1 and W2, ``--reps`` for the
    daemon)."""
    w1_reps, w2_reps = settings.peer_reps if not settings.quick else (1, 1)
    tables, files = settings.pick((12, 25), (3, 8))
    gigabytes, big_files = settings.pick((settings.gigabytes, 400), (0.02, 20))
    [daemon_tables, *_] = settings.pick(settings.daemon_tables, (3,))
    key = f"{fixtures.NAMESPACE}.big"
    print(f"    W1: {tables} tables x {files} small files, a full pass", flush=True)
    w1 = _cli_pair(
        work / "w1",
        settings,
        w1_reps,
        lambda root: full_pass_lakehouse(root, "bench_lines", tables, files),
        lambda root: ["run", "--config", str(root / "icegate.yaml"), "--json"],
    )
    print(f"    W2: {gigabytes} GB in {big_files} files, compaction", flush=True)
    w2 = _cli_pair(
        work / "w2",
        settings,
        w2_reps,
        lambda root: big_table_lakehouse(root, "bench_lines", settings, gigabytes, big_files),
        lambda root: ["optimize", "--table", key, "--config", str(root / "icegate.yaml")]
        + ["--json"],
    )
    print(f"    the daemon: {daemon_tables} due tables", flush=True)
    daemon = _daemon_pair(work / "daemon", settings, daemon_tables)
    figures = []
    for label, (old, new), reps in (
        ("W1_full_pass", w1, w1_reps),
        ("W2_compaction", w2, w2_reps),
        (f"daemon_{daemon_tables}", daemon, settings.reps),
    ):
        figures.append(
            Figure(
                f"spark_lines_{label}",
                new.seconds,
                old.seconds,
                "s",
                "4.1 / 3.5 (ours: 4.1)",
                None,
                note(reps, old, new) + f"; peak MB 3.5 {old.peak_mb:.0f}, 4.1 {new.peak_mb:.0f}",
            )
        )
    return figures
