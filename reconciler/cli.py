"""The `plnt` command line: up, validate, plan, status."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import tempfile
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer

from .loader import Problem, SourceFile, SpecSet, load_sources, read_tree
from .settings import Settings

app = typer.Typer(
    name="plnt",
    help="GitOps reconciler for micro-agent workflows: specs in git, signed recipes, canary sagas on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


class Format(str, Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


def _setup_logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("temporalio", "httpx", "httpcore", "git", "uvicorn.error"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


@app.command()
def up(
    repo: Annotated[str, typer.Option(help="Spec repository: a path, file://, https:// or ssh URL.")],
    path: Annotated[str, typer.Option(help="Subdirectory of the repository holding the specs.")] = "",
    branch: Annotated[str, typer.Option(help="Branch to track.")] = "main",
    state_dir: Annotated[Path, typer.Option(help="Where plnt keeps its state.")] = Path(".plnt"),
    host: Annotated[str, typer.Option(help="Gateway address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Gateway port.")] = 8000,
    interval: Annotated[float, typer.Option(help="Seconds between polls of the repository.")] = 5.0,
    temporal_address: Annotated[
        str | None, typer.Option(help="HOST:PORT of a Temporal server; without it plnt starts the embedded dev server.")
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """Run plnt: Temporal, a worker, the reconciler and the gateway; deploy through local runner processes."""
    _setup_logging(verbose)
    settings = Settings(repo=repo, path=path, branch=branch, state_dir=state_dir, host=host, port=port,
                        interval_s=interval, temporal_address=temporal_address)
    problem = _port_problem(host, port)
    if problem:
        typer.echo(f"error: {problem}", err=True)
        raise typer.Exit(2)
    try:
        asyncio.run(_up(settings))
    except KeyboardInterrupt:
        pass
    except Exception as exc:  # noqa: BLE001 - one clear line, not a traceback, for start-up failures
        from plnt.gateway.server import ServerStartError

        from .errors import PlntError

        if not isinstance(exc, (PlntError, ServerStartError, OSError)):
            raise
        typer.echo(f"error: plnt could not start: {exc}", err=True)
        raise typer.Exit(2) from exc


def _port_problem(host: str, port: int) -> str | None:
    import socket

    if port == 0:
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return f"cannot listen on {host}:{port} ({exc.strerror}); is another plnt running? choose a port with --port"
    return None


async def _up(settings: Settings) -> None:
    from .app import start  # heavy imports only for `up`

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    plnt = await start(settings)
    typer.echo(f"plnt is up: gateway {plnt.url}  (GET /workflows, POST /workflows/NAME/invoke); Ctrl-C stops", err=True)
    await stop.wait()
    typer.echo("plnt: stopping (runners, worker, gateway, Temporal)...", err=True)
    await plnt.stop()
    typer.echo("plnt: stopped", err=True)


@app.command()
def validate(path: Annotated[Path, typer.Argument(help="A spec directory or a single YAML file.")]) -> None:
    """Check specs: exit 0 with a summary, or one FILE:LINE: field: message line per problem and exit 1."""
    if not path.exists():
        typer.echo(f"{path}: no such file or directory", err=True)
        raise typer.Exit(2)
    note = ""
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:  # as a directory reports an unreadable file
            specs, problems = SpecSet(), [Problem(str(path), 1, "document", f"cannot read file: {exc}; save it as UTF-8 text")]
        else:
            specs, problems = load_sources([SourceFile(path=str(path), text=text)], check_references=None)
            if specs.workflow_runs and not specs.backends:
                note = " (backend references not checked: the file declares no PlntBackend; validate the directory)"
    else:
        # Display paths include PATH, in problem lines and in messages pointing at another file.
        files, read_problems = read_tree(path)
        specs, problems = load_sources([SourceFile(path=str(path / f.path), text=f.text) for f in files])
        problems = sorted([Problem(str(path / p.file), p.line, p.field, p.message) for p in read_problems] + problems,
                          key=lambda p: (p.file, p.line))
    if problems:
        for problem in problems:
            typer.echo(str(problem))
        typer.echo(f"{len(problems)} problem{'s' if len(problems) != 1 else ''} found", err=True)
        raise typer.Exit(1)
    typer.echo(f"{path}: valid: {_counts(specs)}{note}")


def _counts(specs: SpecSet) -> str:
    return (f"{len(specs.workflow_runs)} WorkflowRun(s), {len(specs.backends)} PlntBackend(s), "
            f"{len(specs.recipes)} recipe Workflow(s)")


@app.command()
def plan(
    repo: Annotated[str, typer.Option(help="Spec repository: a path or URL.")],
    path: Annotated[str, typer.Option(help="Subdirectory holding the specs.")] = "",
    branch: Annotated[str, typer.Option(help="Branch (when --head is not given).")] = "main",
    base: Annotated[str | None, typer.Option(help="Base revision: plan what --head changes relative to it.")] = None,
    head: Annotated[str | None, typer.Option(help="Head revision (default: the branch).")] = None,
    state_dir: Annotated[Path, typer.Option(help="State of a plnt up, for a plan against live state.")] = Path(".plnt"),
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.text,
) -> None:
    """What would change: against the live state in --state-dir, or between --base and --head (a pull request)."""
    from .plan import DesiredRun, LiveRun, render_markdown, render_text
    from .plan import plan as make_plan
    from .source import GitSource, SourceError

    with tempfile.TemporaryDirectory(prefix="plnt-plan-") as scratch:
        source = GitSource(repo, Path(scratch) / "clone", branch=branch, path=path)
        try:
            head_commit = source.resolve(head) if head else source.fetch()
            desired_specs = _load_or_exit(source, head_commit)
            desired = {k: DesiredRun.from_spec(r) for k, r in desired_specs.workflow_runs.items()}
            if base is not None:
                base_commit = source.resolve(base)
                base_specs = _load_or_exit(source, base_commit)
                live = {
                    key: LiveRun(namespace=d.namespace, name=d.name, version=d.version, fingerprint=d.fingerprint, spec=d.spec)
                    for key, d in ((k, DesiredRun.from_spec(r)) for k, r in base_specs.workflow_runs.items())
                }
                title = f"plnt plan {base_commit[:12]}..{head_commit[:12]}"
            else:
                live = _live_from_state(state_dir)
                title = f"plnt plan {head_commit[:12]} against {state_dir}"
        except SourceError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    items = make_plan(desired, live)
    if format is Format.json:
        typer.echo(json.dumps({"head": head_commit, "base": base_commit if base else None,
                               "items": [i.to_json() for i in items]}, indent=2))
    elif format is Format.markdown:
        typer.echo(render_markdown(items, title=title), nl=False)
    else:
        typer.echo(f"{title}\n" + render_text(items), nl=False)


def _load_or_exit(source: Any, commit: str) -> SpecSet:
    specs, problems = load_sources(source.spec_files(commit))
    if problems:
        typer.echo(f"commit {commit[:12]} has invalid specs:", err=True)
        for problem in problems:
            typer.echo(str(problem), err=True)
        raise typer.Exit(1)
    return specs


def _live_from_state(state_dir: Path) -> dict[str, Any]:
    from .plan import live_from
    from .state import LiveWorkflow, read_json
    from .status import WorkflowRunStatus

    statuses = [WorkflowRunStatus.model_validate(v) for v in (read_json(state_dir / "status.json", {}) or {}).values()]
    records = sorted((state_dir / "releases").glob("*.json")) if (state_dir / "releases").exists() else []
    releases = {item.key: item for item in (LiveWorkflow.model_validate(read_json(r)) for r in records)}
    return live_from(releases, statuses)


@app.command()
def status(
    url: Annotated[str, typer.Option(help="Gateway of a running plnt up.")] = "http://127.0.0.1:8000",
    state_dir: Annotated[Path, typer.Option(help="Read this state directory if the gateway does not answer.")] = Path(".plnt"),
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON (the shape of GET /workflows).")] = False,
) -> None:
    """Each WorkflowRun's phase, version, canary share, endpoint, commit and message."""
    source: dict[str, Any] = {}
    try:
        with httpx.Client(trust_env=False, timeout=5) as client:
            rows = client.get(f"{url}/workflows").raise_for_status().json()
            if not isinstance(rows, list):
                raise ValueError(f"GET {url}/workflows did not answer a list")
            with contextlib.suppress(httpx.HTTPError, ValueError):
                source = client.get(f"{url}/source").raise_for_status().json()
    except (httpx.HTTPError, ValueError):  # nothing there, or something that is not plnt (HTML, other JSON)
        from .state import read_json
        from .status import WorkflowRunStatus

        if not (state_dir / "status.json").exists():
            typer.echo(f"error: no plnt answers at {url} and {state_dir} holds no status; is plnt up running?", err=True)
            raise typer.Exit(2) from None
        typer.echo(f"(no plnt answers at {url}; showing the last status saved in {state_dir})", err=True)
        raw = read_json(state_dir / "status.json", {}) or {}
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
        typer.echo(f"{row['namespace'] + '/' + row['name']:<34} {row['phase']:<11} {row.get('version') or '-':<10} "
                   f"{canary:<14} {(row.get('observedCommit') or '-')[:12]:<13} {row.get('endpoint') or '-':<24} {row.get('message') or ''}")


recipe_app = typer.Typer(help="Recipe authors' commands.", no_args_is_help=True)
app.add_typer(recipe_app, name="recipe")


@recipe_app.command("digest")
def recipe_digest(directory: Annotated[Path, typer.Argument(help="A recipe directory (holding workflow.yaml).")]) -> None:
    """Print the canonical directory digest that `spec.workflow.integrityHash` pins."""
    from plnt.runner.recipe import directory_digest

    if not (directory / "workflow.yaml").is_file():
        typer.echo(f"{directory}: no workflow.yaml here; give a recipe directory (<registry>/<name>/<version>/)", err=True)
        raise typer.Exit(2)
    try:
        typer.echo(directory_digest(directory))
    except ValueError as exc:
        typer.echo(f"{directory}: {exc}", err=True)
        raise typer.Exit(1) from exc


def main() -> None:
    app()


if __name__ == "__main__":
    main()
