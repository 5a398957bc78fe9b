"""Git source: clone or fetch the spec repository and read specs at a commit.

The clone lives in STATE/source with no work tree: specs (and `file:` registries inside the
repository) are read straight from the commit's tree, so a newer fetch never changes what an
older, still running saga reads.

Credentials in the repository URL (`https://user:TOKEN@host/...`, `https://oauth2:TOKEN@...`) never
leave this module: `GitSource.url` and the clone's remote are the URL without them, and git gets
them at fetch time from a credential helper that reads this git process's environment (never a
command line another user can see in `ps`, never the clone's config, only for the URL's own host).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import shlex
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, unquote, urlsplit

import git
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import (
    DEFAULT_LIMITS,
    IGNORE_FILE,
    IgnoreRules,
    ParseCache,
    Problem,
    SourceFile,
    SpecSet,
    load_sources,
    read_specs,
)
from plnt.reconciler.errors import InvalidSpec, RetryLater
from plnt.reconciler.recipes.registries import CHUNK_SIZE, MAX_TRUSTED_ROOT_BYTES, metadata_too_large
from plnt.reconciler.redact import redact
from plnt.reconciler.source.parse_cache import MemoryParseCache

log = logging.getLogger(__name__)

SPEC_SUFFIXES = (".yaml", ".yml")


class SourceError(RetryLater):
    """The repository could not be fetched (unreachable, no such branch): try again next poll."""


class UnreadableTree(InvalidSpec):
    """The commit's tree holds an entry git itself refuses to check out (`..`, `.`, `.git`, an
    empty name, a name with '/'): plnt reads nothing of such a commit."""

    def __init__(self, path: str, what: str) -> None:
        where = "" if repr(path) == what else f" (at {path!r})"
        super().__init__(f"the commit's tree holds an entry named {what}{where}, which git refuses to check out; "
                         "plnt reads nothing of this commit: remove the entry in a new commit")
        self.path = path


@dataclass(frozen=True)
class TreeEntry:
    """One line of `git ls-tree -r -t -l -z`: path relative to the listed tree, raw (bytes as os.fsdecode)."""

    mode: int
    type: str  # blob, tree or commit (a submodule)
    sha: str
    size: int  # 0 for trees and submodules
    path: str


def refused_name(path: str) -> str | None:
    """What git would refuse in a tree path (cf. git's verify_path), or None. A name holding '/'
    shows as extra components, so '../x' or '/x' inside one name is caught the same way."""
    for part in path.split("/"):
        if part in ("", ".", ".."):
            return repr(part)
        if part.rstrip(". ").lower() in (".git", "git~1"):  # .git and its NTFS/HFS aliases
            return repr(part)
    return None


# git asks the helper (`get`) for the URL's host only; `store`/`erase` are ignored, and the empty
# first value drops every helper configured elsewhere (a global `store` would write the token down).
_HELPER = ('!f() { test "$1" = get || return 0; h=; while read -r l && test -n "$l"; do case "$l" in host=*) '
           'h="${l#host=}";; esac; done; test "$h" = "$PLNT_GIT_HOST" || return 0; '
           'printf "username=%s\\npassword=%s\\n" "$PLNT_GIT_USERNAME" "$PLNT_GIT_PASSWORD"; }; f')


def split_credentials(url: str) -> tuple[str, str | None, str | None]:
    """(the URL without user info, user, password) of an http(s) URL; other URLs pass unchanged."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or "@" not in parts.netloc:
        return url, None, None
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    clean = SplitResult(parts.scheme, hostport, parts.path, parts.query, parts.fragment).geturl()
    return clean, unquote(user), unquote(password) if colon else None


def normalise_url(repo: str) -> str:
    """A plain path becomes an absolute path; URLs (file://, https://, ssh) pass unchanged."""
    if "://" in repo or (":" in repo and "@" in repo.split(":", 1)[0]):
        return repo
    return str(Path(repo).expanduser().resolve())


def read_credentials_file(file: Path) -> tuple[str | None, str | None, str | None]:
    """(user, token, ssh private key) from a credentials file: `TOKEN` or `USER:TOKEN` on the first
    line for https, or an OpenSSH/PEM private key for ssh. Errors name the file and the format."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSpec(f"--git-credentials-file {file}: cannot read it ({exc})") from None
    if text.lstrip().startswith("-----BEGIN "):
        return None, None, text if text.endswith("\n") else text + "\n"
    line = text.strip().splitlines()[0].strip() if text.strip() else ""
    if not line:
        raise InvalidSpec(f"--git-credentials-file {file} is empty: write TOKEN or USER:TOKEN on its first line "
                          "(https), or an ssh private key")
    user, colon, token = line.partition(":")
    # A token alone: forges take any user name with a token (GitHub's apps use this one).
    return (user, token, None) if colon else ("x-access-token", line, None)


PREVIEW_REFS = "refs/plnt/previews/"


class GitSource:
    def __init__(self, url: str, clone_dir: Path, *, branch: str = "main", path: str = "",
                 credentials_file: Path | None = None, known_hosts: Path | None = None,
                 previews: tuple[str, ...] = ()) -> None:
        """`credentials_file`: see read_credentials_file; an https token goes to git through the same
        credential helper as a token in the URL, an ssh key through GIT_SSH_COMMAND (a 0600 copy in
        the state directory: ssh refuses a key others can read, as a mounted Secret is)."""
        self.url, user, password = split_credentials(normalise_url(url))  # self.url is safe to show
        ssh_key = None
        if credentials_file is not None:
            if user is not None:
                raise InvalidSpec("the repository URL carries credentials and --git-credentials-file is given: "
                                  "use one of them")
            user, password, ssh_key = read_credentials_file(credentials_file)
        self._secrets = tuple(s for s in (password, user if password is None else None) if s)
        self._git_env = {"GIT_TERMINAL_PROMPT": "0"}
        if user is not None:
            self._git_env.update({
                "GIT_CONFIG_COUNT": "2",
                "GIT_CONFIG_KEY_0": "credential.helper", "GIT_CONFIG_VALUE_0": "",
                "GIT_CONFIG_KEY_1": "credential.helper", "GIT_CONFIG_VALUE_1": _HELPER,
                "PLNT_GIT_HOST": urlsplit(self.url).netloc,
                "PLNT_GIT_USERNAME": user, "PLNT_GIT_PASSWORD": password or "",
            })
        if ssh_key is not None:
            key = clone_dir.parent / "git-ssh-key"
            key.parent.mkdir(parents=True, exist_ok=True)
            key.touch(mode=0o600)
            key.chmod(0o600)
            key.write_text(ssh_key, encoding="utf-8")
            # Without known hosts the first host key is trusted and then pinned (ssh's accept-new).
            hosts = f"-o UserKnownHostsFile={shlex.quote(str(known_hosts))} -o StrictHostKeyChecking=yes" \
                if known_hosts is not None else \
                f"-o UserKnownHostsFile={shlex.quote(str(key.parent / 'git-known-hosts'))} -o StrictHostKeyChecking=accept-new"
            self._git_env["GIT_SSH_COMMAND"] = (f"ssh -i {shlex.quote(str(key))} -o IdentitiesOnly=yes "
                                                f"-o BatchMode=yes {hosts}")
        self.branch = branch
        self.previews = previews  # --previews ref globs (reconciler/review/previews.py), fetched by fetch_previews
        self.path = path.strip("/")
        self._clone_dir = clone_dir
        self._repo: git.Repo | None = None
        self._lock = threading.Lock()  # GitPython is not safe for concurrent use of one Repo
        self._ancestry: dict[tuple[str, str], bool] = {}  # (commit, branch head) -> is_on_branch
        # Parsed spec files by blob id: a new commit costs what changed (plnt.reconciler.source.parse_cache).
        self.parse_cache: ParseCache = MemoryParseCache()

    @property
    def git_env(self) -> dict[str, str]:
        """The environment git needs for this repository's credentials and known hosts (a copy): for a
        git command plnt runs outside its clone (plnt scale and plnt rollback clone and push with it)."""
        return dict(self._git_env)

    def redacted(self, text: str) -> str:
        """`text` (git's complaint, say) with this repository's credentials removed."""
        return redact(text, *self._secrets)

    @property
    def git_dir(self) -> Path:
        """plnt's bare clone (it exists once a fetch succeeded)."""
        return self._clone_dir

    def run_git(self, *args: str, stdin: str | None = None, timeout_s: float = 120.0) -> str:
        """One git command in plnt's clone, with the fetch's credentials and known hosts (e.g. git
        notes, plnt.reconciler.review.notes). Not under the clone's lock: it runs git itself, not GitPython.
        Raises SourceError with git's complaint, credentials removed."""
        try:
            done = subprocess.run(["git", f"--git-dir={self._clone_dir}", *args], input=stdin, capture_output=True,
                                  text=True, env={**os.environ, **self._git_env}, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            raise SourceError(f"git {args[0]} in plnt's clone of {self.url} timed out after {timeout_s:g}s") from None
        if done.returncode != 0:
            reason = redact(" ".join(done.stderr.split()) or f"exit {done.returncode}", *self._secrets)
            raise SourceError(f"git {args[0]} in plnt's clone of {self.url}: {reason}")
        return done.stdout

    def fetch(self) -> str:
        """Fetch the tracked branch; return its newest commit sha."""
        with self._lock:
            repo = self._open()
            try:
                repo.git.fetch("--prune", "--force", "origin", f"+refs/heads/{self.branch}:refs/remotes/origin/{self.branch}",
                               env=self._git_env)
                return repo.commit(f"refs/remotes/origin/{self.branch}").hexsha
            except git.GitCommandError as exc:
                raise SourceError(f"cannot fetch branch {self.branch!r} of {self.url}: {self._reason(exc)}") from exc

    def fetch_previews(self) -> dict[str, str]:
        """Fetch the --previews ref globs into refs/plnt/previews/<glob index>/<*> (pruned: a ref gone
        from the origin is gone here); return {origin ref: commit sha}. Fetched into plnt's own
        namespace, never into the tracked branch's refs."""
        if not self.previews:
            return {}
        with self._lock:
            repo = self._open()
            specs = [f"+{glob}:{PREVIEW_REFS}{index}/*" for index, glob in enumerate(self.previews)]
            try:
                repo.git.fetch("--prune", "--force", "--no-tags", "origin", *specs, env=self._git_env)
                listed = repo.git.for_each_ref("--format=%(objectname) %(refname)", PREVIEW_REFS)
            except git.GitCommandError as exc:
                raise SourceError(f"cannot fetch the preview refs {', '.join(self.previews)} of {self.url}: "
                                  f"{self._reason(exc)}") from exc
        refs: dict[str, str] = {}
        for line in listed.splitlines():
            sha, _, local = line.partition(" ")
            index, _, star = local.removeprefix(PREVIEW_REFS).partition("/")
            if index.isdigit() and int(index) < len(self.previews):
                refs[self.previews[int(index)].replace("*", star, 1)] = sha
        return refs

    def branch_head(self) -> str:
        """The tracked branch's newest commit as plnt last fetched it (fetching when it never did)."""
        with self._lock:
            try:
                return self._open().commit(f"refs/remotes/origin/{self.branch}").hexsha
            except (git.BadName, ValueError, git.GitCommandError):
                pass
        return self.fetch()

    def is_in_preview(self, commit: str, pr: int) -> bool:
        """Whether `commit` is the fetched head of a preview ref of pull request `pr` (the `*` of a
        --previews glob), or an ancestor of it."""
        for index in range(len(self.previews)):
            with self._lock:
                try:
                    if self._open().is_ancestor(commit, f"{PREVIEW_REFS}{index}/{pr}"):
                        return True
                except (git.GitCommandError, ValueError):  # no such ref, or an unknown object
                    continue
        return False

    def resolve(self, rev: str) -> str:
        """A revision (sha, branch, tag, origin/branch) to a commit sha, fetching first."""
        with self._lock:
            repo = self._open()
            try:
                repo.git.fetch("--force", "origin", "+refs/heads/*:refs/remotes/origin/*", "+refs/tags/*:refs/tags/*",
                               env=self._git_env)
            except git.GitCommandError as exc:
                raise SourceError(f"cannot fetch {self.url}: {self._reason(exc)}") from exc
            for attempt in range(2):
                for candidate in (rev, f"refs/remotes/origin/{rev}", f"refs/tags/{rev}"):
                    try:
                        return repo.commit(candidate).hexsha
                    except (git.BadName, ValueError, git.GitCommandError):
                        continue
                # A sha on no branch of the origin (a CI checkout's detached pull request head, reachable
                # from refs/remotes/* or refs/pull/*): fetch that commit itself, as forges and git allow.
                if attempt or not re.fullmatch(r"[0-9a-f]{40}|[0-9a-f]{64}", rev):
                    break
                try:
                    repo.git.fetch("--force", "origin", rev, env=self._git_env)
                except git.GitCommandError:
                    break
            raise SourceError(f"no revision {rev!r} in {self.url}")

    def merge_base(self, a: str, b: str) -> str:
        """The best common ancestor of two resolved commits: where a pull request branched off."""
        with self._lock:
            try:
                return str(self._open().git.merge_base(a, b)).strip()
            except git.GitCommandError as exc:
                raise SourceError(f"commits {a[:12]} and {b[:12]} have no common ancestor in {self.url}") from exc

    def spec_files(self, commit: str, limits: SpecLimits = DEFAULT_LIMITS,
                   known: Callable[[str, str], bool] | None = None) -> list[SourceFile]:
        """Every *.yaml / *.yml under the spec path at the commit, paths relative to the spec path,
        each with its git blob id.

        Within `limits` (see `loader.read_specs`): a blob's size is known before it is read. A
        commit whose tree git would refuse is one unreadable file naming the entry. A file for which
        `known(path, blob id)` is true (a parse cache holds it) is not read: its text is empty and
        `unread` reads it, should the cache not give it after all.
        """
        with self._lock:
            repo = self._open()
            prefix = f"{self.path}/" if self.path else ""
            if (self._object(repo, f"{commit}:{self.path}") or ("", "", 0))[1] != "tree":
                raise SourceError(f"commit {commit[:12]} has no directory {self.path!r}")
            rules = IgnoreRules()
            ignore = self._object(repo, f"{commit}:{prefix}{IGNORE_FILE}")
            if ignore is not None and ignore[1] == "blob":  # patterns only: a bounded read, odd bytes replaced
                data = repo.odb.stream(bytes.fromhex(ignore[0])).read(limits.max_file_bytes)
                rules = IgnoreRules.parse(data.decode("utf-8", "replace"))
            found: list[TreeEntry] = []
            try:
                for entry in self._entries(repo, f"{commit}:{self.path}"):
                    if entry.type != "blob" or not entry.path.endswith(SPEC_SUFFIXES):
                        continue
                    if any(part.startswith(".") for part in entry.path.split("/")) or rules.ignores(entry.path):
                        continue
                    found.append(entry)
                    if len(found) > limits.max_files:
                        break  # read_specs reports it; listing the rest of a huge tree would only cost time
            except UnreadableTree as exc:
                return [SourceFile(_display(exc.path), "", Problem(_display(exc.path), 1, "tree", str(exc)))]
            found.sort(key=lambda e: e.path)
            skip = {e.sha for e in found if known is not None and known(_display(e.path), e.sha)}
            batch: dict[str, bytes] | None = None

            def reader(sha: str) -> bytes:
                nonlocal batch
                if sha in skip:
                    return b""
                if batch is None:  # read_specs has checked the sizes: every blob it may read, at once
                    batch = self._blobs(repo, [e.sha for e in found
                                               if e.sha not in skip and e.size <= limits.max_file_bytes])
                data = batch.get(sha)
                return data if data is not None else bytes(repo.odb.stream(bytes.fromhex(sha)).read())

            files = read_specs(((_display(e.path), e.size, lambda sha=e.sha: reader(sha)) for e in found), limits)
            if len(files) != len(found):  # one problem for the whole commit (too many files, too many bytes)
                return files
            # The blob id names the bytes: the parse cache's key (plnt.reconciler.source.parse_cache).
            return [f if f.problem is not None else
                    dataclasses.replace(f, blob=e.sha, unread=functools.partial(self._read_spec, f.path, e.sha, limits))
                    if e.sha in skip else dataclasses.replace(f, blob=e.sha)
                    for f, e in zip(files, found, strict=True)]

    def _read_spec(self, path: str, sha: str, limits: SpecLimits) -> SourceFile:
        """A spec file spec_files listed without reading it (its size already passed the limits)."""
        with self._lock:
            data = bytes(self._open().odb.stream(bytes.fromhex(sha)).read())
        read = read_specs([(path, len(data), lambda: data)], limits)[0]
        return read if read.problem is not None else dataclasses.replace(read, blob=sha)

    def load(self, commit: str, limits: SpecLimits = DEFAULT_LIMITS) -> tuple[SpecSet, list[Problem]]:
        """The commit's specs, parsed (see `loader.load_sources`); files seen before at the same blob
        id are neither read nor parsed again but taken from `parse_cache` (shared by every reader of
        this clone)."""
        cache = self.parse_cache
        files = self.spec_files(commit, limits, known=lambda path, blob: cache.has(path, blob, limits))
        return load_sources(files, limits=limits, cache=cache)

    def read_file(self, commit: str, path: str, limit: int = MAX_TRUSTED_ROOT_BYTES) -> bytes:
        """One file of the repository at the commit (path relative to the repository root); one of
        more than `limit` bytes is refused (DownloadRefused) before it is read. Its callers read
        policies' trusted roots, hence the default."""
        with self._lock:
            repo = self._open()
            path = path.strip("/")
            what = refused_name(path)
            if what is not None:
                raise UnreadableTree(path, what)
            found = self._object(repo, f"{commit}:{path}")
            if found is None:
                raise FileNotFoundError(f"{path} is not in the spec repository at {commit[:12]}")
            if found[1] != "blob":
                raise FileNotFoundError(f"{path} in the spec repository at {commit[:12]} is not a file")
            if found[2] > limit:
                raise metadata_too_large(f"{path} in the spec repository at {commit[:12]}", found[2], limit,
                                         "commit the file as the tool that wrote it did")
            return bytes(repo.odb.stream(bytes.fromhex(found[0])).read())

    def export(self, commit: str, subdir: str, dest: Path) -> bool:
        """Copy the directory `subdir` (relative to the repository root) at the commit into dest.

        Returns False when the commit has no such directory. Every name is checked before anything
        is written (UnreadableTree), so no entry can lead outside dest.
        """
        with self._lock:
            repo = self._open()
            subdir = subdir.strip("/")
            what = refused_name(subdir) if subdir else None
            if what is not None:
                raise UnreadableTree(subdir, what)
            if (self._object(repo, f"{commit}:{subdir}") or ("", "", 0))[1] != "tree":
                return False
            entries = list(self._entries(repo, f"{commit}:{subdir}", prefix=f"{subdir}/" if subdir else ""))
            dest.mkdir(parents=True, exist_ok=True)
            for entry in entries:
                target = dest.joinpath(*entry.path.split("/"))
                if entry.type == "tree":
                    target.mkdir(parents=True, exist_ok=True)
                elif entry.type == "blob" and entry.mode & 0o170000 == 0o100000:  # regular files only: no links
                    target.parent.mkdir(parents=True, exist_ok=True)
                    # in chunks: a recipe archive or bundle is never whole in memory
                    stream = repo.odb.stream(bytes.fromhex(entry.sha))
                    with open(target, "wb") as out:
                        while chunk := stream.read(CHUNK_SIZE):
                            out.write(chunk)
            return True

    # --- reading trees with git itself (GitPython raises a bare ValueError at a refused name) ---

    @staticmethod
    def _object(repo: git.Repo, spec: str) -> tuple[str, str, int] | None:
        """(sha, type, size) of `commit:path`, or None; asked of GitPython's long-lived `cat-file --batch-check`."""
        if "\n" in spec or "\0" in spec:  # one query per line: a name holding one would desynchronise it
            return None
        try:
            sha, kind, size = repo.git.get_object_header(spec)
        except ValueError:  # missing
            return None
        return os.fsdecode(sha), os.fsdecode(kind), int(size)

    @staticmethod
    def _blobs(repo: git.Repo, shas: list[str]) -> dict[str, bytes]:
        """The blobs named, by id, from one `git cat-file --batch --buffer`: a round trip per file
        through GitPython's cat-file costs about twice as much at 1,000 files. A blob git does not
        give is left out (the caller reads it alone, which raises what is wrong)."""
        if not shas:
            return {}
        wanted = "".join(f"{sha}\n" for sha in dict.fromkeys(shas)).encode()
        done = subprocess.run(["git", f"--git-dir={repo.git_dir}", "cat-file", "--batch", "--buffer"], input=wanted,
                              capture_output=True, check=False, timeout=120)
        if done.returncode != 0:
            return {}
        out, at, blobs = done.stdout, 0, {}
        while at < len(out):
            end = out.index(b"\n", at)
            header = out[at:end].split()
            if len(header) != 3:  # `<sha> missing`
                at = end + 1
                continue
            size = int(header[2])
            if header[1] == b"blob":
                blobs[header[0].decode()] = out[end + 1:end + 1 + size]
            at = end + 1 + size + 1  # the object's bytes, then a newline
        return blobs

    @staticmethod
    def _entries(repo: git.Repo, tree: str, prefix: str = "") -> Iterator[TreeEntry]:
        """Every entry under `tree` (recursive, trees included), streamed from `git ls-tree`: a caller
        that stops early stops git. Raises UnreadableTree at the first name git would refuse (its
        path shown with `prefix`)."""
        command = ["git", f"--git-dir={repo.git_dir}", "ls-tree", "-r", "-t", "-l", "-z", tree]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) as process:
            assert process.stdout is not None
            pending = b""
            try:
                while chunk := process.stdout.read(1 << 16):
                    *records, pending = (pending + chunk).split(b"\0")
                    for record in records:
                        meta, _, raw_path = record.partition(b"\t")
                        mode, kind, sha, size = meta.split()
                        path = os.fsdecode(raw_path)
                        what = refused_name(path)
                        if what is not None:
                            raise UnreadableTree(prefix + path, what)
                        yield TreeEntry(int(mode, 8), kind.decode(), sha.decode(),
                                        int(size) if size.isdigit() else 0, path)
            finally:
                process.kill()  # no-op when git has finished; stops it when the caller stopped early

    def is_on_branch(self, commit: str) -> bool:
        """Whether `commit` (a full sha) is the tracked branch's newest fetched commit or an ancestor of it.

        Every saga step asks (a force-push may have removed its commit); the answer for one commit and
        one branch head never changes, so it is kept per (commit, head) instead of running
        `git merge-base` each time (about 3 % of plnt's CPU with 1,000 sagas)."""
        with self._lock:
            repo = self._open()
            try:
                head = repo.commit(f"refs/remotes/origin/{self.branch}").hexsha
            except (git.BadName, ValueError, git.GitCommandError):
                return False  # nothing fetched yet
            known = self._ancestry.get((commit, head))
            if known is not None:
                return known
            try:
                found = commit == head or bool(repo.is_ancestor(commit, head))
            except (git.GitCommandError, ValueError):  # unknown object, or not a commit: not kept
                return False
            if len(self._ancestry) >= 4096:
                self._ancestry.clear()
            self._ancestry[(commit, head)] = found
            return found

    def _open(self) -> git.Repo:
        if self._repo is not None:
            return self._repo
        if (self._clone_dir / "HEAD").exists():
            repo = git.Repo(self._clone_dir)
            if repo.remotes.origin.url != self.url:  # another repository, or a clone that kept a token
                log.warning("source-reclone old=%s new=%s", redact(repo.remotes.origin.url), self.url)
                shutil.rmtree(self._clone_dir)
                return self._open()
        else:
            self._clone_dir.mkdir(parents=True, exist_ok=True)
            try:
                repo = git.Repo.clone_from(self.url, self._clone_dir, bare=True, env=self._git_env)
            except git.GitCommandError as exc:
                shutil.rmtree(self._clone_dir, ignore_errors=True)
                raise SourceError(f"cannot clone {self.url}: {self._reason(exc)}") from exc
        self._repo = repo
        return repo

    def _reason(self, exc: git.GitCommandError) -> str:
        """git's complaint on one line, credentials removed (git echoes URLs in its errors)."""
        stderr = (exc.stderr or "").strip().replace("\n", " ")
        reason = stderr.removeprefix("stderr: ").strip("' ") or str(exc)
        if re.search(r"Authentication failed|could not read Username|\b40[13]\b", reason):
            reason += " (check the credentials in the repository URL plnt was started with)"
        return redact(reason, *self._secrets)


def _display(path: str) -> str:
    """A tree path for messages and status (JSON): undecodable bytes shown as U+FFFD."""
    return path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")

