"""Benchmarks: every side of every comparison in its own cold process, side by side.

Usage::

    ./scripts/bench.sh [NAME ...] [--reps N] [--quick]
    .venv/bin/python -m bench.run [NAME ...] [--reps N] [--big-reps N] [--scale-max N]
                                  [--quick] [--timeout S] [--keep]

Names (default: all): full_pass, healthy, scale_compaction, wal_ingest, throughput,
sensor, health_sensor, monitoring, scale, query, batching, daemon, peers. ``peers``
installs iceberg-zamboni in its own venv under ``.bench/peers/`` and runs W1 and W2 with
it (``--peer-reps``, default 6 and 4; ``bench.peers`` says how). ``scale`` builds 10,000 tables
(``--scale-tables N``) before it measures: allow half an hour. ``--reps`` (default 3)
repetitions of each comparison; ``--big-reps`` (default 1) for the 1,000-table sizes;
``--scale-max 1000`` adds 1,000 tables to ``scale_compaction`` (default 100);
``ICEGATE_BENCH_GB`` (default 1) sizes ``throughput``. ``--quick`` is a smoke test: 1
repetition, a few tables and files, a tiny throughput size (its figures say nothing about
the targets). ``--keep`` leaves the work folder in place.

How it measures (see ``bench.measure``): users run this service as a fresh process
each time (a CLI call; a Dagster run is one process with one new JVM), so each side of a
comparison is its own new process (``icegate-maintain ...`` for ours; ``python -m
bench.sides NAME`` for a baseline), on its own lakehouse (``bench.fixtures``: built
with pyiceberg in this process, no JVM, untimed, and restored to its untouched state
before every process). Sides alternate which goes first, repetition after repetition.
Time is the wall clock from spawning the process to its exit, measured here; memory
is the peak resident memory of the whole process tree (Python + JVM), sampled five
times a second; ``JVM`` says whether a ``java`` process appeared in the tree. Each
line gives the medians, the ratio ours / baseline, the target and whether it is met.

Exit status: 1 when a benchmark crashed (a side failed, or its output was wrong); a
missed target is reported, not an error.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench import fixtures
from bench.daemon import daemon_until_healthy
from bench.daemon import describe as describe_daemon
from bench.fixtures import Lakehouse, Template, make_lakehouse
from bench.measure import ProcessRun, SideFailed, run_process

REPO = Path(__file__).resolve().parent.parent

# -- settings ---------------------------------------------------------------------------------


@dataclass
class Settings:
    """What the command line asked for."""

    reps: int = 3
    big_reps: int = 1
    scale_max: int = 100
    quick: bool = False
    timeout: float = 7200.0
    gigabytes: float = 1.0
    #: ``daemon``'s lakehouse sizes, and the instance settings its daemon runs with.
    daemon_tables: tuple[int, ...] = (20, 100)
    dagster_yaml: Path = REPO / "dagster.yaml"
    #: ``maintain.trigger.tables_per_run`` for ``daemon`` (None: the default).
    tables_per_run: int | None = None
    #: ``scale``'s lakehouse size.
    scale_tables: int = 10_000
    #: ``peers``' repetitions of W1 and of W2.
    peer_reps: tuple[int, int] = (6, 4)

    def pick(self, full: Any, quick: Any) -> Any:
        return quick if self.quick else full


# -- figures ----------------------------------------------------------------------------------


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"


@dataclass
class Figure:
    """One measure: medians of both sides, their ratio (ours / baseline) and the target."""

    name: str
    ours: float
    baseline: float | None
    unit: str
    target: str
    met: bool | None  # None: shown for reference, no target
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.ours / self.baseline if self.baseline else None

    @property
    def verdict(self) -> str:
        return "-" if self.met is None else ("MET" if self.met else "NOT MET")

    def line(self) -> str:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}"
        return (
            f"{self.name:<24} ours {_num(self.ours):>9} {self.unit:<4} "
            f"baseline {_num(self.baseline):>9} {self.unit if self.baseline else '':<4} "
            f"ratio {ratio:>6}  "
            f"target {self.target:<26} {self.verdict:<7}  {self.note}"
        )

    def row(self) -> list[str]:
        ratio = "-" if self.ratio is None else f"{self.ratio:.2f}"
        return [
            self.name,
            f"{_num(self.ours)} {self.unit}",
            "-" if self.baseline is None else f"{_num(self.baseline)} {self.unit}",
            ratio,
            self.target,
            self.verdict,
        ]


def summary_table(figures: list[Figure]) -> str:
    head = ["measure", "ours (median)", "baseline (median)", "ratio", "target", "verdict"]
    rows = [head] + [f.row() for f in figures]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- running sides ----------------------------------------------------------------------------


@dataclass
class Sample:
    """One process (or one side's processes) as measured by this parent."""

    seconds: float
    peak_mb: float
    jvm: bool
    data: dict[str, Any] = field(default_factory=dict)


@dataclass
class Side:
    """One side of a comparison: ``run`` restores its fixture and measures one repetition."""

    label: str
    run: Callable[[], Sample]


@dataclass
class Summary:
    """A side's samples: median time, highest peak, whether any run had a JVM."""

    label: str
    samples: list[Sample]

    @property
    def seconds(self) -> float:
        return statistics.median(s.seconds for s in self.samples)

    @property
    def peak_mb(self) -> float:
        return max(s.peak_mb for s in self.samples)

    @property
    def jvm(self) -> bool:
        return any(s.jvm for s in self.samples)

    def median(self, key: str) -> float:
        return statistics.median(float(s.data[key]) for s in self.samples)

    def describe(self) -> str:
        return f"{self.label} peak {self.peak_mb:.0f} MB, JVM {'yes' if self.jvm else 'no'}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("ICEGATE_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def icegate(*args: str | Path) -> list[str]:
    """``icegate-maintain ARGS``, the venv's console script."""
    script = Path(sys.executable).parent / "icegate-maintain"
    found = str(script) if script.exists() else shutil.which("icegate-maintain")
    if found is None:
        raise SideFailed("icegate-maintain", reason="not installed (run ./scripts/setup.sh)")
    return [found, *map(str, args)]


def bench_side(name: str, *args: str | Path) -> list[str]:
    """``python -m bench.sides NAME ARGS``."""
    return [sys.executable, "-m", "bench.sides", name, *map(str, args)]


def cold(
    settings: Settings,
    what: str,
    argv: list[str],
    cwd: Path,
    check: Callable[[ProcessRun], dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
) -> Sample:
    """Run ``argv`` as a new process (in ``env``, else ours); a non-zero exit or a failed
    ``check`` is a crash."""
    run = run_process(argv, cwd=cwd, env=env or _env(), timeout=settings.timeout)
    if run.exit_code != 0:
        raise SideFailed(what, run)
    try:
        data = check(run) if check is not None else {}
    except SideFailed:
        raise
    except Exception as exc:
        raise SideFailed(what, run, f"{type(exc).__name__}: {exc}") from exc
    return Sample(run.seconds, run.peak_mb, run.jvm, data)


def alternate(sides: list[Side], reps: int) -> list[Summary]:
    """``reps`` repetitions of every side, each a fresh process on a fresh fixture; the
    order flips every repetition, so no side always goes first."""
    samples: list[list[Sample]] = [[] for _ in sides]
    for rep in range(reps):
        order = list(range(len(sides)))
        if rep % 2:
            order.reverse()
        shown = []
        for index in order:
            sample = sides[index].run()
            samples[index].append(sample)
            shown.append(
                f"{sides[index].label} {sample.seconds:.2f}s {sample.peak_mb:.0f}MB"
                f"{' JVM' if sample.jvm else ''}"
            )
        print(f"    rep {rep + 1}/{reps}: " + " | ".join(shown), flush=True)
    return [Summary(side.label, found) for side, found in zip(sides, samples, strict=True)]


def note(reps: int, *summaries: Summary, extra: str = "") -> str:
    parts = [f"{reps} rep{'s' if reps != 1 else ''}"] + [s.describe() for s in summaries]
    return "; ".join(parts + ([extra] if extra else []))


def side_json(run: ProcessRun) -> dict[str, Any]:
    """The JSON object on a side's last stdout line."""
    lines = [line for line in run.stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the side printed nothing")
    return dict(json.loads(lines[-1]))


def cli_json(run: ProcessRun) -> dict[str, Any]:
    """``icegate-maintain --json``'s output (anything before the object skipped)."""
    match = re.search(r"^\{", run.stdout, re.MULTILINE)
    if match is None:
        raise ValueError(f"no JSON in the output: {run.stdout[-500:]!r}")
    return dict(json.loads(run.stdout[match.start() :]))


def all_ok(doc: dict[str, Any], tables: int) -> list[dict[str, Any]]:
    """The tables of a ``--json`` result, checked: as many as expected, every one ok."""
    found = list(doc.get("tables", []))
    if len(found) != tables:
        raise ValueError(f"{len(found)} tables in the output, {tables} expected")
    bad = [t for t in found if not t.get("ok")]
    if bad:
        first = bad[0]
        errors = [op.get("error") for op in first.get("ops", []) if op.get("error")]
        raise ValueError(
            f"{len(bad)} table(s) not ok, first {first.get('table')}: "
            f"{first.get('error') or errors}"
        )
    return found


def ops_named(tables: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [op for t in tables for op in t.get("ops", []) if op.get("operation") == name]


def all_optimized(size: int) -> Callable[[ProcessRun], dict[str, Any]]:
    """A check of a ``run --json``: ``size`` tables, all ok, each one compacted."""

    def check(run: ProcessRun) -> dict[str, Any]:
        found = all_ok(cli_json(run), size)
        done = [op for op in ops_named(found, "optimize") if op["status"] == "completed"]
        if len(done) != size:
            raise ValueError(f"optimize completed on {len(done)} of {size} tables")
        return {}

    return check


def built(what: str, action: Callable[[], Any]) -> Any:
    started = time.perf_counter()
    value = action()
    print(f"    {what} built in {time.perf_counter() - started:.1f}s (untimed)", flush=True)
    return value


def growth(small: tuple[int, Summary], big: tuple[int, Summary]) -> str:
    (n, a), (m, b) = small, big
    return (
        f"{n}->{m} tables: time x{b.seconds / a.seconds:.2f}, peak MB x{b.peak_mb / a.peak_mb:.2f}"
    )


# -- benchmarks -------------------------------------------------------------------------------


def bench_peers(work: Path, settings: Settings) -> list[Figure]:
    """W1 and W2 against iceberg-zamboni (``bench.peers``, imported late: it imports this)."""
    from bench import peers

    return peers.bench_peers(work, settings)


def bench_full_pass(work: Path, settings: Settings) -> list[Figure]:
    """12 tables x 25 small files: ``icegate-maintain run`` vs. the three procedures by hand."""
    tables, files = settings.pick((12, 25), (3, 8))

    def build(name: str) -> Callable[[Path], list[str]]:
        def make(root: Path) -> list[str]:
            return fixtures.small_file_tables(make_lakehouse(root, name), tables, files, 200)

        return make

    ours = built("ours", lambda: Template(work / "ours", build("bench_ours")))
    seed = built("seed", lambda: Template(work / "seed", build("bench_seed")))

    def run_ours() -> Sample:
        root = ours.restore()
        argv = icegate("run", "--config", root / "icegate.yaml", "--json")
        return cold(settings, "ours", argv, work, lambda r: {"n": len(all_ok(cli_json(r), tables))})

    def run_seed() -> Sample:
        root = seed.restore()
        argv = bench_side("seed_full_pass", root / "icegate.yaml", *seed.value)
        return cold(settings, "seed", argv, work, side_json)

    a, b = alternate([Side("ours", run_ours), Side("seed", run_seed)], settings.reps)
    ratio = a.seconds / b.seconds
    return [
        Figure(
            "full_pass",
            a.seconds,
            b.seconds,
            "s",
            "<= 0.5x",
            ratio <= 0.5,
            note(
                settings.reps,
                a,
                b,
                extra=f"{tables} tables x {files} files, cold CLI vs cold "
                "script calling the procedures table after table",
            ),
        )
    ]


def bench_healthy(work: Path, settings: Settings) -> list[Figure]:
    """Passes over healthy tables (one file, one snapshot each): no JVM, log rows appended."""
    sizes: tuple[int, int, int] = settings.pick((3, 100, 1000), (3, 10, 30))
    figures: list[Figure] = []
    summaries: list[tuple[int, Summary]] = []
    for position, size in enumerate(sizes):
        reps = settings.big_reps if position == 2 else settings.reps
        template = built(
            f"{size} tables",
            lambda size=size: Template(
                work / f"h{size}",
                lambda root: fixtures.healthy_tables(make_lakehouse(root, f"bench_h{size}"), size),
            ),
        )

        def run_ours(template: Template = template, size: int = size) -> Sample:
            root = template.restore()
            lake = Lakehouse(root, f"bench_h{size}")

            def check(run: ProcessRun) -> dict[str, Any]:
                doc = cli_json(run)
                found = all_ok(doc, size)
                expected = sum(len(t.get("ops", [])) for t in found)
                return {"log_rows": fixtures.log_rows(lake, doc["run_id"]), "ops": expected}

            argv = icegate("run", "--config", lake.config_path, "--json")
            return cold(settings, f"ours ({size} tables)", argv, work, check)

        (summary,) = alternate([Side(f"ours {size}", run_ours)], reps)
        summaries.append((size, summary))
        logged = [(int(s.data["log_rows"]), int(s.data["ops"])) for s in summary.samples]
        rows_ok = all(rows > 0 and rows >= ops for rows, ops in logged)
        rows_note = "log rows this run " + ", ".join(f"{r}/{o} ops" for r, o in logged)
        seconds, mb, jvm = summary.seconds, summary.peak_mb, summary.jvm
        if position == 0:
            target, met = "<= 3 s, no JVM, log rows", seconds <= 3 and not jvm and rows_ok
        elif position == 1:
            target, met = "no JVM, log rows", not jvm and rows_ok
        else:
            target = "<= 60 s, no JVM, < 500 MB"
            met = seconds <= 60 and not jvm and mb < 500 and rows_ok
        extra = rows_note
        if position > 0:
            extra += "; " + growth(summaries[position - 1], summaries[position])
        figures.append(
            Figure(
                f"healthy_{size}", seconds, None, "s", target, met, note(reps, summary, extra=extra)
            )
        )
        template.discard()
    return figures


def bench_scale_compaction(work: Path, settings: Settings) -> list[Figure]:
    """``run`` over N tables that each need compaction (6 small files): time, memory, growth."""
    full = [n for n in (10, 100, 1000) if n <= settings.scale_max] or [settings.scale_max]
    sizes: list[int] = settings.pick(full, [2, 6])
    figures: list[Figure] = []
    summaries: list[tuple[int, Summary]] = []
    for size in sizes:
        reps = settings.big_reps if size >= 1000 else settings.reps
        name = f"bench_c{size}"
        template = built(
            f"{size} tables",
            lambda size=size, name=name: Template(
                work / f"c{size}",
                lambda root: fixtures.small_file_tables(make_lakehouse(root, name), size, 6, 100),
            ),
        )

        def run_ours(template: Template = template, size: int = size) -> Sample:
            root = template.restore()
            argv = icegate("run", "--config", root / "icegate.yaml", "--json")
            return cold(settings, f"ours ({size} tables)", argv, work, all_optimized(size))

        (summary,) = alternate([Side(f"ours {size}", run_ours)], reps)
        summaries.append((size, summary))
        extra = f"{summary.seconds / size:.3f} s a table"
        if len(summaries) > 1:
            extra += "; " + growth(summaries[-2], summaries[-1])
        figures.append(
            Figure(
                f"scale_compaction_{size}",
                summary.seconds,
                None,
                "s",
                "(reference)",
                None,
                note(reps, summary, extra=extra),
            )
        )
        template.discard()
    return figures


def bench_wal_ingest(work: Path, settings: Settings) -> list[Figure]:
    """25 WAL files into one table (``compact``) vs. a script appending one DataFrame."""
    files, per_file = 25, 100
    key = f"{fixtures.NAMESPACE}.t0000"

    def build_ours(root: Path) -> Path:
        lake = make_lakehouse(root, "bench_wal")
        fixtures.small_file_tables(lake, 1, 1, 100)
        return fixtures.wal_files(lake, key, files, per_file)

    def build_base(root: Path) -> None:
        fixtures.small_file_tables(make_lakehouse(root, "bench_append", wal=False), 1, 1, 100)

    ours = built("ours", lambda: Template(work / "ours", build_ours))
    base = built("baseline", lambda: Template(work / "append", build_base))

    def run_ours() -> Sample:
        root = ours.restore()

        def check(run: ProcessRun) -> dict[str, Any]:
            (op,) = ops_named(all_ok(cli_json(run), 1), "wal_compaction")
            if op["status"] != "completed":
                raise ValueError(f"wal_compaction {op['status']}: {op['details']}")
            left = list(Path(ours.value).glob("*.parquet"))
            if left:
                raise ValueError(f"{len(left)} WAL files left waiting")
            return {}

        argv = icegate("compact", "--table", key, "--config", root / "icegate.yaml", "--json")
        return cold(settings, "ours", argv, work, check)

    def run_base() -> Sample:
        root = base.restore()
        argv = bench_side("spark_append", root / "icegate.yaml", key, per_file)
        return cold(settings, "baseline", argv, work, side_json)

    a, b = alternate([Side("ours", run_ours), Side("append", run_base)], settings.reps)
    return [
        Figure(
            "wal_ingest",
            a.seconds,
            b.seconds,
            "s",
            "<= 2x",
            a.seconds <= 2 * b.seconds,
            note(
                settings.reps,
                a,
                b,
                extra=f"cold compact of {files} WAL files vs cold Spark start + one append",
            ),
        )
    ]


def bench_throughput(work: Path, settings: Settings) -> list[Figure]:
    """``optimize`` on ~1 GB of small files vs. pyarrow rewriting its own copy of them."""
    gigabytes = settings.pick(settings.gigabytes, 0.02)
    files = settings.pick(400, 20)
    key = f"{fixtures.NAMESPACE}.big"

    def build(root: Path) -> list[tuple[str, int]]:
        lake = make_lakehouse(
            root, "bench_tp", wal=False, maintain={"optimize": {"file_size_threshold": "64MB"}}
        )
        catalog = lake.catalog()
        catalog.create_namespace_if_not_exists(fixtures.NAMESPACE)
        catalog.create_table((fixtures.NAMESPACE, "big"), schema=fixtures.arrow_schema())
        argv = bench_side("build_big", lake.config_path, key, gigabytes, files)
        cold(settings, "building the data (Spark)", argv, work, side_json)
        return fixtures.data_files(lake, key)

    ours = built(f"{gigabytes} GB with Spark", lambda: Template(work / "ours", build))
    size = sum(s for _, s in ours.value)

    def copy_inputs() -> Path:
        folder = work / "pyarrow-in"
        folder.mkdir()
        copies = []
        for index, (path, _) in enumerate(ours.value):
            copies.append(shutil.copy2(path, folder / f"{index:05d}.parquet"))
        listing = work / "pyarrow-in.txt"
        listing.write_text("\n".join(str(c) for c in copies))
        return listing

    listing = built("pyarrow's copy", copy_inputs)

    def run_ours(group_size: str | None = None) -> Sample:
        root = ours.restore()
        if group_size is not None:  # the documented option: several groups, written in parallel
            config = yaml.safe_load((root / "icegate.yaml").read_text())
            config["maintain"]["optimize"]["max_file_group_size"] = group_size
            (root / "icegate.yaml").write_text(yaml.safe_dump(config))

        def check(run: ProcessRun) -> dict[str, Any]:
            (table,) = all_ok(cli_json(run), 1)
            (op,) = ops_named([table], "optimize")
            if op["status"] != "completed":
                raise ValueError(f"optimize {op['status']}: {op['details']}")
            return {
                "op_s": op["duration_s"],
                "procedure_s": (op.get("output") or {}).get("procedure_s"),
                "files_after": (op.get("after") or {}).get("data_files"),
            }

        argv = icegate("optimize", "--table", key, "--config", root / "icegate.yaml", "--json")
        return cold(settings, "ours" if group_size is None else "ours, groups", argv, work, check)

    def run_pyarrow(level: str) -> Callable[[], Sample]:
        def run() -> Sample:
            out = work / f"pyarrow-out-{level}"
            shutil.rmtree(out, ignore_errors=True)
            sample = cold(
                settings,
                f"pyarrow level {level}",
                bench_side("pyarrow_rewrite", listing, out, level),
                work,
                side_json,
            )
            shutil.rmtree(out, ignore_errors=True)
            return sample

        return run

    # Both at zstd level 1: what optimize sets on a table with no codec (the bench's table,
    # made by pyiceberg) and pyarrow's own default.
    sides = [Side("ours", run_ours), Side("pyarrow zstd1", run_pyarrow("1"))]
    a, b = alternate(sides, settings.reps)
    group_size = "128MB" if not settings.quick else "4MB"
    grouped_sides = [Side("ours, groups", lambda: run_ours(group_size)), sides[1]]
    grouped, b2 = alternate(grouped_sides, settings.reps)
    (ref,) = alternate([Side("pyarrow zstd3", run_pyarrow("3"))], settings.reps)
    mb = size / 1024**2
    op_s, arrow_s = a.median("op_s"), b.median("rewrite_s")
    procedure = [s.data["procedure_s"] for s in a.samples if s.data.get("procedure_s")]
    in_spark = (
        f"; the procedure alone (Spark already up) {mb / statistics.median(procedure):.1f} MB/s"
        if procedure
        else ""
    )
    what = (
        f"{size / 1024**3:.2f} GB in {len(ours.value)} files -> {a.samples[0].data['files_after']}"
    )
    return [
        Figure(
            "throughput_op",
            mb / op_s,
            mb / arrow_s,
            "MB/s",
            ">= 0.7x",
            mb / op_s >= 0.7 * mb / arrow_s,
            note(
                settings.reps,
                a,
                b,
                extra=f"{what}; the optimize op's own duration (JSON; in a cold process it "
                "includes starting Spark) vs pyarrow's in-process rewrite time, both zstd level 1 "
                f"(as optimize sets it on a table with no codec){in_spark}",
            ),
        ),
        Figure(
            "throughput_cold",
            mb / a.seconds,
            mb / b.seconds,
            "MB/s",
            ">= 0.7x",
            mb / a.seconds >= 0.7 * mb / b.seconds,
            note(settings.reps, a, b, extra="cold process wall time, spawn to exit"),
        ),
        Figure(
            "throughput_groups",
            mb / grouped.median("op_s"),
            mb / b2.median("rewrite_s"),
            "MB/s",
            ">= 0.7x",
            mb / grouped.median("op_s") >= 0.7 * mb / b2.median("rewrite_s"),
            note(
                settings.reps,
                grouped,
                b2,
                extra=f"with maintain.optimize.max_file_group_size {group_size} (an option: "
                f"more, smaller files, -> {grouped.samples[0].data['files_after']}), op duration",
            ),
        ),
        Figure(
            "throughput_vs_level3",
            mb / a.seconds,
            mb / ref.seconds,
            "MB/s",
            "(reference)",
            None,
            note(
                settings.reps,
                a,
                ref,
                extra="pyarrow at zstd level 3 (parquet-java's default; more work), cold",
            ),
        ),
    ]


def bench_sensor(work: Path, settings: Settings) -> list[Figure]:
    """Discovery + WAL sizing over 1,000 tables, no JVM; each repetition a fresh process."""
    count = settings.pick(1000, 50)

    def build(root: Path) -> Path:
        lake = make_lakehouse(root, "bench_sensor")
        keys = fixtures.empty_tables(lake, count)
        for key in keys:
            folder = lake.wal_root.joinpath(*key.split("."))
            folder.mkdir(parents=True)
            for f in range(3):
                (folder / f"{f}.parquet").write_bytes(b"x" * 100)
        listing = root / "keys.txt"
        listing.write_text("\n".join(keys))
        return listing

    template = built(f"{count} tables", lambda: Template(work / "sensor", build))

    def run() -> Sample:
        root = template.restore()
        argv = bench_side("sensor", root / "icegate.yaml", template.value)
        return cold(settings, "sensor", argv, work, side_json)

    (summary,) = alternate([Side("sensor", run)], settings.reps)
    discovery, wal = summary.median("discovery_s"), summary.median("wal_s")
    tick = statistics.median(
        float(s.data["discovery_s"] + s.data["wal_s"]) for s in summary.samples
    )
    return [
        Figure(
            f"sensor_tick_{count}",
            tick,
            None,
            "s",
            "<= 1 s, no JVM",
            tick <= 1.0 and not summary.jvm,
            note(
                settings.reps,
                summary,
                extra=f"discovery {discovery:.2f}s + WAL sizing {wal:.2f}s, timed inside a fresh "
                f"process (imports not counted: a code server is long-lived); process wall "
                f"{summary.seconds:.1f}s",
            ),
        )
    ]


def bench_health_sensor(work: Path, settings: Settings) -> list[Figure]:
    """The health trigger over 1,000 tables (950 healthy, 50 with 15 small files each):
    one fresh process per repetition, three ticks each as the daemon runs them (manifests
    read; cached and unchanged; after the 50 busy tables' verdicts changed), with the
    events each records (per-table health on change only)."""
    healthy, busy = settings.pick((950, 50), (45, 5))

    def build(root: Path) -> Path:
        # A budget of 10 tables a tick: the other due tables wait, as on a busy lakehouse.
        lake = make_lakehouse(root, "bench_health", maintain={"trigger": {"max_tables": 10}})
        keys = fixtures.healthy_tables(lake, healthy)
        catalog = lake.catalog()
        for t in range(busy):
            table = catalog.create_table(
                (fixtures.NAMESPACE, f"busy{t:03d}"), fixtures.arrow_schema()
            )
            for f in range(15):
                table.append(fixtures.rows(f * 20, 20))
            keys.append(f"{fixtures.NAMESPACE}.busy{t:03d}")
        listing = root / "keys.txt"
        listing.write_text("\n".join(keys))
        return listing

    count = healthy + busy
    template = built(f"{count} tables", lambda: Template(work / "health", build))

    def run() -> Sample:
        root = template.restore()
        argv = bench_side("health_sensor", root / "icegate.yaml", template.value)
        return cold(settings, "health_sensor", argv, work, side_json)

    (summary,) = alternate([Side("health_sensor", run)], settings.reps)
    first, second = summary.median("first_s"), summary.median("second_s")
    third = summary.median("third_s")
    data = summary.samples[0].data
    requested = int(data["first_requested"])
    changed = int(data["changed_tables"])
    # Tables the trigger requests get nothing from the sensor: their run records them.
    waiting = changed - int(data["third_requested_tables"])
    # Events a day at one tick every 30 s: the steady tick's count at each tick, plus one
    # lakehouse_health an hour (recorded at least hourly), plus one event per change.
    steady = int(data["second_events"])
    return [
        Figure(
            f"health_tick_{count}",
            first,
            None,
            "s",
            "< 40 s (one evaluation covers every table), no JVM",
            data["first_assessed"] == count and not summary.jvm,
            note(
                settings.reps,
                summary,
                extra=f"first tick {first:.1f}s (every manifest read), next tick "
                f"{second:.1f}s (walks cached per metadata file), a tick after {changed} "
                f"tables changed {third:.1f}s; {data['first_assessed']} of "
                f"{count} tables assessed in the first, {requested} runs requested (budget "
                f"max_tables 10 of the {busy} due); peak {summary.peak_mb:.0f} MB",
            ),
        ),
        Figure(
            f"health_events_{count}",
            float(steady * 2880 + 24),
            None,
            "events/day",
            "grows with changes, not with ticks",
            steady == 0 and int(data["third_table_events"]) == waiting,
            f"first tick {data['first_table_events']} table events (an assessment of each "
            f"table not requested now) + {data['first_events'] - data['first_table_events']} "
            f"lakehouse_health, stored in {summary.median('first_store_s'):.1f}s; an "
            f"unchanged tick {steady} events; after {changed} tables' verdicts changed, "
            f"{data['third_table_events']} table events (one each of the {waiting} not "
            f"requested; the requested ones are recorded by their run); idle a day: "
            f"{steady} x 2880 ticks + 24 hourly lakehouse_health",
        ),
    ]


def bench_monitoring(work: Path, settings: Settings) -> list[Figure]:
    """``icegate-maintain serve``'s exporter over 1,000 healthy tables, no JVM: a fresh
    process per repetition, as after a restart (the lakehouse was maintained once, so the
    log table and the trigger's memory hold a row per table and operation, and the health
    trigger's looks are stored): its first refresh, a scrape, a steady refresh, scrapes of
    the cached figures."""
    count = settings.pick(1000, 50)

    def build(root: Path) -> list[str]:
        lake = make_lakehouse(root, "bench_monitoring")
        keys = fixtures.healthy_tables(lake, count)
        # A pass over healthy tables (no JVM): log rows and the trigger's memory.
        run = run_process(
            icegate("run", "--config", lake.config_path, "--json"),
            cwd=root,
            env=_env(),
            timeout=settings.timeout,
        )
        if run.exit_code != 0:
            raise SideFailed("the fixture's pass", run)
        # The looks a running health sensor leaves in the trigger's memory.
        from icegate_dagster.monitoring.snapshot import Gatherer

        Gatherer(lake.config, look_budget_s=3600).gather()
        return keys

    template = built(f"{count} tables", lambda: Template(work / "monitoring", build))

    def run() -> Sample:
        root = template.restore()
        argv = bench_side("scrape", root / "icegate.yaml")
        return cold(settings, "scrape", argv, work, side_json)

    (summary,) = alternate([Side("scrape", run)], settings.reps)
    data = summary.samples[0].data
    if data["tables"] != count or data["down"] or data["health"] != "ok":
        raise SideFailed(
            "scrape",
            reason=f"{data['tables']} tables, sources down {data['down']}, "
            f"/health {data['health']}",
        )
    scrape = summary.median("scrape_s")
    first = summary.median("first_refresh_s")
    steady = summary.median("steady_refresh_s")
    return [
        Figure(
            f"scrape_{count}",
            scrape,
            None,
            "s",
            "<= 1 s, no JVM",
            scrape <= 1.0 and not summary.jvm,
            note(
                settings.reps,
                summary,
                extra=f"GET /metrics of the cached figures ({data['series']} series, "
                f"{data['bytes'] / 1e6:.1f} MB, {data['gzip_bytes'] / 1e6:.2f} MB gzip in "
                f"{summary.median('gzip_scrape_s'):.3f}s); the first scrape after the first "
                f"refresh {summary.median('first_scrape_s'):.3f}s; during a refresh "
                f"{summary.median('scrape_during_refresh_s'):.3f}s (max "
                f"{summary.median('scrape_during_refresh_max_s'):.3f}s); /health "
                f"{summary.median('health_s'):.3f}s; process wall {summary.seconds:.1f}s",
            ),
        ),
        Figure(
            f"scrape_refresh_{count}",
            steady,
            None,
            "s",
            "-",
            None,
            f"a refresh with nothing changed ({data['looked_steady']} tables read again); "
            f"the first after a restart {first:.2f}s ({data['looked_first']} tables read, "
            f"{data['log_rows']} log rows read in full)",
        ),
    ]


def bench_scale(work: Path, settings: Settings) -> list[Figure]:
    """The trigger at 10,000 tables (healthy, one small file each): discovery, the health
    sensor's first look and steady ticks, a tick after 1 % of the tables changed, the WAL
    tick, the cursor, what an idle day adds to the instance; and the idle daily pass (a
    cold ``icegate-maintain run``). Each repetition a fresh process on a fresh copy."""
    count = settings.pick(settings.scale_tables, 200)
    changed = max(1, count // 100)

    def build(root: Path) -> Path:
        lake = make_lakehouse(root, "bench_scale")
        keys = fixtures.healthy_tables(lake, count)
        listing = root / "keys.txt"
        listing.write_text("\n".join(keys))
        return listing

    template = built(f"{count} tables", lambda: Template(work / "scale", build))

    def sensors() -> Sample:
        root = template.restore()
        argv = bench_side("scale", root / "icegate.yaml", template.value, str(changed))
        return cold(settings, "scale", argv, work, side_json)

    def idle_pass() -> Sample:
        root = template.restore()
        return cold(settings, "idle pass", icegate("run", "--config", root / "icegate.yaml"), work)

    sides, idle = alternate([Side("sensors", sensors), Side("idle pass", idle_pass)], settings.reps)
    data = sides.samples[0].data
    deadline = 30.0

    def med(path: str) -> float:
        first, _, second = path.partition(".")
        return statistics.median(float(s.data[first][second]) for s in sides.samples)

    first_look = [t["s"] for t in data["first_look"]]
    steady, changed_s, wal_s = med("steady.s"), med("changed.s"), med("wal.s")
    hour_bytes = statistics.median(float(s.data["hour_bytes"]) for s in sides.samples)
    skip_chars = max(int(t.get("skip_chars", 0)) for t in data["first_look"] + [data["steady"]])
    # An idle day: 24 hourly lakehouse_health records; the tick rows Dagster keeps
    # (a cursor and a skip reason each, 2 sensors + discovery every 30 s or 60 s) are
    # purged after a day by dagster.yaml's retention.
    ticks_a_day = 2 * 2880 + 1440
    tick_bytes = (data["cursor_bytes"] + skip_chars + 200) * ticks_a_day
    day_bytes = 24 * hour_bytes
    return [
        Figure(
            f"scale_discovery_{count}",
            med("discovery.s"),
            None,
            "s",
            "under its deadline",
            max(s.data["discovery"]["s"] for s in sides.samples) < deadline,
            f"{count} partitions added in one tick",
        ),
        Figure(
            f"scale_first_look_{count}",
            sum(first_look),
            None,
            "s",
            "each tick < 30 s",
            max(first_look) < deadline,
            f"{len(first_look)} ticks ({', '.join(f'{t:.1f}s' for t in first_look)}); "
            f"{sum(t['events'] for t in data['first_look'])} events, stored in "
            f"{sum(t['store_s'] for t in data['first_look']):.1f}s",
        ),
        Figure(
            f"scale_steady_tick_{count}",
            steady,
            None,
            "s",
            "<= 5 s",
            steady <= 5.0,
            f"{data['steady']['events']} events; peak {sides.peak_mb:.0f} MB, "
            f"JVM {'yes' if sides.jvm else 'no'}",
        ),
        Figure(
            f"scale_changed_tick_{count}",
            changed_s,
            None,
            "s",
            "under its deadline",
            changed_s < deadline,
            f"after {changed} tables (1 %) were appended to and got WAL: "
            f"{data['changed']['events']} events, {data['changed']['runs']} runs requested",
        ),
        Figure(
            f"scale_wal_tick_{count}",
            wal_s,
            None,
            "s",
            "<= 2 s",
            wal_s <= 2.0,
            f"one listing of wal.root; {data['wal']['runs']} runs requested",
        ),
        Figure(
            f"scale_idle_day_{count}",
            day_bytes / 1e6,
            None,
            "MB",
            "<= 1 MB",
            day_bytes <= 1e6,
            f"24 x {hour_bytes / 1e3:.1f} kB (hourly lakehouse_health); cursor "
            f"{data['cursor_bytes']} B; tick rows about {tick_bytes / 1e6:.1f} MB a day, "
            f"purged after a day by dagster.yaml's retention",
        ),
        Figure(
            f"scale_idle_pass_{count}",
            idle.seconds,
            None,
            "s",
            "<= 60 s, no JVM",
            idle.seconds <= 60 and not idle.jvm,
            f"cold icegate-maintain run over {count} healthy tables; peak {idle.peak_mb:.0f} MB",
        ),
    ]


def bench_query(work: Path, settings: Settings) -> list[Figure]:
    """A full scan and a filtered query before vs. after maintenance (single side)."""
    files, count = settings.pick((2000, 200_000), (100, 10_000))

    def build(root: Path) -> None:
        catalog = make_lakehouse(root, "bench_query", wal=False).catalog()
        catalog.create_namespace_if_not_exists(fixtures.NAMESPACE)
        catalog.create_table((fixtures.NAMESPACE, "wide"), schema=fixtures.arrow_schema())

    template = built("empty table", lambda: Template(work / "query", build))

    def run() -> Sample:
        root = template.restore()
        argv = bench_side("query", root / "icegate.yaml", files, count)
        return cold(settings, "query", argv, work, side_json)

    (summary,) = alternate([Side("query", run)], settings.reps)
    after, before = summary.median("after_s"), summary.median("before_s")
    first = summary.samples[0].data
    return [
        Figure(
            "query_after_vs_before",
            after,
            before,
            "s",
            "<= 0.1x",
            after <= 0.1 * before,
            note(
                settings.reps,
                summary,
                extra=f"single side, in-process: before and after in one warm JVM; "
                f"{first['files_before']} files -> {first['files_after']}; full scan + "
                "filtered query",
            ),
        )
    ]


def bench_batching(work: Path, settings: Settings) -> list[Figure]:
    """N tables in one multi-partition Dagster run vs. one run (one process) per table."""
    tables = settings.pick(20, 3)

    def build(name: str) -> Callable[[Path], list[str]]:
        return lambda root: fixtures.small_file_tables(make_lakehouse(root, name), tables, 8, 100)

    batch = built("one-run side", lambda: Template(work / "batch", build("bench_batch")))
    single = built("per-table side", lambda: Template(work / "single", build("bench_single")))

    def run_batch() -> Sample:
        root = batch.restore()
        argv = bench_side("dagster_run", root / "icegate.yaml", ",".join(batch.value))
        return cold(settings, "one Dagster run", argv, work, side_json)

    def run_single() -> Sample:
        root = single.restore()
        runs = [
            cold(
                settings,
                f"Dagster run of {key}",
                bench_side("dagster_run", root / "icegate.yaml", key),
                work,
                side_json,
            )
            for key in single.value
        ]
        return Sample(
            sum(r.seconds for r in runs), max(r.peak_mb for r in runs), any(r.jvm for r in runs)
        )

    a, b = alternate(
        [Side("one run", run_batch), Side("per-table runs", run_single)], settings.reps
    )
    speedup = b.seconds / a.seconds
    return [
        Figure(
            f"batching_{tables}_tables",
            a.seconds,
            b.seconds,
            "s",
            ">= 5x faster (<= 0.2x)",
            speedup >= 5,
            note(
                settings.reps,
                a,
                b,
                extra=f"{speedup:.1f}x faster; baseline = sum of {tables} cold per-table runs "
                "(peak = the largest one)",
            ),
        )
    ]


def bench_daemon(work: Path, settings: Settings) -> list[Figure]:
    """N due tables (15 small files each) brought to health by Dagster's daemon alone vs.
    one cold ``icegate-maintain run`` over an identical lakehouse (see ``bench.daemon``)."""
    sizes: tuple[int, ...] = settings.pick(settings.daemon_tables, (3,))
    maintain: dict[str, Any] = {"expire_snapshots": {"retention_threshold": "1s"}}
    if settings.tables_per_run is not None:
        maintain["trigger"] = {"tables_per_run": settings.tables_per_run}
    figures: list[Figure] = []
    for size in sizes:

        def build(name: str, size: int = size) -> Callable[[Path], list[str]]:
            def make(root: Path) -> list[str]:
                lake = make_lakehouse(root, name, maintain=maintain)
                return fixtures.small_file_tables(lake, size, 15, 200)

            return make

        cli = built(
            f"CLI side, {size} tables", lambda b=build: Template(work / "cli", b("bench_cli"))
        )
        dmn = built(
            f"daemon side, {size} tables",
            lambda b=build: Template(work / "daemon", b("bench_daemon")),
        )

        def run_cli(size: int = size, cli: Template = cli) -> Sample:
            root = cli.restore()
            argv = icegate("run", "--config", root / "icegate.yaml", "--json")
            what = f"icegate-maintain run ({size} tables)"
            return cold(settings, what, argv, work, all_optimized(size))

        def run_daemon(dmn: Template = dmn) -> Sample:
            root = dmn.restore()
            run = daemon_until_healthy(
                root / "icegate.yaml",
                dmn.value,
                work / "daemon_run",
                _env(),
                settings.timeout,
                settings.dagster_yaml,
            )
            print(f"      daemon: {describe_daemon(run)}", flush=True)
            return Sample(
                run.seconds,
                run.peak_mb,
                run.jvm,
                {
                    "run_seconds": run.run_seconds,
                    "runs": run.runs,
                    "first_start_s": run.first_start_s,
                    "after_request_s": run.seconds - run.first_request_s,
                },
            )

        a, b = alternate([Side("daemon", run_daemon), Side("CLI", run_cli)], settings.reps)
        wall_target = 1.5 if size <= 20 else 1.2
        run_seconds = a.median("run_seconds")
        extra = (
            f"{size} tables x 15 small files; daemon: {a.median('runs'):g} runs, first run "
            f"started {a.median('first_start_s'):.1f} s after the daemon's spawn"
        )
        figures += [
            Figure(
                f"daemon_{size}_wall",
                a.seconds,
                b.seconds,
                "s",
                f"<= {wall_target}x",
                a.seconds <= wall_target * b.seconds,
                note(settings.reps, a, b, extra=extra),
            ),
            Figure(
                f"daemon_{size}_after_request",
                a.median("after_request_s"),
                b.seconds,
                "s",
                "(reference)",
                None,
                "the same wall time counted from the health sensor's first run request, as a "
                "daemon already running pays it (its own start, code load and first look "
                "left out)",
            ),
            Figure(
                f"daemon_{size}_run_seconds",
                run_seconds,
                b.seconds,
                "s",
                "<= 1.5x",
                run_seconds <= 1.5 * b.seconds,
                f"sum of the daemon's run durations vs the CLI pass's wall time; "
                f"peak MB daemon tree {a.peak_mb:.0f} vs CLI {b.peak_mb:.0f}",
            ),
        ]
        cli.discard()
        dmn.discard()
    return figures


BENCHMARKS: dict[str, Callable[[Path, Settings], list[Figure]]] = {
    "full_pass": bench_full_pass,
    "healthy": bench_healthy,
    "scale_compaction": bench_scale_compaction,
    "wal_ingest": bench_wal_ingest,
    "throughput": bench_throughput,
    "sensor": bench_sensor,
    "health_sensor": bench_health_sensor,
    "monitoring": bench_monitoring,
    "scale": bench_scale,
    "query": bench_query,
    "batching": bench_batching,
    "daemon": bench_daemon,
    "peers": bench_peers,
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("names", nargs="*", help=f"some of: {', '.join(BENCHMARKS)}")
    parser.add_argument("--reps", type=int, help="repetitions of each comparison (default 3)")
    parser.add_argument(
        "--big-reps", type=int, default=1, help="repetitions at 1,000 tables (default 1)"
    )
    parser.add_argument(
        "--scale-max",
        type=int,
        default=100,
        help="largest scale_compaction size: 100 (default) or 1000",
    )
    parser.add_argument(
        "--scale-tables",
        type=int,
        default=10_000,
        help="scale: tables in its lakehouse (default 10000; building them takes a while)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke test: 1 rep, small data")
    parser.add_argument(
        "--timeout", type=float, default=7200.0, help="seconds before a process is killed"
    )
    parser.add_argument("--keep", action="store_true", help="keep the work folder")
    parser.add_argument(
        "--daemon-tables",
        default="20,100",
        help="daemon: lakehouse sizes, comma-separated (default 20,100)",
    )
    parser.add_argument(
        "--tables-per-run",
        type=int,
        help="daemon: maintain.trigger.tables_per_run of its lakehouses (default: the default)",
    )
    parser.add_argument(
        "--peer-reps",
        default="6,4",
        help="peers: repetitions of W1 and of W2, comma-separated (default 6,4)",
    )
    parser.add_argument(
        "--dagster-yaml",
        type=Path,
        default=REPO / "dagster.yaml",
        help="daemon: the instance settings (default: the repo's dagster.yaml)",
    )
    return parser


def _two_counts(parser: argparse.ArgumentParser, flag: str, text: str) -> tuple[int, int]:
    try:
        first, second = (int(part) for part in text.split(","))
    except ValueError:
        parser.error(f"{flag} {text!r}: expected two counts, e.g. 6,4")
    if first < 1 or second < 1:
        parser.error(f"{flag} {text!r}: each count must be at least 1")
    return first, second


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    reps = args.reps if args.reps is not None else (1 if args.quick else 3)
    if reps < 1 or args.big_reps < 1 or args.scale_max < 1 or args.scale_tables < 1:
        parser.error("--reps, --big-reps, --scale-max and --scale-tables must be at least 1")
    settings = Settings(
        reps=reps,
        big_reps=args.big_reps,
        scale_max=args.scale_max,
        quick=args.quick,
        timeout=args.timeout,
        gigabytes=float(os.environ.get("ICEGATE_BENCH_GB", "1")),
        daemon_tables=tuple(int(n) for n in args.daemon_tables.split(",") if n),
        dagster_yaml=args.dagster_yaml.resolve(),
        tables_per_run=args.tables_per_run,
        scale_tables=args.scale_tables,
        peer_reps=_two_counts(parser, "--peer-reps", args.peer_reps),
    )
    names = args.names or list(BENCHMARKS)
    work = Path(tempfile.mkdtemp(prefix="icegate-bench-"))
    print(
        f"work folder {work}; {reps} rep(s){' (quick)' if args.quick else ''}; every side a cold "
        "process on its own fixture",
        flush=True,
    )
    figures: list[Figure] = []
    failed: list[str] = []
    try:
        for name in names:
            print(f"running {name} ...", flush=True)
            started = time.perf_counter()
            try:
                found = BENCHMARKS[name](work / name, settings)
            except Exception as exc:  # one broken benchmark must not hide the others' figures
                print(f"  {name} FAILED: {type(exc).__name__}: {exc}", flush=True)
                failed.append(name)
                continue
            finally:
                if not args.keep:
                    shutil.rmtree(work / name, ignore_errors=True)
            for figure in found:
                print("  " + figure.line(), flush=True)
            figures += found
            print(f"  done in {time.perf_counter() - started:.0f}s", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print("\nsummary (medians; ratio = ours / baseline)")
    print(summary_table(figures))
    if failed:
        print(f"\ncrashed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
