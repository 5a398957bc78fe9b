"""`plnt status`: each WorkflowRun as a running plnt reports it, or as its state directory last saved it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import auth_headers, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()


@app.command()
def status(
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    state_dir: Annotated[Path, typer.Option(help="Read this state directory if the gateway does not answer.")] = Path(".plnt"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (the shape of GET /workflows).")] = False,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Each WorkflowRun's phase, version, canary share, endpoint, commit and message."""
    import contextlib
    import json

    import httpx

    token = secret(token, token_file, "--token")
    source: dict[str, Any] = {}
    try:
        with httpx.Client(trust_env=False, timeout=5, headers=auth_headers(token)) as client:
            rows = client.get(f"{url}/workflows").raise_for_status().json()
            if not isinstance(rows, list):
                raise ValueError(f"GET {url}/workflows did not answer a list")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                source = client.get(f"{url}/source").raise_for_status().json()
    except (httpx.HTTPError, ValueError):  # nothing there, or something that is not plnt (HTML, other JSON)
        from plnt.core.status import WorkflowRunStatus
        from plnt.reconciler.state import read_json
        from plnt.reconciler.status_store import journal_path, read_statuses

        if not (state_dir / "status.json").exists() and not journal_path(state_dir / "status.json").exists():
            typer.echo(f"error: no plnt answers at {url} and {state_dir} holds no status; is plnt up running?", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"(no plnt answers at {url}; showing the last status saved in {state_dir})", err=True)
        raw = read_statuses(state_dir / "status.json")
        rows = [WorkflowRunStatus.model_validate(v).public() for _, v in sorted(raw.items())]
        source = read_json(state_dir / "source.json", {}) or {}
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if source:
        commit = (source.get("newestCommit") or "")[:12]
        problems = source.get("problems") or []
        health = f"INVALID ({len(problems)} problem{'s' if len(problems) != 1 else ''}; serving {str(source.get('lastReconciledCommit') or '')[:12]})" if problems else "valid"
        typer.echo(f"source {source.get('repo')} branch {source.get('branch')} commit {commit}: {health}")
        for problem in problems:
            typer.echo(f"  {problem}")
    if not rows:
        typer.echo("No WorkflowRuns.")
        return
    header = f"{'NAMESPACE/NAME':<34} {'PHASE':<11} {'VERSION':<10} {'CANARY':<14} {'COMMIT':<13} {'ENDPOINT':<24} MESSAGE"
    typer.echo(header)
    for row in rows:
        canary = f"{row.get('canaryVersion') or ''} {row['canaryPercent']}%" if row.get("canaryVersion") else "-"
        if row.get("canaryVersion") and row.get("canaryStep"):  # a stepped canary: where it is
            canary += f" {row['canaryStep']}/{row['canarySteps']}"
        # A preview (--previews) shows as its WorkflowRun and pull request: default/review-responder [PR #7].
        label = row["namespace"] + "/" + (f"{row['name'].rsplit('--pr', 1)[0]} [PR #{row['preview']}]"
                                          if row.get("preview") else row["name"])
        typer.echo(f"{label:<34} {row['phase']:<11} {row.get('version') or '-':<10} "
                   f"{canary:<14} {(row.get('observedCommit') or '-')[:12]:<13} {_endpoint(row):<24} {_message(row)}")


def _message(row: dict[str, Any]) -> str:
    message = str(row.get("message") or "")
    if row.get("parked"):  # scale to zero (replicas.min: 0)
        return "parked: the next request starts it" + (f"; {message}" if message else "")
    if row.get("replicasDesired") is not None:  # live/desired processes of the stable release
        live = row.get("replicasLive")
        return f"replicas {'?' if live is None else live}/{row['replicasDesired']}" + (f"; {message}" if message else "")
    return message


def _endpoint(row: dict[str, Any]) -> str:
    # Runner endpoints are shown to admin tokens only; others reach a workflow through the gateway.
    if row.get("endpoint"):
        return str(row["endpoint"])
    return "-" if "endpoint" in row or not row.get("version") else "(via gateway)"
