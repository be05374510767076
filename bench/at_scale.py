"""Benchmarks at a thousand tables and more: ``monitoring`` (``icegate-maintain serve``'s
exporter over 1,000 maintained tables) and ``scale`` (the trigger and the idle pass at
10,000 tables).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from bench import fixtures
from bench.fixtures import Template, make_lakehouse
from bench.harness import (
    Figure,
    Sample,
    Settings,
    Side,
    alternate,
    bench_side,
    built,
    child_env,
    cold,
    icegate,
    note,
    side_json,
)
from bench.measure import SideFailed, run_process


def bench_monitoring(work: Path, settings: Settings) -> list[Figure]:
    """``icegate-maintain serve``'s exporter over 1,000 healthy tables (``--monitoring-tables``),
    no JVM: a fresh process per repetition, as after a restart (the lakehouse was maintained
    once, so the log table and the trigger's memory hold a row per table and operation, and
    the health trigger's looks are stored): its first refresh, a scrape, a steady refresh,
    scrapes of the cached figures; by default (the series budget) and with
    ``--operation-detail``, each its own process."""
    count = settings.pick(settings.monitoring_tables, 50)

    def build(root: Path) -> list[str]:
        lake = make_lakehouse(root, "bench_monitoring")
        keys = fixtures.healthy_tables(lake, count)
        # A pass over healthy tables (no JVM): log rows and the trigger's memory.
        run = run_process(
            icegate("run", "--config", lake.config_path, "--json"),
            cwd=root,
            env=child_env(),
            timeout=settings.timeout,
        )
        if run.exit_code != 0:
            raise SideFailed("the fixture's pass", run)
        # The looks a running health sensor leaves in the trigger's memory.
        from icegate_dagster.monitoring.snapshot import Gatherer

        Gatherer(lake.config, look_budget_s=3600).gather()
        return keys

    template = built(f"{count} tables", lambda: Template(work / "monitoring", build))

    def side(setting: str) -> Side:
        def run() -> Sample:
            root = template.restore()
            argv = bench_side("scrape", root / "icegate.yaml", setting)
            return cold(settings, f"scrape ({setting})", argv, work, side_json)

        return Side(f"scrape_{setting}", run)

    summaries = alternate([side("default"), side("detail")], settings.reps)
    figures: list[Figure] = []
    for summary in summaries:
        data = summary.samples[0].data
        setting = data["setting"]
        if data["tables"] != count or data["down"] or data["health"] != "ok":
            raise SideFailed(
                f"scrape ({setting})",
                reason=f"{data['tables']} tables, sources down {data['down']}, "
                f"/health {data['health']}",
            )
        scrape = summary.median("scrape_s")
        first = summary.median("first_refresh_s")
        steady = summary.median("steady_refresh_s")
        suffix = "" if setting == "default" else "_detail"
        per_table = max(s.data["series_per_table_max"] for s in summary.samples)
        figures += [
            Figure(
                f"scrape_{count}{suffix}",
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
                    f"{summary.median('gzip_scrape_s'):.3f}s); the first scrape after the "
                    f"first refresh {summary.median('first_scrape_s'):.3f}s; during a refresh "
                    f"{summary.median('scrape_during_refresh_s'):.3f}s (max "
                    f"{summary.median('scrape_during_refresh_max_s'):.3f}s); /health "
                    f"{summary.median('health_s'):.3f}s; process wall {summary.seconds:.1f}s",
                ),
            ),
            Figure(
                f"scrape_series_per_table_{count}{suffix}",
                float(per_table),
                None,
                "series",
                "<= 25" if setting == "default" else "-",
                per_table <= 25 if setting == "default" else None,
                f"the most series of one table on /metrics (mean "
                f"{data['series_per_table_mean']:.1f}); {data['series']} series in all",
            ),
            Figure(
                f"scrape_refresh_{count}{suffix}",
                steady,
                None,
                "s",
                "-",
                None,
                f"a refresh with nothing changed ({data['looked_steady']} tables read again); "
                f"the first after a restart {first:.2f}s ({data['looked_first']} tables read, "
                f"{data['log_rows']} log rows read in full; icegate_exporter_refresh_duration_"
                f"seconds said {summary.median('served_refresh_s'):.2f}s); peak memory "
                f"{summary.peak_mb:.0f} MB",
            ),
        ]
    return figures


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
