"""Benchmarks of what compaction costs and buys: ``throughput`` (``optimize`` on about
1 GB of small files against pyarrow rewriting its own copy) and ``query`` (a full scan and a
filtered query before against after maintenance).
"""

from __future__ import annotations

import shutil
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from bench import fixtures
from bench.fixtures import Template, make_lakehouse
from bench.harness import (
    Figure,
    Sample,
    Settings,
    Side,
    all_ok,
    alternate,
    bench_side,
    built,
    cli_json,
    cold,
    icegate,
    note,
    ops_named,
    side_json,
)
from bench.measure import ProcessRun


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
