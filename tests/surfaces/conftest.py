"""Everything under tests/surfaces starts real servers on loopback; CI runs them all. Most
of them start a JVM too (a pass, a Dagster run, a Spark cluster), and all are slow: the
whole folder is in the ``spark`` tier."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/surfaces/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.surfaces)
            item.add_marker(pytest.mark.integration)
            item.add_marker(pytest.mark.spark)
