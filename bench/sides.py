"""What one side of a benchmark runs, each in its own new process.

``python -m bench.sides NAME ARG ...``; the parent (``bench.run``) times the process
from spawn to exit. A side prints one JSON object on its last stdout line when it has
figures of its own to report (in-process durations, counts). Imports are made inside
each side, so that a side loads only what it uses, as a user's own script would.

Sides:

* ``seed_full_pass CONFIG KEY...``: the by-hand way of a full pass: start Spark with
  the config, then for each table ``rewrite_data_files``, ``expire_snapshots``
  (older than 7 days, ``retain_last => 1``) and ``remove_orphan_files`` (older than 7
  days), one after the other.
* ``spark_append CONFIG KEY ROWS``: start Spark and append one small DataFrame.
* ``build_big CONFIG KEY GB FILES``: fill ``KEY`` with about ``GB`` of data in ``FILES``
  files (a throughput fixture; not timed).
* ``pyarrow_rewrite PATHS_FILE OUT LEVEL``: read the Parquet files listed in
  ``PATHS_FILE`` and write them as one zstd file (``LEVEL`` a number or ``default``).
* ``health_sensor CONFIG KEYS_FILE``: ticks of the health trigger as the daemon runs them
  (cold; those recording every table's check verdicts; cached and unchanged; after 50
  tables' verdicts changed), events and check evaluations counted.
* ``sensor CONFIG KEYS_FILE``: one tick of each sensor (discovery, WAL sizing), each
  timed in-process.
* ``scale CONFIG KEYS_FILE CHANGED``: the trigger's sensors over a large lakehouse: the
  first look tick by tick, a steady tick, a tick after CHANGED tables changed, the WAL
  tick, cursor bytes, what an hour adds to the instance.
* ``query CONFIG FILES ROWS``: build a ``FILES``-file table with Spark, time queries,
  maintain it, time them again (one warm JVM: a single-side before/after figure).
* ``dagster_run CONFIG KEY[,KEY...]``: one Dagster ``maintenance_job`` run over the
  tables, in this process (as a run launcher makes it).
* ``schedule_tick CONFIG OUT``: one tick of ``daily_maintenance`` on a fresh instance (no
  earlier look: every table is read), timed in-process, its run requests' configs and tags
  written to ``OUT`` (JSON) for ``batch_run``; then the next day's tick in the same process
  (every look fresh); the log rows each wrote.
* ``batch_run CONFIG REQUESTS INDEX``: the ``INDEX``-th run request of ``REQUESTS`` as the
  daemon launches it: ``maintenance_batch_job`` with its config and tags, in this process.
* ``scrape CONFIG``: ``icegate-maintain serve``'s exporter in this process, as after a
  restart: its first refresh (the looks stored by the trigger), a scrape of ``/metrics``,
  a steady refresh (nothing changed), scrapes from the cached figures, ``/health``.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any


def _emit(figures: dict[str, Any]) -> None:
    print(json.dumps(figures), flush=True)


def seed_full_pass(config_path: str, *keys: str) -> None:
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import TableRef
    from icegate_dagster.spark.session import get_spark, stop_spark

    config = load_config(config_path)
    catalog = config.catalog.name
    spark = get_spark(config)
    try:
        cutoff = (datetime.now(UTC) - timedelta(days=7)).strftime("%Y-%m-%d %H:%M:%S")
        for key in keys:
            arg = TableRef.parse(key).procedure_argument()
            spark.sql(f"CALL {catalog}.system.rewrite_data_files(table => {arg})").collect()
            spark.sql(
                f"CALL {catalog}.system.expire_snapshots(table => {arg}, "
                f"older_than => TIMESTAMP '{cutoff}', retain_last => 1)"
            ).collect()
            spark.sql(
                f"CALL {catalog}.system.remove_orphan_files(table => {arg}, "
                f"older_than => TIMESTAMP '{cutoff}')"
            ).collect()
    finally:
        stop_spark()
    _emit({"tables": len(keys)})


def spark_append(config_path: str, key: str, count: str) -> None:
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import TableRef
    from icegate_dagster.spark.session import get_spark, stop_spark

    config = load_config(config_path)
    spark = get_spark(config)
    try:
        name = TableRef.parse(key).spark_identifier(config.catalog.name)
        frame = spark.range(int(count)).selectExpr(
            "id",
            "'acme' AS tenant_id",
            "timestamp_seconds(1793491200 + id) AS timestamp",
            "concat('log line ', id, ' ', repeat('x', 40)) AS body",
        )
        frame.writeTo(name).append()
    finally:
        stop_spark()
    _emit({"rows": int(count)})


def build_big(config_path: str, key: str, gigabytes: str, files: str) -> None:
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import TableRef
    from icegate_dagster.spark.session import get_spark, stop_spark

    config = load_config(config_path)
    spark = get_spark(config)
    try:
        name = TableRef.parse(key).spark_identifier(config.catalog.name)
        rows_needed = int(float(gigabytes) * 1024**3 / 60)  # ~60 bytes a row once compressed
        frame = spark.range(rows_needed).selectExpr(
            "id",
            "concat('tenant-', id % 50) AS tenant_id",
            "timestamp_seconds(1793491200 + id) AS timestamp",
            "concat('took ', id % 997, ' ms; ', sha2(cast(id AS string), 256)) AS body",
        )
        frame.repartition(int(files)).writeTo(name).append()
    finally:
        stop_spark()
    _emit({"rows": rows_needed})


def pyarrow_rewrite(paths_file: str, out: str, level: str) -> None:
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    started = time.perf_counter()
    paths = Path(paths_file).read_text().split("\n")
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    dataset = ds.dataset([p for p in paths if p], format="parquet")
    with pq.ParquetWriter(
        target / "compacted.parquet",
        dataset.schema,
        compression="zstd",
        compression_level=None if level == "default" else int(level),
    ) as writer:
        for batch in dataset.to_batches():
            writer.write_batch(batch)
    _emit({"rewrite_s": time.perf_counter() - started})


def sensor(config_path: str, keys_file: str) -> None:
    import dagster as dg

    from icegate_dagster.assets.names import iceberg_tables
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.discovery_sensor import iceberg_table_discovery
    from icegate_dagster.sensors.wal_sensor import wal_size_sensor

    keys = [k for k in Path(keys_file).read_text().split("\n") if k]
    resource_ = LakehouseResource(config_path=config_path)

    def timed(action: Callable[[], Any]) -> float:
        started = time.perf_counter()
        action()
        return time.perf_counter() - started

    with dg.instance_for_test() as instance:

        def tick(which: Any) -> float:
            context = dg.build_sensor_context(instance=instance, resources={"lakehouse": resource_})
            return timed(lambda: which(context))

        discovery_s = tick(iceberg_table_discovery)
        instance.add_dynamic_partitions(iceberg_tables.name, keys)
        wal_s = tick(wal_size_sensor)
    _emit({"discovery_s": discovery_s, "wal_s": wal_s, "tables": len(keys)})


#: The most ticks ``health_sensor`` gives the check verdicts of every table.
MAX_CHECK_TICKS = 40


def health_sensor(config_path: str, keys_file: str) -> None:
    """Ticks of ``table_health_sensor`` over the listed tables in one process, as the
    daemon runs them (each tick's events stored in the instance, its cursor kept): the
    first reads every table's manifests and records each table once; then the ticks that
    record the tables' check verdicts (``checks``: one evaluation per table and metadata
    check, in a short run per tick, until a tick records none); the second finds the walks
    cached and nothing changed; before the third, the ``busy`` tables' own
    ``icegate.health.min_score`` property is raised above their score, so their verdicts
    change. Each tick: evaluation time, events recorded, time to store them, check
    evaluations and the recording run's events."""
    import dagster as dg

    from icegate_dagster.assets.names import HEALTH_CHECKS_JOB, MAINTAINED_TABLE, iceberg_tables
    from icegate_dagster.catalog import open_catalog
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import TableRef
    from icegate_dagster.maintenance.health.checks import METADATA_CHECKS
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor

    keys = [k for k in Path(keys_file).read_text().split("\n") if k]
    resource_ = LakehouseResource(config_path=config_path)
    figures: dict[str, Any] = {"tables": len(keys)}
    cursor: str | None = None

    def evaluations(instance: dg.DagsterInstance) -> int:
        return sum(
            len(
                instance.event_log_storage.get_asset_check_execution_history(
                    dg.AssetCheckKey(MAINTAINED_TABLE, name), limit=1_000_000
                )
            )
            for name in METADATA_CHECKS
        )

    def run_events(instance: dg.DagsterInstance) -> tuple[int, int]:
        """The recording runs so far, and every event they stored."""
        runs = instance.get_runs(dg.RunsFilter(job_name=HEALTH_CHECKS_JOB))
        return len(runs), sum(len(instance.all_logs(r.run_id)) for r in runs)

    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, keys)
        ticks = ["first", *(f"checks{n}" for n in range(1, MAX_CHECK_TICKS + 1))]
        settled = False
        requested: set[str] = set()
        for tick in [*ticks, "second", "third"]:
            if tick.startswith("checks") and settled:
                continue
            stored, (runs, logged) = evaluations(instance), run_events(instance)
            if tick == "third":
                catalog = open_catalog(load_config(config_path).catalog)
                busy = [k for k in keys if ".busy" in k]
                for key in busy:
                    table = catalog.load_table(TableRef.parse(key).identifier)
                    with table.transaction() as change:
                        change.set_properties({"icegate.health.min_score": "65"})
                figures["changed_tables"] = len(busy)
                # And one commit on as many healthy tables: a second snapshot, over the
                # lakehouse's checks.max_snapshots of 1: their snapshot_count verdicts change
                # (nothing else their pages show).
                grown = [k for k in keys if ".busy" not in k][: len(busy)]
                for key in grown:
                    table = catalog.load_table(TableRef.parse(key).identifier)
                    table.append(table.scan(limit=1).to_arrow())
                figures["checks_changed"] = len(grown)
            context = dg.build_sensor_context(
                instance=instance, resources={"lakehouse": resource_}, cursor=cursor
            )
            started = time.perf_counter()
            result = table_health_sensor(context)
            figures[f"{tick}_s"] = time.perf_counter() - started
            assert isinstance(result, dg.SensorResult)
            figures[f"{tick}_requested"] = len(result.run_requests or [])
            asked = [
                entry["table"]
                for r in result.run_requests or []
                for entry in r.run_config["ops"]["plan_batch"]["config"]["tables"]
            ]
            figures[f"{tick}_requested_tables"] = len(asked)
            if tick.startswith(("first", "checks")):
                requested.update(asked)
            events = list(result.asset_events or [])
            figures[f"{tick}_events"] = len(events)
            figures[f"{tick}_table_events"] = sum(1 for e in events if e.partition)
            started = time.perf_counter()
            for event in events:  # what the daemon does with them
                instance.report_runless_asset_event(event)
            figures[f"{tick}_store_s"] = time.perf_counter() - started
            cursor = result.cursor if result.cursor is not None else cursor
            assessed = [
                e.metadata["tables_assessed"].value
                for e in events
                if isinstance(e, dg.AssetMaterialization) and e.partition is None
            ]
            figures[f"{tick}_assessed"] = assessed[0] if assessed else None
            now_runs, now_logged = run_events(instance)
            figures[f"{tick}_evaluations"] = evaluations(instance) - stored
            figures[f"{tick}_runs"] = now_runs - runs
            figures[f"{tick}_run_events"] = now_logged - logged
            settled = tick.startswith("checks") and figures[f"{tick}_evaluations"] == 0
            if tick.startswith(("first", "checks")):  # tables the healthy check judges
                infos = instance.event_log_storage.get_asset_check_partition_info(
                    [dg.AssetCheckKey(MAINTAINED_TABLE, "healthy")]
                )
                figures["judged_tables"] = sum(1 for i in infos if i.is_current)
        figures["requested_tables"] = len(requested)
        checks = [t for t in ticks[1:] if f"{t}_s" in figures]
        figures["checks_ticks"] = sum(1 for t in checks if figures[f"{t}_evaluations"])
        for name in ("s", "evaluations", "runs", "run_events", "events"):
            figures[f"checks_{name}"] = sum(figures[f"{t}_{name}"] for t in checks)
        figures["checks_max_s"] = max(figures[f"{t}_s"] for t in checks)
    _emit(figures)


