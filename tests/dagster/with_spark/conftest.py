"""Every test here runs a job of the code location, which starts Spark: marker ``spark``."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/dagster/with_spark/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.spark)
