"""The whole lakehouse in object storage, end to end: tables in SeaweedFS behind its Iceberg
REST catalog AND the WAL in an ``s3://`` root of the same server, maintained by one cold
``icegate-maintain run`` and by a real Dagster run of ``maintenance_job``.

Tables are written by pyiceberg: ``orders`` with many small appends, ``logs`` with a few
and WAL objects waiting for it. After a pass: ``orders`` compacted and expired with the same
rows (pyiceberg and DuckDB read them back), no object in a table's data folder that no
retained snapshot reaches (listed with the test's own S3 client) apart from the young
orphan, the orphan older than the 24 h floor gone, every WAL row in ``logs`` exactly once
and no WAL object left, and no key on any command line, in the output or the log table.
The Dagster run executes in a fresh interpreter (its own JVM, started with the S3 jars)
against a temporary instance that the test then reads.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml
from pyiceberg.catalog import load_catalog

from icegate_dagster.assets.names import MAINTAINED_TABLE
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.log.writer import read_log
from tests.integration.test_wal_compaction import as_rows, wal_rows
from tests.lakehouse import SCHEMA, batch
from tests.ps_sampler import PsSampler
from tests.surfaces.seaweedfs_server import SeaweedServer, seaweedfs_fixture  # noqa: F401
from tests.surfaces.test_s3_tables import (
    S3Lake,
    _create_table,
    _duckdb_rows,
    _exists,
    _maintain_block,
    _no_secret_anywhere,
    _objects,
    _op,
    _plant_orphans,
    _s3,
    keys_in_environment,  # noqa: F401
)
from tests.surfaces.test_wal_on_s3 import _rows_of

ORDER_APPENDS = 20
LOG_APPENDS = 3
WAL_FILES = 4
WAL_ROWS_PER_FILE = 20
Row = tuple[Any, ...]


class S3Lakehouse:
    """Tables behind the REST catalog in one namespace, their WAL in a bucket of its own."""

    def __init__(self, lake: S3Lake, namespace: str, wal_bucket: str) -> None:
        self.lake, self.namespace, self.wal_bucket = lake, namespace, wal_bucket
        self.orders, self.logs = f"{namespace}.orders", f"{namespace}.logs"
        self.log_table = f"{namespace}_meta.maintenance_log"  # no "_" names in SeaweedFS

    def wal_folder(self, key: str) -> str:
        ref = TableRef.parse(key)
        return f"{self.wal_bucket}/wal/{ref.namespace}/{ref.name}"

    def fill_wal(self, key: str, files: int, start: int) -> Counter[Row]:
        """``files`` WAL objects as an ingester lands them (one PUT each); their rows."""
        expected: Counter[Row] = Counter()
        client = _s3(self.lake.server)
        for i in range(files):
            rows = wal_rows(start + i * WAL_ROWS_PER_FILE, WAL_ROWS_PER_FILE, ("api", "web")[i % 2])
            pq.write_table(rows, f"{self.wal_folder(key)}/wal-{i:04d}.parquet", filesystem=client)
            expected += as_rows(rows)
        return expected

    def wal_objects(self) -> set[str]:
        """Every object left under the WAL root (any table, quarantine included)."""
        return _objects(self.lake.server, f"s3://{self.wal_bucket}/wal")

    def rows(self, key: str) -> Counter[Row]:
        return _rows_of(self.lake.rows(key))

    def unreachable(self, key: str) -> set[str]:
        """Objects in the table's data folder that no retained snapshot references."""
        table = self.lake.table(key)
        reachable = set(table.inspect.all_files()["file_path"].to_pylist())
        listed = _objects(self.lake.server, f"{table.location()}/data")
        live = set(table.inspect.files()["file_path"].to_pylist())
        assert live and live <= listed, "the listing misses the table's live files"
        return listed - reachable