def query(config_path: str, files: str, count: str) -> None:
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import Maintainer, TableRef
    from icegate_dagster.spark.session import get_spark, stop_spark

    config = load_config(config_path)
    spark = get_spark(config)
    try:
        ref = TableRef.parse("bench.wide")
        name = ref.spark_identifier(config.catalog.name)
        frame = spark.range(int(count)).selectExpr(
            "id",
            "'acme' AS tenant_id",
            "timestamp_seconds(1793491200 + id) AS timestamp",
            "concat('log line ', id, ' ', repeat('x', 40)) AS body",
        )
        frame.repartition(int(files)).writeTo(name).append()  # one commit, many small files

        def queries() -> float:
            started = time.perf_counter()
            for _ in range(3):
                spark.sql(f"SELECT count(*), max(length(body)) FROM {name}").collect()
                spark.sql(f"SELECT count(*) FROM {name} WHERE id BETWEEN 1000 AND 2000").collect()
            return (time.perf_counter() - started) / 3

        before = queries()
        result = Maintainer(config, spark=lambda: spark).maintain_table(ref)
        if not result.ok:
            raise SystemExit(f"maintenance failed: {json.dumps(result.as_dict())}")
        after = queries()
    finally:
        stop_spark()
    _emit(
        {
            "before_s": before,
            "after_s": after,
            "files_before": result.before.data_files if result.before else -1,
            "files_after": result.after.data_files if result.after else -1,
        }
    )


