"""``requests``: what maintenance costs in object-store requests, counted by kind.

A lakehouse in SeaweedFS (``weed mini`` on loopback): its Iceberg REST catalog, tables
written by pyiceberg (``TABLES`` tables of ``APPENDS`` small appends each) and the WAL in an
``s3://`` root with ``WAL_FILES`` files for each of the first ``WAL_TABLES`` tables. Every
client's ``s3.endpoint`` (the CLI's Spark and Python sides, the sensors) names a counting
proxy (:mod:`tests.s3_proxy`) in front of the server's S3, which counts each request as S3
bills it: LIST, HEAD, GET, PUT, DELETE, OTHER. Measured, in order:

* ``full pass``: a cold ``icegate-maintain run`` (its own process and JVM): WAL ingest,
  compaction, manifests, expiry deleting files, orphan listing, the log table's commits;
* ``idle pass``: the same command once the pass after the full one has expired the full
  pass's own snapshots (1 s retention): nothing due;
* ``wal sensor tick``, ``health sensor tick``: one tick each of ``wal_size_sensor`` and
  ``table_health_sensor``, evaluated here with ``dg.build_sensor_context`` (no JVM);
  ``health tick, unchanged``: the health sensor's next tick, no table changed since.

Counts are what this measures, not time. Requests the REST catalog server makes to its own
storage (it writes the metadata JSON) do not pass the proxy: a managed catalog bills those
to its own account. docs/performance.md extrapolates the counts to 10,000 tables.
"""

from __future__ import annotations

import os
import secrets
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import yaml

from bench.fixtures import arrow_schema, rows
from bench.harness import Figure, Settings, all_ok, child_env, cli_json, icegate
from bench.measure import SideFailed, run_process

NAMESPACE = "bench"
LOG_TABLE = "bench_meta.maintenance_log"  # SeaweedFS refuses names starting with "_"
TABLES, APPENDS, WAL_TABLES, WAL_FILES = 10, 15, 3, 5
PHASES = (
    "full pass",
    "idle pass",
    "wal sensor tick",
    "health sensor tick",
    "health tick, unchanged",
)
Counts = dict[str, int]


def _config(root: Path, catalog: dict[str, str], wal_root: str) -> Path:
    raw = {
        "catalog": catalog,
        "namespaces": [NAMESPACE],
        "wal": {"root": wal_root},
        "spark": {"master": "local[1]"},
        "maintain": {
            "locks": {"uri": f"sqlite:///{root / 'leases.db'}"},
            "log_table": LOG_TABLE,
            "compaction": {"min_files": WAL_FILES - 1},
            "optimize": {"min_input_files": 2},
            "expire_snapshots": {"retention_threshold": "1s", "retain_last": 1},
            "remove_orphan_files": {"retention_threshold": "24h"},
        },
    }
    path = root / "icegate.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _build(server: Any, tables: int, appends: int) -> tuple[list[str], str]:
    """The tables (written straight to the server, not counted) and the WAL root."""
    from pyarrow import fs
    from pyiceberg.catalog import load_catalog

    catalog = load_catalog("bench_build", **server.catalog_properties())
    catalog.create_namespace_if_not_exists(NAMESPACE)
    catalog.create_namespace_if_not_exists(LOG_TABLE.split(".")[0])
    keys = []
    for t in range(tables):
        table = catalog.create_table((NAMESPACE, f"t{t:04d}"), schema=arrow_schema())
        for a in range(appends):
            table.append(rows(t * 100_000 + a * 10, 10))
        keys.append(f"{NAMESPACE}.t{t:04d}")
    s3 = fs.S3FileSystem(
        endpoint_override=server.s3_endpoint.removeprefix("http://"),
        scheme="http",
        access_key=server.access_key,
        secret_key=server.secret_key,
        region="us-east-1",
        force_virtual_addressing=False,
        allow_bucket_creation=True,
    )
    bucket = f"wal-{secrets.token_hex(4)}"
    s3.create_dir(bucket)
    for key in keys[:WAL_TABLES]:
        for f in range(WAL_FILES):
            name = f"{bucket}/wal/{key.replace('.', '/')}/wal-{f:04d}.parquet"
            pq.write_table(rows(5_000_000 + f * 20, 20, "wal"), name, filesystem=s3)
    return keys, f"s3://{bucket}/wal"


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """The keys in this process's environment while the sensors tick (``${VAR}``)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _sensor_ticks(config_path: Path, keys: list[str], take: Callable[[], Counts]) -> list[Counts]:
    """One tick of ``wal_size_sensor``, then two of ``table_health_sensor`` (the second
    with the first's cursor and events, as the daemon runs it: no table changed since)."""
    import dagster as dg

    from icegate_dagster.assets.names import ICEBERG_TABLES
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from icegate_dagster.sensors.wal_sensor import wal_size_sensor

    resources = {"lakehouse": LakehouseResource(config_path=str(config_path))}
    found = []
    cursor = None
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(ICEBERG_TABLES, keys)
    for sensor in (wal_size_sensor, table_health_sensor, table_health_sensor):
        context = dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor)
        take()
        result = sensor(context)
        if not isinstance(result, dg.SensorResult | dg.SkipReason):
            raise SideFailed(sensor.name, reason=f"the tick returned {result!r}")
        found.append(take())
        if sensor is table_health_sensor and isinstance(result, dg.SensorResult):
            for event in result.asset_events:
                instance.report_runless_asset_event(event)
            cursor = result.cursor if result.cursor is not None else cursor
    return found


