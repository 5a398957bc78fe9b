"""Only trusted commits deploy: commit signatures checked by git's own machinery.

`--verify-commits head` checks the newest commit of the tracked branch; `all` checks every commit
since the last reconciled one (`git rev-list NEW --not LAST`), merged branches included, so an
unsigned or foreign commit cannot hide under a good merge. The trusted signers come from plnt's own
settings, never from the repository they protect:

- SSH signatures: `--allowed-signers FILE` in git's format (`gpg.ssh.allowedSignersFile`; principals,
  `valid-after`/`valid-before` and `namespaces` honoured by ssh-keygen; a refusal that the file
  explains, such as a key limited to namespaces other than "git", names the entry's file:line:
  plnt.reconciler.source.allowed_signers);
- OpenPGP signatures: `--gpg-keys DIR` of public keys (`*.asc`, `*.gpg`, `*.pub`), imported into a
  keyring of plnt's own (GNUPGHOME in the state directory).

Each check is `git verify-commit --raw SHA` with the user's and the system's git config ignored,
so nothing outside these settings (a `gpg.program`, a global allowed-signers file) can widen trust.
A verdict is cached per commit: a commit's bytes, so its signature, never change.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Literal

from plnt.reconciler.errors import NeedsHuman
from plnt.reconciler.source.allowed_signers import explain_refusal, read_ssh_signature
from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

log = logging.getLogger(__name__)

VerifyMode = Literal["none", "head", "all"]


class CommitVerificationError(NeedsHuman):
    """The trust settings themselves are unusable (a missing allowed-signers file, keys gpg refuses)."""


class CommitVerdict(BaseModel):
    model_config = ConfigDict(frozen=True)

    commit: str
    trusted: bool
    signer: str | None = None  # principal (SSH) or user id and key (OpenPGP), when known
    reason: str | None = None  # why not: unsigned, unknown key, expired key, bad signature, ...
    detail: str | None = None  # the allowed-signers entry (file:line) behind the reason, and what to change

    @model_serializer(mode="wrap")
    def _detail_only_when_known(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # GET /source's `untrusted` object keeps the shape it had when the file adds nothing.
        data: dict[str, Any] = handler(self)
        if data.get("detail") is None:
            data.pop("detail", None)
        return data

    def problem(self) -> str:
        who = f" (signed by {self.signer})" if self.signer else ""
        detail = f"; {self.detail}" if self.detail else ""
        return f"commit {self.commit[:12]} is not trusted: {self.reason}{who}{detail}"


_SSH_GOOD = re.compile(r'Good "git" signature for (?P<principal>\S+) with (?P<key>\S+ key \S+)')
_SSH_KEY = re.compile(r'Good "git" signature with (?P<key>\S+ key \S+)')
_GPG = re.compile(r"^\[GNUPG:\] (?P<status>[A-Z_]+) ?(?P<rest>.*)$", re.M)


# gpg's status lines that refuse a signature (`KEYID USER-ID` follows each), in the order checked.
_GPG_REFUSALS = (("EXPKEYSIG", "expired key"), ("REVKEYSIG", "revoked key"), ("BADSIG", "bad signature"),
                 ("EXPSIG", "expired signature"))


def _gpg_signer(rest: str) -> str:
    key, _, uid = rest.partition(" ")
    return f"{uid} (OpenPGP key {key})"


def parse_verdict(commit: str, returncode: int, output: str) -> CommitVerdict:
    """`git verify-commit --raw` exit code and output (stdout and stderr) to a verdict. Pure."""
    gpg = {m["status"]: m["rest"] for m in _GPG.finditer(output)}
    good_ssh = _SSH_GOOD.search(output)
    if returncode == 0:
        if "GOODSIG" in gpg:
            return CommitVerdict(commit=commit, trusted=True, signer=_gpg_signer(gpg["GOODSIG"]))
        if good_ssh:
            return CommitVerdict(commit=commit, trusted=True, signer=f"{good_ssh['principal']} ({good_ssh['key']})")
        return CommitVerdict(commit=commit, trusted=True)
    for status, reason in _GPG_REFUSALS:
        if status in gpg:
            return CommitVerdict(commit=commit, trusted=False, reason=reason, signer=_gpg_signer(gpg[status]))
    if "NO_PUBKEY" in gpg:
        return CommitVerdict(commit=commit, trusted=False, reason="unknown key",
                             signer=f"OpenPGP key {gpg['NO_PUBKEY'].split()[0]}")
    lowered = output.lower()
    key = _SSH_KEY.search(output)
    signer = good_ssh["principal"] if good_ssh else (key["key"] if key else None)
    if "key has expired" in lowered:
        return CommitVerdict(commit=commit, trusted=False, reason="expired key", signer=signer)
    if "not yet valid" in lowered:
        return CommitVerdict(commit=commit, trusted=False, reason="key not yet valid", signer=signer)
    if "no principal matched" in lowered:
        return CommitVerdict(commit=commit, trusted=False, reason="unknown key", signer=signer)
    if "signature verification failed" in lowered or "bad signature" in lowered:
        return CommitVerdict(commit=commit, trusted=False, reason="bad signature", signer=signer)
    if not output.strip() or "no signature" in lowered:
        return CommitVerdict(commit=commit, trusted=False, reason="unsigned")
    first = next((line.strip() for line in output.splitlines() if line.strip()), "")
    return CommitVerdict(commit=commit, trusted=False, reason=f"not verified: {first[:200]}", signer=signer)


class CommitVerifier:
    def __init__(self, mode: VerifyMode, *, home: Path, allowed_signers: Path | None = None,
                 gpg_keys: Path | None = None, git: str = "git") -> None:
        if mode != "none" and allowed_signers is None and gpg_keys is None:
            raise CommitVerificationError(f"--verify-commits {mode} needs trusted signers: --allowed-signers FILE "
                                          "(SSH) and/or --gpg-keys DIR (OpenPGP public keys)")
        self.mode = mode
        self._git = git
        self._cache: dict[str, CommitVerdict] = {}
        home.mkdir(parents=True, exist_ok=True)
        if allowed_signers is not None and not allowed_signers.is_file():
            raise CommitVerificationError(f"--allowed-signers {allowed_signers}: no such file")
        # An empty allowed-signers file when none is given: git then refuses every SSH signature.
        self._allowed = allowed_signers.resolve() if allowed_signers else home / "no-allowed-signers"
        if allowed_signers is None:
            self._allowed.write_text("")
        self._gnupghome = home / "gnupg"
        shutil.rmtree(self._gnupghome, ignore_errors=True)  # rebuilt from --gpg-keys at every start
        self._gnupghome.mkdir(mode=0o700)
        if gpg_keys is not None:
            self._import_keys(gpg_keys)

    def _import_keys(self, directory: Path) -> None:
        if not directory.is_dir():
            raise CommitVerificationError(f"--gpg-keys {directory}: not a directory of OpenPGP public keys")
        files = sorted(p for p in directory.iterdir() if p.suffix in (".asc", ".gpg", ".pub", ".key") and p.is_file())
        if not files:
            raise CommitVerificationError(f"--gpg-keys {directory}: no *.asc, *.gpg, *.pub or *.key files in it")
        for file in files:
            done = subprocess.run(["gpg", "--batch", "--quiet", "--import", str(file)], env=self._env(),
                                  capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise CommitVerificationError(f"--gpg-keys {file}: gpg cannot import it: "
                                              f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else done.returncode}")
        log.info("commit-verification keys=%d from %s", len(files), directory)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
        env.update(GNUPGHOME=str(self._gnupghome), GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull,
                   LC_ALL="C")
        return env

    def verify(self, git_dir: Path, commit: str) -> CommitVerdict:
        cached = self._cache.get(commit)
        if cached is not None:
            return cached
        done = subprocess.run(
            [self._git, f"--git-dir={git_dir}", "-c", f"gpg.ssh.allowedSignersFile={self._allowed}",
             "verify-commit", "--raw", commit],
            env=self._env(), capture_output=True, text=True, timeout=60,
        )
        verdict = parse_verdict(commit, done.returncode, done.stdout + done.stderr)
        if not verdict.trusted and verdict.reason != "unsigned":
            verdict = self._explained(git_dir, verdict)
        self._cache[commit] = verdict
        return verdict

    def _explained(self, git_dir: Path, verdict: CommitVerdict) -> CommitVerdict:
        """The verdict, with the allowed-signers entry that refused the commit's SSH key named when
        ssh-keygen's own words do not say why (a key limited to other namespaces, past valid-before)."""
        done = subprocess.run([self._git, f"--git-dir={git_dir}", "cat-file", "commit", verdict.commit],
                              env=self._env(), capture_output=True, text=True, errors="replace", timeout=60)
        signature = read_ssh_signature(done.stdout) if done.returncode == 0 else None
        found = explain_refusal(self._allowed, signature, verdict.reason) if signature is not None else None
        if found is None:
            return verdict
        return verdict.model_copy(update=found.model_dump())

    def to_check(self, git_dir: Path, head: str, last: str | None) -> list[str]:
        """The commits a new head brings: the head alone (`head`, or nothing reconciled yet), or every
        commit reachable from it and not from the last reconciled one (`all`), oldest first."""
        if self.mode == "head" or last is None or last == head:
            return [head]
        done = subprocess.run([self._git, f"--git-dir={git_dir}", "rev-list", "--reverse", head, "--not", last],
                              env=self._env(), capture_output=True, text=True, timeout=120)
        if done.returncode != 0:  # the last reconciled commit is gone (gc after a force-push): the head alone
            log.warning("verify-commits: cannot list commits since %s (%s); checking the head only",
                        last[:12], done.stderr.strip()[:200])
            return [head]
        return done.stdout.split() or [head]

    def first_untrusted(self, git_dir: Path, head: str, last: str | None) -> CommitVerdict | None:
        if self.mode == "none":
            return None
        for commit in self.to_check(git_dir, head, last):
            verdict = self.verify(git_dir, commit)
            if not verdict.trusted:
                return verdict
        return None