def dagster_run(config_path: str, joined_keys: str) -> None:
    import dagster as dg

    from icegate_dagster.assets.names import iceberg_tables
    from icegate_dagster.definitions import defs
    from icegate_dagster.resources import LakehouseResource, SparkResource

    keys = joined_keys.split(",")
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(iceberg_tables.name, keys)
    tags = {
        "dagster/asset_partition_range_start": keys[0],
        "dagster/asset_partition_range_end": keys[-1],
    }
    result = defs.resolve_job_def("maintenance_job").execute_in_process(
        instance=instance,
        partition_key=keys[0] if len(keys) == 1 else None,
        tags=None if len(keys) == 1 else tags,
        resources={
            "lakehouse": LakehouseResource(config_path=config_path),
            "spark": SparkResource(),
        },
        raise_on_error=False,
    )
    if not result.success:
        raise SystemExit(f"the Dagster run over {keys[0]}..{keys[-1]} failed")
    _emit({"tables": len(keys)})


def schedule_tick(config_path: str, out: str) -> None:
    import dagster as dg

    from icegate_dagster.catalog import open_catalog
    from icegate_dagster.config import load_config
    from icegate_dagster.jobs.daily import daily_run_id
    from icegate_dagster.jobs.maintenance import daily_maintenance
    from icegate_dagster.maintenance.identifiers import TableRef
    from icegate_dagster.maintenance.log.writer import read_log
    from icegate_dagster.resources import LakehouseResource

    config = load_config(config_path)
    figures: dict[str, Any] = {}
    first = datetime.now(UTC).replace(microsecond=0)
    with dg.instance_for_test() as instance:
        # The day's tick, then the next day's in the same process (a code server keeps the
        # looks: the health sensor's, or this tick's): nothing changed, every look fresh.
        for name, scheduled in (("tick", first), ("steady", first + timedelta(days=1))):
            started = time.perf_counter()
            with dg.build_schedule_context(
                instance=instance,
                resources={"lakehouse": LakehouseResource(config_path=config_path)},
                scheduled_execution_time=scheduled,
            ) as context:
                result = daily_maintenance(context)
            requests = [] if isinstance(result, dg.SkipReason) else list(result or [])
            figures[f"{name}_s"] = time.perf_counter() - started
            rows = read_log(
                open_catalog(config.catalog),
                TableRef.parse(config.log_table),
                run_id=daily_run_id(scheduled),
            )
            figures[f"{name}_rows"] = len(rows)
            figures[f"{name}_not_looked_at"] = len(
                {r["table_name"] for r in rows if r["details"].startswith("not looked at")}
            )
            if name == "tick":
                figures["runs"] = len(requests)
                figures["tables_requested"] = sum(
                    len(r.run_config["ops"]["plan_batch"]["config"]["tables"]) for r in requests
                )
                Path(out).write_text(
                    json.dumps([{"run_config": r.run_config, "tags": r.tags} for r in requests])
                )
    _emit(figures)


