"""Everything under tests/surfaces starts real servers on loopback; CI runs them all. Most
of them start a JVM too (a pass, a Dagster run, a Spark cluster), and all are slow: the
whole folder is in the ``spark`` tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.surfaces.spark_connect_server import ConnectServer, spark_connect_server


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/surfaces/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.surfaces)
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark_connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConnectServer]:
    """One Spark Connect server with Iceberg per test session (it takes ~20 s to start)."""
    with spark_connect_server(tmp_path_factory.mktemp("spark_connect")) as server:
        yield server
