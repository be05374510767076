"""Dagster tests: a temporary instance and a lakehouse whose tables are partitions."""

from collections.abc import Iterator

import dagster as dg
import pytest

from icegate_dagster.definitions import defs
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource, SparkResource
from icegate_dagster.sensors import iceberg_table_discovery
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
