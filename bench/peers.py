"""``bench peers``: ``icegate-maintain`` side by side with iceberg-zamboni, a peer without a JVM.

Zamboni (pyiceberg + DuckDB) is installed in its own virtual environment under
``.bench/peers/`` the first time (never a dependency of this project), and both tools
run as a new user would run them: one fresh process per repetition, each on its own
lakehouse, identical and built untimed, order alternated, medians.

* **W1, a full pass**: 12 tables x 25 small appends, each with a 30-day-old orphan and a
  young file of a write in progress; ``icegate-maintain run`` against ``zamboni
  maintenance --yes`` (compaction, manifests, expiry, orphans; each tool's defaults).
* **W2, compaction**: one table of about 1 GB in 400 files (zstd), written by Spark;
  ``icegate-maintain optimize`` against ``zamboni compact --yes``.

After every process the parent checks its outcome, untimed: every table's rows (count and
sum of ids) as before, its data files compacted, on W1 the old orphan gone and the young
file kept. A side that loses a row or deletes the young file crashes the benchmark. Our
side's notes carry its profile: each operation's seconds, summed over the tables, from its
``--json`` output.

``--connect`` (``bench peers --connect``, the ``peers_connect_*`` rows): our side is a thin
client of a warm Spark Connect server (``bench.connect``: started untimed before the sides
run, then one untimed pass of ours through it). Our memory is then the peak, at one
instant, of our process tree plus the server's JVM; the server's own peak and its growth
during each run are in the notes. Measured (docs/performance.md, "On Spark Connect")::

    ICEGATE_BENCH_GB=0.5 .venv/bin/python -m bench.run peers daemon --connect \
        --peer-reps 3,2 --reps 3 --daemon-tables 20
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pyarrow.dataset as ds

from bench import fixtures
from bench.connect import WarmServer, warm_server
from bench.fixtures import Lakehouse, Template, make_lakehouse
from bench.harness import (
    REPO,
    Figure,
    Sample,
    Settings,
    Side,
    Summary,
    alternate,
    bench_side,
    built,
    cli_json,
    cold,
    icegate,
    note,
    side_json,
)
from bench.measure import ProcessRun

#: The peer, pinned: the version the issue measured.
ZAMBONI = "iceberg-zamboni==0.7.0"
#: Where peers' environments live (git-ignored), one folder per pinned requirement.
PEERS_HOME = REPO / ".bench" / "peers"
#: Zamboni's ``--local-warehouse`` catalog: its SQL catalog is always named this.
ZAMBONI_CATALOG = "local"
#: The young file's age and the orphan's: either side of both tools' 3-day guard.
OLD_ORPHAN_AGE_S = 30 * 86400


def zamboni_script() -> Path:
    """The ``zamboni`` console script, installing it in its own venv on first use."""
    env = PEERS_HOME / ZAMBONI.replace("==", "-")
    script, done = env / "bin" / "zamboni", env / ".installed"
    if done.exists() and script.exists():
        return script
    shutil.rmtree(env, ignore_errors=True)  # a half-made venv from an interrupted install
    python = getattr(sys, "_base_executable", None) or sys.executable
    print(f"    installing {ZAMBONI} into {env} (untimed) ...", flush=True)
    for argv in (
        [python, "-m", "venv", str(env)],
        [str(env / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", ZAMBONI],
    ):
        done_run = subprocess.run(argv, capture_output=True, text=True)
        if done_run.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed:\n{done_run.stderr[-2000:]}")
    done.write_text(ZAMBONI + "\n")
    return script


def peer_env() -> dict[str, str]:
    """The peer's environment: this one without our paths or config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ICEGATE_", "PYTHON"))}
    env["HOME"] = str(PEERS_HOME)  # no ~/.zamboni.yml or ~/.pyiceberg.yaml of the user's
    return env


# -- fixtures ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """What every table must read after a pass: its rows, and on W1 its planted files."""

    keys: list[str]
    rows: dict[str, tuple[int, int]]  # key -> (count, sum of ids)
    old_orphans: list[Path]
    young_files: list[Path]


def _rows_of(lake: Lakehouse, key: str) -> tuple[int, int]:
    """A table's row count and sum of ids, read from its current data files by pyarrow."""
    paths = [path for path, _ in fixtures.data_files(lake, key)]
    ids = ds.dataset(paths, format="parquet").to_table(columns=["id"]).column("id")
    total = pc.sum(ids).as_py()
    return len(ids), int(total or 0)


def _plant(lake: Lakehouse, key: str) -> tuple[Path, Path]:
    """An old orphan and a young file (a write in progress) in ``key``'s data folder."""
    import pyarrow.parquet as pq

    namespace, name = key.split(".", 1)
    location = lake.catalog().load_table((namespace, name)).location()
    data = Path(location.removeprefix("file:").removeprefix("//")) / "data"
    data.mkdir(parents=True, exist_ok=True)
    old, young = data / "orphan-from-a-failed-write.parquet", data / "write-in-progress.parquet"
    pq.write_table(fixtures.rows(9_000_000, 50), old)
    pq.write_table(fixtures.rows(9_100_000, 50), young)
    past = time.time() - OLD_ORPHAN_AGE_S
    os.utime(old, (past, past))
    return old, young


