"""The runner's own resource limits (`--limit-*`), set before the recipe is imported; each case runs
in a child Python process, so the limits never touch the test process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import EXAMPLE

pytestmark = pytest.mark.integration  # each case runs a real Python process

RECIPE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_limits_are_set_soft_and_hard_and_never_above_a_hard_limit_in_place() -> None:
    result = run_python("""
        import resource
        from plnt.runner.__main__ import _parse, apply_limits
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))  # an operator's stricter limit
        apply_limits(_parse(["--recipe", "x", "--limit-memory-mib", "600", "--limit-open-files", "1000",
                             "--limit-processes", "5000"]))
        print(resource.getrlimit(resource.RLIMIT_AS), resource.getrlimit(resource.RLIMIT_NOFILE),
              resource.getrlimit(resource.RLIMIT_NPROC))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == f"({600 * 2**20}, {600 * 2**20}) (200, 200) (5000, 5000)"


def test_a_bad_limit_exits_3_before_the_recipe_is_loaded() -> None:
    result = subprocess.run([sys.executable, "-m", "plnt.runner", "--recipe", str(RECIPE), "--port", "1",
                             "--limit-open-files", "0"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 3, result
    assert result.stderr.strip() == "plnt.runner: cannot apply limits: --limit-open-files must be > 0"
