"""Hostile specs committed to the repository a live `plnt up` follows (issue 8, item 3; item 7's
unreadable tree). Each commit must be refused as a FILE:LINE problem in status and GET /source,
within bounded memory (this process is plnt: its VmHWM), with nothing written outside the state
directory, the serving version still answering, and the gateway answering /healthz meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from plnt.reconciler.app import Plnt

from tests.attacks.live import AttackRepo, OutsideWrites, assert_still_serving, live_plnt
from tests.e2e.harness import wait_for
from tests.reconciler.source.test_source import commit_with_entry

pytestmark = pytest.mark.integration

PROBLEM_LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<field>[^:]+): (?P<message>.+)$")
HOSTILE = "workflowruns/hostile.yaml"
RSS_BOUND_MIB = 200  # generous: the 429-byte alias bomb took plnt from 167 MiB to 1.6 GiB


def vm_hwm_mib() -> float:
    """Peak resident memory of this process, which is the plnt under attack."""
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def alias_bomb(levels: int = 9) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def merge_bomb(levels: int = 9) -> str:
    lines = ["m0: &m0 {k0: 1, k1: 2, k2: 3}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 9)}], own{i}: 1}}" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def write_bytes(data: bytes, relative: str = HOSTILE) -> Callable[[AttackRepo], str]:
    def make(repo: AttackRepo) -> str:
        (repo.path / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo.path / relative).write_bytes(data)
        return repo.repo.commit(f"hostile {relative}")
    return make


def many_files(count: int) -> Callable[[AttackRepo], str]:
    def make(repo: AttackRepo) -> str:
        bulk = repo.path / "bulk"
        bulk.mkdir()
        for i in range(count):
            (bulk / f"f{i:05}.yaml").write_text("a: 1\n")
        return repo.repo.commit(f"{count} spec files")
    return make


def dotdot_tree(repo: AttackRepo) -> str:
    return commit_with_entry(repo.repo, "..")


@dataclass(frozen=True)
class Case:
    make: Callable[[AttackRepo], str]
    problem: str  # the start of the first problem line: FILE:LINE: field: message...


BACKEND_WITH_DUPLICATE = b"apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: other}\nspec: {type: local}\nspec: {}\n"

CASES = {
    "nul-byte": Case(write_bytes(b"apiVersion: plnt.work/v1\nkind: Plnt\0Backend\n"),
                     f"{HOSTILE}:2: document: character U+0000 at column 11 is not allowed in YAML"),
    "invalid-utf8": Case(write_bytes(b"apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: caf\xe9}\n"),
                         f"{HOSTILE}:3: document: not UTF-8 text: byte 0xe9 at column 21"),
    "5000-deep": Case(write_bytes(b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n"),
                      f"{HOSTILE}:1: document: nested more than 64 levels deep (max_depth)"),
    "alias-bomb": Case(write_bytes(alias_bomb().encode()),
                       f"{HOSTILE}:5: document: aliases or merge keys expand this file to more than"),
    "merge-key-bomb": Case(write_bytes(merge_bomb().encode()),
                           f"{HOSTILE}:5: document: aliases or merge keys expand this file to more than"),
    "2MiB-file": Case(write_bytes(b"# " + b"x" * 2 * 2**20 + b"\n"),
                      f"{HOSTILE}:1: document: file is 2097155 bytes, over the limit of 1048576"),
    "20000-files": Case(many_files(20_000), "bulk/f09999.yaml:1: document: more than 10000 spec files (limit max_files); nothing of this commit was read"),
    "duplicate-keys": Case(write_bytes(BACKEND_WITH_DUPLICATE),
                           f"{HOSTILE}:5: spec: duplicate key 'spec'; first given at line 4"),
    "dotdot-tree": Case(dotdot_tree, "..:1: tree: the commit's tree holds an entry named '..', which git refuses"),
}


class HealthProbe:
    """Asks GET /healthz back to back until stopped; keeps (sent, answered) monotonic times."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[tuple[float, float]] = []
        self.failures: list[str] = []
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=60) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                response = await client.get(f"{self.url}/healthz")
                if response.status_code != 200:
                    self.failures.append(f"{response.status_code} {response.text[:100]}")
                self.answers.append((sent, time.monotonic()))
                await asyncio.sleep(0.005)

    def __enter__(self) -> HealthProbe:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    async def stop(self) -> None:
        self._stop.set()
        assert self._task is not None
        await self._task

    def within(self, start: float, end: float) -> list[tuple[float, float]]:
        """Answers to requests sent after start and answered before end."""
        return [(s, a) for s, a in self.answers if s >= start and a <= end]


