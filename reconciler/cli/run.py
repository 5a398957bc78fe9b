"""`plnt run NAME`: invoke a deployed workflow through the gateway from the terminal, as an
application would (POST /workflows/NAME/invoke), and print its answer and what served it.

The answer is asked for as a stream: the output step's tokens are printed on stderr as they come
(only a workflow whose output step streams sends any), the answer (the runner's `output`) on stdout
as JSON, then `served by NAME VERSION (TRACK)` on stderr. --json prints the runner's whole answer.

Exit 0 answered; 1 not served (unknown workflow, nothing promoted yet, several namespaces, no canary,
an input missing, a step failed); 2 bad options, plnt cannot be reached or the token is refused;
3 the runner did not answer (502, 504: retry later)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import auth_headers, fail, secret
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile

app = command_app()

TRACKS = ("stable", "canary")


@app.command()
def run(
    name: Annotated[str, typer.Argument(help="WorkflowRun name.")],
    inputs: Annotated[list[str] | None, typer.Option("--input", "-i", help=(
        "An input as KEY=VALUE (a string), repeatable; added to --input-file's, and wins over them."))] = None,
    input_file: Annotated[Path | None, typer.Option(help="A JSON object of inputs ('-': standard input).")] = None,
    namespace: Annotated[str | None, typer.Option(help=(
        "Its namespace, when the name is in several (default: the only one).")) ] = None,
    track: Annotated[str | None, typer.Option(help=(
        "stable or canary: the release to ask (X-Plnt-Track); default: the gateway's split.")) ] = None,
    stream: Annotated[bool, typer.Option("--stream/--no-stream", help=(
        "Ask for a stream and print the tokens as they come (stderr).")) ] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the runner's whole answer as JSON.")] = False,
    timeout: Annotated[float, typer.Option(min=1, help="Seconds to wait for the answer (between two events when streamed).")] = 120.0,
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    token: Token = None,
    token_file: TokenFile = None,
) -> None:
    """Invoke a workflow through the gateway: its answer on stdout, streamed tokens and the version that served it on stderr."""
    import httpx

    body = request_body(inputs or [], _read_input_file(input_file))
    if track is not None and track not in TRACKS:
        raise fail(f"--track must be {' or '.join(TRACKS)}, not {track!r}", 2)
    headers = auth_headers(secret(token, token_file, "--token"))
    if track:
        headers["x-plnt-track"] = track
    if stream:
        headers["accept"] = "text/event-stream"
    params = {"namespace": namespace} if namespace else {}
    try:
        with httpx.Client(trust_env=False, timeout=httpx.Timeout(timeout, connect=10)) as client, client.stream(
                "POST", f"{url}/workflows/{name}/invoke", params=params, json=body, headers=headers) as response:
            if response.status_code >= 400:
                response.read()
                raise refused(response, name)
            served = (response.headers.get("x-plnt-version"), response.headers.get("x-plnt-track"))
            if "text/event-stream" in response.headers.get("content-type", ""):
                answer = _read_stream(response)
            else:
                answer = json.loads(response.read())
    except httpx.TimeoutException as exc:
        raise fail(f"no answer from {name} within {timeout:.0f} s ({type(exc).__name__}); raise --timeout", 3) from exc
    except httpx.HTTPError as exc:
        raise fail(f"no plnt answers at {url} ({exc}); is plnt up running? (--url)", 2) from exc
    typer.echo(json.dumps(answer if as_json else answer.get("output"), indent=2, ensure_ascii=False))
    version = served[0] or answer.get("version") or "?"
    typer.echo(f"served by {answer.get('workflow') or name} {version} ({served[1] or 'stable'})", err=True)


def request_body(pairs: list[str], from_file: dict[str, Any]) -> dict[str, Any]:
    """The invocation's JSON object: --input-file's inputs, then each --input KEY=VALUE over them."""
    body = dict(from_file)
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise fail(f"--input {pair!r}: give KEY=VALUE (e.g. --input review='Great service')", 2)
        body[key.strip()] = value
    return body


def _read_input_file(path: Path | None) -> dict[str, Any]:
    if path is None:
        return {}
    import sys

    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
        data = json.loads(text)
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"--input-file {path}: cannot read it ({exc})", 2) from exc
    except json.JSONDecodeError as exc:
        raise fail(f"--input-file {path}:{exc.lineno}:{exc.colno}: not JSON: {exc.msg}", 2) from exc
    if not isinstance(data, dict):
        raise fail(f"--input-file {path}: must hold a JSON object of inputs, not {type(data).__name__}", 2)
    return data


def _read_stream(response: Any) -> dict[str, Any]:
    """The runner's SSE stream: tokens echoed on stderr as they arrive, the `result` event returned;
    an `error` event (or a stream ending without a result) exits 1."""
    from plnt.gateway.sse import SSEParser

    parser = SSEParser()
    streamed = False
    for chunk in response.iter_raw():
        for event in parser.feed(chunk):
            if event.event == "token":
                typer.echo(json.loads(event.data).get("text", ""), err=True, nl=False)
                streamed = True
            elif event.event in ("result", "error"):
                if streamed:
                    typer.echo("", err=True)
                data = json.loads(event.data)
                if event.event == "error":
                    raise fail(_error_text(data.get("error") or {}), 1)
                return data  # type: ignore[no-any-return]
    raise fail("the stream ended without an answer (the runner stopped mid-way?); try again", 3)


def _error_text(error: dict[str, Any]) -> str:
    where = f" at step {error['step']}" if error.get("step") else ""
    return f"{error.get('type', 'error')}{where}: {error.get('message', '')}"


def refused(response: Any, name: str) -> typer.Exit:
    """An error answer as one `error:` line, and the exit code that says what to do next."""
    try:
        error = response.json().get("error") or {}
    except (ValueError, AttributeError):
        error = {"message": response.text[:300]}
    message = _error_text(error).replace("pick one with ?namespace=", "pick one with --namespace")
    status = response.status_code
    if status == 503 and (retry := response.headers.get("retry-after")):
        message += f" (retry in {retry} s)"
    if status in (401, 403):
        return fail(f"{message} (--token/--token-file)", 2)
    if status in (502, 504):
        return fail(message, 3)
    return fail(f"{name}: {message}" if status == 404 else message, 1)
