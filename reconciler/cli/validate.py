"""`plnt validate`: a spec directory or file checked as plnt would load it, offline."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import SpecLimitOptions, with_option_groups

if TYPE_CHECKING:
    from plnt.core.specs.loader import SpecSet

app = command_app()


@app.command()
@with_option_groups
def validate(
    *,
    path: Annotated[Path, typer.Argument(help="A spec directory or a single YAML file.")],
    limits: SpecLimitOptions,
) -> None:
    """Check specs: exit 0 with a summary, or one FILE:LINE: field: message line per problem and exit 1.
    Warnings (FILE:LINE: field: warning: ...) do not change the exit code."""
    from plnt.core.specs.loader import Problem, SourceFile, load_sources, read_file_spec, read_tree

    if not path.exists():
        typer.echo(f"{path}: no such file or directory", err=True)
        raise typer.Exit(2)
    spec_limits = limits.limits()
    note = ""
    if path.is_file():
        specs, problems = load_sources([read_file_spec(path, str(path), spec_limits)], check_references=None,
                                       limits=spec_limits)
        if (specs.workflow_runs or specs.model_deployments) and not specs.backends:
            note = " (backend references not checked: the file declares no PlntBackend; validate the directory)"
    else:
        # Display paths include PATH, in problem lines and in messages pointing at another file.
        files, read_problems = read_tree(path, spec_limits)
        specs, problems = load_sources([SourceFile(path=str(path / f.path), text=f.text) for f in files],
                                       limits=spec_limits)
        problems = sorted([Problem(str(path / p.file), p.line, p.field, p.message) for p in read_problems] + problems,
                          key=lambda p: (p.file, p.line))
    for warning in specs.warnings:
        typer.echo(str(warning))
    if problems:
        for problem in problems:
            typer.echo(str(problem))
        typer.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        raise typer.Exit(1)
    typer.echo(f"{path}: valid: {_counts(specs)}{note}")


def _counts(specs: SpecSet) -> str:
    models = f"{len(specs.model_deployments)} ModelDeployment(s), " if specs.model_deployments else ""
    return (f"{len(specs.workflow_runs)} WorkflowRun(s), {models}{len(specs.backends)} PlntBackend(s), "
            f"{len(specs.trust_policies)} RecipeTrustPolicy(s), {len(specs.recipes)} recipe Workflow(s)")
