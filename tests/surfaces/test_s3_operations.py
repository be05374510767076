"""The pass's other operations on S3 tables (SeaweedFS on loopback), beside what
``test_s3_tables.py`` (binpack, manifests, expiry, orphans) and ``test_s3_lakehouse.py``
(the WAL, ``maintenance_job``) cover: sort optimize, delete-file compaction and
``rewrite_position_delete_files``, TTL, statistics, tables sharing a location, deferred
orphan deletion and a Dagster run of ``maintenance_batch_job``.

Tables are written by pyiceberg; the merge-on-read deletes (which pyiceberg cannot write)
by Spark SQL in a fresh interpreter, as users make them. One cold ``icegate-maintain run``
maintains four tables of the REST catalog configured differently (per-table settings), and
each is then checked on S3 with readers that are not this project's: pyiceberg, DuckDB,
pyarrow's own S3 client. On a SQL catalog whose warehouse is ``s3://``: two tables
sharing a folder in a bucket through expiry and deferred orphan deletion, and a WAL root
inside a table's folder refused. A health tick's ``maintenance_batch_job`` run maintains
REST-catalog tables in a fresh interpreter.
"""

from __future__ import annotations

import io
import json
import os
import random
import secrets
import subprocess
import sys
import textwrap
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pyiceberg.catalog import Catalog, load_catalog

from icegate_dagster.assets.names import BATCH_JOB, MAINTAINED_TABLE, TABLES_TAG
from icegate_dagster.config import load_config
from icegate_dagster.maintenance import Maintainer, TableRef
from icegate_dagster.maintenance.log.writer import read_log
from tests.lakehouse import SCHEMA, SPEC, batch
from tests.surfaces.seaweedfs_server import (  # noqa: F401
    SeaweedServer,
    plant_old_object,
    seaweedfs_fixture,
)
from tests.surfaces.test_s3_tables import (
    CLI,
    OLD_S,
    S3Lake,
    _create_table,
    _duckdb_rows,
    _exists,
    _maintain_block,
    _op,
    _s3,
    _write_config,
    keys_in_environment,  # noqa: F401
)

Row = tuple[Any, ...]
#: A namespace of its own: the other S3 tests' runs maintain theirs.
NAMESPACE = "ops"
LOG_TABLE = "ops_meta.maintenance_log"  # SeaweedFS refuses table names starting with "_"
SORTED = f"{NAMESPACE}.sorted"  # strategy: sort, and Puffin statistics
REFUNDS = f"{NAMESPACE}.refunds"  # merge-on-read deletes, applied by optimize
RETURNS = f"{NAMESPACE}.returns"  # dangling position deletes, rewrite_position_delete_files
EVENTS = f"{NAMESPACE}.events"  # a TTL rule
SORTED_APPENDS = 8
PUFFIN_MAGIC = b"PFA1"


def _rows(ids: list[int], service: Any, stamp: Any) -> pa.Table:
    """Rows of ``SCHEMA`` for ``ids``: ``service(id)``, ``stamp(id)``, ``body`` ``row <id>``."""
    return pa.Table.from_pydict(
        {
            "id": ids,
            "service": [service(i) for i in ids],
            "timestamp": [stamp(i) for i in ids],
            "body": [f"row {i}" for i in ids],
        },
        schema=SCHEMA.as_arrow(),
    )


def _epoch(i: int) -> datetime:
    return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=i)


def _as_read(rows: Counter[Row]) -> Counter[Row]:
    """pyiceberg's rows as DuckDB's ``_duckdb_rows`` reads them (id, service, body)."""
    return Counter((r[0], r[1], r[3]) for r in rows.elements())


def _files(lake: S3Lake, key: str) -> set[str]:
    return set(lake.table(key).inspect.files()["file_path"].to_pylist())