def _s3_lakehouse(seaweedfs: SeaweedServer, root: Path, namespace: str) -> S3Lakehouse:
    """``orders`` (many small appends) and ``logs`` (a few) written by pyiceberg behind the
    REST catalog; ``icegate.yaml`` naming the catalog block of deploy.md §6 and ``wal.root``
    in a bucket of the same server (reached with the catalog's S3 settings)."""
    root.mkdir(parents=True, exist_ok=True)
    wal_bucket = f"wal-{secrets.token_hex(4)}"
    _s3(seaweedfs).create_dir(wal_bucket)
    catalog = load_catalog(f"s3_{namespace}", **seaweedfs.catalog_properties())
    catalog.create_namespace_if_not_exists(namespace)
    raw = {
        "catalog": seaweedfs.catalog_block("s3_rest"),
        "namespaces": [namespace],
        "wal": {"root": f"s3://{wal_bucket}/wal"},
        "spark": {"master": "local[1]"},
        "maintain": {
            **_maintain_block(f"{namespace}_meta.maintenance_log", root),
            "compaction": {"min_files": 2},
        },
    }
    config_path = root / "icegate.yaml"
    config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert seaweedfs.access_key not in config_path.read_text()
    lakehouse = S3Lakehouse(S3Lake(seaweedfs, root, config_path, catalog), namespace, wal_bucket)
    _create_table(catalog, lakehouse.orders, ORDER_APPENDS)
    logs = catalog.create_table(TableRef.parse(lakehouse.logs).identifier, SCHEMA)
    for i in range(LOG_APPENDS):
        logs.append(batch(100_000 + i * 10, ("api", "web"), rows_per_service=2))
    return lakehouse


def _log_text(lakehouse: S3Lakehouse, run_id: str | None = None) -> list[dict[str, Any]]:
    rows = read_log(lakehouse.lake.catalog, TableRef.parse(lakehouse.log_table))
    return [r for r in rows if run_id is None or r["run_id"] == run_id]


