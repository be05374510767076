"""The discovery sensor keeps partitions equal to the catalog's tables."""

import dagster as dg
import yaml

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


def test_a_listing_that_comes_back_short_removes_nothing_the_catalog_still_has(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """A partition goes only once the catalog, asked for that very table, says it does not
    exist: here the listing misses every table (its namespaces are configured away, as a
    catalog in failover answering "no such namespace" would miss them)."""
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    lh.add_table("lakehouse.spans", appends=1)
    resource = LakehouseResource(config_path=str(lh.config_path))
    with dg.instance_for_test() as instance:
        discovery_tick(instance, resource)
        raw = yaml.safe_load(lh.config_path.read_text())
        lh.config_path.write_text(yaml.safe_dump({**raw, "namespaces": ["elsewhere"]}))

        short = discovery_tick(instance, LakehouseResource(config_path=str(lh.config_path)))

        assert isinstance(short, dg.SkipReason)
        assert "missing from the listing, but the catalog still has it" in str(short.skip_message)
        assert sorted(instance.get_dynamic_partitions("iceberg_tables")) == [
            "lakehouse.logs",
            "lakehouse.spans",
        ]
        # Restored, and one table really dropped: only that one goes.
        lh.config_path.write_text(yaml.safe_dump(raw))
        lh.catalog.drop_table(("lakehouse", "spans"))
        gone = discovery_tick(instance, resource)
        assert isinstance(gone, dg.SensorResult)
        assert instance.get_dynamic_partitions("iceberg_tables") == ["lakehouse.logs"]
