"""Suite-wide fixtures: one Spark session for the whole test session."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from icegate_dagster.spark.session import stop_spark
from tests.lakehouse import Lakehouse, make_lakehouse


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Slow files first (marker ``slow``): spread over processes, the longest files start
    at once instead of ending the suite alone."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.fixture(scope="session", autouse=True)
def _one_spark_session() -> Iterator[None]:
    """Spark starts lazily on first use and is stopped once, at the end of the suite."""
    yield
    stop_spark()


@pytest.fixture(autouse=True)
def _no_dagster_home_of_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CLI pass records in ``$DAGSTER_HOME`` when set: the tests' passes never reach the
    instance of whoever runs them (a test that wants one sets its own)."""
    monkeypatch.delenv("DAGSTER_HOME", raising=False)


@pytest.fixture
def lakehouse_factory(tmp_path: Path) -> Callable[..., Lakehouse]:
    """Make temporary lakehouses: ``lakehouse_factory(maintain={...})``."""
    count = 0

    def make(maintain: dict[str, Any] | None = None, wal: bool = False) -> Lakehouse:
        nonlocal count
        count += 1
        return make_lakehouse(tmp_path / f"lakehouse{count}", maintain, wal=wal)

    return make
