"""Starts dagster-webserver on loopback over this code location, for the UI-facing tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.net import free_port

REPO = Path(__file__).resolve().parents[1]
#: Answers once the code location has loaded: both assets are known.
READY_QUERY = """
{ assetNodes(assetKeys: [{path: ["maintained_table"]}, {path: ["maintenance_log"]}]) {
    assetKey { path }
    partitionKeys
    dependencyKeys { path }
} }
"""


def make_dagster_home(folder: Path) -> Path:
    """A persistent Dagster instance folder with this repo's ``dagster.yaml``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    return folder


def graphql(port: int, query: str) -> dict[str, Any]:
    """One GraphQL query against the webserver; its ``data``."""
    body = json.dumps({"query": query}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        payload: dict[str, Any] = json.loads(response.read())
    return payload.get("data") or {}


@contextmanager
def running_webserver(
    dagster_home: Path, config_path: Path, log_path: Path, timeout_s: float = 180
) -> Iterator[tuple[int, dict[str, Any]]]:
    """dagster-webserver on a free loopback port; yields the port and the ready answer.

    The server's output goes to ``log_path`` so a failure can be read afterwards.
    """
    port = free_port()
    env = {
        **os.environ,
        "DAGSTER_HOME": str(dagster_home),
        "ICEGATE_CONFIG": str(config_path),
    }
    command = [sys.executable, "-m", "dagster_webserver", "-h", "127.0.0.1", "-p", str(port)]
    command += ["-w", str(REPO / "workspace.yaml")]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    data = graphql(port, READY_QUERY)
                    if data.get("assetNodes"):
                        break
                except OSError:
                    pass
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dagster-webserver did not come up (exit {server.poll()}); "
                        f"see {log_path}:\n{log_path.read_text()[-3000:]}"
                    )
                time.sleep(1)
            yield port, data
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
