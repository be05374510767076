"""Dagster tests: a temporary instance and a lakehouse whose tables are partitions."""

from collections.abc import Iterator

import dagster as dg
import pytest

from icegate_dagster.definitions import defs
from icegate_dagster.partitions import iceberg_tables
from icegate_dagster.resources import LakehouseResource, SparkResource
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
