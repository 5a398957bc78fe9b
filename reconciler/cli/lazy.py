"""A command group whose commands live in modules of their own, imported when one of them runs or
its --help is asked for. The group's own --help lists them from their one-line helps in a table
(LazyCommand): `plnt --help` imports no command module, so it starts in a fraction of the time."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import typer
from typer import _click
from typer.core import TyperCommand, TyperGroup


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives (a module whose `app` is a typer.Typer of that one command, or of a
    group of them) and its one-line help: what the command's docstring says first."""

    module: str
    help: str

    def load(self, name: str) -> _click.Command:
        command = typer.main.get_command(importlib.import_module(self.module).app)
        command.name = name
        return command


class _Listed(TyperCommand):
    """A command as the group's --help lists it: its name and help, nothing imported yet."""


class LazyGroup(TyperGroup):
    """A TyperGroup of `lazy_commands` (a subclass names them): each is loaded the first time the
    group resolves it; until then the group holds a _Listed stand-in, so listing them, and
    suggesting a name for a mistyped one, need no import."""

    lazy_commands: ClassVar[dict[str, LazyCommand]] = {}

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        self._listing = False
        for name, lazy in self.lazy_commands.items():
            self.commands.setdefault(name, _Listed(name, help=lazy.help))

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        command = self.commands.get(cmd_name)
        if isinstance(command, _Listed) and not self._listing:
            command = self.commands[cmd_name] = self.lazy_commands[cmd_name].load(cmd_name)
        return command

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        self._listing = True  # the table of commands: their one-line helps, no module imported
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


def command_app(**settings: Any) -> typer.Typer:
    """The `app` of a command module: a typer.Typer without completion options of its own (plnt has none)."""
    return typer.Typer(add_completion=False, **settings)
