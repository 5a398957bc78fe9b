"""Each rollout's verdict back on its commit, end to end: a real plnt (Temporal, runner processes,
gateway, signed recipes of gitops-example) reporting to the DECLARED forge stand-in
(tests/forge_standin.py, GitHub's documented shapes; not a live forge), and writing git notes into
the spec repository it deploys from (a real git repository, its origin)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from plnt.reconciler.review.notes import NOTES_REF
from pydantic import SecretStr

from tests.conftest import SpecRepo
from tests.e2e.harness import hook, invoke, running_plnt, settings_for, wait_for, wait_phase
from tests.forge_standin import ForgeStandin

pytestmark = pytest.mark.integration

RUN_FILE = "workflowruns/review-responder.yaml"
TOKEN = "e2e-forge-token-ABC123"
CONTEXT = "plnt/default/review-responder"


def statuses_of(s: ForgeStandin, sha: str) -> list[tuple[str, str]]:
    return [(st["state"], st["description"]) for st in s.statuses if st["sha"] == sha and st["context"] == CONTEXT]


def notes(repo: Path) -> str:
    return subprocess.run(["git", "log", "--notes=plnt", "--format=%H%n%N"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout


def has_note(repo: Path, ref: str = NOTES_REF) -> bool:
    return subprocess.run(["git", "rev-parse", "-q", "--verify", ref], cwd=repo, capture_output=True).returncode == 0


async def test_statuses_in_order_and_notes_for_a_promoted_then_a_rolled_back_commit(
    spec_repo: SpecRepo, tmp_path: Path, temporal_address: str, temporal_namespace: str
) -> None:
    first = spec_repo.git("rev-parse", "HEAD")
    with ForgeStandin("github", "owner/specs", TOKEN, page_size=3) as forge:
        settings = settings_for(spec_repo.path, tmp_path / "state", temporal_address, temporal_namespace,
                                forge="github", forge_api_url=forge.api_url, forge_project="owner/specs",
                                forge_token=SecretStr(TOKEN), write_notes=True)
        async with running_plnt(settings) as plnt:
            await wait_phase(plnt, "Ready", version="1.2.0")
            await wait_for(lambda: any(s == "success" for s, _ in statuses_of(forge, first)),
                           what=f"success on {first[:12]} (seen: {statuses_of(forge, first)})")

            spec_repo.replace(RUN_FILE, "review-responder@1.2.0", "review-responder@1.4.0")
            second = spec_repo.commit("broken 1.4.0")  # its smoke test fails: every invocation errors
            await hook(plnt)
            await wait_phase(plnt, "RolledBack", version="1.2.0")
            await wait_for(lambda: any(s == "failure" for s, _ in statuses_of(forge, second)),
                           what=f"failure on {second[:12]} (seen: {statuses_of(forge, second)})")
            served = await invoke(plnt)
            assert served.status_code == 200 and served.json()["version"] == "1.2.0"
            await wait_for(lambda: second in notes(spec_repo.path) and "RolledBack 1.4.0" in notes(spec_repo.path),
                           what="notes for both commits in the origin")
        ours = [r for r in forge.requests if r.path.endswith("/statuses/" + first) or r.path.endswith("/statuses/" + second)]
        assert all(r.headers.get("Authorization") == f"Bearer {TOKEN}" for r in ours)

    on_first, on_second = statuses_of(forge, first), statuses_of(forge, second)
    print("statuses", on_first, on_second, sep="\n")
    # Each commit: pending (one or more distinct steps) then exactly one final verdict, last.
    assert on_first[-1] == ("success", "Ready 1.2.0: " + on_first[-1][1].split(": ", 1)[1])
    assert [s for s, _ in on_first[:-1]] and all(s == "pending" for s, _ in on_first[:-1]), on_first
    assert "≤ 2500" in on_first[-1][1] and "errors 0% ≤ 1%" in on_first[-1][1]
    assert on_second[-1][0] == "failure" and on_second[-1][1].startswith("RolledBack 1.4.0 (1.2.0 serving): error rate 100%")
    assert [s for s, _ in on_second[:-1]] and all(s == "pending" for s, _ in on_second[:-1]), on_second
    # The verdict of the first commit is not touched by the second rollout (nor by "in sync" passes).
    assert [s for s, _ in on_first].count("success") == 1
    for seq in (on_first, on_second):
        assert len(set(seq)) == len(seq), f"a repeated status: {seq}"
    # Nothing posted on any other context or commit.
    assert {st["context"] for st in forge.statuses} == {CONTEXT}
    assert {st["sha"] for st in forge.statuses} == {first, second}

    log = notes(spec_repo.path)
    lines = log.split("\n")
    note_first = lines[lines.index(first) + 1]
    note_second = lines[lines.index(second) + 1]
    assert note_first.startswith("default/review-responder: Ready 1.2.0 (p95 ") and note_first.endswith("Z")
    assert note_second.startswith("default/review-responder: RolledBack 1.4.0 (error rate 100% over budget 1%")
    assert "1.2.0 still serving" in note_second