@pytest.mark.usefixtures("keys_in_environment")
def test_one_cold_run_maintains_tables_and_wal_in_s3_behind_the_rest_catalog(
    seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    lakehouse = _s3_lakehouse(seaweedfs, tmp_path / "cli", "e2e_cli")
    lake, orders, logs = lakehouse.lake, lakehouse.orders, lakehouse.logs
    old_files = set(lake.table(orders).inspect.files()["file_path"].to_pylist())
    assert len(old_files) == ORDER_APPENDS
    appended = {s.snapshot_id for s in lake.table(orders).metadata.snapshots}
    order_rows = lake.rows(orders)
    expected_logs = lakehouse.rows(logs) + lakehouse.fill_wal(logs, WAL_FILES, start=1)
    assert len(lakehouse.wal_objects()) == WAL_FILES
    old_orphan, young_orphan = _plant_orphans(lake, orders)
    time.sleep(1.2)  # every appended snapshot passes the 1 s threshold

    done, ps = lake.cold_run()

    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    reports = {r["table"]: r for r in json.loads(done.stdout)["tables"]}
    assert set(reports) == {orders, logs}
    for operation in ("optimize", "expire_snapshots", "remove_orphan_files"):
        assert _op(reports[orders], operation)["status"] == "completed", reports[orders]["ops"]
    assert _op(reports[logs], "wal_compaction")["status"] == "completed", reports[logs]["ops"]
    assert _op(reports[logs], "wal_compaction")["output"]["wal_files_ingested"] == WAL_FILES
    # orders: compacted to one file, no appended snapshot left, the same rows for two readers.
    table = lake.table(orders)
    now_files = set(table.inspect.files()["file_path"].to_pylist())
    assert len(now_files) == 1 and not now_files & old_files
    assert not appended & {s.snapshot_id for s in table.metadata.snapshots}
    assert [uri for uri in old_files if _exists(seaweedfs, uri)] == []
    assert lake.rows(orders) == order_rows
    assert _duckdb_rows(lake, orders) == Counter((r[0], r[1], r[3]) for r in order_rows.elements())
    # No object a snapshot cannot reach, but the young orphan; the old one is gone.
    assert _op(reports[orders], "remove_orphan_files")["output"]["orphans_removed"] == 1
    assert not _exists(seaweedfs, old_orphan) and _exists(seaweedfs, young_orphan)
    assert lakehouse.unreachable(orders) == {young_orphan}
    assert lakehouse.unreachable(logs) == set()
    # logs: every WAL row once (pyiceberg and DuckDB), and the WAL root is empty.
    assert lakehouse.rows(logs) == expected_logs
    assert _duckdb_rows(lake, logs) == Counter((r[0], r[1], r[3]) for r in expected_logs.elements())
    assert lakehouse.wal_objects() == set()
    log_rows = _log_text(lakehouse)
    logged = {(r["table_name"], r["operation"], r["status"]) for r in log_rows}
    assert {(orders, "optimize", "completed"), (logs, "wal_compaction", "completed")} <= logged
    _no_secret_anywhere(lake, done, ps, log_rows)


#: A fresh interpreter runs ``maintenance_job`` over the given tables in-process against the
#: instance in ``DAGSTER_HOME``: its Spark session (one per process, jars fixed when its JVM
#: starts) is this run's own, started with the S3 jars.
_DAGSTER_RUN = textwrap.dedent(
    """
    import json, sys
    from types import SimpleNamespace
    import dagster as dg
    from tests.dagster.conftest import run_maintenance

    config_path, *keys = sys.argv[1:]
    with dg.DagsterInstance.get() as instance:
        result = run_maintenance(SimpleNamespace(config_path=config_path), instance, keys)
        print(json.dumps({"run_id": result.run_id, "success": result.success}))
    """
)


@pytest.mark.usefixtures("keys_in_environment")
def test_a_dagster_run_maintains_tables_and_wal_in_s3_behind_the_rest_catalog(
    seaweedfs: SeaweedServer, tmp_path: Path
) -> None:
    lakehouse = _s3_lakehouse(seaweedfs, tmp_path / "dagster", "e2e_dagster")
    lake, orders, logs = lakehouse.lake, lakehouse.orders, lakehouse.logs
    old_files = set(lake.table(orders).inspect.files()["file_path"].to_pylist())
    order_rows = lake.rows(orders)
    expected_logs = lakehouse.rows(logs) + lakehouse.fill_wal(logs, WAL_FILES, start=1)
    old_orphan, young_orphan = _plant_orphans(lake, orders)
    time.sleep(1.2)
    home = tmp_path / "dagster_home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.pop("PYSPARK_SUBMIT_ARGS", None)
    root = str(Path(__file__).resolve().parents[2])
    env.update(
        DAGSTER_HOME=str(home), PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")])
    )

    with PsSampler() as ps:
        done = subprocess.run(  # noqa: S603
            [sys.executable, "-c", _DAGSTER_RUN, str(lake.config_path), logs, orders],
            capture_output=True,
            text=True,
            timeout=600,
            cwd=lake.root,
            env=env,
            check=False,
        )

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["success"], done.stderr[-3000:]
    run_id = outcome["run_id"]
    with dg.DagsterInstance.from_config(str(home)) as instance:
        records = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[orders, logs]),
            limit=10,
        ).records
        events = instance.all_logs(run_id)
        checks: list[Any] = [
            event.get_dagster_event().event_specific_data
            for event in events
            if event.dagster_event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION
        ]
        # Every event of the run (metadata, logs, check results) as the UI would show it.
        event_text = "\n".join(repr(event) for event in events)
    # One materialization per table, by this run, with the outcome of its pass.
    by_table = {r.partition_key: r for r in records}
    assert set(by_table) == {orders, logs} and {r.run_id for r in records} == {run_id}
    order_meta = {k: v.value for k, v in by_table[orders].asset_materialization.metadata.items()}
    log_meta = {k: v.value for k, v in by_table[logs].asset_materialization.metadata.items()}
    assert order_meta["rows_before"] == order_meta["rows_after"] == sum(order_rows.values())
    assert (order_meta["files_before"], order_meta["files_after"]) == (ORDER_APPENDS, 1)
    assert order_meta["orphans_removed"] == 1
    assert log_meta["wal_files_ingested"] == WAL_FILES and log_meta["wal_files_count"] == 0
    # Every check of both tables ran and passed.
    verdicts = {(c.partition, c.check_name): c.passed for c in checks}
    assert {partition for partition, _ in verdicts} == {orders, logs}
    assert all(verdicts.values()), verdicts
    assert verdicts[(orders, "rows_preserved")] and verdicts[(logs, "ops_succeeded")]
    # The same outcomes in S3 as after a CLI pass.
    assert len(lake.table(orders).inspect.files()) == 1
    assert [uri for uri in old_files if _exists(seaweedfs, uri)] == []
    assert lake.rows(orders) == order_rows
    assert not _exists(seaweedfs, old_orphan)
    assert lakehouse.unreachable(orders) == {young_orphan}
    assert lakehouse.unreachable(logs) == set()
    assert lakehouse.rows(logs) == expected_logs
    assert lakehouse.wal_objects() == set()
    # No key on a command line, in the run's output or in its log rows.
    log_rows = _log_text(lakehouse, run_id)
    assert {(r["table_name"], r["operation"]) for r in log_rows} >= {
        (orders, "optimize"),
        (logs, "wal_compaction"),
    }
    _no_secret_anywhere(lake, done, ps, log_rows)
    assert "wal_files_ingested" in event_text
    for secret in seaweedfs.secrets:
        assert secret not in event_text, "a key is in the run's events"