def _delete_files(lake: S3Lake, key: str) -> list[dict[str, Any]]:
    """The current snapshot's delete files, as pyiceberg's ``delete_files`` table lists them."""
    listed: list[dict[str, Any]] = lake.table(key).inspect.delete_files().to_pylist()
    return listed


def _dangling(lake: S3Lake, key: str) -> list[str]:
    """Position delete files of the current snapshot naming no live data file (each read
    from S3: the data files its rows point at)."""
    data = set(lake.table(key).inspect.data_files()["file_path"].to_pylist())
    dangling = []
    for delete in _delete_files(lake, key):
        positions = pq.read_table(io.BytesIO(_read(lake, delete["file_path"])))
        if not set(positions["file_path"].to_pylist()) & data:
            dangling.append(delete["file_path"])
    return dangling


def _read(lake: S3Lake, uri: str) -> bytes:
    with _s3(lake.server).open_input_file(uri.split("://", 1)[1]) as handle:
        return bytes(handle.read())


#: Spark SQL statements in a fresh interpreter, through the catalog ``icegate.yaml`` names:
#: this process's JVM may have started (for an earlier test) without the S3 jars.
_SPARK_SQL = """
import sys
from icegate_dagster.config import load_config
from icegate_dagster.spark.session import get_spark
spark = get_spark(load_config(sys.argv[1]))
for statement in sys.argv[2:]:
    spark.sql(statement).collect()
"""


def _spark_sql(lake: S3Lake, *statements: str) -> None:
    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", _SPARK_SQL, str(lake.config_path), *statements],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]


def _merge_on_read_table(catalog: Catalog, key: str) -> None:
    """``key`` written by pyiceberg (format 2, merge-on-read for Spark's row-level writes):
    two appends of 100 rows, even ids ``api``, odd ones ``web``: four data files."""
    table = catalog.create_table(
        TableRef.parse(key).identifier,
        SCHEMA,
        partition_spec=SPEC,
        properties={
            "format-version": "2",
            "write.delete.mode": "merge-on-read",
            "write.update.mode": "merge-on-read",
        },
    )
    for start in (0, 100):
        table.append(_rows(list(range(start, start + 100)), _parity, _epoch))


def _parity(i: int) -> str:
    return "api" if i % 2 == 0 else "web"


def _plant_old_parquet(lake: S3Lake, uri: str, rows: pa.Table) -> None:
    """A Parquet file written by pyarrow alone (no field ids: ``add_files`` takes it), put at
    ``uri`` older than the 24 h floor."""
    buffer = io.BytesIO()
    pq.write_table(rows, buffer)
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    plant_old_object(lake.server, bucket, key, buffer.getvalue(), OLD_S)


def _old_object(lake: S3Lake, folder: str, name: str) -> str:
    uri = f"{folder}/{name}-{secrets.token_hex(4)}.parquet"
    bucket, key = uri.removeprefix("s3://").split("/", 1)
    plant_old_object(lake.server, bucket, key, b"PAR1 old PAR1", OLD_S)
    return uri


@pytest.fixture
def ops_lake(
    seaweedfs: SeaweedServer,
    keys_in_environment: None,  # noqa: F811
    tmp_path: Path,
) -> S3Lake:
    """The REST catalog's ``ops`` namespace, and an ``icegate.yaml`` whose per-table
    settings give each table its own operations."""
    catalog = load_catalog("s3_ops", **seaweedfs.catalog_properties())
    catalog.create_namespace_if_not_exists(NAMESPACE)
    raw = {
        "catalog": seaweedfs.catalog_block("s3_rest"),
        "namespaces": [NAMESPACE],
        "wal": {"root": "wal"},  # a local WAL root, empty: the tables are S3's
        "spark": {"master": "local[1]"},
        "maintain": {
            **_maintain_block(LOG_TABLE, tmp_path),
            "tables": {
                SORTED: {
                    "optimize": {"strategy": "sort", "sort_order": "id ASC"},
                    "compute_table_stats": {"enabled": True},
                },
                EVENTS: {"retention": {"days": 30, "column": "timestamp"}},
                # No file is small, none has enough deletes: optimize leaves the deletes
                # to rewrite_position_delete_files.
                RETURNS: {
                    "optimize": {
                        "file_size_threshold": 1,
                        "delete_file_threshold": 100,
                        "delete_ratio_threshold": 1.0,
                    }
                },
            },
        },
    }
    config_path = tmp_path / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert seaweedfs.access_key not in config_path.read_text()
    return S3Lake(seaweedfs, tmp_path, config_path, catalog)


