"""The discovery sensor keeps partitions equal to the catalog's tables."""

import time

import dagster as dg
import yaml

from icegate_dagster.definitions import defs
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


def _backfill_of_every_table(instance: dg.DagsterInstance, backfill_id: str) -> None:
    """A backfill of ``maintained_table`` over all its partitions, stored as the UI's Launch
    backfill stores it (requested; no daemon here picks it up)."""
    from dagster._core.execution.backfill import BulkActionStatus, PartitionBackfill

    from icegate_dagster.assets.names import MAINTAINED_TABLE

    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=backfill_id,
        asset_graph=defs.resolve_asset_graph(),
        partition_names=None,
        asset_selection=[MAINTAINED_TABLE],
        backfill_timestamp=time.time(),
        tags={},
        dynamic_partitions_store=instance,
        all_partitions=True,
        title=None,
        description=None,
        run_config=None,
    )
    assert backfill.status == BulkActionStatus.REQUESTED
    instance.add_backfill(backfill)


def _cancel(instance: dg.DagsterInstance, backfill_id: str) -> None:
    """What the UI's Cancel backfill does: the status becomes CANCELING, and stays so until
    a daemon's backfill loop has canceled its runs."""
    from dagster._core.execution.backfill import BulkActionStatus

    backfill = instance.get_backfill(backfill_id)
    assert backfill is not None
    instance.update_backfill(backfill.with_status(BulkActionStatus.CANCELING))


def test_a_canceled_backfill_no_longer_pins_the_partitions_of_dropped_tables(
    lakehouse_factory: LakehouseFactory,
) -> None:
    """A requested backfill of ``maintained_table`` may still launch runs: a dropped table
    stays a partition meanwhile. Once canceled (CANCELING, which lasts until a daemon
    finishes the cancellation: none runs here) it launches nothing more: the dropped
    table's partition goes once no unfinished run of it names the table."""
    lh = lakehouse_factory()
    for key in ("lakehouse.logs", "lakehouse.spans", "lakehouse.metrics"):
        lh.add_table(key, appends=1)
    resource = LakehouseResource(config_path=str(lh.config_path))
    with dg.instance_for_test() as instance:
        discovery_tick(instance, resource)
        _backfill_of_every_table(instance, "everything")
        lh.catalog.drop_table(("lakehouse", "spans"))

        pinned = discovery_tick(instance, resource)
        assert isinstance(pinned, dg.SkipReason)
        assert "lakehouse.spans (backfill everything is requested)" in str(pinned.skip_message)
        assert "lakehouse.spans" in instance.get_dynamic_partitions("iceberg_tables")

        # A run the backfill launched, over a range that ends at the dropped table, still
        # waiting when the backfill is canceled: it pins the partition by itself.
        run = instance.create_run_for_job(
            defs.resolve_job_def("maintenance_job"),
            tags={
                "dagster/backfill": "everything",
                "dagster/asset_partition_range_start": "lakehouse.metrics",
                "dagster/asset_partition_range_end": "lakehouse.spans",
            },
            status=dg.DagsterRunStatus.NOT_STARTED,
        )
        _cancel(instance, "everything")
        held = discovery_tick(instance, resource)
        assert isinstance(held, dg.SkipReason)
        assert f"lakehouse.spans (run {run.run_id} is not_started)" in str(held.skip_message)

        instance.report_run_canceled(run)
        freed = discovery_tick(instance, resource)

        assert isinstance(freed, dg.SensorResult), freed
        assert sorted(instance.get_dynamic_partitions("iceberg_tables")) == [
            "lakehouse.logs",
            "lakehouse.metrics",
        ]
        still = instance.get_backfill("everything")
        assert still is not None and still.status.value == "CANCELING"
