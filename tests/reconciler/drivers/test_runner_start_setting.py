"""runner_start: fork (the default) or exec, in Settings and as --runner-start on `plnt up` and
`plnt worker`; how each reaches the local driver."""

from __future__ import annotations

from pathlib import Path

import pytest
from plnt.reconciler.app import make_local_driver
from plnt.reconciler.cli.main import app
from plnt.reconciler.settings import Settings
from plnt.reconciler.state import StateDir
from pydantic import ValidationError
from typer.testing import CliRunner


def test_fork_is_the_default_and_only_fork_or_exec_are_accepted() -> None:
    assert Settings(repo="/r").runners.start == "fork"
    assert Settings(repo="/r", runner_start="exec").runners.start == "exec"
    with pytest.raises(ValidationError, match="fork"):
        Settings(repo="/r", runner_start="spawn")  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["up", "worker"])
def test_runner_start_option(command: str) -> None:
    result = CliRunner().invoke(app, [command, "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "--runner-start" in result.output and "fork|exec" in result.output
    bad = CliRunner().invoke(app, [command, "--repo", "/nowhere", "--runner-start", "spawn"])
    assert bad.exit_code == 2 and "spawn" in bad.output


@pytest.mark.parametrize("way", ["fork", "exec"])
def test_the_setting_reaches_the_local_driver(tmp_path: Path, way: str) -> None:
    driver = make_local_driver(Settings(repo="/r", runner_start=way), StateDir(tmp_path),  # type: ignore[arg-type]
                               on_change=lambda: None, drain=lambda release: None,  # type: ignore[arg-type,return-value]
                               limits_for=lambda namespace, name: None)
    assert driver._spawner.runner_start == way