def batch_run(config_path: str, requests_file: str, index: str) -> None:
    import dagster as dg

    from icegate_dagster.assets.names import BATCH_JOB
    from icegate_dagster.definitions import defs
    from icegate_dagster.resources import LakehouseResource, SparkResource

    request = json.loads(Path(requests_file).read_text())[int(index)]
    with dg.instance_for_test() as instance:
        result = defs.resolve_job_def(BATCH_JOB).execute_in_process(
            instance=instance,
            run_config=request["run_config"],
            tags=request["tags"],
            resources={
                "lakehouse": LakehouseResource(config_path=config_path),
                "spark": SparkResource(),
            },
            raise_on_error=False,
        )
    if not result.success:
        raise SystemExit(f"the daily schedule's run {index} failed")
    _emit({"tables": len(request["run_config"]["ops"]["plan_batch"]["config"]["tables"])})


def scale(config_path: str, keys_file: str, changed: str) -> None:
    """The trigger's sensors over a large lakehouse in one fresh process, as the daemon
    runs them (events stored in the instance, cursors kept): discovery on a fresh instance;
    the health sensor's first look, tick after tick until every table has a look; a steady
    tick (nothing changed); a tick after ``changed`` tables were appended to (1 %); the WAL
    sensor over a root where those tables have WAL; what a quiet hour and an idle day add
    to the instance. Each tick: evaluation seconds, events, seconds to store them."""
    import os

    import dagster as dg
    import pyarrow.parquet as pq

    from icegate_dagster.assets.trigger_state import simulated_clock
    from icegate_dagster.catalog import open_catalog
    from icegate_dagster.config import load_config
    from icegate_dagster.maintenance import TableRef
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.discovery_sensor import iceberg_table_discovery
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from icegate_dagster.sensors.wal_sensor import wal_size_sensor

    keys = [k for k in Path(keys_file).read_text().split("\n") if k]
    config = load_config(config_path)
    resource_ = LakehouseResource(config_path=config_path)
    figures: dict[str, Any] = {"tables": len(keys)}
    cursors: dict[str, str | None] = {}

    def size(folder: str) -> int:
        return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())

    with dg.instance_for_test() as instance:

        def tick(sensor: Any) -> dict[str, Any]:
            context = dg.build_sensor_context(
                instance=instance,
                resources={"lakehouse": resource_},
                cursor=cursors.get(sensor.name),
            )
            started = time.perf_counter()
            result = sensor(context)
            seconds = time.perf_counter() - started
            out: dict[str, Any] = {"s": seconds, "events": 0, "store_s": 0.0, "runs": 0}
            if isinstance(result, dg.SensorResult):
                started = time.perf_counter()
                for request in result.dynamic_partitions_requests or []:
                    if isinstance(request, dg.AddDynamicPartitionsRequest):
                        instance.add_dynamic_partitions(
                            "iceberg_tables", list(request.partition_keys)
                        )
                for event in result.asset_events:
                    instance.report_runless_asset_event(event)
                out["store_s"] = time.perf_counter() - started
                out["events"] = len(result.asset_events)
                out["runs"] = len(result.run_requests or [])
                if result.cursor is not None:
                    cursors[sensor.name] = result.cursor
                skip = result.skip_reason.skip_message if result.skip_reason else ""
                out["skip_chars"] = len(skip or "")
            return out

        figures["discovery"] = tick(iceberg_table_discovery)
        looks = []
        while True:  # the first look, as many ticks as it takes
            looks.append(tick(table_health_sensor))
            cursor = json.loads(cursors.get("table_health_sensor") or "{}")
            if cursor.get("resume_at") is None or len(looks) > 20:
                break
        figures["first_look"] = looks
        figures["steady"] = tick(table_health_sensor)
        catalog = open_catalog(config.catalog)
        wal_root = Path(str(config.wal_root).removeprefix("file://"))
        for key in keys[: int(changed)]:
            table = catalog.load_table(TableRef.parse(key).identifier)
            table.append(table.scan(limit=1).to_arrow())
            folder = wal_root.joinpath(*key.split("."))
            folder.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.scan(limit=1).to_arrow(), folder / "w.parquet")
        figures["changed"] = tick(table_health_sensor)
        figures["wal"] = tick(wal_size_sensor)
        figures["cursor_bytes"] = len(cursors.get("table_health_sensor") or "")
        # A quiet hour on the test's clock: nothing but the hourly lakehouse_health, whose
        # size (and the tick rows' size) make what an idle day adds to the instance.
        root = str(instance.root_directory)
        before = size(root)
        now = [time.time()]
        with simulated_clock(lambda: now[0]):
            quiet = []
            for _ in range(3):
                now[0] += 3600
                quiet.append(tick(table_health_sensor))
        figures["quiet_hours"] = quiet
        figures["hour_bytes"] = (size(root) - before) / 3
        figures["instance_bytes"] = size(root)
        figures["pid_rss_mb"] = (
            int(Path(f"/proc/{os.getpid()}/status").read_text().split("VmHWM:")[1].split()[0])
            / 1024
        )
    _emit(figures)


