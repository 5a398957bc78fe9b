"""`plnt list`: every WorkflowRun and ModelDeployment a running plnt serves, one line each: kind,
namespace/name, phase, stable version, canary version and share, backend, replicas (GET /workflows).

Exit 0 listed, 2 plnt cannot be reached, the token is refused, or bad options."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import api_get, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()

OUTPUTS = ("table", "json")
COLUMNS = ("KIND", "NAMESPACE/NAME", "PHASE", "STABLE", "CANARY", "BACKEND", "REPLICAS")


@app.command("list")
def list_resources(
    output: Annotated[str, typer.Option("--output", "-o", help="table (one line each) or json (the rows of "
                                                                "GET /workflows).")] = "table",
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Every WorkflowRun and ModelDeployment, one line each: kind, name, phase, versions, backend, replicas."""
    import json

    if output not in OUTPUTS:
        raise fail(f"--output must be {' or '.join(OUTPUTS)}, not {output!r}", 2)
    rows = api_get(url, "/workflows", secret(token, token_file, "--token"))
    if not isinstance(rows, list):
        raise fail(f"GET {url}/workflows did not answer a list: is that plnt? (--url)", 2)
    if output == "json":
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("No WorkflowRuns or ModelDeployments.")
        return
    for line in table(rows):
        typer.echo(line)


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The header and one line per row, columns as wide as their widest cell."""
    cells = [COLUMNS, *(_cells(row) for row in sorted(rows, key=lambda r: (r["kind"], r["namespace"], r["name"])))]
    widths = [max(len(line[i]) for line in cells) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip() for line in cells]


def _cells(row: dict[str, Any]) -> tuple[str, ...]:
    name = row["name"]
    if row.get("preview"):  # a preview (--previews): its WorkflowRun and pull request
        name = f"{name.rsplit('--pr', 1)[0]}[PR#{row['preview']}]"
    canary = f"{row['canaryVersion']}@{row.get('canaryPercent') or 0}%" if row.get("canaryVersion") else "-"
    stable = row.get("version") or "-"
    if row.get("pin"):  # a person's emergency pin holds it until the commit naming it lands (drift)
        stable += "(pinned)"
    return (row.get("kind") or "WorkflowRun", f"{row['namespace']}/{name}", row["phase"], stable,
            canary, row.get("backend") or "-", replicas_text(row.get("replicas"), row))


def replicas_text(replicas: dict[str, Any] | None, row: dict[str, Any] | None = None) -> str:
    """{min, max} as one cell: 2 (min only, or min = max), 1-3, 0-1 (scale to zero); - before any release;
    with the processes running out of those asked for first, when the row has them: 2/3 (1-4)."""
    if not replicas:
        return "-"
    low, high = replicas.get("min"), replicas.get("max")
    text = str(low) if high is None or high == low else f"{low}-{high}"
    if row is not None and row.get("replicasDesired") is not None:
        live = row.get("replicasLive")
        text = f"{'?' if live is None else live}/{row['replicasDesired']} ({text})"
    return text
