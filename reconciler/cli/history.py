"""`plnt history`: a WorkflowRun's newest saga, step by step, from a running plnt."""

from __future__ import annotations

from typing import Annotated

import typer
from plnt.reconciler.cli.common import auth_headers, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()


@app.command()
def history(
    name: Annotated[str, typer.Argument(help="WorkflowRun name.")],
    namespace: Annotated[str, typer.Option(help="WorkflowRun namespace.")] = "default",
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    run: Annotated[str | None, typer.Option(help="One saga run's id (GET /workflows/NAME/rollouts lists them; "
                                            "default: the newest).")] = None,
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """The newest saga's steps for a WorkflowRun: start, duration, attempts, outcome (from Temporal's history)."""
    import json

    import httpx

    token = secret(token, token_file, "--token")
    try:
        with httpx.Client(trust_env=False, timeout=10, headers=auth_headers(token)) as client:
            params = {"namespace": namespace, **({"run": run} if run else {})}
            response = client.get(f"{url}/workflows/{name}/history", params=params)
    except httpx.HTTPError as exc:
        raise fail(f"no plnt answers at {url} ({exc}); is plnt up running?", 2) from exc
    if response.status_code == 404:
        raise fail(response.json().get("error", {}).get("message", f"no saga for {namespace}/{name}"), 1)
    response.raise_for_status()
    data = response.json()
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    result = data.get("result") or {}
    typer.echo(f"saga {data['workflow_id']} run {data['run_id']}: {data['status']}"
               + (f" -> {result.get('phase')}: {result.get('reason')}" if result else ""))
    if data.get("commit"):
        signer = f", signed by {data['signer']}" if data.get("signer") else ""
        typer.echo(f"commit {data['commit'][:12]} version {data.get('version') or '-'}{signer}")
    typer.echo(f"{'STEP':<18} {'STARTED':<26} {'DURATION':>10} {'ATTEMPTS':>8}  OUTCOME")
    for step in data["steps"]:
        duration = f"{step['duration_ms']:.0f} ms" if step["duration_ms"] is not None else "-"
        line = f"{step['step']:<18} {str(step['started_at'] or '-')[:26]:<26} {duration:>10} {step['attempts']:>8}  {step['outcome']}"
        typer.echo(line + (f": {step['error']}" if step.get("error") else ""))
    for action in data.get("actions") or []:
        reason = f": {action['reason']}" if action.get("reason") else ""
        typer.echo(f"{action['verb']} by {action.get('by') or 'someone'} at {str(action.get('at') or '-')[:26]}{reason}")
