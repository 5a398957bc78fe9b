"""--verify-commits against real signatures: commits signed with ssh-keygen and gpg keys made at test
time, verified by git's own `git verify-commit` (and ssh-keygen / gpg under it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from plnt.reconciler.source.allowed_signers import parse_allowed_signers
from plnt.reconciler.source.commit_trust import CommitVerificationError, CommitVerifier, parse_verdict

from tests.conftest import GIT_ENV

# --- parsing git's answers (pure) ------------------------------------------------------------------

SSH_GOOD = 'Good "git" signature for signer-a@example.com with ED25519 key SHA256:Ans\n'
SSH_UNKNOWN = 'Good "git" signature with ED25519 key SHA256:zah\nNo principal matched.\n'
SSH_EXPIRED = ('Good "git" signature with ED25519 key SHA256:Ans\nallowed:1: key has expired: verify time '
               '2026-12-01T02:19:52 > valid-before 2020-01-01T00:00:00\nNo principal matched.\n')


@pytest.mark.parametrize("code, output, trusted, reason, signer", [
    (0, SSH_GOOD, True, None, "signer-a@example.com (ED25519 key SHA256:Ans)"),
    (1, "", False, "unsigned", None),
    (1, SSH_UNKNOWN, False, "unknown key", "ED25519 key SHA256:zah"),
    (1, SSH_EXPIRED, False, "expired key", "ED25519 key SHA256:Ans"),
    (1, "Signature verification failed: incorrect signature\n", False, "bad signature", None),
    (0, "[GNUPG:] GOODSIG ECB9 Signer B <signer-b@example.com>\n[GNUPG:] TRUST_UNDEFINED 0 pgp\n", True, None,
     "Signer B <signer-b@example.com> (OpenPGP key ECB9)"),
    (1, "[GNUPG:] ERRSIG ECB9 22 8 00 1 9 6A30\n[GNUPG:] NO_PUBKEY ECB9\n", False, "unknown key", "OpenPGP key ECB9"),
    (1, "[GNUPG:] EXPKEYSIG F564 Old <old@example.com>\n", False, "expired key", "Old <old@example.com> (OpenPGP key F564)"),
    (1, "[GNUPG:] BADSIG F564 Old <old@example.com>\n", False, "bad signature", "Old <old@example.com> (OpenPGP key F564)"),
    (1, "[GNUPG:] REVKEYSIG F564 Old <old@example.com>\n", False, "revoked key", "Old <old@example.com> (OpenPGP key F564)"),
])
def test_parse_verdict(code: int, output: str, trusted: bool, reason: str | None, signer: str | None) -> None:
    verdict = parse_verdict("c" * 40, code, output)
    assert (verdict.trusted, verdict.reason, verdict.signer) == (trusted, reason, signer)
    if not trusted:
        assert verdict.problem().startswith(f"commit {'c' * 12} is not trusted: {reason}")


def test_verification_needs_trusted_signers_from_settings(tmp_path: Path) -> None:
    with pytest.raises(CommitVerificationError, match="--allowed-signers FILE"):
        CommitVerifier("head", home=tmp_path)
    with pytest.raises(CommitVerificationError, match="no such file"):
        CommitVerifier("head", home=tmp_path, allowed_signers=tmp_path / "missing")
    (tmp_path / "keys").mkdir()
    with pytest.raises(CommitVerificationError, match="no \\*.asc"):
        CommitVerifier("all", home=tmp_path, gpg_keys=tmp_path / "keys")


# --- real signatures ----------------------------------------------------------------------------------


class Signers:
    """SSH keys (signer-a trusted, attacker not) and OpenPGP keys (signer-b trusted, old expired, unknown-signer unknown)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        for name in ("signer-a", "attacker"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(root / name)],
                           check=True)
        self.allowed = root / "allowed_signers"
        self.allowed.write_text(f"signer-a@example.com {(root / 'signer-a.pub').read_text().strip()}\n")
        self.gnupg = root / "signing-gnupg"
        self.gnupg.mkdir(mode=0o700)
        self.fpr: dict[str, str] = {}
        for name, extra in (("signer-b", []), ("old", ["--faked-system-time", "20200101T000000"]), ("unknown-signer", [])):
            subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", *extra, "--quick-gen-key",
                            f"{name.title()} <{name}@example.com>", "ed25519", "sign", "1d" if name == "old" else "1y"],
                           env=self.gpg_env, check=True, capture_output=True)
            listing = subprocess.run(["gpg", "--list-keys", "--with-colons", f"{name}@example.com"], env=self.gpg_env,
                                     check=True, capture_output=True, text=True).stdout
            self.fpr[name] = next(line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr"))
        self.gpg_keys = root / "trusted-gpg"
        self.gpg_keys.mkdir()
        for name in ("signer-b", "old"):  # unknown-signer's key is not given to plnt
            exported = subprocess.run(["gpg", "--armor", "--export", self.fpr[name]], env=self.gpg_env, check=True,
                                      capture_output=True).stdout
            (self.gpg_keys / f"{name}.asc").write_bytes(exported)

    @property
    def gpg_env(self) -> dict[str, str]:
        return {**os.environ, "GNUPGHOME": str(self.gnupg)}


class Repo:
    def __init__(self, path: Path, signers: Signers) -> None:
        self.path, self.signers = path, signers
        path.mkdir()
        self.git("init", "-q", "-b", "main")
        self.n = 0

    def git(self, *args: str, env: dict[str, str] | None = None) -> str:
        return subprocess.run(["git", *args], cwd=self.path, env={**(env or os.environ), **GIT_ENV}, check=True,
                              capture_output=True, text=True).stdout.strip()

    def commit(self, signer: str | None, message: str = "change") -> str:
        self.n += 1
        (self.path / f"f{self.n}").write_text(str(self.n))
        self.git("add", "-A")
        args: list[str] = []
        env = None
        if signer in ("signer-a", "attacker"):
            args = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={self.signers.root / signer}.pub"]
        elif signer is not None:
            args = ["-c", f"user.signingkey={self.signers.fpr[signer]}"]
            env = self.signers.gpg_env
            if signer == "old":  # signed while its key was valid (2020), verified now that it has expired
                args += ["-c", f"gpg.program={self._faked_gpg()}"]
        self.git(*args, "commit", "-q", *(["-S"] if signer else []), "-m", message, env=env)
        return self.git("rev-parse", "HEAD")

    def _faked_gpg(self) -> Path:
        script = self.signers.root / "gpg-2020"
        if not script.exists():
            script.write_text('#!/bin/sh\nexec gpg --faked-system-time 20200101T120000 "$@"\n')
            script.chmod(0o755)
        return script


@pytest.fixture(scope="module")
def signers(tmp_path_factory: pytest.TempPathFactory) -> Signers:
    return Signers(tmp_path_factory.mktemp("signers"))


@pytest.fixture
def repo(tmp_path: Path, signers: Signers) -> Repo:
    return Repo(tmp_path / "repo", signers)


def verifier(tmp_path: Path, signers: Signers, mode: str = "head") -> CommitVerifier:
    return CommitVerifier(mode, home=tmp_path / "state", allowed_signers=signers.allowed,  # type: ignore[arg-type]
                          gpg_keys=signers.gpg_keys)


@pytest.mark.integration  # ssh-keygen, gpg and git processes
@pytest.mark.parametrize("signer, trusted, reason, who", [
    ("signer-a", True, None, "signer-a@example.com"),
    (None, False, "unsigned", None),
    ("attacker", False, "unknown key", "ED25519 key SHA256:"),
    ("signer-b", True, None, "Signer-B <signer-b@example.com>"),
    ("unknown-signer", False, "unknown key", "OpenPGP key"),
    ("old", False, "expired key", "Old <old@example.com>"),
])
def test_real_signatures(repo: Repo, signers: Signers, tmp_path: Path, signer: str | None, trusted: bool,
                         reason: str | None, who: str | None) -> None:
    commit = repo.commit(signer)
    verdict = verifier(tmp_path, signers).verify(repo.path / ".git", commit)
    assert (verdict.trusted, verdict.reason) == (trusted, reason), verdict
    if who is not None:
        assert verdict.signer is not None and who in verdict.signer, verdict


@pytest.mark.integration
def test_an_ssh_key_past_its_valid_before_date_is_expired(repo: Repo, signers: Signers, tmp_path: Path) -> None:
    commit = repo.commit("signer-a")
    expired = tmp_path / "allowed-expired"
    expired.write_text(f'signer-a@example.com valid-before="20200101" {(signers.root / "signer-a.pub").read_text().strip()}\n')
    verdict = CommitVerifier("head", home=tmp_path / "s", allowed_signers=expired).verify(repo.path / ".git", commit)
    assert (verdict.trusted, verdict.reason) == (False, "expired key")


@pytest.mark.integration
def test_the_users_git_config_cannot_widen_trust(repo: Repo, signers: Signers, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A global allowed-signers file naming attacker is ignored: only plnt's settings decide."""
    commit = repo.commit("attacker")
    home = tmp_path / "home"
    home.mkdir()
    wide = home / "wide"
    wide.write_text(f"attacker {(signers.root / 'attacker.pub').read_text().strip()}\n")
    (home / ".gitconfig").write_text(f"[gpg \"ssh\"]\n\tallowedSignersFile = {wide}\n")
    monkeypatch.setenv("HOME", str(home))
    verdict = verifier(tmp_path, signers).verify(repo.path / ".git", commit)
    assert (verdict.trusted, verdict.reason) == (False, "unknown key")


@pytest.mark.integration
def test_all_finds_a_bad_commit_under_a_good_merge_head_does_not(repo: Repo, signers: Signers, tmp_path: Path) -> None:
    last = repo.commit("signer-a", "reconciled")
    repo.git("checkout", "-q", "-b", "feature")
    good = repo.commit("signer-b", "signed work")
    bad = repo.commit(None, "an unsigned commit in the branch")
    repo.git("checkout", "-q", "main")
    repo.git("-c", "gpg.format=ssh", "-c", f"user.signingkey={signers.root / 'signer-a'}.pub",
             "merge", "-q", "--no-ff", "-S", "-m", "a signed merge", "feature")
    head = repo.git("rev-parse", "HEAD")
    git_dir = repo.path / ".git"
    assert verifier(tmp_path, signers, "head").first_untrusted(git_dir, head, last) is None
    strict = verifier(tmp_path / "all", signers, "all")
    assert strict.to_check(git_dir, head, last) == [good, bad, head]
    untrusted = strict.first_untrusted(git_dir, head, last)
    assert untrusted is not None and (untrusted.commit, untrusted.reason) == (bad, "unsigned")
    # Nothing reconciled yet: the head alone.
    assert strict.to_check(git_dir, head, None) == [head]


# --- what the allowed-signers file adds to a refusal ---------------------------------------------------


def _entry(signers: Signers, options: str, principal: str = "signer-a@example.com") -> str:
    return f"{principal} {options} {(signers.root / 'signer-a.pub').read_text().strip()}"


@pytest.mark.integration
def test_a_key_limited_to_the_file_namespace_is_refused_as_such(repo: Repo, signers: Signers, tmp_path: Path) -> None:
    """ssh-keygen says only "Could not verify signature": the refusal names the entry and the fix."""
    commit = repo.commit("signer-a")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text("# signers of release files\n" + _entry(signers, 'namespaces="file"') + "\n")
    verdict = CommitVerifier("head", home=tmp_path / "s", allowed_signers=allowed).verify(repo.path / ".git", commit)
    assert (verdict.trusted, verdict.reason) == (False, "the key's namespaces do not allow git"), verdict
    assert verdict.signer is not None and verdict.signer.startswith("signer-a@example.com (ssh-ed25519 key SHA256:")
    problem = verdict.problem()
    assert f'{allowed.resolve()}:2 (namespaces="file")' in problem, problem
    assert 'add git to namespaces="..." in that line (namespaces="file,git")' in problem, problem
    assert "Could not verify" not in problem
    assert verdict.model_dump(mode="json")["detail"] == verdict.detail  # GET /source's `untrusted` carries it
    # With git added, the same commit is trusted: the explanation decides nothing.
    allowed.write_text(_entry(signers, 'namespaces="file,git"') + "\n")
    assert CommitVerifier("head", home=tmp_path / "t", allowed_signers=allowed).verify(repo.path / ".git", commit).trusted


@pytest.mark.integration
def test_a_key_listed_for_git_on_another_line_is_not_blamed_on_its_namespaces(repo: Repo, signers: Signers,
                                                                              tmp_path: Path) -> None:
    """The attacker's key is unknown: an unrelated entry limited to "file" does not change the reason."""
    commit = repo.commit("attacker")
    allowed = tmp_path / "allowed_signers"
    allowed.write_text(_entry(signers, 'namespaces="file"') + "\n")
    verdict = CommitVerifier("head", home=tmp_path / "s", allowed_signers=allowed).verify(repo.path / ".git", commit)
    assert verdict.trusted is False and verdict.detail is None and "namespaces" not in (verdict.reason or ""), verdict


@pytest.mark.integration
def test_an_expired_ssh_key_names_its_valid_before_entry(repo: Repo, signers: Signers, tmp_path: Path) -> None:
    commit = repo.commit("signer-a")
    expired = tmp_path / "allowed-expired"
    expired.write_text("\n" + _entry(signers, 'namespaces="git",valid-before="20200101"') + "\n")
    verdict = CommitVerifier("head", home=tmp_path / "s", allowed_signers=expired).verify(repo.path / ".git", commit)
    assert (verdict.trusted, verdict.reason) == (False, "expired key")
    assert f'{expired.resolve()}:2 (valid-before="20200101")' in verdict.problem(), verdict.problem()
    assert "move valid-before later" in verdict.problem()


@pytest.mark.integration  # ssh-keygen makes the key
def test_allowed_signers_entries_are_parsed_as_ssh_keygen_reads_them(tmp_path: Path) -> None:
    """Keys made by ssh-keygen; the file is written by hand in every form its manual allows."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    key = (tmp_path / "k.pub").read_text().split()
    allowed = tmp_path / "allowed"
    allowed.write_text("\n".join([
        "# a comment",
        f"a@example.com {key[0]} {key[1]} a comment",
        f'"b@example.com,c@example.com" namespaces="git,file",valid-before="20300101" {key[0]} {key[1]}',
        f"*@example.com cert-authority {key[0]} {key[1]}",
        f'd@example.com Namespaces="file",valid-after="20200101" {key[0]} {key[1]}',
        "not an entry",
    ]) + "\n")
    entries = parse_allowed_signers(allowed)
    assert [(e.line, e.principals, e.namespaces, e.valid_before, e.cert_authority) for e in entries] == [
        (2, "a@example.com", None, None, False),
        (3, "b@example.com,c@example.com", "git,file", "20300101", False),
        (4, "*@example.com", None, None, True),
        (5, "d@example.com", "file", None, False),
    ]
    assert [e.allows("git") for e in entries] == [True, True, True, False]
    # OpenSSH's pattern lists: wildcards, and a negated match refuses.
    assert entries[0].model_copy(update={"namespaces": "g*"}).allows("git")
    assert not entries[0].model_copy(update={"namespaces": "*,!git"}).allows("git")
