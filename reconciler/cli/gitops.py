"""What `plnt scale` and `plnt rollback` share: their options (the spec repository, as `plnt up` names
it, and the forge that gets the pull request), and the one way they change anything: an edit of the
spec file committed on a new branch with a pull request, or, with --commit-to-branch, committed to the
tracked branch (reconciler/review/proposals.py). Never the live state behind git's back.

Exit 0 done (the pull request's URL, or the commit, on stdout), 1 refused (nothing changed: no such
resource, nothing to change, the branch exists, a version never promoted), 2 bad options or plnt
cannot be reached, 3 git or the forge failed (the message says what was pushed)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from plnt.reconciler.cli.common import fail, secret_from
from plnt.reconciler.cli.options import (
    ForgeApiUrl,
    ForgeProject,
    ForgeTokenEnv,
    ForgeTokenFile,
    GitCredentialsFile,
    GitKnownHosts,
    OptionGroup,
    SpecPath,
)

if TYPE_CHECKING:
    from plnt.core.specs.edit import FieldPath
    from plnt.reconciler.review.proposals import Located


@dataclasses.dataclass(frozen=True)
class ChangeOptions(OptionGroup):
    """Where the change goes: the spec repository (as plnt up reads it) and its forge."""

    panel = "Spec repository and forge"

    repo: Annotated[str | None, typer.Option(envvar="PLNT_REPO", help=(
        "Spec repository plnt tracks: a path, file://, https:// or ssh URL (or PLNT_REPO); required. Credentials "
        "in an https URL are never shown; prefer --git-credentials-file."))] = None
    path: SpecPath = ""
    branch: Annotated[str, typer.Option(help="The branch plnt tracks: the pull request's base.")] = "main"
    git_credentials_file: GitCredentialsFile = None
    git_known_hosts: GitKnownHosts = None
    forge: Annotated[str | None, typer.Option(help="The repository's forge (github, gitlab or gitea): where the "
                                                   "pull request is opened.")] = None
    forge_api_url: ForgeApiUrl = None
    forge_project: ForgeProject = None
    forge_token_env: ForgeTokenEnv = None
    forge_token_file: ForgeTokenFile = None
    commit_to_branch: Annotated[bool, typer.Option("--commit-to-branch", help=(
        "Commit straight to the tracked branch instead of opening a pull request. Works only where the "
        "repository lets you push to that branch: its protection on the forge is the operator's switch."))] = False

    def check(self) -> None:
        """Exit 2 naming what is missing."""
        if not self.repo:
            raise fail("--repo (or PLNT_REPO) is required: the spec repository plnt tracks", 2)
        if self.commit_to_branch:
            return
        missing = [option for option, value in (("--forge", self.forge), ("--forge-api-url", self.forge_api_url),
                                                ("--forge-project", self.forge_project),
                                                ("--forge-token-env or --forge-token-file",
                                                 self.forge_token_env or self.forge_token_file)) if not value]
        if missing:
            raise fail(f"a pull request needs {', '.join(missing)} (or --commit-to-branch, where the tracked branch "
                       "takes direct pushes)", 2)
        if self.forge not in ("github", "gitlab", "gitea"):
            raise fail(f"--forge must be github, gitlab or gitea, not {self.forge!r}", 2)


@dataclasses.dataclass(frozen=True)
class Change:
    """What a verb asks for, in words for the branch, the commit and the pull request."""

    verb: str          # scale | rollback
    summary: str       # "scale default/review-responder to 3 replicas"
    branch: str        # plnt/scale-review-responder-3


def who() -> str:
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def branch_name(verb: str, namespace: str, name: str, what: str) -> str:
    return f"plnt/{verb}-{'' if namespace == 'default' else namespace + '-'}{name}-{what}"


def propose(options: ChangeOptions, namespace: str, name: str,
            changes_for: Callable[[Located, Callable[[Located, str], object]], tuple[Change, Mapping[FieldPath, str | int | None]]]) -> None:
    """Clone, locate namespace/name, edit as `changes_for` says, commit, push, open the pull request
    (or commit to the tracked branch); print the URL (or the commit). `changes_for` gets the located
    resource and a way to read it at an earlier version (SpecCheckout.at_version)."""
    import asyncio
    import tempfile

    from plnt.reconciler.errors import InvalidSpec
    from plnt.reconciler.review.proposals import ProposalFailed, ProposalRefused, SpecCheckout, open_pull_request

    options.check()
    token = None if options.commit_to_branch else secret_from(options.forge_token_env, options.forge_token_file,
                                                              "--forge-token")
    assert options.repo is not None
    with tempfile.TemporaryDirectory(prefix="plnt-change-") as scratch:
        try:
            checkout = SpecCheckout(options.repo, Path(scratch) / "specs", branch=options.branch, path=options.path,
                                    credentials_file=options.git_credentials_file, known_hosts=options.git_known_hosts)
        except InvalidSpec as exc:  # credentials given twice, or unreadable
            raise fail(str(exc), 2) from exc
        try:
            checkout.clone()
            located = checkout.locate(namespace, name)
            change, changes = changes_for(located, checkout.at_version)
            if not checkout.edit(located, changes):
                raise ProposalRefused(f"{located.file} already says so: nothing to {change.verb}")
            body = (f"{change.summary[0].upper()}{change.summary[1:]}, asked by {who()} with `plnt {change.verb}`.\n\n"
                    "Merging this deploys it as any change to the specs: plnt plans it and rolls it out.")
            message = f"{change.summary[0].upper()}{change.summary[1:]}\n\n{body}"
            done = checkout.commit_and_push(located, message, None if options.commit_to_branch else change.branch)
            if options.commit_to_branch:
                typer.echo(f"{located.file}: committed {done.commit[:12]} to {done.branch} of {checkout.url}: "
                           f"{change.summary}")
                return
            from plnt.reconciler.review.forge import make_forge

            async def opened() -> str | None:
                assert options.forge and options.forge_api_url and options.forge_project and token
                forge = make_forge(options.forge, options.forge_api_url, options.forge_project, token)
                try:
                    title = f"{change.summary[0].upper()}{change.summary[1:]}"
                    return (await open_pull_request(forge, done, options.branch, title, body)).url
                finally:
                    await forge.aclose()

            url = asyncio.run(opened())
        except ProposalRefused as exc:
            raise fail(str(exc), 1) from exc
        except ProposalFailed as exc:
            raise fail(str(exc), 3) from exc
    typer.echo(f"{located.file}: {change.summary} on branch {done.branch}; pull request:", err=True)
    typer.echo(url)
