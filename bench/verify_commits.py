"""What --verify-commits costs per reconcile: `git verify-commit` over the commits a new head brings.

Makes a real git repository with N signed commits (SSH keys from ssh-keygen, OpenPGP keys from gpg),
then times CommitVerifier.first_untrusted with `all` over 1 and N new commits (cold: a fresh
verifier, no cached verdicts), and once more warm (cached).

    python bench/verify_commits.py [--commits 100] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plnt.reconciler.source.commit_trust import CommitVerifier  # noqa: E402

GIT = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@plnt.invalid",
       "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@plnt.invalid"}


def run(*args: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    return subprocess.run(list(args), cwd=cwd, env={**os.environ, **GIT, **(env or {})}, check=True,
                          capture_output=True, text=True).stdout.strip()


def make_repo(root: Path, kind: str, commits: int) -> tuple[Path, dict[str, Path]]:
    repo = root / f"repo-{kind}"
    repo.mkdir()
    run("git", "init", "-q", "-b", "main", cwd=repo)
    env: dict[str, str] = {}
    if kind == "ssh":
        key = root / "key"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (root / "allowed").write_text(f"bench@plnt.invalid {key.with_suffix('.pub').read_text().strip()}\n")
        sign = ["-c", "gpg.format=ssh", "-c", f"user.signingkey={key}.pub"]
        trust = {"allowed_signers": root / "allowed"}
    else:
        home = root / "gnupg"
        home.mkdir(mode=0o700)
        env = {"GNUPGHOME": str(home)}
        subprocess.run(["gpg", "--batch", "--quiet", "--passphrase", "", "--quick-gen-key", "Bench <bench@plnt.invalid>",
                        "ed25519", "sign", "1y"], env={**os.environ, **env}, check=True, capture_output=True)
        (root / "keys").mkdir()
        (root / "keys" / "bench.asc").write_bytes(subprocess.run(
            ["gpg", "--armor", "--export", "bench@plnt.invalid"], env={**os.environ, **env}, check=True,
            capture_output=True).stdout)
        sign = ["-c", "user.signingkey=bench@plnt.invalid"]
        trust = {"gpg_keys": root / "keys"}
    for i in range(commits + 1):
        (repo / "f").write_text(str(i))
        run("git", "add", "-A", cwd=repo)
        run("git", *sign, "commit", "-q", "-S", "-m", f"c{i}", cwd=repo, env=env)
    return repo, trust


def timed(verifier: CommitVerifier, git_dir: Path, head: str, last: str) -> float:
    start = time.perf_counter()
    assert verifier.first_untrusted(git_dir, head, last) is None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commits", type=int, default=100)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    print(f"# bench/verify_commits.py: {os.cpu_count()} cores; git {run('git', '--version', cwd=ROOT).split()[-1]}; "
          "cold = a fresh verifier, warm = verdicts cached", file=sys.stderr)
    rows = []
    with tempfile.TemporaryDirectory(prefix="plnt-bench-verify-") as tmp:
        for kind in ("ssh", "gpg"):
            root = Path(tmp) / kind
            root.mkdir()
            repo, trust = make_repo(root, kind, args.commits)
            git_dir = repo / ".git"
            head = run("git", "rev-parse", "HEAD", cwd=repo)
            for new in (1, args.commits):
                last = run("git", "rev-parse", f"HEAD~{new}", cwd=repo)
                verifier = CommitVerifier("all", home=root / f"state-{new}", **trust)  # type: ignore[arg-type]
                cold = timed(verifier, git_dir, head, last)
                warm = timed(verifier, git_dir, head, last)
                rows.append({"signature": kind, "new_commits": new, "cold_ms": round(cold * 1000, 1),
                             "cold_ms_per_commit": round(cold * 1000 / new, 2), "warm_ms": round(warm * 1000, 2)})
    if not args.json:
        print(f"{'signature':10} {'new commits':>11} {'cold ms':>9} {'per commit':>11} {'warm ms':>8}")
        for r in rows:
            print(f"{r['signature']:10} {r['new_commits']:>11} {r['cold_ms']:>9} {r['cold_ms_per_commit']:>11} "
                  f"{r['warm_ms']:>8}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
