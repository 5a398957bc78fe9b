"""The `integration` marker check (tests/hygiene.py) run against tests written to break it, in a
pytest of their own (a subprocess, so the check of THIS run does not see their servers)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.hygiene import runners_under

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import pytest
from tests.hygiene import pytest_collection_modifyitems, pytest_runtest_makereport, pytest_runtest_protocol  # noqa: F401


@pytest.fixture
def temporal_address():
    return "127.0.0.1:7233"  # a stand-in: only the fixture's NAME matters to the check
"""

CASES = """
import socket
import subprocess
import sys

import pytest


def listen():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()


def test_unit_that_listens():
    listen()


def test_unit_that_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_unit_that_gets_a_service_fixture_on_the_fly(request):
    request.getfixturevalue("temporal_address")


def test_unit_that_runs_git():
    subprocess.run(["git", "--version"], check=True, capture_output=True)


def test_unit_whose_program_is_missing():
    with pytest.raises(FileNotFoundError):
        subprocess.run(["/nonexistent/program"])


def test_unit_that_fails_on_its_own():
    listen()
    assert False, "its own failure"


@pytest.mark.integration
def test_marked_integration_that_listens():
    listen()


def test_requesting_a_service_fixture_is_integration(temporal_address):
    listen()
"""


def run_pytest(directory: Path, *args: str) -> tuple[dict[str, str], str]:
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", *args],
                            cwd=directory, capture_output=True, text=True, timeout=120)
    outcomes = {name: outcome for outcome, name in
                re.findall(r"^(PASSED|FAILED|ERROR) test_cases\.py::(\w+)", result.stdout, re.M)}
    return outcomes, result.stdout


@pytest.mark.integration
def test_the_check_fails_unit_tests_that_start_services(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: starts real services\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_cases.py").write_text(CASES)

    outcomes, output = run_pytest(tmp_path)
    assert outcomes == {
        "test_unit_that_listens": "FAILED",
        "test_unit_that_starts_a_process": "FAILED",
        "test_unit_that_gets_a_service_fixture_on_the_fly": "FAILED",
        "test_unit_that_runs_git": "PASSED",
        "test_unit_whose_program_is_missing": "PASSED",
        "test_unit_that_fails_on_its_own": "FAILED",
        "test_marked_integration_that_listens": "PASSED",
        "test_requesting_a_service_fixture_is_integration": "PASSED",
    }, output
    assert "test_unit_that_listens is not marked integration, but it started: a listening socket on ('127.0.0.1'" in output
    assert "but it started: the process" in output and "but it started: the service fixture 'temporal_address'" in output
    assert "its own failure" in output and "integration check" in output  # its own failure kept, the check added

    outcomes, output = run_pytest(tmp_path, "-m", "not integration")
    assert "test_marked_integration_that_listens" not in outcomes
    assert "test_requesting_a_service_fixture_is_integration" not in outcomes, "the fixture did not mark it"
    assert "2 deselected" in output, output


RUNNER_CASES = """
import subprocess
import sys

import pytest

# A stand-in for a runner: a process whose command line reads like one (`-m plnt.runner ...`).
SLEEPER = "import time; time.sleep(120)"


def runner(tmp_path):
    return subprocess.Popen([sys.executable, "-c", SLEEPER, "-m", "plnt.runner", "--recipe", str(tmp_path / "r")])


@pytest.mark.integration
def test_integration_that_leaves_a_runner(tmp_path):
    runner(tmp_path)


@pytest.mark.integration
def test_integration_that_stops_its_runner(tmp_path):
    process = runner(tmp_path)
    process.kill()
    process.wait()


@pytest.mark.integration
def test_integration_whose_runner_is_elsewhere(tmp_path_factory):
    runner(tmp_path_factory.mktemp("not-the-tests-own"))  # no tmp_path: not this check's to judge
"""


@pytest.mark.integration
def test_the_check_fails_a_test_that_leaves_a_runner_running(tmp_path: Path) -> None:
    """tests/hygiene.py's `no_runner_outlives_its_test`, run against tests written to break it: the
    stand-in "runner" (a sleeping python whose command line reads `-m plnt.runner`) left by one test
    fails it and is killed."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    integration: starts real services\n")
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST).replace(
        "pytest_runtest_protocol  # noqa: F401", "pytest_runtest_protocol, no_runner_outlives_its_test  # noqa: F401"))
    (tmp_path / "test_cases.py").write_text(RUNNER_CASES)
    outcomes, output = run_pytest(tmp_path, f"--basetemp={tmp_path / 'base'}")  # its runners' paths: under ours
    try:
        assert outcomes == {
            "test_integration_that_leaves_a_runner": "ERROR",
            "test_integration_that_stops_its_runner": "PASSED",
            "test_integration_whose_runner_is_elsewhere": "PASSED",
        }, output
        assert "1 runner process(es) outlived the test (killed now): pid " in output
        left = [argv for argv in runners_under(tmp_path).values() if "not-the-tests-own" not in argv]
        assert left == [], f"the check did not kill the leftover runner: {left}"
    finally:
        for pid in runners_under(tmp_path):  # the one the check rightly left alone (and any it missed)
            os.kill(pid, signal.SIGKILL)
