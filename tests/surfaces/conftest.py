"""Everything under tests/surfaces starts real servers on loopback; CI runs them all."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/surfaces/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.surfaces)
            item.add_marker(pytest.mark.integration)
