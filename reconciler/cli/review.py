"""`plnt review`: the plan of a pull request, posted on it (one comment, the `plnt/plan` status) from
its CI job. Logic in review/plan_review.py; this is options, exit codes and output.

Exit codes: 0 the plan was made (and posted); 1 the plan cannot be made (invalid specs, a recipe that
cannot be trusted): a required check then blocks the merge; 2 bad options or an unreadable
repository/revision; 3 the forge refused the token or is unavailable (down, rate-limiting, or answering
something that is not its API: a body that is not JSON, or JSON of another shape).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.common import fail, secret_from, setup_logging
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import ReviewRegistryAccessOptions, SpecLimitOptions, Verbose, with_option_groups
from plnt.reconciler.redact import redact

if TYPE_CHECKING:  # review/plan_review.py pulls in the registries: imported when the command runs
    from plnt.reconciler.review.plan_review import Review

Echo = Callable[..., None]

FORGES = ("github", "gitlab", "gitea")

app = command_app()


@app.command()
@with_option_groups
def review(
    *,
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
    registries: ReviewRegistryAccessOptions,
    limits: SpecLimitOptions,
    format: Annotated[str, typer.Option("--format", "-f", help="What goes to stdout: markdown (the comment) or json.")] = "markdown",
    verbose: Verbose = False,
) -> None:
    """The plan of a pull request (BASE...HEAD) with its recipes verified, as one comment on the PR and
    a commit status plnt/plan carrying the plan digest that --require-approval binds approvals to.
    Exit 0 plan made, 1 plan cannot be made (invalid specs, untrusted recipe), 2 bad options, 3 forge error."""
    import asyncio
    import shutil
    import tempfile

    from plnt.reconciler.errors import InvalidSpec
    from plnt.reconciler.recipes.pull import RecipeCache
    from plnt.reconciler.review.plan_review import dumps, make_review, render_comment, status_of
    from plnt.reconciler.source.git import GitSource, SourceError

    setup_logging(verbose)
    if format not in ("markdown", "json"):
        raise fail(f"--format must be markdown or json, not {format!r}", 2)
    token = None
    if forge is not None:
        if forge not in FORGES:
            raise fail(f"--forge must be one of {', '.join(FORGES)}, not {forge!r}", 2)
        missing = [o for o, v in (("--api-url", api_url), ("--project", project), ("--pr", pr)) if not v]
        if missing:
            raise fail(f"--forge {forge} needs {', '.join(missing)}", 2)
        token = secret_from(token_env, token_file, "--token")
        if token is None:
            raise fail(f"--forge {forge} needs a token: --token-env NAME or --token-file FILE", 2)
    elif pr is not None:
        raise fail("--pr needs --forge (and --api-url, --project, a token)", 2)

    def echo(text: str, err: bool = False, nl: bool = True) -> None:
        typer.echo(redact(text, *(t for t in (token,) if t)), err=err, nl=nl)

    options = registries.registry_options()
    scratch = Path(tempfile.mkdtemp(prefix="plnt-review-"))
    try:
        try:
            source = GitSource(repo, scratch / "clone", path=path)
            base, head = (_as_in_checkout(repo, rev) for rev in (base, head))
            result = make_review(source, base, head, cache=RecipeCache(cache_dir or scratch / "recipes"),
                                 registry_options=options, limits=limits.limits())
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


def _as_in_checkout(repo: str, rev: str) -> str:
    """`rev` as the CI job's checkout reads it, when --repo is one: there `origin/main` is the remote's
    main as last fetched, while in plnt's own clone of the checkout it would be the checkout's local
    `main` branch, stale or missing (found against a real forge). A revision the checkout does not know
    is left to plnt's clone."""
    import subprocess

    if not Path(repo).is_dir():
        return rev
    done = subprocess.run(["git", "-C", repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else rev


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
