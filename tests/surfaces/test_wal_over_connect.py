"""WAL compaction as a thin Spark Connect client: no JVM in the client's process (issue 40).

The test session's Spark Connect server with Iceberg runs on loopback (pyspark's own
Spark, the ``spark-connect`` plugin and Iceberg's runtime from set-up's jars folder); the test's
process only speaks gRPC to it. Spark reads the WAL and writes the batch on the server;
the publish is pyiceberg's one catalog commit. The assertions are the local path's:
every row once, the WAL files deleted only after the commit, the client killed -9 at
any step survived by a rerun. Each client is a fresh interpreter (pyspark refuses a
remote session beside a local one, which other tests of the process may have started);
the test's own process reads the table with pyiceberg only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.errors import OperationError
from icegate_dagster.maintenance import TableRef
from icegate_dagster.maintenance.wal import (
    BATCH_PROPERTY,
    CHECKPOINTS,
    KILL_AT_ENV,
    LEDGER_PROPERTY,
    STAGING_PREFIX,
    compact_wal,
    configured_wal_root,
    quarantined_files,
)
from icegate_dagster.spark.session import get_spark
from tests.integration.test_wal_compaction import TABLE, WAL_RULES, as_rows, fill_wal
from tests.lakehouse import Lakehouse, LakehouseFactory
from tests.surfaces.spark_connect_server import ConnectServer


@pytest.fixture
def connect_url(spark_connect: ConnectServer) -> str:
    """The test session's Spark Connect server (tests/surfaces/conftest.py)."""
    return spark_connect.url


def _client_main(config_path: str, url: str, create_v3: str) -> None:
    """A client process: (the v3 table made first, if asked) one forced WAL compaction;
    prints its outcome, or its error, and whether a JVM was started in this process."""
    from pyspark import SparkContext

    from icegate_dagster.catalog import open_catalog
    from icegate_dagster.config import load_config

    os.environ["SPARK_REMOTE"] = url  # as a user sets it: the run's session is Connect's
    path = Path(config_path)
    config = load_config(path)
    assert config.spark.remote == url
    lh = Lakehouse(path.parent, path, config, open_catalog(config.catalog))
    ref = TableRef.parse(TABLE)
    if create_v3 == "v3":
        get_spark(config).sql(  # pyiceberg 0.12 writes no format-version 3 metadata
            f"CREATE TABLE {ref.spark_identifier(config.catalog.name)} (id BIGINT, "
            "service STRING, timestamp TIMESTAMP, body STRING) USING iceberg "
            "PARTITIONED BY (service) TBLPROPERTIES ('format-version'='3')"
        )
    if create_v3 == "client-fault":
        get_spark(config)
        # PySpark's functions now take the classic path: each fails in this process, before
        # any file reaches Spark (as they did before the session set the flag).
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED")
    report: dict[str, Any] = {}
    try:
        outcome = compact_wal(
            lambda: get_spark(config),
            config.catalog.name,
            ref,
            lh.table(TABLE),
            configured_wal_root(config),
            config.for_table(TABLE).compaction,
            force=True,
        )
        report.update(status=outcome.status, details=outcome.details, output=outcome.output)
    except OperationError as exc:
        report.update(status="error", details=str(exc))
    # py4j's gateway is how pyspark starts a JVM in its own process.
    report["jvm_here"] = SparkContext._gateway is not None
    print(json.dumps(report, default=str))


