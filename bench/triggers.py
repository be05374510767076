"""Benchmarks of the Dagster side: the sensors' ticks and the runs they launch.

``sensor`` (discovery and WAL sizing over 1,000 tables), ``health_sensor`` (the health
trigger's ticks over 1,000 tables and the events they record), ``batching`` (one
multi-partition run against a run per table), ``daemon`` (Dagster's daemon alone
bringing due tables to health against one cold ``icegate-maintain run``) and ``schedule``
(the daily schedule's day at 1,000 tables, 10 due, against one CLI pass).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fixtures
from bench.connect import WarmServer, warm_server
from bench.daemon import daemon_until_healthy
from bench.daemon import describe as describe_daemon
from bench.fixtures import Template, make_lakehouse
from bench.harness import (
    Figure,
    Sample,
    Settings,
    Side,
    all_optimized,
    alternate,
    bench_side,
    built,
    child_env,
    cold,
    icegate,
    note,
    side_json,
)


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
    one fresh process per repetition, its ticks as the daemon runs them (manifests read;
    those recording every table's check verdicts; cached and unchanged; after the 50 busy
    tables' verdicts changed), with the events and check evaluations each records (per
    table on change only)."""
    healthy, busy = settings.pick((950, 50), (45, 5))

    def build(root: Path) -> Path:
        # A budget of 10 tables a tick: the other due tables wait, as on a busy lakehouse.
        # At most one snapshot: a healthy table's next commit fails its snapshot_count.
        lake = make_lakehouse(
            root,
            "bench_health",
            maintain={"trigger": {"max_tables": 10}, "checks": {"max_snapshots": 1}},
        )
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
        Figure(
            f"health_checks_{count}",
            float(data["checks_evaluations"]),
            None,
            "evaluations",
            "4 per table judged, then only on a change",
            data["checks_evaluations"] == 4 * data["judged_tables"]
            # Every table the trigger did not request (some it requested were judged first).
            and data["judged_tables"] + data["requested_tables"] >= count
            and data["second_evaluations"] == 0
            and data["third_evaluations"] == 4 * data["checks_changed"],
            f"the four metadata checks' verdicts of {data['judged_tables']} tables (the "
            f"{data['requested_tables']} the trigger requested meanwhile wait for their "
            f"runs), after the first tick: {data['checks_ticks']} ticks "
            f"({data['checks_s']:.1f}s of evaluation in all, the longest "
            f"{data['checks_max_s']:.1f}s), {data['checks_runs']} runs of icegate_health_checks "
            f"storing {data['checks_run_events']} events (the evaluations and each run's own); "
            f"an unchanged tick: {data['second_evaluations']} evaluations, "
            f"{data['second_runs']} runs; after {data['checks_changed']} healthy tables' "
            f"snapshot_count verdicts changed: {data['third_evaluations']} evaluations in "
            f"{data['third_runs']} run, {data['third_run_events']} events, the tick "
            f"{third:.1f}s",
        ),
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
    one cold ``icegate-maintain run`` over an identical lakehouse (see ``bench.daemon``).
    With ``--connect`` both are thin clients of one warm Spark Connect server
    (``bench.connect``; its memory counted with each side's): the ``daemon_connect_*``
    rows."""
    if not settings.connect:
        return _bench_daemon(work, settings, None)
    with warm_server(work / "connect_server") as server:
        return _bench_daemon(work, settings, server)


def _bench_daemon(work: Path, settings: Settings, server: WarmServer | None) -> list[Figure]:
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
            if server is None:
                return cold(settings, what, argv, work, all_optimized(size))
            env, pid = server.env(), server.pid
            return cold(settings, what, argv, work, all_optimized(size), env, pid)

        def run_daemon(dmn: Template = dmn) -> Sample:
            root = dmn.restore()
            run = daemon_until_healthy(
                root / "icegate.yaml",
                dmn.value,
                work / "daemon_run",
                server.env() if server else child_env(),
                settings.timeout,
                settings.dagster_yaml,
                server.pid if server else None,
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

        if server is not None:  # the server's first client, untimed: a warm server after it
            warm = run_cli()
            print(f"    warm-up pass through the server (untimed): {warm.seconds:.2f}s", flush=True)
        a, b = alternate([Side("daemon", run_daemon), Side("CLI", run_cli)], settings.reps)
        wall_target = 1.5 if size <= 20 else 1.2
        run_seconds = a.median("run_seconds")
        prefix = "daemon_connect" if server else "daemon"
        extra = (
            f"{size} tables x 15 small files; daemon: {a.median('runs'):g} runs, first run "
            f"started {a.median('first_start_s'):.1f} s after the daemon's spawn"
        )
        figures += [
            Figure(
                f"{prefix}_{size}_wall",
                a.seconds,
                b.seconds,
                "s",
                f"<= {wall_target}x",
                a.seconds <= wall_target * b.seconds,
                note(settings.reps, a, b, extra=extra),
            ),
            Figure(
                f"{prefix}_{size}_after_request",
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
                f"{prefix}_{size}_run_seconds",
                run_seconds,
                b.seconds,
                "s",
                "<= 1.5x",
                run_seconds <= 1.5 * b.seconds,
                f"sum of the daemon's run durations vs the CLI pass's wall time; "
                f"peak MB daemon tree {a.peak_mb:.0f} vs CLI {b.peak_mb:.0f}"
                + (" (each with the server's JVM, at one instant)" if server else ""),
            ),
        ]
        cli.discard()
        dmn.discard()
    return figures


def bench_schedule(work: Path, settings: Settings) -> list[Figure]:
    """The daily schedule's whole day at 1,000 tables, 10 of them due (15 small files each),
    against one cold ``icegate-maintain run`` over an identical lakehouse: runs started, JVMs
    started, wall time. The day is the schedule's tick (a fresh process and instance, no
    earlier look: every table read) and each run it requests, as the daemon launches it
    (its own fresh process); the pass is one process."""
    healthy, due = settings.pick((990, 10), (45, 5))
    count = healthy + due

    def build(root: Path) -> list[str]:
        lake = make_lakehouse(root, "bench_schedule")
        keys = fixtures.healthy_tables(lake, healthy)
        catalog = lake.catalog()
        for t in range(due):
            table = catalog.create_table(
                (fixtures.NAMESPACE, f"busy{t:03d}"), fixtures.arrow_schema()
            )
            for f in range(15):
                table.append(fixtures.rows(f * 20, 20))
            keys.append(f"{fixtures.NAMESPACE}.busy{t:03d}")
        return keys

    day = built(f"schedule side, {count} tables", lambda: Template(work / "day", build))
    cli = built(f"CLI side, {count} tables", lambda: Template(work / "pass", build))

    def run_day() -> Sample:
        root = day.restore()
        requests = root / "requests.json"
        argv = bench_side("schedule_tick", root / "icegate.yaml", requests)
        tick = cold(settings, "daily_maintenance tick", argv, work, side_json)
        if tick.data["tables_requested"] != due:
            raise ValueError(f"the tick asked for {tick.data['tables_requested']} of {due} due")
        runs = [
            cold(
                settings,
                f"daily run {index}",
                bench_side("batch_run", root / "icegate.yaml", requests, index),
                work,
                side_json,
            )
            for index in range(int(tick.data["runs"]))
        ]
        samples = [tick, *runs]
        return Sample(
            sum(s.seconds for s in samples),
            max(s.peak_mb for s in samples),
            any(s.jvm for s in samples),
            {
                "runs": len(runs),
                "jvms": sum(1 for s in samples if s.jvm),
                "tick_s": tick.seconds,
                "tick_in_process_s": tick.data["tick_s"],
                "tick_jvm": int(tick.jvm),
                "rows": tick.data["tick_rows"],
                "not_looked_at": tick.data["tick_not_looked_at"],
                "steady_s": tick.data["steady_s"],
                "steady_not_looked_at": tick.data["steady_not_looked_at"],
            },
        )

    def run_cli() -> Sample:
        root = cli.restore()
        argv = icegate("run", "--config", root / "icegate.yaml", "--json")
        sample = cold(settings, f"icegate-maintain run ({count} tables)", argv, work)
        return Sample(sample.seconds, sample.peak_mb, sample.jvm, {"jvms": int(sample.jvm)})

    a, b = alternate([Side("schedule day", run_day), Side("CLI pass", run_cli)], settings.reps)
    runs, jvms = a.median("runs"), a.median("jvms")
    cli_jvms = b.median("jvms")
    # What the schedule planned before (every partition, 25 a run): for comparison only.
    before = -(-count // 25)
    return [
        Figure(
            f"schedule_day_{count}_wall",
            a.seconds,
            b.seconds,
            "s",
            "<= 1.5x",
            a.seconds <= 1.5 * b.seconds,
            note(
                settings.reps,
                a,
                b,
                extra=f"{count} tables, {due} due; the day: tick "
                f"{a.median('tick_s'):.1f}s (process; {a.median('tick_in_process_s'):.1f}s "
                f"in it, JVM {'yes' if a.median('tick_jvm') else 'no'}, "
                f"{a.median('rows'):g} log rows written, "
                f"{a.median('not_looked_at'):g} tables not looked at) + {runs:g} run(s)",
            ),
        ),
        Figure(
            f"schedule_tick_{count}_steady",
            a.median("steady_s"),
            None,
            "s",
            "within maintain.trigger.tick_deadline (30 s), every table looked at",
            a.median("steady_s") < 30 and a.median("steady_not_looked_at") == 0,
            "the next day's tick in the same process, the looks fresh (as the health sensor "
            f"keeps them in the code server): {a.median('steady_not_looked_at'):g} tables not "
            "looked at; its log rows included",
        ),
        Figure(
            f"schedule_day_{count}_runs",
            runs,
            1.0,
            "runs",
            f"ceil({due} due / tables_per_run) (was {before})",
            runs == -(-due // 100),
            f"runs the tick requested for {due} due tables of {count} (maintain.trigger."
            f"tables_per_run 100); the schedule before planned {before} runs of 25 tables; "
            "the baseline is the CLI pass's one process",
        ),
        Figure(
            f"schedule_day_{count}_jvms",
            jvms,
            cli_jvms,
            "JVMs",
            "<= the CLI pass's",
            jvms <= cli_jvms,
            "processes of the day with a java child (the tick none: it reads metadata with "
            "pyiceberg) vs the CLI pass's",
        ),
    ]
