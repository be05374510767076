"""Sensors: table discovery (no JVM: pyiceberg metadata only)."""

import hashlib

import dagster as dg

from icegate_dagster.partitions import ICEBERG_TABLES, iceberg_tables
from icegate_dagster.resources import LakehouseResource


def partition_changes(discovered: list[str], current: list[str]) -> tuple[list[str], list[str]]:
    """Tables to add as partitions, and partitions whose table is gone."""
    found, known = set(discovered), set(current)
    return sorted(found - known), sorted(known - found)


@dg.sensor(
    name="iceberg_table_discovery",
    minimum_interval_seconds=60,
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Adds a partition of maintained_table for each new table; removes dropped ones.",
)
def iceberg_table_discovery(
    context: dg.SensorEvaluationContext, lakehouse: LakehouseResource
) -> dg.SensorResult | dg.SkipReason:
    """Keep the partitions equal to the catalog's tables (``_``-prefixed ones excluded)."""
    maintainer = lakehouse.maintainer(run_id="discovery")
    discovered = [ref.key for ref in maintainer.discover()]
    current = list(context.instance.get_dynamic_partitions(ICEBERG_TABLES))
    added, removed = partition_changes(discovered, current)
    cursor = hashlib.sha256("\n".join(sorted(discovered)).encode()).hexdigest()[:16]
    if not added and not removed:
        return dg.SkipReason(
            f"no change: the {len(discovered)} tables of catalog "
            f"{maintainer.config.catalog.name!r} are all partitions already"
        )
    requests: list[dg.AddDynamicPartitionsRequest | dg.DeleteDynamicPartitionsRequest] = []
    if added:
        context.log.info(f"new tables: {', '.join(added)}")
        requests.append(iceberg_tables.build_add_request(added))
    if removed:
        context.log.info(f"tables gone from the catalog: {', '.join(removed)}")
        requests.append(iceberg_tables.build_delete_request(removed))
    return dg.SensorResult(dynamic_partitions_requests=requests, cursor=cursor)