class ParseWindow:
    """When plnt's reconciler read and parsed each commit (wraps Reconciler._read_specs, which runs
    in a worker thread); also counts reconcile passes."""

    def __init__(self, plnt: Plnt) -> None:
        self.windows: list[tuple[float, float]] = []
        self.passes = 0
        reconciler = plnt.reconciler
        read, once = reconciler._read_specs, reconciler.reconcile_once

        def timed_read(commit: str) -> Any:
            start = time.monotonic()
            try:
                return read(commit)
            finally:
                self.windows.append((start, time.monotonic()))

        async def counted_pass(**kwargs: Any) -> Any:
            try:
                return await once(**kwargs)
            finally:
                self.passes += 1

        reconciler._read_specs = timed_read  # type: ignore[method-assign]
        reconciler.reconcile_once = counted_pass  # type: ignore[method-assign]


async def source_of(plnt: Plnt) -> dict[str, Any]:
    async with httpx.AsyncClient(trust_env=False, timeout=30) as client:
        response = await client.get(f"{plnt.url}/source")
        response.raise_for_status()
        return dict(response.json())


async def refused(plnt: Plnt, commit: str, timeout: float = 120.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        source = await source_of(plnt)
        return source if source.get("newestCommit") == commit and source.get("problems") else None

    return await wait_for(check, timeout=timeout, what=f"GET /source to show commit {commit[:12]} refused")


async def reconciled(plnt: Plnt, commit: str, timeout: float = 60.0) -> None:
    await wait_for(lambda: plnt.reconciler.source_status.get("lastReconciledCommit") == commit,
                   timeout=timeout, what=f"commit {commit[:12]} reconciled")


async def more_passes(parses: ParseWindow, count: int = 3) -> None:
    """Wait until the reconciler has made `count` more passes (the commit seen again each time)."""
    target = parses.passes + count
    await wait_for(lambda: parses.passes >= target, what=f"{count} more reconcile passes")


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
async def test_hostile_spec_commit_is_refused_and_changes_nothing(
    case: Case, attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="plnt.reconciler.control.loop")
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        # The repository's work tree is the attacker's to write; plnt must write only in its state.
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root, attack_repo.path])
        parses = ParseWindow(plnt)
        memory_before = vm_hwm_mib()
        with HealthProbe(plnt.url) as health:
            commit = await asyncio.to_thread(case.make, attack_repo)
            source = await refused(plnt, commit)
            await more_passes(parses)
            await health.stop()

        first = source["problems"][0]
        assert first.startswith(case.problem), source["problems"]
        assert all(PROBLEM_LINE.match(line) for line in source["problems"]), source["problems"]
        assert source["lastReconciledCommit"] != commit
        assert (await source_of(plnt))["problems"] == source["problems"]  # and it stays so
        status = plnt.statuses.get("default/review-responder")
        assert status is not None  # what still serves, then what is refused
        assert status.message.startswith(f"Ready 1.2.0; commit {commit[:12]} is invalid") and case.problem in status.message

        # Reported once, however many passes saw the commit; never a traceback.
        invalid = [r for r in caplog.records if r.getMessage().startswith(f"commit-invalid commit={commit[:12]}")]
        assert len(invalid) == 1, [r.getMessage() for r in invalid]
        assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records if r.exc_info]
        assert len(parses.windows) == 1  # read and parsed once, however many passes saw it

        assert vm_hwm_mib() - memory_before < RSS_BOUND_MIB
        assert health.failures == [] and health.answers, health.failures[:3]
        await assert_still_serving(plnt)
        outside.assert_none()


