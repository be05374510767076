"""Starts dagster-webserver on loopback over this code location, for the UI-facing tests."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from tests.servers import ServerProcess, free_port

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
    """A persistent Dagster instance folder with this repo's ``dagster.yaml``, its
    first-visit newsletter dialog marked seen (Dagster's own ``.nux/nux.yaml``): on a slow
    host the dialog appeared after ``_open`` stopped waiting for it, and covered every
    later click."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    (folder / ".nux").mkdir(exist_ok=True)
    (folder / ".nux" / "nux.yaml").write_text("seen: 1\n")
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


def _loaded(port: int) -> dict[str, Any] | None:
    """The ready answer once the code location has loaded, else None."""
    data = graphql(port, READY_QUERY)
    return data if data.get("assetNodes") else None


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
    with ServerProcess("dagster-webserver", command, log_path, cwd=REPO, env=env) as server:
        data = server.wait_ready(partial(_loaded, port), timeout_s, interval=1)
        yield port, data
