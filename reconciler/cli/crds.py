"""`plnt crds`: the CustomResourceDefinitions, generated from the spec models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from plnt.reconciler.cli.lazy import command_app

app = command_app()


@app.command()
def crds(
    out: Annotated[Path | None, typer.Option(
        help="Write one file per CRD into this directory (charts/plnt/crds); default: one YAML stream on stdout.")] = None,
) -> None:
    """The CustomResourceDefinitions of WorkflowRun, ModelDeployment, PlntBackend and RecipeTrustPolicy, generated from the models."""
    from plnt.reconciler.control.crds import crd_files, crds_yaml

    if out is None:
        typer.echo(crds_yaml(), nl=False)
        return
    out.mkdir(parents=True, exist_ok=True)
    for name, text in crd_files().items():
        (out / name).write_text(text, encoding="utf-8")
        typer.echo(f"wrote {out / name}", err=True)