async def test_gateway_answers_while_a_large_legal_commit_is_parsed(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
) -> None:
    """1,500 recipe documents (legal, nothing to deploy): the parse runs in a thread, so /healthz
    requests sent after it began are answered before it ended. (Parsed on the event loop, no request
    sent during the parse could be answered before it ended.) An ordering, not a rate: how many were
    answered and the longest gap are printed, not asserted."""
    recipes = "---\n".join(
        f"apiVersion: microagents.dev/v1\nkind: Workflow\nmetadata: {{name: bulk, version: 1.0.{i}}}\n"
        "runtime: {entrypoint: steps.py}\nsteps:\n  - {id: classify_intent, tool: llm.classify}\n"
        "  - {id: draft_reply, tool: llm.generate, deps: [classify_intent]}\n" for i in range(1500))
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        parses = ParseWindow(plnt)
        with HealthProbe(plnt.url) as health:
            commit = await asyncio.to_thread(write_bytes(recipes.encode(), "bulk/recipes.yaml"), attack_repo)
            await reconciled(plnt, commit, timeout=120)
            await health.stop()
        assert plnt.reconciler.source_status["problems"] == []
        start, end = max(parses.windows, key=lambda w: w[1] - w[0])  # the large commit
        assert len(plnt.reconciler._loaded[1].recipes) == 1500  # type: ignore[index]
        during = health.within(start, end)
        gaps = [b[1] - a[1] for a, b in zip(during, during[1:], strict=False)]
        assert during, f"no /healthz sent during the {end - start:.2f} s parse was answered before it ended"
        print(f"parse {end - start:.2f} s: {len(during)} /healthz answered during it, longest gap "
              f"{max(gaps, default=0):.3f} s")
        await assert_still_serving(plnt)


async def test_loose_identity_regex_is_a_warning_in_source_logged_once_and_the_commit_applies(
    attack_repo: AttackRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An identityRegex with unescaped dots (it accepts recipes@attackXplnt.invalid too) deploys as
    before (trust.py applies it with re.fullmatch; the real signer matches) but is shown and logged."""
    caplog.set_level(logging.INFO, logger="plnt.reconciler.control.loop")
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        parses = ParseWindow(plnt)
        policy = attack_repo.path / "trust" / "policy.yaml"
        policy.write_text(policy.read_text().replace("identity: recipes@", "identityRegex: recipes@"))
        commit = await asyncio.to_thread(attack_repo.repo.commit, "identityRegex with unescaped dots")
        await reconciled(plnt, commit)
        await more_passes(parses)
        source = await source_of(plnt)
        assert source["problems"] == []
        assert source["warnings"] == [
            "trust/policy.yaml:11: spec.signers[0].identityRegex: warning: an unescaped '.' in "
            "'recipes@attack.plnt.invalid' matches any character, not only a dot ('recipes@attackXplnt.invalid' is "
            "accepted too); write '\\.' for a literal dot"]
        logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("commit-warning")]
        assert logged == [f"commit-warning commit={commit[:12]} {source['warnings'][0]}"]
        await assert_still_serving(plnt)
        # Escaped, the warning goes away with the next commit.
        policy.write_text(policy.read_text().replace("recipes@attack.plnt.invalid", "recipes@attack\\.plnt\\.invalid"))
        fixed = await asyncio.to_thread(attack_repo.repo.commit, "dots escaped")
        await reconciled(plnt, fixed)
        assert (await source_of(plnt))["warnings"] == []
