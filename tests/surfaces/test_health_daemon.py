"""Under ``dagster dev``, with nothing but its daemon acting, unhealthy tables get maintained.

No run is launched by the test: the discovery sensor adds the partitions, the health
sensor requests runs of exactly the tables and operations that are due, and the run
workers do them. After 50 small appends to a maintained table it is maintained again
within 4 minutes; the healthy table next to it gets no run and no commit.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.partitions import ICEBERG_TABLES
from tests.lakehouse import Lakehouse, LakehouseFactory, batch
from tests.servers import ServerProcess, free_port, http_answers, wait_until
from tests.webserver import REPO, make_dagster_home

pytestmark = pytest.mark.slow

MAINTAINED_TABLE = dg.AssetKey("maintained_table")
LAKEHOUSE_HEALTH = dg.AssetKey("lakehouse_health")
#: The issue's promise: a table crossing a threshold is maintained within minutes.
MAINTAINED_AGAIN_WITHIN_S = 240


def _materializations(instance: dg.DagsterInstance, key: str) -> list[dg.EventLogRecord]:
    return list(
        instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]), limit=100
        ).records
    )


def _operations(run: dg.DagsterRun) -> list[str] | None:
    config: Any = run.run_config
    try:
        return list(config["ops"]["maintained_table"]["ops"]["plan"]["config"]["operations"])
    except (KeyError, TypeError):
        return None  # the full pass


def _runs_of(instance: dg.DagsterInstance, key: str) -> list[dg.DagsterRun]:
    return list(instance.get_runs(filters=dg.RunsFilter(tags={"dagster/partition": key})))


def _data_files(lh: Lakehouse, key: str) -> int:
    return len(lh.table(key).inspect.files())


def test_daemon_alone_maintains_unhealthy_tables_and_leaves_a_healthy_one(
    lakehouse_factory: LakehouseFactory, tmp_path: Path
) -> None:
    lh = lakehouse_factory()
    # Busy: 14 appends, 14 small files in each of its two partitions: optimize is due.
    lh.add_table("lakehouse.busy", appends=14)
    # Idle: one file per partition, nothing expirable: healthy, nothing due.
    lh.add_table("lakehouse.idle", appends=1)
    idle_metadata = lh.table("lakehouse.idle").metadata_location
    home = make_dagster_home(tmp_path / "dagster_home")
    port = free_port()
    env = {
        "DAGSTER_HOME": str(home),
        "ICEGATE_CONFIG": str(lh.config_path),
        "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin",
    }
    command = [sys.executable, "-m", "dagster", "dev", "-w", str(REPO / "workspace.yaml")]
    command += ["-h", "127.0.0.1", "-p", str(port)]
    with ServerProcess(
        "dagster dev", command, tmp_path / "dagster_dev.log", cwd=REPO, env=env, own_group=True
    ) as server:

        def waited(probe: Any, timeout: float, what: str) -> Any:
            return wait_until(
                probe,
                timeout,
                what,
                interval=2,
                abort=server.exit_reason,
                details=lambda: server.log_tail(60),
            )

        # The instance's storage is created by dagster dev: open it once the UI answers.
        waited(lambda: http_answers(f"http://127.0.0.1:{port}/"), 180, "dagster dev to start")
        with dg.DagsterInstance.from_config(str(home)) as instance:
            _maintained_on_its_own(lh, instance, waited, idle_metadata)


def _maintained_on_its_own(
    lh: Lakehouse, instance: dg.DagsterInstance, waited: Any, idle_metadata: str
) -> None:
    # 1. The daemon finds the tables and maintains the unhealthy one on its own.
    waited(
        lambda: (
            set(instance.get_dynamic_partitions(ICEBERG_TABLES))
            >= {"lakehouse.busy", "lakehouse.idle"}
        ),
        180,
        "the discovery sensor to add both tables as partitions",
    )
    first = waited(
        lambda: _materializations(instance, "lakehouse.busy"),
        300,
        "the health sensor's first run of lakehouse.busy",
    )
    assert _data_files(lh, "lakehouse.busy") == 2  # one file per partition now

    # 2. 50 small appends: the table crosses its threshold again.
    busy = lh.table("lakehouse.busy")
    for i in range(50):
        busy.append(batch(100_000 + i * 1000, ("api",), rows_per_service=2))
    crossed = time.time()
    assert _data_files(lh, "lakehouse.busy") == 52

    again = waited(
        lambda: [r for r in _materializations(instance, "lakehouse.busy") if r.timestamp > crossed],
        MAINTAINED_AGAIN_WITHIN_S,
        "lakehouse.busy to be maintained again after 50 appends",
    )
    took = again[-1].timestamp - crossed
    assert took <= MAINTAINED_AGAIN_WITHIN_S
    assert _data_files(lh, "lakehouse.busy") <= 2
    # The partition is recorded before the run's last step (maintenance_log): let it end.
    waited(
        lambda: all(
            (run := instance.get_run_by_id(r.run_id)) is not None and run.is_finished for r in again
        ),
        120,
        "the second run of lakehouse.busy to finish",
    )

    # Only the due operations ran: a health run names them; orphans and TTL are not due.
    runs = [run for run in _runs_of(instance, "lakehouse.busy") if run.status.value == "SUCCESS"]
    assert len(runs) >= 2
    for run in runs:
        operations = _operations(run)
        assert operations is not None and "optimize" in operations, operations
        assert "remove_orphan_files" not in operations and "retention" not in operations
    assert first[0].timestamp < crossed

    # 3. The healthy idle table got no run and no commit.
    assert _runs_of(instance, "lakehouse.idle") == []
    assert lh.table("lakehouse.idle").metadata_location == idle_metadata

    # 4. lakehouse_health was recorded at the evaluations, both tables in it.
    health = list(
        instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=LAKEHOUSE_HEALTH), limit=1000
        ).records
    )
    assert len(health) >= 2
    latest = health[0].asset_materialization
    assert latest is not None
    assert latest.metadata["tables"].value == 2
    assert latest.metadata["tables_assessed"].value == 2
    least_healthy = str(latest.metadata["least_healthy"].value)
    assert "lakehouse.busy" in least_healthy and "lakehouse.idle" in least_healthy
    # Over time: the evaluation that requested the second run saw busy due.
    assert any(
        record.timestamp > crossed
        and record.asset_materialization is not None
        and record.asset_materialization.metadata["tables_due"].value >= 1
        for record in health
    )
