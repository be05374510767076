"""dagster-webserver, started on loopback over this code location, answers GraphQL."""

from pathlib import Path

import dagster as dg

from icegate_dagster.assets.names import iceberg_tables
from tests.lakehouse import LakehouseFactory
from tests.webserver import make_dagster_home, running_webserver


def test_webserver_lists_maintained_table_with_its_partitions(
    lakehouse_factory: LakehouseFactory, tmp_path: Path
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    lh.add_table("lakehouse.spans", appends=1)
    home = make_dagster_home(tmp_path / "dagster_home")
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, ["lakehouse.logs", "lakehouse.spans"])

    with running_webserver(home, lh.config_path, tmp_path / "webserver.log") as (_, data):
        nodes = {tuple(n["assetKey"]["path"]): n for n in data["assetNodes"]}
    assert nodes[("maintained_table",)]["partitionKeys"] == ["lakehouse.logs", "lakehouse.spans"]
    assert {"path": ["maintained_table"]} in nodes[("maintenance_log",)]["dependencyKeys"]