def _ops_done(results: list[dict[str, Any]]) -> str:
    """How many tables each operation did something to (``completed``), to read the
    counts against."""
    done: Counter[str] = Counter(
        op["operation"] for t in results for op in t["ops"] if op["status"] == "completed"
    )
    return ", ".join(f"{name} on {n}" for name, n in sorted(done.items())) or "nothing done"


def _table(counts: dict[str, Counts], tables: int, kinds: tuple[str, ...]) -> str:
    head = ["phase", *kinds, "total", "per table"]
    lines = [head]
    for phase, found in counts.items():
        total = sum(found[k] for k in kinds[:-1])  # "deleted objects" is not a request
        lines.append([phase, *(str(found[k]) for k in kinds), str(total), f"{total / tables:.1f}"])
        lines.append(["  per table", *(f"{found[k] / tables:.1f}" for k in kinds), "", ""])
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)) for r in lines)


def _measure(work: Path, settings: Settings, server: Any, proxy: Any) -> dict[str, Counts]:
    """Build the lakehouse (uncounted), then count each phase's requests."""
    tables = settings.pick(TABLES, WAL_TABLES)
    keys, wal_root = _build(server, tables, settings.pick(APPENDS, 4))
    catalog = {**server.catalog_block("lake"), "s3.endpoint": proxy.endpoint}
    config_path = _config(work, catalog, wal_root)
    env = {**child_env(), **server.env()}
    counts: dict[str, Counts] = {}
    # The pass between the two expires the snapshots the full pass made (1 s retention):
    # the idle pass comes after it, with nothing left to do.
    for phase in (PHASES[0], "settling pass (not counted)", PHASES[1]):
        proxy.counts.take()
        run = run_process(
            icegate("run", "--json", "--config", config_path),
            cwd=work,
            env=env,
            timeout=settings.timeout,
        )
        if run.exit_code != 0:
            raise SideFailed(phase, run)
        found = proxy.counts.take()
        if phase in PHASES:
            counts[phase] = found
        (work / f"{phase.split(' (')[0].replace(' ', '_')}.json").write_text(run.stdout)
        print(f"    {phase}: {_ops_done(all_ok(cli_json(run), tables))}", flush=True)
    with _environment(server.env()):
        ticks = _sensor_ticks(config_path, keys, proxy.counts.take)
    counts.update(zip(PHASES[2:], ticks, strict=True))
    return counts


def bench_requests(work: Path, settings: Settings) -> list[Figure]:
    """Requests by kind for a full pass, an idle pass and one tick of each sensor."""
    from tests.s3_proxy import DELETED_OBJECTS, KINDS, counting_proxy
    from tests.surfaces.seaweedfs_server import running_seaweedfs

    work.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        proxy = stack.enter_context(counting_proxy("http://127.0.0.1:1"))  # upstream below
        # SeaweedFS's REST catalog hands Java clients its own ``s3.endpoint`` with each
        # table (its external URL), which wins over the client's: it must name the proxy,
        # or Spark's S3FileIO would go around it.
        with _environment({"S3_EXTERNAL_URL": proxy.endpoint}):
            server = stack.enter_context(running_seaweedfs(work / "weed"))
        proxy.forward_to(server.s3_endpoint)
        counts = _measure(work, settings, server, proxy)
    tables = settings.pick(TABLES, WAL_TABLES)
    kinds = (*KINDS, DELETED_OBJECTS)
    print(
        f"    requests through the proxy, {tables} tables of {settings.pick(APPENDS, 4)} "
        f"appends, {WAL_TABLES} with {WAL_FILES} WAL files:"
    )
    print("\n".join("    " + line for line in _table(counts, tables, kinds).splitlines()))
    return [
        Figure(
            name=f"requests/table {phase}",
            ours=sum(found[k] for k in KINDS) / tables,
            baseline=None,
            unit="req",
            target="- (counted)",
            met=None,
            note=", ".join(f"{k} {found[k]}" for k in kinds if found[k]),
        )
        for phase, found in counts.items()
    ]
