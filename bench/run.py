"""Benchmarks: every side of every comparison in its own cold process, side by side.

Usage::

    ./scripts/bench.sh [NAME ...] [--reps N] [--quick]
    .venv/bin/python -m bench.run [NAME ...] [--reps N] [--big-reps N] [--scale-max N]
                                  [--quick] [--timeout S] [--keep]

Names (default: all): full_pass, healthy, scale_compaction, wal_ingest, throughput,
sensor, health_sensor, monitoring, scale, query, batching, daemon, schedule, peers,
requests, spark_lines. ``schedule`` is the daily schedule's day at 1,000 tables (10 due)
against one CLI pass: runs and JVMs started, wall time.
``requests`` counts object-store requests by kind through a proxy in front of SeaweedFS
(``bench.object_store``). ``spark_lines`` runs W1, W2 and the daemon's first size on
Spark 3.5 (``.venv``) against Spark 4.1 (``.venv-spark4``: ``scripts/setup.sh --spark4``;
``bench.lines``). ``peers``
installs iceberg-zamboni in its own venv under ``.bench/peers/`` and runs W1 and W2 with
it (``--peer-reps``, default 6 and 4; ``bench.peers`` says how). ``scale`` builds 10,000 tables
(``--scale-tables N``) before it measures: allow half an hour; ``monitoring`` builds and
maintains 1,000 (``--monitoring-tables N``) and measures the exporter by default and with
``--operation-detail``. ``--reps`` (default 3)
repetitions of each comparison; ``--big-reps`` (default 1) for the 1,000-table sizes;
``--scale-max 1000`` adds 1,000 tables to ``scale_compaction`` (default 100);
``ICEGATE_BENCH_GB`` (default 1) sizes ``throughput`` and ``peers``' W2. ``--connect``
makes our side of ``peers`` and ``daemon`` a thin client of a warm Spark Connect server
started untimed (``bench.connect``; its memory counted with ours): the ``peers_connect_*``
and ``daemon_connect_*`` rows. ``--quick`` is a smoke test: 1
repetition, a few tables and files, a tiny throughput size (its figures say nothing about
the targets). ``--keep`` leaves the work folder in place.

How it measures (see ``bench.harness`` and ``bench.measure``): users run this service as
a fresh process each time (a CLI call; a Dagster run is one process with one new JVM), so
each side of a comparison is its own new process (``icegate-maintain ...`` for ours; ``python -m
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
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.at_scale import bench_monitoring, bench_scale
from bench.compaction import bench_query, bench_throughput
from bench.harness import REPO, Figure, Settings, summary_table
from bench.lines import bench_spark_lines
from bench.object_store import bench_requests
from bench.passes import bench_full_pass, bench_healthy, bench_scale_compaction, bench_wal_ingest
from bench.peers import bench_peers
from bench.triggers import (
    bench_batching,
    bench_daemon,
    bench_health_sensor,
    bench_schedule,
    bench_sensor,
)

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
    "schedule": bench_schedule,
    "peers": bench_peers,
    "requests": bench_requests,
    "spark_lines": bench_spark_lines,
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
    parser.add_argument(
        "--monitoring-tables",
        type=int,
        default=1000,
        help="monitoring: tables in its lakehouse, maintained once (default 1000)",
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
        "--connect",
        action="store_true",
        help="peers, daemon: our side a thin client of a warm Spark Connect server started "
        "untimed (its memory counted with ours); see bench.connect",
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
    counts = (reps, args.big_reps, args.scale_max, args.scale_tables, args.monitoring_tables)
    if min(counts) < 1:
        parser.error(
            "--reps, --big-reps, --scale-max, --scale-tables and --monitoring-tables must be "
            "at least 1"
        )
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
        monitoring_tables=args.monitoring_tables,
        peer_reps=_two_counts(parser, "--peer-reps", args.peer_reps),
        connect=args.connect,
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
