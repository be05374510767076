"""The discovery sensor keeps partitions equal to the catalog's tables."""

import dagster as dg

from icegate_dagster.resources import LakehouseResource
from tests.dagster.conftest import discovery_tick
from tests.lakehouse import LakehouseFactory


def test_sensor_adds_new_tables_removes_dropped_and_skips_underscore(
    lakehouse_factory: LakehouseFactory,
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    lh.add_table("lakehouse.spans", appends=1)
    lh.add_table("lakehouse._maintenance_log", appends=1)
    resource = LakehouseResource(config_path=str(lh.config_path))

    with dg.instance_for_test() as instance:
        first = discovery_tick(instance, resource)
        assert isinstance(first, dg.SensorResult)
        assert first.cursor is None  # the state is the instance's partitions, not a cursor
        assert sorted(instance.get_dynamic_partitions("iceberg_tables")) == [
            "lakehouse.logs",
            "lakehouse.spans",
        ]

        second = discovery_tick(instance, resource)
        assert isinstance(second, dg.SkipReason)
        assert "no change" in str(second.skip_message)
        assert "2 tables" in str(second.skip_message)

        lh.catalog.drop_table(("lakehouse", "spans"))
        lh.add_table("lakehouse.metrics", appends=1)
        third = discovery_tick(instance, resource)
        assert isinstance(third, dg.SensorResult)
        assert sorted(instance.get_dynamic_partitions("iceberg_tables")) == [
            "lakehouse.logs",
            "lakehouse.metrics",
        ]
