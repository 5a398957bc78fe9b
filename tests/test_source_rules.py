"""Rules about how product code is written that a review can miss, checked with `ast`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("reconciler", "gateway", "runner")


def wait_for_calls(source: str) -> list[int]:
    """Lines that call asyncio.wait_for (as `asyncio.wait_for` or an imported `wait_for`)."""
    tree = ast.parse(source)
    imported = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                and node.module == "asyncio" for alias in node.names if alias.name == "wait_for"}
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if (isinstance(func, ast.Attribute) and func.attr == "wait_for" and isinstance(func.value, ast.Name)
                    and func.value.id == "asyncio") or (isinstance(func, ast.Name) and func.id in imported):
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("source, expected", [
    ("import asyncio\nasync def f(e):\n    await asyncio.wait_for(e.wait(), 1)\n", [3]),
    ("from asyncio import wait_for as w\nasync def f(e):\n    await w(e.wait(), 1)\n", [3]),
    ("import asyncio\nasync def f(e):\n    async with asyncio.timeout(1):\n        await e.wait()\n", []),
])
def test_the_rule_sees_wait_for(source: str, expected: list[int]) -> None:
    assert wait_for_calls(source) == expected


def test_no_asyncio_wait_for_in_product_code() -> None:
    """On Python 3.11 (which plnt supports), asyncio.wait_for drops a cancellation that lands in the
    loop turn the awaited thing finishes: a cancelled install kept polling a runner's health for its
    whole start timeout (tests/core/test_upstream.py). `async with asyncio.timeout(...)` does not."""
    found = [f"{path.relative_to(ROOT)}:{line}" for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))
             for line in wait_for_calls(path.read_text())]
    assert found == [], f"use `async with asyncio.timeout(...)` instead of asyncio.wait_for at {found}"