def full_pass_lakehouse(root: Path, name: str, tables: int, files: int) -> Expected:
    lake = make_lakehouse(root, name, wal=False)
    keys = fixtures.small_file_tables(lake, tables, files, 200)
    planted = [_plant(lake, key) for key in keys]
    return Expected(
        keys,
        {key: _rows_of(lake, key) for key in keys},
        [old for old, _ in planted],
        [young for _, young in planted],
    )


def big_table_lakehouse(
    root: Path, name: str, settings: Settings, gigabytes: float, files: int
) -> Expected:
    lake = make_lakehouse(root, name, wal=False)
    key = f"{fixtures.NAMESPACE}.big"
    catalog = lake.catalog()
    catalog.create_namespace_if_not_exists(fixtures.NAMESPACE)
    catalog.create_table((fixtures.NAMESPACE, "big"), schema=fixtures.arrow_schema())
    argv = bench_side("build_big", lake.config_path, key, str(gigabytes), str(files))
    cold(settings, "building the data (Spark)", argv, root.parent, side_json)
    return Expected([key], {key: _rows_of(lake, key)}, [], [])


def zamboni_table_config(root: Path, script: Path) -> Path:
    """Zamboni's ``table-config.json`` for the lakehouse at ``root`` (as its docs say: the
    catalog described as it is, then run as is), written into the fixture."""
    out = root / "zamboni-table-config.json"
    subprocess.run(
        [str(script), "table-config", "generate", "--local-warehouse", str(root)]
        + ["--db", ZAMBONI_CATALOG, "-o", str(out)],
        check=True,
        cwd=root,
        env=peer_env(),
        capture_output=True,
    )
    return out


# -- checks -------------------------------------------------------------------------------------


def checked(root: Path, name: str, expected: Expected) -> Callable[[ProcessRun], dict[str, Any]]:
    """The outcome of a side's process on the lakehouse at ``root``, checked against
    ``expected``: the data files it left (most in any table, and their sizes)."""

    def check(run: ProcessRun) -> dict[str, Any]:
        lake = Lakehouse(root, name)
        files_after, sizes = 0, []
        for key in expected.keys:
            found = _rows_of(lake, key)
            if found != expected.rows[key]:
                wanted = expected.rows[key]
                raise ValueError(f"{key}: (rows, sum of ids) {found}, expected {wanted}")
            data = fixtures.data_files(lake, key)
            files_after = max(files_after, len(data))
            sizes += [size for _, size in data]
        kept = [str(p) for p in expected.old_orphans if p.exists()]
        lost = [str(p) for p in expected.young_files if not p.exists()]
        if lost:
            raise ValueError(f"young files deleted: {lost[:3]}")
        return {
            "files_after": files_after,
            "mean_file_mb": statistics.mean(sizes) / 1024**2,
            "old_orphans_left": len(kept),
        }

    return check


def ours_ok(run: ProcessRun) -> dict[str, float]:
    """Our pass checked (every table ok), and its profile: each operation's seconds summed
    over the tables (``op_<name>_s``), from the ``--json`` output."""
    doc = cli_json(run)
    bad = [t["table"] for t in doc.get("tables", []) if not t.get("ok")]
    if bad:
        raise ValueError(f"tables not ok: {bad}")
    profile: dict[str, float] = {}
    for table in doc.get("tables", []):
        for op in table.get("ops", []):
            key = f"op_{op['operation']}_s"
            profile[key] = profile.get(key, 0.0) + float(op.get("duration_s") or 0.0)
    return profile


def profile_note(summary: Summary) -> str:
    """Our side's median seconds per operation (summed over its tables)."""
    keys = sorted({k for s in summary.samples for k in s.data if k.startswith("op_")})
    parts = [f"{k[3:-2]} {summary.median(k):.1f}" for k in keys if summary.median(k) >= 0.05]
    return "ours' seconds per operation (sum over tables, median): " + ", ".join(parts)


# -- the comparison ----------------------------------------------------------------------------


