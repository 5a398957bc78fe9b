"""`plnt review`: the plan of a pull request, posted on it (one comment, the `plnt/plan` status) from
its CI job. Logic in review/plan_review.py; this is options, exit codes and output.

Exit codes: 0 the plan was made (and posted); 1 the plan cannot be made (invalid specs, a recipe that
cannot be trusted): a required check then blocks the merge; 2 bad options or an unreadable
repository/revision; 3 the forge refused the token or is unavailable (down, rate-limiting, or answering
something that is not its API: a body that is not JSON, or JSON of another shape).
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.main import MaxSpecFileKb, MaxSpecFiles, _fail, _secret_from, _setup_logging, _spec_limits, app
from plnt.reconciler.redact import redact

if TYPE_CHECKING:  # review/plan_review.py pulls in the registries: imported when the command runs
    from plnt.reconciler.review.plan_review import Review

Echo = Callable[..., None]

FORGES = ("github", "gitlab", "gitea")


@app.command()
def review(
    repo: Annotated[str, typer.Option(envvar="PLNT_REPO", help=(
        "Spec repository: a path (the CI job's checkout, e.g. '.'), file://, https:// or ssh URL.")
    )],
    base: Annotated[str, typer.Option(help=(
        "The pull request's target: a sha or branch. The plan starts from `git merge-base BASE HEAD`."))],
    head: Annotated[str, typer.Option(help="The pull request's head commit (sha or branch).")],
    path: Annotated[str, typer.Option(help="Subdirectory of the repository holding the specs.")] = "",
    forge: Annotated[str | None, typer.Option(help=(
        "github, gitlab or gitea: post the plan on --pr there. Without it the comment is printed (any CI)."))] = None,
    api_url: Annotated[str | None, typer.Option(help=(
        "The forge's REST API: https://api.github.com, https://gitlab.example/api/v4, https://gitea.example/api/v1."))] = None,
    project: Annotated[str | None, typer.Option(help="OWNER/REPO on the forge (GitLab: the project's full path).")] = None,
    pr: Annotated[int | None, typer.Option(help="Pull (merge) request number (GitLab: the MR's iid).", min=1)] = None,
    token_env: Annotated[str | None, typer.Option(help="NAME of the environment variable holding the forge token.")] = None,
    token_file: Annotated[Path | None, typer.Option(help="File holding the forge token.")] = None,
    target_url: Annotated[str | None, typer.Option(help="Link of the plnt/plan status (e.g. the CI job's page).")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help=(
        "Recipe cache (verified entries are re-verified on every use); default: a fresh temporary directory."))] = None,
    s3_endpoint_url: Annotated[str | None, typer.Option(help="S3-compatible endpoint for s3:// registries.")] = None,
    s3_region: Annotated[str | None, typer.Option(help="Region for s3:// registries.")] = None,
    oci_insecure_host: Annotated[list[str] | None, typer.Option(
        help="OCI registry (host or host:port) allowed over plain HTTP. Repeatable.")] = None,
    allow_file_registry: Annotated[list[Path] | None, typer.Option(
        help="Directory under which file:/// registries may be read (file:rel/dir inside the repository always "
             "works). Repeatable.")] = None,
    max_download_mb: Annotated[int, typer.Option(min=1, help="Stop a recipe download past this many MiB.")] = 256,
    max_spec_files: MaxSpecFiles = 10_000,
    max_spec_file_kb: MaxSpecFileKb = 1024,
    format: Annotated[str, typer.Option("--format", "-f", help="What goes to stdout: markdown (the comment) or json.")] = "markdown",
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    """The plan of a pull request (BASE...HEAD) with its recipes verified, as one comment on the PR and
    a commit status plnt/plan carrying the plan digest that --require-approval binds approvals to.
    Exit 0 plan made, 1 plan cannot be made (invalid specs, untrusted recipe), 2 bad options, 3 forge error."""
    from plnt.reconciler.errors import InvalidSpec
    from plnt.reconciler.recipes.pull import RecipeCache
    from plnt.reconciler.recipes.registries import RegistryOptions
    from plnt.reconciler.review.plan_review import dumps, make_review, render_comment, status_of
    from plnt.reconciler.source.git import GitSource, SourceError

    _setup_logging(verbose)
    if format not in ("markdown", "json"):
        raise _fail(f"--format must be markdown or json, not {format!r}", 2)
    token = None
    if forge is not None:
        if forge not in FORGES:
            raise _fail(f"--forge must be one of {', '.join(FORGES)}, not {forge!r}", 2)
        missing = [o for o, v in (("--api-url", api_url), ("--project", project), ("--pr", pr)) if not v]
        if missing:
            raise _fail(f"--forge {forge} needs {', '.join(missing)}", 2)
        try:
            token = _secret_from(token_env, token_file, "--token")
        except ValueError as exc:
            raise _fail(str(exc), 2) from exc
        if token is None:
            raise _fail(f"--forge {forge} needs a token: --token-env NAME or --token-file FILE", 2)
    elif pr is not None:
        raise _fail("--pr needs --forge (and --api-url, --project, a token)", 2)

    def echo(text: str, err: bool = False, nl: bool = True) -> None:
        typer.echo(redact(text, *(t for t in (token,) if t)), err=err, nl=nl)

    options = RegistryOptions(s3_endpoint_url=s3_endpoint_url, s3_region=s3_region,
                              allow_insecure_http=tuple(oci_insecure_host or ()),
                              max_download_bytes=max_download_mb * 2**20,
                              file_roots=tuple(str(p.resolve()) for p in allow_file_registry or ()))
    scratch = Path(tempfile.mkdtemp(prefix="plnt-review-"))
    try:
        try:
            source = GitSource(repo, scratch / "clone", path=path)
            result = make_review(source, base, head, cache=RecipeCache(cache_dir or scratch / "recipes"),
                                 registry_options=options, limits=_spec_limits(max_spec_files, max_spec_file_kb))
        except (SourceError, InvalidSpec) as exc:
            echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    echo(dumps(result) if format == "json" else render_comment(result), nl=format == "json")
    state, description = status_of(result)
    if forge is not None:
        assert api_url and project and pr and token
        code = asyncio.run(_post(forge, api_url, project, token, pr, result, target_url, echo))
        if code:
            raise typer.Exit(code)
    else:
        echo(f"plnt/plan: {state}: {description}" + (f" (digest {result.digest})" if result.digest else ""), err=True)
    if not result.ok:
        raise typer.Exit(1)


async def _post(kind: str, api_url: str, project: str, token: str, pr: int, result: Review,
                target_url: str | None, echo: Echo) -> int:
    """Post the comment and the status; 0, or 3 with what to do (2 for a malformed --project)."""
    from plnt.reconciler.review.forge import ForgeError, ForgeRefused, ForgeUnavailable, make_forge
    from plnt.reconciler.review.plan_review import post

    try:
        client = make_forge(kind, api_url, project, token)
    except ValueError as exc:
        echo(f"error: --project: {exc}", err=True)
        return 2
    try:
        parts, state, description = await post(client, pr, result, target_url=target_url)
    except ForgeError as exc:
        advice = ("check the token and its permissions (comments on pull requests, commit statuses)"
                  if isinstance(exc, ForgeRefused) else
                  "the forge is unavailable, rate-limiting or answered something that is not its API: re-run the job"
                  if isinstance(exc, ForgeUnavailable) else
                  "check --api-url, --project and --pr")
        echo(f"error: could not post the plan on {kind} {project} #{pr}: {type(exc).__name__}: {exc}; {advice}", err=True)
        return 3
    finally:
        await client.aclose()
    echo(f"posted the plan on {kind} {project} #{pr} ({parts} comment{'s' if parts != 1 else ''}); "
         f"status plnt/plan on {result.head[:12]}: {state}: {description}"
         + (f" (digest {result.digest})" if result.digest else ""), err=True)
    return 0
