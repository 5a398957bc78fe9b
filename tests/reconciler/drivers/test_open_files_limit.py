"""plnt raises its soft open-files limit to the hard one before it starts runners (a connection or
more per runner: 1,000 runners pass the usual soft 1,024). In a child process, not to change pytest's."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import resource
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
from plnt.reconciler.drivers.processes import raise_open_files_limit
raise_open_files_limit()
now = resource.getrlimit(resource.RLIMIT_NOFILE)
expected = hard if hard != resource.RLIM_INFINITY else 1 << 20
print(now[0] == expected and now[1] == hard)
"""


@pytest.mark.integration
def test_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    result = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "True", result.stderr
