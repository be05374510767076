"""What the Spark Connect tests run in a process of its own, as a run would: the CLI, or a
sensor's batch run of the code location. Each writes, as JSON to the file
``$ICEGATE_TEST_REPORT`` names, what it did and whether this process ever started a JVM
(PySpark's py4j gateway: it exists once a local Spark has been launched).

    python -m tests.surfaces.connect_client cli <icegate-maintain arguments>
    python -m tests.surfaces.connect_client batch <config path>
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _gateway_started() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None or SparkContext._jvm is not None


def _cli(argv: list[str]) -> tuple[int, dict[str, Any]]:
    from icegate_dagster.cli import main

    code = main(argv)
    return code, {}


def _batch(config_path: str) -> tuple[int, dict[str, Any]]:
    """One tick of the health sensor and the batch run it asks for, as the daemon would."""
    import dagster as dg

    from icegate_dagster.assets.names import MAINTAINED_TABLE, TABLES_TAG, iceberg_tables
    from icegate_dagster.definitions import defs
    from icegate_dagster.resources import LakehouseResource, SparkResource
    from icegate_dagster.sensors.health_sensor import table_health_sensor
    from tests.dagster.conftest import BUSY, IDLE, OLD

    lakehouse = LakehouseResource(config_path=config_path)
    with dg.instance_for_test() as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, [BUSY, IDLE, OLD])
        context = dg.build_sensor_context(instance=instance, resources={"lakehouse": lakehouse})
        tick = table_health_sensor(context)
        assert isinstance(tick, dg.SensorResult)
        [request] = tick.run_requests or []
        assert request.job_name is not None
        result = defs.resolve_job_def(request.job_name).execute_in_process(
            instance=instance,
            run_config=request.run_config,
            tags=request.tags,
            resources={"lakehouse": lakehouse, "spark": SparkResource()},
            raise_on_error=False,
        )
        materialized = {}
        for key in (BUSY, IDLE, OLD):
            records = instance.fetch_materializations(
                dg.AssetRecordsFilter(asset_key=MAINTAINED_TABLE, asset_partitions=[key]),
                limit=1,
            ).records
            materialized[key] = records[0].run_id if records else None
        report = {
            "job": request.job_name,
            "tables_tag": request.tags.get(TABLES_TAG),
            "success": result.success,
            "run_id": result.run_id,
            "materialized_by": materialized,
        }
    return (0 if result.success else 1), report


def main() -> int:
    kind, *rest = sys.argv[1:]
    code, report = _cli(rest) if kind == "cli" else _batch(rest[0])
    report["jvm_gateway"] = _gateway_started()
    with open(os.environ["ICEGATE_TEST_REPORT"], "w", encoding="utf-8") as out:
        json.dump(report, out)
    return code


if __name__ == "__main__":
    sys.exit(main())
