"""`icegate-maintain run` against a real Spark standalone cluster on loopback.

The suite's own Spark session is local (one session per process), so the pass
runs as a user would run it: the CLI in its own process, with ``spark.master``
pointing at the cluster. Its executors run in the worker, which proves the
Iceberg runtime jar reaches them and that the work ran there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lakehouse import Lakehouse, make_lakehouse
from tests.surfaces.spark_cluster import SparkCluster, spark_standalone_cluster

TABLES = ("lakehouse.logs", "lakehouse.orders")
CLI = Path(sys.executable).parent / "icegate-maintain"


@dataclass
class ClusterPass:
    """The lakehouse, the cluster and what `icegate-maintain run` did."""

    cluster: SparkCluster
    lakehouse: Lakehouse
    rows_before: dict[str, Counter[tuple[Any, ...]]]
    files_before: dict[str, int]
    completed: subprocess.CompletedProcess[str]
    report: dict[str, Any]
    snapshots_before: dict[str, set[int]]


def cluster_spark_block(cluster: SparkCluster) -> dict[str, Any]:
    """The ``spark:`` block of icegate.yaml for this cluster."""
    return {
        "master": cluster.master_url,
        "conf": {
            # The address executors call the driver back on; loopback keeps all of it local.
            "spark.driver.host": "127.0.0.1",
            # Must fit the worker's memory (1g here, which Spark's 1g default just fills).
            "spark.executor.memory": "512m",
            # Without a cap an application takes every core of the cluster.
            "spark.cores.max": "1",
            # Spark's default 200 makes expiry and orphan removal run ~800 tiny tasks.
            "spark.sql.shuffle.partitions": "4",
        },
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    """A master and one worker on 127.0.0.1 for this module; stopped afterwards."""
    with spark_standalone_cluster(tmp_path_factory.mktemp("spark_cluster")) as running:
        yield running


@pytest.fixture(scope="module")
def cluster_pass(cluster: SparkCluster, tmp_path_factory: pytest.TempPathFactory) -> ClusterPass:
    """Two small-file tables, an old orphan and a young file; `run` on the cluster."""
    lh = make_lakehouse(
        tmp_path_factory.mktemp("cluster_lakehouse"),
        maintain={"expire_snapshots": {"retention_threshold": "1s", "retain_last": 1}},
    )
    lh.add_table("lakehouse.logs", appends=6, services=("api", "web"))
    lh.add_table("lakehouse.orders", appends=5, services=("shop",))
    lh.planted["old"] = lh.plant_file("lakehouse.logs", "old-orphan.parquet", timedelta(days=30))
    lh.planted["young"] = lh.plant_file("lakehouse.logs", "young.parquet", timedelta(hours=1))
    raw = yaml.safe_load(lh.config_path.read_text())
    raw["spark"] = cluster_spark_block(cluster)
    lh.config_path.write_text(yaml.safe_dump(raw))
    rows_before = {key: lh.rows_without_spark(key) for key in TABLES}
    files_before = {key: len(lh.table(key).inspect.files()) for key in TABLES}
    snapshots_before = {
        key: {s.snapshot_id for s in lh.table(key).metadata.snapshots} for key in TABLES
    }
    time.sleep(1.2)  # every snapshot so far is now older than the 1s threshold
    # The executors need no Python at all (log rows go in as SQL): a worker host without
    # this venv's interpreter must do. PYSPARK_PYTHON names what executors would start.
    env = {**os.environ, "PYSPARK_PYTHON": "/nonexistent/python3"}
    completed = subprocess.run(
        [str(CLI), "run", "--config", str(lh.config_path), "--json"],
        capture_output=True,
        text=True,
        env=env,
        cwd=lh.root,
        timeout=300,
        check=False,
    )
    assert completed.returncode == 0, (
        f"exit {completed.returncode}\n{completed.stdout}\n{completed.stderr[-4000:]}"
    )
    report: dict[str, Any] = json.loads(completed.stdout)
    return ClusterPass(cluster, lh, rows_before, files_before, completed, report, snapshots_before)


def test_every_op_completed(cluster_pass: ClusterPass) -> None:
    tables = {t["table"]: t for t in cluster_pass.report["tables"]}
    assert sorted(tables) == list(TABLES)
    logs_ops = [(op["operation"], op["status"]) for op in tables["lakehouse.logs"]["ops"]]
    assert logs_ops == [
        ("optimize", "completed"),
        ("rewrite_position_delete_files", "skipped"),  # no delete files
        ("rewrite_manifests", "completed"),
        ("expire_snapshots", "completed"),
        ("remove_orphan_files", "completed"),
    ], tables["lakehouse.logs"]
    assert all(op["status"] != "failed" for t in tables.values() for op in t["ops"])


def test_data_files_drop_and_rows_are_identical(cluster_pass: ClusterPass) -> None:
    lh = cluster_pass.lakehouse
    assert cluster_pass.files_before == {"lakehouse.logs": 12, "lakehouse.orders": 5}
    assert len(lh.table("lakehouse.logs").inspect.files()) == 2  # one per partition
    assert len(lh.table("lakehouse.orders").inspect.files()) == 1
    for key, before in cluster_pass.rows_before.items():
        assert sum(before.values()) > 0
        assert lh.rows_without_spark(key) == before  # same rows, as multisets
        for path in lh.data_file_paths(key):
            assert path.exists(), path


def test_snapshots_expired_old_orphan_removed_young_file_kept(cluster_pass: ClusterPass) -> None:
    lh = cluster_pass.lakehouse
    for key in TABLES:
        # Every snapshot from before the pass (older than the 1s threshold) is gone; a
        # snapshot the pass made less than a second before its expiry may stay.
        snapshots = lh.table(key).metadata.snapshots
        assert not {s.snapshot_id for s in snapshots} & cluster_pass.snapshots_before[key]
        assert 1 <= len(snapshots) <= 2
    assert not lh.planted["old"].exists()
    assert lh.planted["young"].exists()


def test_log_rows_written(cluster_pass: ClusterPass) -> None:
    run_id = cluster_pass.report["run_id"]
    rows = [r for r in cluster_pass.lakehouse.log_rows() if r["run_id"] == run_id]
    assert len(rows) == 10  # 5 ops x 2 tables
    by_key = {(r["table_name"], r["operation"]): r for r in rows}
    optimize = by_key[("lakehouse.logs", "optimize")]
    assert (optimize["status"], optimize["files_before"], optimize["files_after"]) == (
        "completed",
        12,
        2,
    )


def test_the_work_ran_on_the_cluster(cluster_pass: ClusterPass) -> None:
    cluster = cluster_pass.cluster
    # The driver has stopped; the master marks the application finished right after.
    state = cluster.wait_for(
        "the finished icegate-maintain application",
        lambda s: any(a.get("name") == "icegate-maintain" for a in s.get("completedapps", [])),
        timeout=30,
    )
    [app] = [a for a in state["completedapps"] if a["name"] == "icegate-maintain"]
    assert app["cores"] >= 1
    assert app["state"] == "FINISHED"
    # The worker ran an executor for it: <work dir>/<app id>/<executor id>/stderr.
    executors = [p for p in (cluster.work_dir / app["id"]).iterdir() if p.is_dir()]
    assert executors, f"no executor folder under {cluster.work_dir / app['id']}"
    stderr = "\n".join((p / "stderr").read_text(errors="replace") for p in executors)
    assert "Got assigned task" in stderr  # it ran tasks...
    assert "DataWritingSparkTask: Committed partition" in stderr  # ...and wrote data files
    # The Iceberg runtime, found by the driver in the installed package, reached the executor.
    assert any(next(p.glob("iceberg-spark-runtime-*.jar"), None) for p in executors)
