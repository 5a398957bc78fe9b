"""`plnt rollout`: a person's hand on a running rollout (a canary under way): show, pause, resume,
promote, abort. Each action names the rollout's commit and spec fingerprint; the saga refuses one
meant for another rollout (a newer commit came meanwhile) and records the others in its history.

Exit 0 done, 1 refused or no rollout under way, 2 plnt cannot be reached or bad options."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import api_answer, api_get, auth_headers, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app(help="A running rollout: show, pause, resume, promote or abort it (admin scope for actions).",
                  no_args_is_help=True)

Name = Annotated[str, typer.Argument(help="WorkflowRun or ModelDeployment name.")]
Namespace = Annotated[str, typer.Option(help="Its namespace.")]
Url = Annotated[str, typer.Option(help="Gateway of a running plnt up (or the reconciler's control address).")]
Commit = Annotated[str | None, typer.Option(help=(
    "Act only if the rollout under way deploys this commit (a full sha or a prefix of 7 or more): what you "
    "saw in plnt status. Without it: the rollout under way when the command runs (printed)."))]
Reason = Annotated[str, typer.Option(help="Why, recorded with the action in the saga's history.")]
By = Annotated[str | None, typer.Option(help="Who acts, as recorded (default: USER@HOST).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def describe(state: dict[str, Any]) -> str:
    where = (f"step {state['canary_step']}/{state['canary_steps']}" if state.get("canary_step")
             else f"at {state['step']} (its canary takes no traffic yet)")
    held = ""
    if state.get("paused_by"):
        held = f", paused by {state['paused_by']}"
    elif state.get("waiting_for_person"):
        held = ", waiting for a person (resume, promote or abort)"
    if state.get("decision"):
        held += f", {state['decision']} decided"
    return f"rollout of {state.get('version')} at commit {state['commit'][:12]}: {where}{held}"


def _show(name: str, namespace: str, url: str, token: str | None, as_json: bool) -> dict[str, Any]:
    state: dict[str, Any] = api_get(url, f"/workflows/{name}/rollout", token, {"namespace": namespace})
    if as_json:
        import json

        typer.echo(json.dumps(state, indent=2))
    else:
        typer.echo(describe(state))
        for action in state.get("actions") or []:
            typer.echo(f"  {action}")
    return state


def _act(verb: str, name: str, namespace: str, url: str, token: str | None, token_file: Any, commit: str | None,
         reason: str, by: str | None, as_json: bool) -> None:
    import getpass
    import json
    import socket

    import httpx

    token = secret(token, token_file, "--token")
    if commit is not None and (len(commit) < 7 or not all(c in "0123456789abcdef" for c in commit)):
        raise fail(f"--commit {commit!r}: give a commit sha (7 hex digits or more)", 2)
    state: dict[str, Any] = api_get(url, f"/workflows/{name}/rollout", token, {"namespace": namespace})
    if commit is not None and not state["commit"].startswith(commit):
        raise fail(f"the rollout of {namespace}/{name} under way deploys commit {state['commit'][:12]}, not {commit}: "
                   "a newer commit came; look again with plnt status (nothing done)", 1)
    if by is None:
        by = f"{getpass.getuser()}@{socket.gethostname()}"
    body = {"commit": state["commit"], "fingerprint": state["fingerprint"], "by": by, "reason": reason}
    try:
        with httpx.Client(trust_env=False, timeout=30, headers=auth_headers(token)) as client:
            response = client.post(f"{url}/workflows/{name}/rollout/{verb}", params={"namespace": namespace}, json=body)
    except httpx.HTTPError as exc:
        raise fail(f"no plnt answers at {url} ({exc}); is plnt up running? (--url)", 2) from exc
    answer = api_answer(response)
    if as_json:
        typer.echo(json.dumps(answer, indent=2))
        return
    typer.echo(f"{namespace}/{name}: {answer['message']}")
    typer.echo(f"({describe(answer['rollout']) if answer.get('rollout') else describe(state)}; by {by})")


@app.command("show")
def show(name: Name, namespace: Namespace = "default", url: Url = "http://127.0.0.1:8000", as_json: Json = False,
         token: Token = None, token_file: TokenFile = None) -> None:
    """Where the rollout under way is: its commit, version, step, whether it is paused, and what people did."""
    _show(name, namespace, url, secret(token, token_file, "--token"), as_json)


_VERBS = {
    "pause": "Hold the rollout before its next step (or its promotion) until resume, promote or abort.\n"
             "A step's smoke test under way finishes, and a failing one still rolls back.",
    "resume": "End a pause: a person's, a `pause: manual` step's, or what is left of a timed one.",
    "promote": "Promote the canary now, skipping what is left of its steps, smoke tests and pauses.",
    "abort": "Roll the canary back now. The rollout ends RolledBack and stays so until a new commit changes it.",
}


def _verb_command(verb: str) -> Any:
    def command(name: Name, namespace: Namespace = "default", url: Url = "http://127.0.0.1:8000",
                commit: Commit = None, reason: Reason = "", by: By = None, as_json: Json = False,
                token: Token = None, token_file: TokenFile = None) -> None:
        _act(verb, name, namespace, url, token, token_file, commit, reason, by, as_json)

    command.__doc__ = _VERBS[verb]
    command.__name__ = verb
    return command


for _verb in _VERBS:
    app.command(_verb)(_verb_command(_verb))
