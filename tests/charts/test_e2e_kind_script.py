"""tools/e2e_kind.sh, `make e2e-kind` and .github/workflows/e2e-kind.yml, checked without running
them (no Docker engine and no kind here): bash parses the script, shellcheck lints it where it is
installed (it is not part of `make test`), its prerequisite checks fail with a clear message, and the
Makefile target and the CI workflow call it. That the end-to-end run passes is NOT proven.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.charts.chartkit import ROOT

SCRIPT = ROOT / "tools" / "e2e_kind.sh"
WORKFLOW = ROOT / ".github" / "workflows" / "e2e-kind.yml"


def test_make_target_and_workflow_call_the_script() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "\ne2e-kind: install\n\tbash tools/e2e_kind.sh\n" in makefile
    assert "e2e-kind" in makefile.split(".PHONY:", 1)[1].splitlines()[0]
    workflow = yaml.safe_load(WORKFLOW.read_text())
    steps = workflow["jobs"]["e2e-kind"]["steps"]
    assert any(step.get("run", "").strip() == "make e2e-kind" for step in steps)
    assert any("kind" in step.get("run", "") and "install" in step.get("run", "") for step in steps)
    assert os.access(SCRIPT, os.X_OK)


def test_the_script_says_it_has_not_run_here() -> None:
    text = SCRIPT.read_text()
    assert "HAS NOT BEEN RUN" in text
    for needed in ("docker build", "kind load docker-image", "temporal server start-dev", "upgrade --install plnt charts/plnt",
                   "review-responder@1.3.0", "/workflows/review-responder/invoke", "port-forward"):
        assert needed in text, needed


@pytest.mark.integration  # runs bash
def test_bash_parses_it() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.integration  # runs shellcheck
def test_shellcheck() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed (`make test` does not install it): apt-get install shellcheck")
    result = subprocess.run([shellcheck, "-x", str(SCRIPT)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def fake_bin(tmp_path: Path, **scripts: str) -> str:
    """A PATH with the few programs the script runs before its checks, and the given fakes."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for program in ("dirname", "sed", "date", "id", "mktemp", "rm"):
        found = shutil.which(program)
        assert found, program
        (bin_dir / program).symlink_to(found)
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
    return str(bin_dir)


@pytest.mark.integration  # runs bash
def test_missing_docker_is_a_clear_error(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    result = subprocess.run([bash, str(SCRIPT)], capture_output=True, text=True, check=False,
                            env={"PATH": fake_bin(tmp_path), "HOME": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.startswith("e2e-kind: docker is missing: install Docker"), result.stderr


@pytest.mark.integration  # runs bash
def test_docker_without_an_engine_is_a_clear_error(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    path = fake_bin(tmp_path, docker='echo "Cannot connect to the Docker daemon" >&2; exit 1')
    result = subprocess.run([bash, str(SCRIPT)], capture_output=True, text=True, check=False,
                            env={"PATH": path, "HOME": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.startswith("e2e-kind: docker is installed but no Docker engine answers"), result.stderr


@pytest.mark.integration  # runs bash
def test_missing_kind_is_a_clear_error(tmp_path: Path) -> None:
    bash = shutil.which("bash")
    path = fake_bin(tmp_path, docker="exit 0")
    result = subprocess.run([bash, str(SCRIPT)], capture_output=True, text=True, check=False,
                            env={"PATH": path, "HOME": str(tmp_path)})
    assert result.returncode == 1
    assert result.stderr.startswith("e2e-kind: kind is missing: install kind"), result.stderr