def _compare(
    work: Path,
    settings: Settings,
    reps: int,
    build: Callable[[Path, str], Expected],
    ours_argv: Callable[[Path], list[str]],
    zamboni_argv: Callable[[Path, Path], list[str]],
    server: WarmServer | None = None,
) -> tuple[Summary, Summary]:
    script = built("iceberg-zamboni's venv", zamboni_script)

    def build_peer(root: Path) -> Expected:
        expected = build(root, ZAMBONI_CATALOG)
        zamboni_table_config(root, script)
        return expected

    ours = built("ours", lambda: Template(work / "ours", lambda root: build(root, "bench_peer")))
    peer = built("zamboni's", lambda: Template(work / "zamboni", build_peer))

    def run_ours() -> Sample:
        root = ours.restore()
        check = checked(root, "bench_peer", ours.value)

        def both(run: ProcessRun) -> dict[str, Any]:
            profile = ours_ok(run)
            return {**check(run), **profile}

        if server is None:
            return cold(settings, "icegate-maintain", ours_argv(root), work, both)
        argv, env = ours_argv(root), server.env()
        return cold(settings, "icegate-maintain", argv, work, both, env, server.pid)

    def run_peer() -> Sample:
        root = peer.restore()
        check = checked(root, ZAMBONI_CATALOG, peer.value)
        argv = zamboni_argv(script, root)
        return cold(settings, "zamboni", argv, root, check, env=peer_env())

    if server is not None:  # the server's first client, untimed: a warm server after it
        warm = run_ours()
        print(f"    warm-up pass through the server (untimed): {warm.seconds:.2f}s", flush=True)
    a, b = alternate([Side("ours", run_ours), Side("zamboni", run_peer)], reps)
    ours.discard()
    peer.discard()
    return a, b


def _files(summary: Summary) -> str:
    sample = summary.samples[-1].data
    return f"{sample['files_after']} files of {sample['mean_file_mb']:.1f} MB"


def bench_peers(work: Path, settings: Settings) -> list[Figure]:
    """W1 (a full pass, 12 tables x 25 small files) and W2 (1 GB in 400 files compacted):
    ``icegate-maintain`` against iceberg-zamboni 0.7.0, wall time and peak memory. With
    ``--connect``, ours a thin client of a warm Spark Connect server (``bench.connect``):
    the ``peers_connect_*`` rows."""
    if not settings.connect:
        return _bench_peers(work, settings, None)
    with warm_server(work / "connect_server") as server:
        return _bench_peers(work, settings, server)


def _bench_peers(work: Path, settings: Settings, server: WarmServer | None) -> list[Figure]:
    w1_reps, w2_reps = settings.peer_reps if not settings.quick else (1, 1)
    tables, files = settings.pick((12, 25), (3, 8))
    gigabytes, big_files = settings.pick((settings.gigabytes, 400), (0.02, 20))
    key = f"{fixtures.NAMESPACE}.big"
    print(f"    W1: {tables} tables x {files} small files, a full pass", flush=True)
    w1 = _compare(
        work / "w1",
        settings,
        w1_reps,
        lambda root, name: full_pass_lakehouse(root, name, tables, files),
        lambda root: icegate("run", "--config", root / "icegate.yaml", "--json"),
        lambda script, root: (
            [str(script), "maintenance", "--local-warehouse", str(root)]
            + ["--db", ZAMBONI_CATALOG, "--table-config", str(root / "zamboni-table-config.json")]
            + ["--yes"]
        ),
        server,
    )
    print(f"    W2: {gigabytes} GB in {big_files} files, compaction", flush=True)
    w2 = _compare(
        work / "w2",
        settings,
        w2_reps,
        lambda root, name: big_table_lakehouse(root, name, settings, gigabytes, big_files),
        lambda root: (
            icegate("optimize", "--table", key, "--config", root / "icegate.yaml") + ["--json"]
        ),
        lambda script, root: (
            [str(script), "compact", key, "--local-warehouse", str(root)]
            + ["--db", ZAMBONI_CATALOG, "--yes"]
        ),
        server,
    )
    figures = []
    prefix = "peers_connect" if server else "peers"
    targets = (1.0, 1.2) if server else (1.3, 1.2)
    for label, (ours, peer), target, reps in (
        ("W1_full_pass", w1, targets[0], w1_reps),
        ("W2_compaction", w2, targets[1], w2_reps),
    ):
        ratio = ours.seconds / peer.seconds
        as_compacted = ours.median("files_after") <= peer.median("files_after")
        orphans = ours.median("old_orphans_left"), peer.median("old_orphans_left")
        files_note = f"after: ours {_files(ours)}, zamboni {_files(peer)}"
        if label.startswith("W1"):
            files_note += (
                f" (most in a table); old orphans left {orphans[0]:.0f} / {orphans[1]:.0f}"
            )
        files_note += "; " + profile_note(ours)
        if server is not None:
            files_note += (
                f"; server's own peak {ours.max('server_peak_mb'):.0f} MB, its growth during "
                f"a run {ours.median('server_growth_mb'):.0f} MB (median)"
            )
        figures.append(
            Figure(
                f"{prefix}_{label}",
                ours.seconds,
                peer.seconds,
                "s",
                f"<= {target}x, files <= peer's",
                ratio <= target and as_compacted,
                note(reps, ours, peer, extra=files_note),
            )
        )
        figures.append(
            Figure(
                f"{prefix}_{label}_peak",
                ours.peak_mb,
                peer.peak_mb,
                "MB",
                "ours <= 1536 MB",
                ours.peak_mb <= 1536,
                f"highest peak of the process tree over {reps} reps"
                + (" (ours: our client tree + the server's JVM at one instant)" if server else ""),
            )
        )
    return figures
