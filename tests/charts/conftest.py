"""Fixtures of the chart tests: the real helm binary (a `helm` fixture makes a test integration)."""

from __future__ import annotations

import pytest

from tests.charts.chartkit import find_helm


@pytest.fixture(scope="session")
def helm() -> str:
    return find_helm()