def scrape(config_path: str, setting: str = "default") -> None:
    """The exporter over a lakehouse: refreshes, scrapes, series (``setting``: ``default``,
    or ``detail`` for ``serve --operation-detail``)."""
    import gzip
    import statistics
    import threading
    import urllib.request

    from icegate_dagster.config import load_config
    from icegate_dagster.monitoring.server import Exporter, make_server

    config = load_config(config_path)
    exporter = Exporter(config, max_age_s=60.0, operation_detail=setting == "detail")
    server = make_server(exporter, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"

    def get(path: str, gzip_ok: bool = False) -> tuple[float, bytes]:
        headers = {"Accept-Encoding": "gzip"} if gzip_ok else {}
        started = time.perf_counter()
        with urllib.request.urlopen(urllib.request.Request(url + path, headers=headers)) as got:
            body = got.read()
        return time.perf_counter() - started, body

    started = time.perf_counter()
    first = exporter.refresh()
    figures: dict[str, Any] = {"first_refresh_s": time.perf_counter() - started}
    assert first is not None, exporter.last_error
    figures["first_scrape_s"], body = get("/metrics")
    started = time.perf_counter()
    steady = exporter.refresh()
    figures["steady_refresh_s"] = time.perf_counter() - started
    assert steady is not None, exporter.last_error
    scrapes = [get("/metrics")[0] for _ in range(5)]
    # Scrapes while a refresh runs (one in three, at 1,000 tables and the default max-age):
    # the refresher holds the interpreter for most of its time.
    busy = threading.Thread(target=exporter.refresh)
    started = time.perf_counter()
    busy.start()
    during = []
    while busy.is_alive():
        during.append(get("/metrics")[0])
    busy.join()
    figures["busy_refresh_s"] = time.perf_counter() - started
    figures["scrape_during_refresh_s"] = statistics.median(during)
    figures["scrape_during_refresh_max_s"] = max(during)
    figures["scrape_s"] = statistics.median(scrapes)
    figures["gzip_scrape_s"], zipped = get("/metrics", gzip_ok=True)
    figures["health_s"], health = get("/health")
    server.shutdown()
    exporter.stop()
    text = body.decode()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    served_refresh = next(
        float(line.rsplit(" ", 1)[1])
        for line in samples
        if line.startswith("icegate_exporter_refresh_duration_seconds ")
    )
    per_table: dict[str, int] = {}
    for line in samples:
        if 'table="' in line:
            table = line.split('table="', 1)[1].split('"', 1)[0]
            per_table[table] = per_table.get(table, 0) + 1
    figures.update(
        setting=setting,
        tables=len(steady.tables),
        looked_first=first.looked,
        looked_steady=steady.looked,
        series=len(samples),
        series_per_table_max=max(per_table.values(), default=0),
        series_per_table_mean=sum(per_table.values()) / max(1, len(per_table)),
        # What the exporter served for the first refresh (its figures were scraped after
        # it), against the same refresh timed from outside.
        served_refresh_s=served_refresh,
        bytes=len(body),
        gzip_bytes=len(zipped),
        gzip_same=gzip.decompress(zipped)[:1000] == body[:1000],
        log_rows=steady.log.rows_read if steady.log else 0,
        down=sorted(name for name, state in steady.sources.items() if not state.ok),
        health=json.loads(health)["status"],
    )
    _emit(figures)


SIDES: dict[str, Callable[..., None]] = {
    "seed_full_pass": seed_full_pass,
    "spark_append": spark_append,
    "build_big": build_big,
    "pyarrow_rewrite": pyarrow_rewrite,
    "sensor": sensor,
    "health_sensor": health_sensor,
    "scale": scale,
    "query": query,
    "dagster_run": dagster_run,
    "schedule_tick": schedule_tick,
    "batch_run": batch_run,
    "scrape": scrape,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in SIDES:
        print(f"usage: python -m bench.sides {{{','.join(SIDES)}}} ARG ...", file=sys.stderr)
        return 2
    SIDES[argv[0]](*argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
