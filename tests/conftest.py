"""Shared test configuration: tier markers by directory, and the cluster fixtures."""

from __future__ import annotations

import pytest

pytest_plugins = ["localcluster.testing"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        path = str(item.path)
        for tier in ("unit", "integration", "e2e", "chaos", "security", "node"):
            if f"/tests/{tier}/" in path:
                item.add_marker(getattr(pytest.mark, tier))