def _client(
    lh: Lakehouse,
    url: str,
    *,
    kill_at: str | None = None,
    create_v3: bool = False,
    client_fault: bool = False,
) -> dict[str, Any]:
    """Run :func:`_client_main` in a fresh interpreter; its report, or ``{"killed": True}``."""
    script = (
        "import sys; from tests.surfaces.test_wal_over_connect import _client_main; "
        "_client_main(*sys.argv[1:])"
    )
    env = {k: v for k, v in os.environ.items() if k != KILL_AT_ENV}
    env["PYTHONPATH"] = str(Path(__file__).parents[2])
    if kill_at is not None:
        env[KILL_AT_ENV] = kill_at
    mode = "v3" if create_v3 else "client-fault" if client_fault else "-"
    args = [str(lh.config_path), url, mode]
    child = subprocess.run(  # noqa: S603
        [sys.executable, "-c", script, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if kill_at is not None:
        assert child.returncode == -signal.SIGKILL, child.stdout + child.stderr[-3000:]
        return {"killed": True}
    assert child.returncode == 0, child.stdout + child.stderr[-3000:]
    report: dict[str, Any] = json.loads(child.stdout.strip().splitlines()[-1])
    assert report["jvm_here"] is False, report
    return report


def _rows(lh: Lakehouse) -> Counter[tuple[Any, ...]]:
    """The table's rows read by pyiceberg, as :func:`as_rows` spells them."""
    return as_rows(lh.table(TABLE).scan().to_arrow())


@pytest.fixture
def lh(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lakehouse = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lakehouse.add_table(TABLE, appends=2)
    return lakehouse


def test_a_wal_batch_lands_once_through_spark_connect_with_no_jvm_in_the_client(
    connect_url: str, lh: Lakehouse
) -> None:
    expected = _rows(lh) + fill_wal(lh, files=5)

    report = _client(lh, connect_url)

    assert report["status"] == "completed", report
    assert report["output"]["wal_files_ingested"] == 5
    assert _rows(lh) == expected
    assert lh.wal_files(TABLE) == []
    table = lh.table(TABLE)
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    assert snapshot.summary[BATCH_PROPERTY] == report["output"]["batch_id"]
    assert LEDGER_PROPERTY in table.properties
    assert set(table.metadata.refs) == {"main"}  # the staging branch went with the commit
    # The published files keep the statistics Spark wrote (scan planning prunes on them).
    added = [
        e.data_file
        for m in snapshot.manifests(table.io)
        if m.added_snapshot_id == snapshot.snapshot_id
        for e in m.fetch_manifest_entry(table.io)
    ]
    assert added and all(f.lower_bounds and f.upper_bounds and f.value_counts for f in added)


@pytest.mark.parametrize("point", CHECKPOINTS)
def test_the_client_killed_9_at_any_step_then_a_rerun_ingests_exactly_once(
    connect_url: str, lh: Lakehouse, point: str
) -> None:
    expected = _rows(lh) + fill_wal(lh, files=4)
    _client(lh, connect_url, kill_at=point)

    report = _client(lh, connect_url)

    assert report["status"] in ("completed", "skipped"), report
    assert _rows(lh) == expected
    assert lh.wal_files(TABLE) == []
    assert not [r for r in lh.table(TABLE).metadata.refs if r.startswith(STAGING_PREFIX)]


def test_a_format_v3_table_is_refused_over_connect_before_anything_is_written(
    connect_url: str, lakehouse_factory: LakehouseFactory
) -> None:
    """pyiceberg writes no format-version 3 snapshot: over Connect (no Java API in the
    process) the op fails saying so, and every WAL file waits, none quarantined."""
    lh = lakehouse_factory(maintain=WAL_RULES, wal=True)
    lh.catalog.create_namespace_if_not_exists("lakehouse")
    fill_wal(lh, files=4)
    waiting = lh.wal_files(TABLE)

    report = _client(lh, connect_url, create_v3=True)

    assert report["status"] == "error", report
    assert "format-version 3" in report["details"]
    assert "local Spark session" in report["details"]
    assert lh.wal_files(TABLE) == waiting
    assert quarantined_files(configured_wal_root(lh.config), TableRef.parse(TABLE)) == []
    table = lh.table(TABLE)
    assert table.format_version == 3
    assert table.metadata.snapshots == []
    assert not table.metadata.refs


def test_a_fault_of_the_client_quarantines_no_wal_file(connect_url: str, lh: Lakehouse) -> None:
    """An error raised by PySpark in this process (here its functions on the classic path)
    says nothing about a file: the op fails, every WAL file waits for the next run."""
    expected = _rows(lh) + fill_wal(lh, files=3)
    waiting = lh.wal_files(TABLE)

    report = _client(lh, connect_url, client_fault=True)

    assert report["status"] == "error", report
    assert "not the file's fault" in report["details"]
    assert lh.wal_files(TABLE) == waiting
    assert quarantined_files(configured_wal_root(lh.config), TableRef.parse(TABLE)) == []
    assert _client(lh, connect_url)["status"] == "completed"  # the next run ingests them
    assert _rows(lh) == expected
