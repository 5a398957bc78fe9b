"""`plnt scale NAME --replicas N`: a WorkflowRun's or ModelDeployment's replicas changed in git, never
in the live state: the spec file's `replicas.min` set to N (and `max` raised to N when it is below) in
a commit on a new branch `plnt/scale-NAME-N` with a pull request, so review and approval apply as to
any change; or, with --commit-to-branch, a commit on the tracked branch. plnt rolls it out once merged.

Exit 0 done (the pull request's URL on stdout), 1 refused (nothing changed), 2 bad options,
3 git or the forge failed."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from plnt.reconciler.cli.gitops import Change, ChangeOptions, branch_name, propose
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import with_option_groups

app = command_app()


@app.command()
@with_option_groups
def scale(
    *,
    name: Annotated[str, typer.Argument(help="WorkflowRun or ModelDeployment name.")],
    replicas: Annotated[int, typer.Option(min=0, help=(
        "Replicas to keep running: replicas.min (0 is scale to zero, local backends only); max is raised to it "
        "when below."))],
    max_replicas: Annotated[int | None, typer.Option("--max", min=1, help="Also set replicas.max.")] = None,
    namespace: Annotated[str, typer.Option(help="Its namespace.")] = "default",
    change: ChangeOptions,
) -> None:
    """Change a WorkflowRun's or ModelDeployment's replicas in git: a commit on a new branch and a pull request
    (or, with --commit-to-branch, a commit on the tracked branch). Prints the pull request's URL."""

    def changes_for(located: Any, _at_version: Any) -> tuple[Change, dict[tuple[str, ...], int]]:
        current = located.resource.spec.replicas
        changes = {("spec", "replicas", "min"): replicas}
        high = max_replicas if max_replicas is not None else current.max
        if high is not None and high < replicas:
            high = replicas
        if high != current.max:
            changes[("spec", "replicas", "max")] = high
        what = str(replicas) if high in (None, replicas) else f"{replicas}-{high}"
        summary = f"scale {namespace}/{name} to {what} replica{'s' if what != '1' else ''}"
        return Change("scale", summary, branch_name("scale", namespace, name, what)), changes

    propose(change, namespace, name, changes_for)