def test_one_cold_run_sorts_applies_deletes_expires_rows_and_writes_statistics_on_s3(
    ops_lake: S3Lake,
) -> None:
    lake, server, catalog = ops_lake, ops_lake.server, ops_lake.catalog
    spark_catalog = "s3_rest"

    # SORTED: eight appends of shuffled ids, one partition.
    ids = list(range(SORTED_APPENDS * 10))
    random.Random(39).shuffle(ids)
    table = catalog.create_table(TableRef.parse(SORTED).identifier, SCHEMA, partition_spec=SPEC)
    for i in range(SORTED_APPENDS):
        table.append(_rows(ids[i * 10 : (i + 1) * 10], lambda _: "api", _epoch))
    sorted_files = _files(lake, SORTED)
    assert len(sorted_files) == SORTED_APPENDS

    # EVENTS: seven rows 45 days old, five 29 days old, four an hour old.
    now = datetime.now(UTC)
    events = catalog.create_table(TableRef.parse(EVENTS).identifier, SCHEMA, partition_spec=SPEC)
    for start, count, days in ((0, 7, 45), (100, 5, 29), (200, 4, 1 / 24)):
        stamp = now - timedelta(days=days)
        events.append(_rows(list(range(start, start + count)), _parity, lambda _, t=stamp: t))

    # REFUNDS and RETURNS: merge-on-read deletes by Spark SQL; on RETURNS another engine
    # then compacts the api partition, leaving its delete files dangling.
    _merge_on_read_table(catalog, REFUNDS)
    _merge_on_read_table(catalog, RETURNS)
    _spark_sql(
        lake,
        f"DELETE FROM {spark_catalog}.{REFUNDS} WHERE id % 10 = 3",
        f"UPDATE {spark_catalog}.{REFUNDS} SET body = 'updated' WHERE id % 10 = 4",
        f"DELETE FROM {spark_catalog}.{RETURNS} WHERE id % 10 IN (3, 4)",
        f"CALL {spark_catalog}.system.rewrite_data_files(table => '{RETURNS}', "
        "where => \"service = 'api'\", options => map('rewrite-all', 'true'))",
    )
    refund_deletes = {d["file_path"] for d in _delete_files(lake, REFUNDS)}
    assert refund_deletes and all(_exists(server, p) for p in refund_deletes)
    assert {d["content"] for d in _delete_files(lake, REFUNDS)} == {1}  # position deletes
    assert len(_delete_files(lake, RETURNS)) == 4 and len(_dangling(lake, RETURNS)) == 2

    rows = {key: lake.rows(key) for key in (SORTED, REFUNDS, RETURNS)}
    events_kept = Counter(r for r in lake.rows(EVENTS).elements() if r[0] >= 100)
    time.sleep(1.2)  # every snapshot but the current one passes the 1 s threshold

    done, _ = lake.cold_run()

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    reports = {r["table"]: r for r in json.loads(done.stdout)["tables"]}
    assert set(reports) == {SORTED, REFUNDS, RETURNS, EVENTS}

    # a. Sort: one file, rows identical, ids in ascending order inside it.
    assert _op(reports[SORTED], "optimize")["status"] == "completed", reports[SORTED]["ops"]
    [compacted] = _files(lake, SORTED)
    assert compacted not in sorted_files
    written = pq.read_table(io.BytesIO(_read(lake, compacted)), columns=["id"])
    assert written["id"].to_pylist() == sorted(ids) != ids
    assert lake.rows(SORTED) == rows[SORTED]
    assert [p for p in sorted_files if _exists(server, p)] == []  # expired with their files

    # d. Statistics: a Puffin file on S3 for the compacted snapshot, named by the metadata.
    assert _op(reports[SORTED], "compute_table_stats")["status"] == "completed"
    table = lake.table(SORTED)
    [stats] = table.metadata.statistics
    current = table.current_snapshot()
    assert current is not None and stats.snapshot_id == current.snapshot_id
    assert stats.statistics_path.startswith(f"{table.location()}/")
    puffin = _read(lake, stats.statistics_path)
    assert len(puffin) == stats.file_size_in_bytes
    assert puffin[:4] == PUFFIN_MAGIC and puffin[-4:] == PUFFIN_MAGIC

    # b. Deletes applied by optimize: no delete file left, none on S3 (expired with their
    # snapshots), the deleted rows still deleted; DuckDB reads the same.
    assert _op(reports[REFUNDS], "optimize")["status"] == "completed", reports[REFUNDS]["ops"]
    assert _delete_files(lake, REFUNDS) == []
    assert [p for p in refund_deletes if _exists(server, p)] == []
    assert lake.rows(REFUNDS) == rows[REFUNDS]
    assert not [r for r in rows[REFUNDS] if r[0] % 10 == 3]
    assert _duckdb_rows(lake, REFUNDS) == _as_read(rows[REFUNDS])
    # ... and dangling position deletes dropped, the live ones rewritten and still deleting.
    rewrite = _op(reports[RETURNS], "rewrite_position_delete_files")
    assert rewrite["status"] == "completed", reports[RETURNS]["ops"]
    assert rewrite["output"]["rewritten_delete_files_count"] == 4
    assert rewrite["output"]["added_delete_files_count"] == 2
    assert len(_delete_files(lake, RETURNS)) == 2 and _dangling(lake, RETURNS) == []
    assert all(_exists(server, d["file_path"]) for d in _delete_files(lake, RETURNS))
    assert lake.rows(RETURNS) == rows[RETURNS]
    assert _duckdb_rows(lake, RETURNS) == _as_read(rows[RETURNS])

    # c. TTL: the seven rows past 30 days gone, the others kept.
    retention = _op(reports[EVENTS], "retention")
    assert retention["status"] == "completed" and retention["output"]["rows_deleted"] == 7
    assert lake.rows(EVENTS) == events_kept
    assert {"retention"} & {op["operation"] for op in reports[SORTED]["ops"]} == set()

    logged = {
        (r["table_name"], r["operation"], r["status"])
        for r in read_log(catalog, TableRef.parse(LOG_TABLE))
    }
    assert {
        (SORTED, "optimize", "completed"),
        (SORTED, "compute_table_stats", "completed"),
        (RETURNS, "rewrite_position_delete_files", "completed"),
        (EVENTS, "retention", "completed"),
    } <= logged


