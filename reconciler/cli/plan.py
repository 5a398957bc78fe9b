"""`plnt plan`: what would change, against a plnt up's live state or between two revisions (the
same plan as the UI's preview, plan/view.py)."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import Annotated, Any

import typer
from plnt.reconciler.cli.lazy import command_app

app = command_app()


class Format(str, enum.Enum):
    text = "text"
    json = "json"
    markdown = "markdown"


@app.command()
def plan(
    repo: Annotated[str, typer.Option(envvar="PLNT_REPO", help="Spec repository: a path or URL (or PLNT_REPO).")],
    path: Annotated[str, typer.Option(help="Subdirectory holding the specs.")] = "",
    branch: Annotated[str, typer.Option(help="Branch (when --head is not given).")] = "main",
    base: Annotated[str | None, typer.Option(help="Base revision: plan what --head changes relative to it.")] = None,
    head: Annotated[str | None, typer.Option(help="Head revision (default: the branch).")] = None,
    state_dir: Annotated[Path, typer.Option(help="State of a plnt up, for a plan against live state.")] = Path(".plnt"),
    format: Annotated[Format, typer.Option("--format", "-f")] = Format.text,
    cache_dir: Annotated[Path | None, typer.Option(
        envvar="PLNT_CACHE_DIR", help="Where parsed spec files are kept between plans, by git blob id "
        "(default: $XDG_CACHE_HOME/plnt or ~/.cache/plnt; or PLNT_CACHE_DIR).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Parse every spec file; read and write no cache.")] = False,
) -> None:
    """What would change: against the live state in --state-dir, or between --base and --head (a pull request)."""
    import json
    import tempfile

    from plnt.core.specs.loader import DEFAULT_LIMITS
    from plnt.reconciler.plan.view import InvalidRevision, InvalidSpecsAt, plan_between
    from plnt.reconciler.source.git import GitSource, SourceError
    from plnt.reconciler.source.parse_cache import DiskParseCache

    with tempfile.TemporaryDirectory(prefix="plnt-plan-") as scratch:
        source = GitSource(repo, Path(scratch) / "clone", branch=branch, path=path)
        # Files unchanged since the last plan are not parsed again (base and head share one cache anyway).
        disk = None if no_cache else DiskParseCache(cache_dir or _default_cache_dir(), DEFAULT_LIMITS)
        if disk is not None:
            source.parse_cache = disk
        try:
            # The same plan as the UI's preview (GET /plan): plan_view.plan_between.
            view = plan_between(source, head=head, base=base, live=lambda: _live_from_state(state_dir),
                                live_label=str(state_dir))
        except InvalidSpecsAt as exc:
            typer.echo(f"commit {exc.commit[:12]} has invalid specs:", err=True)
            for problem in exc.problems:
                typer.echo(str(problem), err=True)
            raise typer.Exit(1) from exc
        except (SourceError, InvalidRevision) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if disk is not None:
            disk.save()
    if format is Format.json:
        typer.echo(json.dumps(view.cli_json(), indent=2))
    elif format is Format.markdown:
        typer.echo(view.markdown(), nl=False)
    else:
        typer.echo(view.text(), nl=False)


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "plnt"


def _live_from_state(state_dir: Path) -> dict[str, Any]:
    from plnt.core.status import WorkflowRunStatus
    from plnt.reconciler.plan.diff import live_from
    from plnt.reconciler.state import LiveWorkflow, read_json
    from plnt.reconciler.status_store import read_statuses

    statuses = [WorkflowRunStatus.model_validate(v) for v in read_statuses(state_dir / "status.json").values()]
    records = sorted((state_dir / "releases").glob("*.json")) if (state_dir / "releases").exists() else []
    releases = {item.key: item for item in (LiveWorkflow.model_validate(read_json(r)) for r in records)}
    return live_from(releases, statuses)
