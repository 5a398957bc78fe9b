"""`plnt rollback NAME [--to VERSION]`: a WorkflowRun or ModelDeployment rolled back in git, never in
the live state behind its back: the spec file names the earlier release again (its recipe ref and
integrityHash, or its model version and rootDigest, as the file's history had them when that version
was deployed) in a commit on a new branch `plnt/rollback-NAME-VERSION` with a pull request; or, with
--commit-to-branch, a commit on the tracked branch. Once merged, plnt rolls it out as any change.

Without --to: the newest version plnt promoted (its rollouts, GET /workflows/NAME/rollouts) other
than the one the spec names now. A version plnt never promoted is refused unless --force.

Exit 0 done (the pull request's URL on stdout), 1 refused (nothing changed), 2 bad options or plnt
cannot be reached, 3 git or the forge failed."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from plnt.reconciler.cli.common import api_answer, api_get, auth_headers, fail, secret
from plnt.reconciler.cli.gitops import Change, ChangeOptions, branch_name, propose, who
from plnt.reconciler.cli.lazy import command_app
from plnt.reconciler.cli.options import Token, TokenFile, with_option_groups

app = command_app()


@app.command()
@with_option_groups
def rollback(
    *,
    name: Annotated[str, typer.Argument(help="WorkflowRun or ModelDeployment name.")],
    to: Annotated[str | None, typer.Option(help=(
        "The version to roll back to (default: the newest promoted one other than the spec's now)."))] = None,
    force: Annotated[bool, typer.Option("--force", help="Roll back to --to even if plnt never promoted it (or "
                                                         "without asking plnt).")] = False,
    now: Annotated[bool, typer.Option("--now", help=(
        "Also pin the stable release to the version at once (admin scope): plnt deploys it again from the "
        "commit that last promoted it, promoted as soon as it is installed, and holds it, shown as drift, until "
        "the commit naming it lands."))] = False,
    reason: Annotated[str, typer.Option(help="Why, recorded with the pin (--now).")] = "",
    namespace: Annotated[str, typer.Option(help="Its namespace.")] = "default",
    url: Annotated[str, typer.Option(help="Gateway of the running plnt that knows the promoted versions.")] = (
        "http://127.0.0.1:8000"),
    token: Token = None,
    token_file: TokenFile = None,
    change: ChangeOptions,
) -> None:
    """Roll a WorkflowRun or ModelDeployment back to an earlier promoted version in git: a commit on a new
    branch and a pull request (or, with --commit-to-branch, on the tracked branch). Prints its URL."""
    if to is None and force:
        raise fail("--force needs --to VERSION: the version to roll back to", 2)
    if now and force:
        raise fail("--now pins only a version plnt promoted: leave out --force", 2)
    change.check()
    token = secret(token, token_file, "--token")
    promoted: list[str] | None = None
    if not (force and to):
        promoted = promoted_versions(api_get(url, f"/workflows/{name}/rollouts", token,
                                             {"namespace": namespace, "limit": "100"}))

    def changes_for(located: Any, at_version: Any) -> tuple[Change, dict[tuple[str, ...], Any]]:
        from plnt.reconciler.review.proposals import ProposalRefused

        current = located.resource.version
        try:
            target = pick_version(current, to, promoted)
        except ValueError as exc:
            raise ProposalRefused(f"{namespace}/{name}: {exc}") from exc
        old = at_version(located, target)
        try:
            changes = release_fields(located.kind, located.resource, old, target)
        except ValueError as exc:
            raise ProposalRefused(f"{located.file}: {exc}") from exc
        if now:  # before the commit: the pin holds until the commit made next lands
            typer.echo(pin(url, token, namespace, name, target, reason), err=True)
        summary = f"roll {namespace}/{name} back to {target} (from {current})"
        return Change("rollback", summary, branch_name("rollback", namespace, name, target)), changes

    propose(change, namespace, name, changes_for)


def pin(url: str, token: str | None, namespace: str, name: str, version: str, reason: str) -> str:
    """POST /workflows/NAME/pin: plnt's answer, or exit (1 refused, 2 unreachable or not admin)."""
    import httpx

    try:
        with httpx.Client(trust_env=False, timeout=30, headers=auth_headers(token)) as client:
            response = client.post(f"{url}/workflows/{name}/pin", params={"namespace": namespace},
                                   json={"version": version, "by": who(), "reason": reason})
    except httpx.HTTPError as exc:
        raise fail(f"no plnt answers at {url} ({exc}); is plnt up running? (--url)", 2) from exc
    return f"{namespace}/{name}: {api_answer(response)['message']}"


def promoted_versions(rollouts: Any) -> list[str]:
    """The versions plnt promoted (a saga that ended Ready), newest first, each once."""
    versions: list[str] = []
    for rollout in rollouts if isinstance(rollouts, list) else []:
        version = rollout.get("version")
        if rollout.get("phase") == "Ready" and rollout.get("action") != "uninstall" and version and version not in versions:
            versions.append(version)
    return versions


def pick_version(current: str, to: str | None, promoted: list[str] | None) -> str:
    """The version to roll back to: `to` (checked against `promoted` unless None: --force), or the
    newest promoted one other than `current`. ValueError says why none."""
    if to is not None:
        if to == current:
            raise ValueError(f"the spec names {to} already: nothing to roll back")
        if promoted is not None and to not in promoted:
            listed = ", ".join(promoted) or "none"
            raise ValueError(f"plnt never promoted {to} (promoted, newest first: {listed}); --force rolls back to it "
                             "anyway")
        return to
    earlier = [v for v in promoted or [] if v != current]
    if not earlier:
        raise ValueError(f"no promoted version other than {current} to roll back to (promoted: "
                         f"{', '.join(promoted or []) or 'none'})")
    return earlier[0]


def release_fields(kind: str, current: Any, old: Any, version: str) -> dict[tuple[str, ...], Any]:
    """The fields that name a release, as they were when `version` was deployed (`old`, from the file's
    history); without that history, a WorkflowRun's ref alone when nothing pins it."""
    if kind == "WorkflowRun":
        workflow = current.spec.workflow
        if old is None:
            if workflow.integrity_hash is not None:
                raise ValueError(f"{version} is not in this file's history, so its integrityHash is unknown: edit "
                                 "the file by hand (`plnt recipe digest` prints the pin)")
            return {("spec", "workflow", "ref"): f"{workflow.name}@{version}"}
        was = old.spec.workflow
        return {("spec", "workflow", "ref"): was.ref, ("spec", "workflow", "registry"): was.registry,
                ("spec", "workflow", "integrityHash"): was.integrity_hash}
    if old is None:
        raise ValueError(f"{version} is not in this file's history, so its rootDigest is unknown: edit the file by "
                         "hand (`plnt model manifest` prints it)")
    model = old.spec.model
    return {("spec", "model", key): value for key, value in (
        ("registry", model.registry), ("name", model.name), ("version", model.version),
        ("rootDigest", model.root_digest))}
