"""A change to the live state proposed through git, never made behind its back (plnt scale, plnt
rollback): a clone of the spec repository, a minimal textual edit of the file that defines the
resource (core/specs/edit.py), a commit on a new branch pushed to the repository and a pull request
opened on its forge, so review and approval apply as to any change; or, with `commit_to_branch`, the
commit pushed straight to the tracked branch, which succeeds only where the repository lets the
person push there (the forge's branch protection is the operator's switch).

Errors say what to do next: `ProposalRefused` (nothing done: no such resource, nothing to change, the
branch exists already, a version never promoted), `ProposalFailed` (git or the forge failed: the
message says which step and whether something was pushed).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from plnt.core.specs.edit import EditRefused, FieldPath, edit_resource, find_resource
from plnt.core.specs.loader import SourceFile, load_sources, read_tree
from plnt.core.specs.models import Deployable
from plnt.reconciler.review.forge import Forge, ForgeError
from plnt.reconciler.source.git import GitSource

KINDS = ("WorkflowRun", "ModelDeployment")


class ProposalRefused(Exception):
    """Nothing was changed: the reason says what to fix."""


class ProposalFailed(Exception):
    """git or the forge failed on the way; the message says at which step, and what was pushed."""


@dataclass(frozen=True)
class Located:
    kind: str
    file: str  # relative to the repository's root
    resource: Deployable


@dataclass(frozen=True)
class Proposed:
    """What was done: the pull request's URL, or the commit pushed to the tracked branch."""

    commit: str
    branch: str
    url: str | None = None  # the pull request, when one was opened


