"""dagster-webserver, started on loopback over this code location, answers GraphQL."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg

from icegate_dagster.partitions import iceberg_tables
from tests.lakehouse import LakehouseFactory

REPO = Path(__file__).resolve().parents[2]
QUERY = """
{ assetNodes(assetKeys: [{path: ["maintained_table"]}, {path: ["maintenance_log"]}]) {
    assetKey { path }
    partitionKeys
    dependencyKeys { path }
} }
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _graphql(port: int, query: str, deadline: float) -> dict[str, object]:
    body = json.dumps({"query": query}).encode()
    while True:
        try:
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=10) as response:
                payload: dict[str, object] = json.loads(response.read())
                data = payload.get("data")
                if isinstance(data, dict) and data.get("assetNodes"):
                    return data
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError("dagster-webserver did not answer in time")
        time.sleep(1)


def test_webserver_lists_maintained_table_with_its_partitions(
    lakehouse_factory: LakehouseFactory, tmp_path: Path
) -> None:
    lh = lakehouse_factory()
    lh.add_table("lakehouse.logs", appends=1)
    lh.add_table("lakehouse.spans", appends=1)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    env = {**os.environ, "DAGSTER_HOME": str(home), "ICEGATE_CONFIG": str(lh.config_path)}
    with dg.DagsterInstance.from_config(str(home)) as instance:
        instance.add_dynamic_partitions(iceberg_tables.name, ["lakehouse.logs", "lakehouse.spans"])

    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster_webserver",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-w",
            str(REPO / "workspace.yaml"),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        data = _graphql(port, QUERY, time.monotonic() + 120)
    finally:
        server.terminate()
        server.wait(timeout=30)
    nodes = {tuple(n["assetKey"]["path"]): n for n in data["assetNodes"]}  # type: ignore[union-attr,index]
    assert nodes[("maintained_table",)]["partitionKeys"] == ["lakehouse.logs", "lakehouse.spans"]
    assert {"path": ["maintained_table"]} in nodes[("maintenance_log",)]["dependencyKeys"]
