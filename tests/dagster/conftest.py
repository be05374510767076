"""Dagster tests: a temporary instance and a lakehouse whose tables are partitions."""

import time
from collections.abc import Iterator
from typing import Any

import dagster as dg
import pytest

from icegate_dagster.assets.names import iceberg_tables
from icegate_dagster.definitions import defs
from icegate_dagster.resources import LakehouseResource, SparkResource
from icegate_dagster.sensors.discovery_sensor import iceberg_table_discovery
from tests.lakehouse import Lakehouse, LakehouseFactory


@pytest.fixture
def instance() -> Iterator[dg.DagsterInstance]:
    with dg.instance_for_test() as temp_instance:
        yield temp_instance


def resources_for(lakehouse: Lakehouse) -> dict[str, object]:
    """The code location's resources, pointed at a test lakehouse."""
    return {
        "lakehouse": LakehouseResource(config_path=str(lakehouse.config_path)),
        "spark": SparkResource(),
    }


def run_maintenance(
    lakehouse: Lakehouse, instance: dg.DagsterInstance, keys: list[str]
) -> dg.ExecuteInProcessResult:
    """Run ``maintenance_job`` over ``keys`` (one run), as the schedule or a backfill would."""
    instance.add_dynamic_partitions(iceberg_tables.name, keys)
    job = defs.resolve_job_def("maintenance_job")
    tags = (
        {
            "dagster/asset_partition_range_start": keys[0],
            "dagster/asset_partition_range_end": keys[-1],
        }
        if len(keys) > 1
        else None
    )
    return job.execute_in_process(
        instance=instance,
        partition_key=keys[0] if len(keys) == 1 else None,
        tags=tags,
        resources=resources_for(lakehouse),
    )


@pytest.fixture
def small_lakehouse(lakehouse_factory: LakehouseFactory) -> Lakehouse:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=6, services=("api", "web"))
    lh.add_table("lakehouse.orders", appends=5, services=("shop",))
    lh.add_table("lakehouse.spans", appends=5, services=("a",))
    return lh


def launch(
    instance: dg.DagsterInstance,
    request: dg.RunRequest,
    status: dg.DagsterRunStatus = dg.DagsterRunStatus.NOT_STARTED,
) -> dg.DagsterRun:
    """What the daemon does with a sensor's request before the run executes: a run that
    waits (a queued run needs a code location's origin; an unstarted one is as unfinished)."""
    assert request.job_name is not None and request.run_key is not None
    return instance.create_run_for_job(
        defs.resolve_job_def(request.job_name),
        run_config=request.run_config,
        tags={**request.tags, "dagster/run_key": request.run_key},
        status=status,
    )


def run_request(
    request: dg.RunRequest, lakehouse: Lakehouse, instance: dg.DagsterInstance
) -> dg.ExecuteInProcessResult:
    """What the daemon does with a sensor's run request: run its job with its config and
    tags (in this process)."""
    assert request.job_name is not None
    return defs.resolve_job_def(request.job_name).execute_in_process(
        instance=instance,
        run_config=request.run_config,
        tags=request.tags,
        resources=resources_for(lakehouse),
    )


#: Tables of the health trigger's tests: 6 small files in each partition (``optimize`` due
#: with ``health.small_files`` 5); snapshots past a 1 s retention (``expire_snapshots``
#: due, nothing else); one file per partition, nothing expirable (healthy).
BUSY, OLD, IDLE = "lakehouse.busy", "lakehouse.old", "lakehouse.idle"


def health_lakehouse(factory: LakehouseFactory, **maintain: Any) -> Lakehouse:
    """BUSY, OLD and IDLE, with OLD's first snapshots past their retention."""
    lh = factory(
        maintain={
            # OLD's two expirable snapshots make expiry due (default: 10 of them).
            "health": {"small_files": 5, "expirable_snapshots": 1},
            "tables": {OLD: {"expire_snapshots": {"retention_threshold": "1s"}}},
            **maintain,
        }
    )
    lh.add_table(OLD, appends=3)
    written = time.monotonic()
    lh.add_table(BUSY, appends=6)
    lh.add_table(IDLE, appends=1)
    time.sleep(max(0.0, 1.1 - (time.monotonic() - written)))
    return lh


def discovery_tick(
    instance: dg.DagsterInstance, resource: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """One tick of the discovery sensor, its partition requests applied as the daemon does."""
    context = dg.build_sensor_context(instance=instance, resources={"lakehouse": resource})
    result = iceberg_table_discovery(context)
    if isinstance(result, dg.SensorResult):
        for request in result.dynamic_partitions_requests or []:
            if isinstance(request, dg.AddDynamicPartitionsRequest):
                instance.add_dynamic_partitions(iceberg_tables.name, list(request.partition_keys))
            else:
                for key in request.partition_keys:
                    instance.delete_dynamic_partition(iceberg_tables.name, key)
    assert isinstance(result, dg.SensorResult | dg.SkipReason)
    return result


def health_tick(
    instance: dg.DagsterInstance, resource: LakehouseResource, cursor: str | None
) -> tuple[dg.SensorResult, str | None]:
    """One tick of the health sensor as the daemon runs it: its asset events stored in the
    instance, its cursor kept. Returns the result and the cursor for the next tick."""
    from icegate_dagster.sensors.health_sensor import table_health_sensor

    context = dg.build_sensor_context(
        instance=instance, resources={"lakehouse": resource}, cursor=cursor
    )
    result = table_health_sensor(context)
    assert isinstance(result, dg.SensorResult)
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result, result.cursor if result.cursor is not None else cursor