class SpecCheckout:
    """A clone of the spec repository with a work tree, made with plnt's credentials handling
    (reconciler/source/git.py: never on a command line, never in the clone's config)."""

    def __init__(self, repo: str, work: Path, *, branch: str = "main", path: str = "",
                 credentials_file: Path | None = None, known_hosts: Path | None = None) -> None:
        self._source = GitSource(repo, work.parent / f"{work.name}-credentials" / "unused", branch=branch, path=path,
                                 credentials_file=credentials_file, known_hosts=known_hosts)
        self.url = self._source.url  # without credentials: safe to show
        self.branch = branch
        self.path = path.strip("/")
        self.work = work

    def git(self, *args: str, what: str) -> str:
        try:
            done = subprocess.run(["git", *args], cwd=self.work if self.work.exists() else None, capture_output=True,
                                  text=True, env={**os.environ, **self._source.git_env}, timeout=120, check=False)
        except subprocess.TimeoutExpired:
            raise ProposalFailed(f"{what}: git {args[0]} timed out after 120 s") from None
        if done.returncode != 0:
            reason = self._source.redacted(" ".join(done.stderr.split()) or f"exit {done.returncode}")
            raise ProposalFailed(f"{what}: {reason}")
        return done.stdout.strip()

    def clone(self) -> None:
        self.git("clone", "-q", "--branch", self.branch, self.url, str(self.work),
                 what=f"cannot clone branch {self.branch} of {self.url}")

    def locate(self, namespace: str, name: str) -> Located:
        """The one WorkflowRun or ModelDeployment namespace/name among the specs (under `path`,
        .plntignore respected, as plnt reads them)."""
        root = self.work / self.path if self.path else self.work
        files, _ = read_tree(root)
        found = [(kind, f) for f in files for kind in KINDS if find_resource(f.text, f.path, kind, namespace, name)]
        if not found:
            raise ProposalRefused(f"no WorkflowRun or ModelDeployment {namespace}/{name} in {self.url} branch "
                                  f"{self.branch}{' path ' + self.path if self.path else ''}")
        if len(found) > 1:
            raise ProposalRefused(f"{namespace}/{name} is defined more than once: "
                                  f"{', '.join(f'{f.path} ({kind})' for kind, f in found)}; fix the specs first")
        kind, file = found[0]
        resource = _resource(file.text, file.path, kind, namespace, name)
        if resource is None:
            raise ProposalRefused(f"{file.path}: {kind} {namespace}/{name} is not valid now; fix it first "
                                  "(plnt validate)")
        relative = f"{self.path}/{file.path}" if self.path else file.path
        return Located(kind, relative, resource)

    def at_version(self, located: Located, version: str) -> Deployable | None:
        """The resource as its file defined it in the newest commit of the tracked branch where it
        served `version` (what pins that release: its integrityHash or rootDigest); None if never."""
        commits = self.git("log", "--format=%H", "HEAD", "--", located.file, what=f"cannot read the history of "
                           f"{located.file}").split()
        meta = located.resource.metadata
        for commit in commits:
            try:
                text = self.git("show", f"{commit}:{located.file}", what="read")
            except ProposalFailed:
                continue  # the file was deleted in that commit
            old = _resource(text, located.file, located.kind, meta.namespace, meta.name)
            if old is not None and old.version == version:
                return old
        return None

    def edit(self, located: Located, changes: Mapping[FieldPath, str | int | None]) -> bool:
        """Edit the file in the work tree; False when it already says so (nothing to commit)."""
        target = self.work / located.file
        text = target.read_text(encoding="utf-8")
        meta = located.resource.metadata
        try:
            edited = edit_resource(text, located.file, located.kind, meta.namespace, meta.name, changes)
        except EditRefused as exc:
            raise ProposalRefused(str(exc)) from exc
        if edited == text:
            return False
        target.write_text(edited, encoding="utf-8")
        return True

    def remote_branch_exists(self, branch: str) -> bool:
        return bool(self.git("ls-remote", "--heads", "origin", f"refs/heads/{branch}", what="cannot list branches"))

    def commit_and_push(self, located: Located, message: str, branch: str | None) -> Proposed:
        """Commit the edited file; push it to a new `branch`, or to the tracked branch when None."""
        target = branch or self.branch
        if branch is not None:
            if self.remote_branch_exists(branch):
                raise ProposalRefused(f"branch {branch} exists already on {self.url} (a pull request from an earlier "
                                      "run?): merge or close it and delete the branch, then run this again")
            self.git("checkout", "-q", "-b", branch, what="cannot make the branch")
        self.git("add", "--", located.file, what="cannot stage the change")
        self.git("commit", "-q", "-m", message, what="cannot commit (is git's user.name and user.email set?)")
        commit = self.git("rev-parse", "HEAD", what="rev-parse")
        try:
            self.git("push", "-q", "origin", f"HEAD:refs/heads/{target}", what=f"cannot push to {target}")
        except ProposalFailed as exc:
            if "branch is currently checked out" in str(exc):  # git's words for a non-bare repository's branch
                raise ProposalFailed(
                    f"cannot push to {target}: {self.url} is a checkout with {target} checked out, which git refuses "
                    "to update; there, run `git config receive.denyCurrentBranch updateInstead` (make up's demo "
                    "repository has it), or use a bare repository; nothing was pushed") from None
            hint = (" (the branch is protected, or you may not push there: leave out --commit-to-branch to open a "
                    "pull request)") if branch is None else ""
            raise ProposalFailed(f"{exc}{hint}; nothing was pushed") from None
        return Proposed(commit=commit, branch=target)


def _resource(text: str, file: str, kind: str, namespace: str, name: str) -> Deployable | None:
    specs, _ = load_sources([SourceFile(file, text)], check_references=None)
    runs = specs.workflow_runs if kind == "WorkflowRun" else specs.model_deployments
    return runs.get(f"{namespace}/{name}")


async def open_pull_request(forge: Forge, done: Proposed, base: str, title: str, body: str) -> Proposed:
    """The pull request of a pushed branch; on failure, say the branch is pushed and how to go on."""
    try:
        opened = await forge.open_pull_request(done.branch, base, title, body)
    except ForgeError as exc:
        raise ProposalFailed(f"branch {done.branch} is pushed (commit {done.commit[:12]}) but the pull request could "
                             f"not be opened: {exc}; open it by hand, or delete the branch and run this again") from exc
    return Proposed(commit=done.commit, branch=done.branch, url=opened.url)
