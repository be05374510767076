"""Benchmarks of a maintenance pass: ``icegate-maintain`` as a user runs it, cold.

``full_pass`` (a pass against the procedures called by hand), ``healthy`` (passes over
healthy tables: no JVM), ``scale_compaction`` (a pass over N tables to compact, its growth)
and ``wal_ingest`` (``compact`` of WAL files against one Spark append).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.fixtures import Lakehouse, Template, make_lakehouse
from bench.harness import (
    Figure,
    Sample,
    Settings,
    Side,
    Summary,
    all_ok,
    all_optimized,
    alternate,
    bench_side,
    built,
    cli_json,
    cold,
    growth,
    icegate,
    note,
    ops_named,
    side_json,
)
from bench.measure import ProcessRun


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
