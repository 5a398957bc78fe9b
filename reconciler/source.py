"""Git source: clone or fetch the spec repository and read specs at a commit.

The clone lives in STATE/source with no work tree: specs (and `file:` registries inside the
repository) are read straight from the commit's tree, so a newer fetch never changes what an
older, still running saga reads.
"""

from __future__ import annotations

import logging
import shutil
import threading
from pathlib import Path, PurePosixPath

import git

from .errors import RetryLater
from .loader import IGNORE_FILE, IgnoreRules, SourceFile

log = logging.getLogger(__name__)

SPEC_SUFFIXES = (".yaml", ".yml")


class SourceError(RetryLater):
    """The repository could not be fetched (unreachable, no such branch): try again next poll."""


def normalise_url(repo: str) -> str:
    """A plain path becomes an absolute path; URLs (file://, https://, ssh) pass unchanged."""
    if "://" in repo or (":" in repo and "@" in repo.split(":", 1)[0]):
        return repo
    return str(Path(repo).expanduser().resolve())


class GitSource:
    def __init__(self, url: str, clone_dir: Path, *, branch: str = "main", path: str = "") -> None:
        self.url = normalise_url(url)
        self.branch = branch
        self.path = path.strip("/")
        self._clone_dir = clone_dir
        self._repo: git.Repo | None = None
        self._lock = threading.Lock()  # GitPython is not safe for concurrent use of one Repo

    def fetch(self) -> str:
        """Fetch the tracked branch; return its newest commit sha."""
        with self._lock:
            repo = self._open()
            try:
                repo.git.fetch("--prune", "--force", "origin", f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}")
                return repo.commit(f"refs/remotes/origin/{self.branch}").hexsha
            except git.GitCommandError as exc:
                raise SourceError(f"cannot fetch branch {self.branch!r} of {self.url}: {_git_reason(exc)}") from exc

    def resolve(self, rev: str) -> str:
        """A revision (sha, branch, tag, origin/branch) to a commit sha, fetching first."""
        with self._lock:
            repo = self._open()
            try:
                repo.git.fetch("--force", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*")
            except git.GitCommandError as exc:
                raise SourceError(f"cannot fetch {self.url}: {_git_reason(exc)}") from exc
            for candidate in (rev, f"refs/remotes/origin/{rev}", f"refs/tags/{rev}"):
                try:
                    return repo.commit(candidate).hexsha
                except (git.BadName, ValueError, git.GitCommandError):
                    continue
            raise SourceError(f"no revision {rev!r} in {self.url}")

    def spec_files(self, commit: str) -> list[SourceFile]:
        """Every *.yaml / *.yml under the spec path at the commit, paths relative to the spec path."""
        with self._lock:
            tree = self._open().commit(commit).tree
            if self.path:
                try:
                    tree = tree / self.path
                except KeyError as exc:
                    raise SourceError(f"commit {commit[:12]} has no directory {self.path!r}") from exc
            try:
                rules = IgnoreRules.parse((tree / IGNORE_FILE).data_stream.read().decode("utf-8", "replace"))
            except KeyError:
                rules = IgnoreRules()
            files: list[SourceFile] = []
            for item in tree.traverse():
                if item.type != "blob" or not item.path.endswith(SPEC_SUFFIXES):
                    continue
                relative = PurePosixPath(item.path).relative_to(self.path) if self.path else PurePosixPath(item.path)
                if any(part.startswith(".") for part in relative.parts) or rules.ignores(str(relative)):
                    continue
                files.append(SourceFile(path=str(relative), text=item.data_stream.read().decode("utf-8", "replace")))
            return sorted(files, key=lambda f: f.path)

    def read_file(self, commit: str, path: str) -> bytes:
        """One file of the repository at the commit (path relative to the repository root)."""
        with self._lock:
            tree = self._open().commit(commit).tree
            try:
                blob = tree / path.strip("/")
            except KeyError:
                raise FileNotFoundError(f"{path} is not in the spec repository at {commit[:12]}") from None
            if blob.type != "blob":
                raise FileNotFoundError(f"{path} in the spec repository at {commit[:12]} is not a file")
            return bytes(blob.data_stream.read())

    def export(self, commit: str, subdir: str, dest: Path) -> bool:
        """Copy the directory `subdir` (relative to the repository root) at the commit into dest.

        Returns False when the commit has no such directory.
        """
        with self._lock:
            tree = self._open().commit(commit).tree
            try:
                tree = tree / subdir.strip("/")
            except KeyError:
                return False
            if tree.type != "tree":
                return False
            for item in tree.traverse():
                target = dest / PurePosixPath(item.path).relative_to(tree.path)
                if item.type == "tree":
                    target.mkdir(parents=True, exist_ok=True)
                elif item.type == "blob" and item.mode & 0o170000 == 0o100000:  # regular files only: no links
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(item.data_stream.read())
            return True

    def is_on_branch(self, commit: str) -> bool:
        """Whether `commit` (a full sha) is the tracked branch's newest fetched commit or an ancestor of it."""
        with self._lock:
            try:
                return bool(self._open().is_ancestor(commit, f"refs/remotes/origin/{self.branch}"))
            except (git.GitCommandError, ValueError):  # unknown object, or not a commit
                return False

    def _open(self) -> git.Repo:
        if self._repo is not None:
            return self._repo
        if (self._clone_dir / "HEAD").exists():
            repo = git.Repo(self._clone_dir)
            if repo.remotes.origin.url != self.url:
                log.warning("source-reclone old=%s new=%s", repo.remotes.origin.url, self.url)
                shutil.rmtree(self._clone_dir)
                return self._open()
        else:
            self._clone_dir.mkdir(parents=True, exist_ok=True)
            try:
                repo = git.Repo.clone_from(self.url, self._clone_dir, bare=True)
            except git.GitCommandError as exc:
                shutil.rmtree(self._clone_dir, ignore_errors=True)
                raise SourceError(f"cannot clone {self.url}: {_git_reason(exc)}") from exc
        self._repo = repo
        return repo


def _git_reason(exc: git.GitCommandError) -> str:
    stderr = (exc.stderr or "").strip().replace("\n", " ")
    return stderr.removeprefix("stderr: ").strip("' ") or str(exc)
