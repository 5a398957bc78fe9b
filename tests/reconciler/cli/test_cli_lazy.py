"""The command table of `plnt` (reconciler/cli/main.py, lazy.py): `plnt --help` lists every command
without importing any command module; a command's own --help imports its module and none of the
other commands' (nor settings or spec models); the one-line helps of the table are the commands' own; the option groups
(cli/options.py) refuse an option declared twice."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from typing import Annotated

import pytest
import typer
from plnt.reconciler.cli.main import COMMANDS, app
from plnt.reconciler.cli.options import SpecLimitOptions, with_option_groups

CLI = "plnt.reconciler.cli."
SHARED = {"main", "lazy", "common", "options", "roles", "trust_files"}  # what command modules share


def modules_after(*argv: str) -> set[str]:
    """The plnt modules a `plnt ARGV` process has imported when it exits."""
    code = ("import json, sys\n"
            f"sys.argv = ['plnt', *{list(argv)!r}]\n"
            "from plnt.reconciler.cli.main import main\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('plnt') or m == 'pydantic')), file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stderr.strip().splitlines()[-1]))


@pytest.mark.integration  # starts plnt processes
def test_plnt_help_lists_every_command_and_imports_none() -> None:
    imported = modules_after("--help")
    assert imported == {"plnt", "plnt.reconciler", "plnt.reconciler.cli", f"{CLI}lazy", f"{CLI}main"}, imported
    result = subprocess.run([sys.executable, "-m", "plnt.reconciler.cli", "--help"], capture_output=True, text=True,
                            env={"COLUMNS": "300", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"}, timeout=60, check=True)
    listed = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("│ ") and line[2] != " "]
    assert listed[1:] == list(COMMANDS), result.stdout  # after the --help option's row


@pytest.mark.integration
@pytest.mark.parametrize("command", ["validate", "up", "recipe"])
def test_a_commands_help_imports_that_command_alone(command: str) -> None:
    imported = modules_after(command, "--help")
    assert {m.removeprefix(CLI) for m in imported if m.startswith(CLI)} - SHARED == {command}
    # Settings, spec models, git: only when the command runs.
    assert {m for m in imported if not m.startswith(CLI)} <= {"plnt", "plnt.reconciler", "plnt.reconciler.cli",
                                                             "plnt.reconciler.redact", "pydantic"}


def test_the_tables_help_is_each_commands_own() -> None:
    root = typer.main.get_command(app)
    context = typer.core._click.Context(root, info_name="plnt")
    for name, lazy in COMMANDS.items():
        command = root.get_command(context, name)
        assert command is not None and command.name == name
        assert lazy.help == inspect.cleandoc(command.help or "").split("\n\n")[0], name


def test_an_option_declared_twice_is_refused() -> None:
    def command(*, limits: SpecLimitOptions,
                max_spec_files: Annotated[int, typer.Option()] = 1) -> None:  # pragma: no cover - never runs
        pass

    with pytest.raises(TypeError, match="max_spec_files"):
        with_option_groups(command)
