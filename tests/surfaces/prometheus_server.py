"""A throw-away Prometheus server on loopback, and the exporter it scrapes.

Debian's ``prometheus`` package provides ``prometheus`` and ``promtool``. The server gets a
configuration of its own in a temporary folder: the job ``icegate-maintain`` (and any more
asked for), scraped every second, the project's alert rules evaluated every second, its
data in that folder. Queries go through its HTTP API (``/api/v1/query``), as Grafana's
would.
"""

from __future__ import annotations

import contextlib
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.servers import ServerProcess, free_port, http_answers
from tests.webserver import REPO

PROMETHEUS = Path("/usr/bin/prometheus")
PROMTOOL = Path("/usr/bin/promtool")
RULES = REPO / "deploy" / "prometheus" / "icegate-rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "icegate-rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "icegate-maintenance.json"
JOB = "icegate-maintain"


def need_prometheus() -> None:
    """Fail with the set-up to run when Debian's prometheus is missing."""
    assert PROMETHEUS.exists() and PROMTOOL.exists(), (
        "Debian's prometheus (prometheus, promtool) is missing: run scripts/setup.sh --test"
    )


class Prometheus:
    """A running Prometheus: its address and its query API."""

    def __init__(self, url: str, process: ServerProcess) -> None:
        self.url = url
        self.process = process

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        """``GET /api/v1/<path>``'s ``data`` (raises on an error status)."""
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as answer:
            document = json.load(answer)
        assert document["status"] == "success", document
        return document["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series: each ``{"metric": {...}, "value": [t, "v"]}``."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", data
        return list(data["result"])

    def values(self, expr: str) -> dict[str, float]:
        """An instant query's values by ``table`` label (``""`` for none)."""
        return {s["metric"].get("table", ""): float(s["value"][1]) for s in self.query(expr)}

    def value(self, expr: str) -> float | None:
        """The single value of an instant query (None: no series)."""
        found = self.query(expr)
        assert len(found) <= 1, f"{expr}: {len(found)} series"
        return float(found[0]["value"][1]) if found else None


@contextlib.contextmanager
def running_prometheus(
    root: Path, targets: Sequence[str], more_jobs: Mapping[str, Sequence[str]] | None = None
) -> Iterator[Prometheus]:
    """Prometheus scraping ``targets`` (``host:port``) as job ``icegate-maintain`` (and
    ``more_jobs``' targets under their job names) every second, with the project's alert
    rules; stopped afterwards."""
    need_prometheus()
    root.mkdir(parents=True, exist_ok=True)
    jobs = {JOB: targets, **(more_jobs or {})}
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": job, "static_configs": [{"targets": list(found)}]}
            for job, found in jobs.items()
        ],
    }
    config_path = root / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [
        str(PROMETHEUS),
        f"--config.file={config_path}",
        f"--storage.tsdb.path={root / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        # A lookback shorter than the default 5 minutes: a series that stopped shows so
        # within seconds (the tests scrape every second).
        "--query.lookback-delta=30s",
    ]
    with ServerProcess("prometheus", args, root / "prometheus.log") as process:
        process.wait_ready(lambda: http_answers(f"{url}/-/ready"), 30, what="prometheus ready")
        yield Prometheus(url, process)


def exporter_command(config: Path, port: int, *more: str) -> list[str]:
    """``icegate-maintain serve`` on loopback, refreshing every second."""
    script = Path(sys.executable).parent / "icegate-maintain"
    return [str(script), "serve", "--config", str(config), "--port", str(port), *more]


def get(url: str) -> tuple[int, bytes, dict[str, str]]:
    """``GET url``: status, body and headers (an error status is an answer too)."""
    request = urllib.request.Request(url)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read(), dict(answer.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def dashboard_targets(panels: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """(title of the row it is in, target) of every panel target: a row is a panel of
    type ``row`` and holds the panels after it, up to the next row."""
    row = ""
    for panel in panels:
        if panel["type"] == "row":
            row = panel["title"]
        for target in panel.get("targets", []):
            yield row, target


def dashboard_queries(*, detail: bool | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel target of the shipped dashboard; ``detail``
    True: only those of the row that needs ``serve --operation-detail``, False: the others."""
    document = json.loads(DASHBOARD.read_text())
    titles = {id(t): p["title"] for p in document["panels"] for t in p.get("targets", [])}
    return [
        (titles[id(target)], target["expr"])
        for row, target in dashboard_targets(document["panels"])
        if detail is None or detail == ("--operation-detail" in row)
    ]


def template_queries() -> list[tuple[str, str]]:
    """(variable, query) of the dashboard's query variables."""
    document = json.loads(DASHBOARD.read_text())
    return [
        (variable["name"], variable["definition"])
        for variable in document["templating"]["list"]
        if variable["type"] == "query"
    ]