def _cli(lake: S3Lake, *args: str) -> dict[str, Any]:
    """``icegate-maintain`` in its own process; its JSON."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    done = subprocess.run(  # noqa: S603
        [str(CLI), *args, "--config", str(lake.config_path), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=lake.root,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    for secret in lake.server.secrets:
        assert secret not in done.stdout + done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def _sql_lake(server: SeaweedServer, root: Path) -> S3Lake:
    """A SQLite catalog whose warehouse is a bucket of its own on the server."""
    bucket = f"shared-{secrets.token_hex(4)}"
    _s3(server).create_dir(bucket)
    s3 = {k: v for k, v in server.catalog_block("s3_sql").items() if k.startswith("s3.")}
    block = {
        "name": "s3_sql",
        "uri": f"sqlite:///{root / 'catalog.db'}",
        "warehouse": f"s3://{bucket}/warehouse",
        **s3,
    }
    config_path = _write_config(root, block, "lakehouse", None)
    properties = {**block, **{k: os.path.expandvars(v) for k, v in s3.items()}}
    catalog = load_catalog(properties.pop("name"), **properties)
    catalog.create_namespace("lakehouse")
    return S3Lake(server, root, config_path, catalog)


@pytest.mark.usefixtures("keys_in_environment")
def test_tables_sharing_a_folder_in_a_bucket_keep_each_others_files_and_deferred_deletes_wait(
    seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    """As ``tests/integration/test_shared_locations.py`` on disk, in a bucket: ``inner`` lies
    in ``events``' folder and both read one old Parquet file, which ``events`` then
    overwrites away. Expiry of ``events`` consults ``inner`` and keeps that file. Deferred
    deletion: collecting deletes nothing; deleting later removes only the candidates still
    unreferenced and unchanged: one adopted by ``inner`` meanwhile and one written again
    stay. (A SQL catalog: SeaweedFS's REST catalog refuses writes to a table whose folder
    lies inside another table's.)"""
    lake = _sql_lake(seaweedfs, tmp_path)
    catalog, events, inner = lake.catalog, "lakehouse.events", "lakehouse.inner"
    _create_table(catalog, events, appends=3)
    location = lake.table(events).location()
    catalog.create_table(
        TableRef.parse(inner).identifier, SCHEMA, partition_spec=SPEC, location=f"{location}/inner"
    ).append(batch(10_000, ("web",)))
    data = f"{location}/data/service=api"
    shared = f"{data}/shared-{secrets.token_hex(4)}.parquet"
    _plant_old_parquet(lake, shared, batch(20_000, ("api",)))
    lake.table(events).add_files([shared])
    lake.table(inner).add_files([shared])
    own_files = _files(lake, events) - {shared}
    lake.table(events).overwrite(batch(30_000, ("api", "web")))  # events alone no longer reads it
    assert shared not in _files(lake, events) and shared in _files(lake, inner)
    rows = {key: lake.rows(key) for key in (events, inner)}
    time.sleep(1.2)

    # 1. Expiry of events: its own overwritten files go, the one inner reads stays.
    expired = _cli(lake, "expire", "--table", events)
    [report] = expired["tables"]
    op = _op(report, "expire_snapshots")
    assert op["status"] == "completed", op
    assert op["output"]["tables_consulted"] == [inner] and inner in op["details"]
    assert _exists(seaweedfs, shared)
    assert [p for p in own_files if _exists(seaweedfs, p)] == []
    for key in (events, inner):
        assert lake.rows(key) == rows[key], key
        assert all(_exists(seaweedfs, p) for p in _files(lake, key)), key
    assert _duckdb_rows(lake, inner) == _as_read(rows[inner])

    # 2. Deferred deletion from events' folder: old unreferenced objects there and in
    # inner's folder are candidates; the file inner reads and a young object are not.
    doomed = _old_object(lake, data, "failed-write")
    in_inner = _old_object(lake, f"{location}/inner/data", "failed-write")
    rewritten = _old_object(lake, data, "rewritten-later")
    adopted = f"{location}/inner/data/service=api/adopted-later-{secrets.token_hex(4)}.parquet"
    _plant_old_parquet(lake, adopted, batch(70_000, ("api",)))
    young = f"{data}/young-{secrets.token_hex(4)}.parquet"
    with _s3(seaweedfs).open_output_stream(young.removeprefix("s3://")) as out:
        out.write(b"PAR1 young PAR1")

    collected = _cli(lake, "orphans", "--collect", "--table", events)

    [report] = collected["tables"]
    assert report["status"] == "completed", report
    assert {c["path"] for c in report["candidates"]} == {doomed, in_inner, rewritten, adopted}
    candidates = (doomed, in_inner, rewritten, adopted)
    assert all(_exists(seaweedfs, p) for p in candidates)  # collecting deletes nothing
    # Meanwhile: one candidate is adopted by inner, another written again.
    lake.table(inner).add_files([adopted])
    with _s3(seaweedfs).open_output_stream(rewritten.removeprefix("s3://")) as out:
        out.write(b"PAR1 written again PAR1")
    rows = {key: lake.rows(key) for key in (events, inner)}

    deleted = _cli(lake, "orphans", "--delete-collected", "--table", events)

    [report] = deleted["tables"]
    assert report["status"] == "completed", report
    assert {d["path"] for d in report["deleted"]} == {doomed, in_inner}
    kept = {k["path"]: k for k in report["kept"]}
    assert {path: k["reason"] for path, k in kept.items()} == {
        adopted: "referenced",
        rewritten: "younger",
    }
    assert inner in kept[adopted]["detail"]
    assert not _exists(seaweedfs, doomed) and not _exists(seaweedfs, in_inner)
    assert all(_exists(seaweedfs, p) for p in (rewritten, adopted, young, shared))
    for key in (events, inner):
        assert lake.rows(key) == rows[key], key
        assert all(_exists(seaweedfs, p) for p in _files(lake, key)), key
    logged = read_log(catalog, TableRef.parse("lakehouse._maintenance_log"))
    assert {(r["table_name"], r["operation"], r["status"]) for r in logged} >= {
        (events, "expire_snapshots", "completed"),
        (events, "remove_orphan_files", "completed"),
    }


def _no_spark() -> object:
    raise AssertionError("this refusal must not need Spark")


@pytest.mark.parametrize("operation", ["remove_orphan_files", "wal_compaction"])
@pytest.mark.usefixtures("keys_in_environment")
def test_a_wal_root_inside_an_s3_tables_folder_is_refused_naming_both(
    seaweedfs: SeaweedServer, tmp_path: Path, operation: str
) -> None:
    """As ``tests/unit/test_path_guards.py`` on disk: orphan removal would delete the WAL
    files waiting there, and WAL work would list the table's own files. Refused before
    Spark, and an old WAL object there stays."""
    lake = _sql_lake(seaweedfs, tmp_path)
    key = "lakehouse.logs"
    _create_table(lake.catalog, key, appends=2)
    location = lake.table(key).location()
    raw = yaml.safe_load(lake.config_path.read_text())
    raw["wal"] = {"root": f"{location}/wal"}
    lake.config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    waiting = _old_object(lake, f"{location}/wal/lakehouse/logs", "wal")

    maintainer = Maintainer(load_config(lake.config_path), spark=_no_spark)
    result = maintainer.run_op(TableRef.parse(key), operation)

    assert result.status == "failed", result
    assert f"refusing {operation} on {key}" in result.details
    assert location.removeprefix("s3://") in result.details and "wal.root" in result.details
    assert _exists(seaweedfs, waiting)


#: A fresh interpreter (its own JVM, started with the S3 jars) ticks the health sensor
#: once against the instance in ``DAGSTER_HOME`` and runs the batch run it requests, as
#: the daemon would.
_BATCH_RUN = textwrap.dedent(
    """
    import json, sys
    from types import SimpleNamespace
    import dagster as dg
    from icegate_dagster.assets.names import iceberg_tables
    from icegate_dagster.resources import LakehouseResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from tests.dagster.conftest import run_request

    config_path, *keys = sys.argv[1:]
    with dg.DagsterInstance.get() as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, keys)
        resource = LakehouseResource(config_path=config_path)
        tick = table_health_sensor(
            dg.build_sensor_context(instance=instance, resources={"lakehouse": resource})
        )
        [request] = tick.run_requests
        result = run_request(request, SimpleNamespace(config_path=config_path), instance)
        print(json.dumps({
            "job": request.job_name,
            "tables": request.run_config["ops"]["plan_batch"]["config"]["tables"],
            "run_id": result.run_id,
            "success": result.success,
        }))
    """
)


@pytest.mark.usefixtures("keys_in_environment")
def test_a_health_tick_and_its_batch_run_maintain_s3_tables_behind_the_rest_catalog(
    seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    namespace = "batch"
    busy, old, idle = f"{namespace}.busy", f"{namespace}.old", f"{namespace}.idle"
    log_table = f"{namespace}_meta.maintenance_log"
    catalog = load_catalog("s3_batch", **seaweedfs.catalog_properties())
    catalog.create_namespace_if_not_exists(namespace)
    raw = {
        "catalog": seaweedfs.catalog_block("s3_rest"),
        "namespaces": [namespace],
        "spark": {"master": "local[1]"},
        "maintain": {
            "log_table": log_table,
            "locks": {"uri": f"sqlite:///{tmp_path / 'leases.db'}"},
            "optimize": {"min_input_files": 2},
            # OLD's expirable snapshots make expiry due; BUSY's small files optimize.
            "health": {"small_files": 5, "expirable_snapshots": 1},
            "tables": {old: {"expire_snapshots": {"retention_threshold": "1s"}}},
        },
    }
    config_path = tmp_path / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    lake = S3Lake(seaweedfs, tmp_path, config_path, catalog)
    _create_table(catalog, old, appends=3)
    written = time.monotonic()
    table = catalog.create_table(TableRef.parse(busy).identifier, SCHEMA, partition_spec=SPEC)
    for i in range(6):
        table.append(batch(i * 10, ("api", "web")))
    _create_table(catalog, idle, appends=1)
    busy_files = _files(lake, busy)
    assert len(busy_files) == 12
    old_lists = {s.manifest_list for s in lake.table(old).metadata.snapshots}
    old_current = lake.table(old).current_snapshot()
    assert old_current is not None and len(old_lists) == 3
    idle_metadata = lake.table(idle).metadata_location
    rows = {key: lake.rows(key) for key in (busy, old)}
    time.sleep(max(0.0, 1.2 - (time.monotonic() - written)))
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    root = str(Path(__file__).resolve().parents[2])
    env.update(
        DAGSTER_HOME=str(home), PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")])
    )

    done = subprocess.run(  # noqa: S603
        [sys.executable, "-c", _BATCH_RUN, str(config_path), busy, idle, old],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=env,
        check=False,
    )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["job"] == BATCH_JOB and outcome["success"], done.stderr[-3000:]
    planned = {t["table"]: t["operations"] for t in outcome["tables"]}
    assert planned == {busy: ["optimize"], old: ["expire_snapshots"]}
    # On S3: BUSY compacted to a file per partition with its rows; OLD's expired
    # snapshots gone, their manifest lists deleted; IDLE untouched.
    assert len(_files(lake, busy)) == 2 and not _files(lake, busy) & busy_files
    assert lake.rows(busy) == rows[busy]
    kept = {s.manifest_list for s in lake.table(old).metadata.snapshots}
    assert kept == {old_current.manifest_list}
    assert [p for p in old_lists - kept if _exists(seaweedfs, p)] == []
    assert lake.rows(old) == rows[old]
    assert lake.table(idle).metadata_location == idle_metadata
    # Each table's partition recorded by this run; its log rows written to the log table.
    run_id = outcome["run_id"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[busy, old, idle]),
            limit=10,
        ).records
        assert instance.get_run_by_id(run_id).tags[TABLES_TAG] == "2"
    assert {(r.partition_key, r.run_id) for r in records} == {(busy, run_id), (old, run_id)}
    logged = {
        (r["table_name"], r["operation"], r["status"])
        for r in read_log(catalog, TableRef.parse(log_table))
        if r["run_id"] == run_id
    }
    assert logged == {(busy, "optimize", "completed"), (old, "expire_snapshots", "completed")}
    for secret in seaweedfs.secrets:
        assert secret not in done.stdout + done.stderr
