"""The attack suite's common ground: a live `plnt up` (in-process `start()`, the code path the CLI
runs: real Temporal, real git, real runner processes, real gateway) on a spec repository whose
recipes are signed by a trust root made for the test, plus the checks every attack ends with:

- the refusal and its message (each test asserts its own);
- nothing was written outside the state directory (`OutsideWrites`);
- the version already serving keeps answering (`assert_still_serving`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from plnt.reconciler.app import Plnt
from plnt.reconciler.recipes.archive import pack_recipe_to

from tests.conftest import EXAMPLE, SpecRepo
from tests.e2e.harness import invoke, running_plnt, settings_for, wait_phase
from tests.sigstore_ca import TestSigstoreAuthority

RUN_FILE = "workflowruns/review-responder.yaml"
IDENTITY = "recipes@attack.plnt.invalid"
ISSUER = "https://issuer.attack.plnt.invalid"

POLICY = f"""\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata:
  name: attack-recipes
spec:
  recipes: ["review-responder"]
  trustRoot:
    trustedRootFile: trust/attack-trusted-root.json
  signers:
    - issuer: {ISSUER}
      identity: {IDENTITY}
"""


@dataclass
class AttackRepo:
    """The example spec repository, re-signed by a trust root made for this test."""

    repo: SpecRepo
    authority: TestSigstoreAuthority

    @property
    def path(self) -> Path:
        return self.repo.path

    def publish(self, name: str, version: str, source: Path | None = None, *, registry: str = "registry",
                sign: bool = True, identity: str = IDENTITY, issuer: str = ISSUER,
                authority: TestSigstoreAuthority | None = None) -> Path:
        """Pack `source` (default: the example's recipe sources) into `registry/name/version/` inside
        the repository and sign it; returns the entry's directory. Commit it yourself."""
        source = source or EXAMPLE / "recipes" / name / version
        entry = self.path / registry / name / version
        entry.mkdir(parents=True, exist_ok=True)
        pack_recipe_to(source, entry / "recipe.tar.gz")
        bundle = entry / "recipe.tar.gz.sigstore.json"
        bundle.unlink(missing_ok=True)
        if sign:
            bundle.write_text((authority or self.authority).sign(entry / "recipe.tar.gz", identity, issuer))
        return entry

    def deploy(self, ref: str, registry: str = "file:registry") -> str:
        """Point the WorkflowRun at ref (name@version) in registry and commit; returns the commit."""
        text = (self.path / RUN_FILE).read_text()
        lines = []
        for line in text.splitlines():
            if line.strip().startswith("ref:"):
                line = line.split("ref:")[0] + f"ref: {ref}"
            elif line.strip().startswith("registry:"):
                line = line.split("registry:")[0] + f"registry: {registry}"
            lines.append(line)
        (self.path / RUN_FILE).write_text("\n".join(lines) + "\n")
        return self.repo.commit(f"deploy {ref} from {registry}")


@pytest.fixture
def attack_repo(spec_repo: SpecRepo) -> AttackRepo:
    """review-responder 1.2.0 and 1.3.0 signed by a fresh test authority; the demo policy replaced."""
    authority = TestSigstoreAuthority(name="attack")
    authority.write_trusted_root(spec_repo.path / "trust" / "attack-trusted-root.json")
    (spec_repo.path / "trust" / "policy.yaml").write_text(POLICY)
    repo = AttackRepo(spec_repo, authority)
    for version in ("1.2.0", "1.3.0"):
        repo.publish("review-responder", version)
    spec_repo.commit("recipes signed by the attack-suite authority")
    return repo


class OutsideWrites:
    """Every file under `roots` (path -> (size, mtime_ns)), compared before and after an attack.

    The state directory (and anything under `ignore`) is left out: writing there is plnt's job.
    """

    def __init__(self, roots: list[Path], ignore: list[Path]) -> None:
        self.roots = [r.resolve() for r in roots]
        self.ignore = [i.resolve() for i in ignore]
        self.before = self._scan()

    def _scan(self) -> dict[str, tuple[int, int]]:
        seen: dict[str, tuple[int, int]] = {}
        for root in self.roots:
            for dirpath, dirnames, filenames in os.walk(root):
                here = Path(dirpath)
                dirnames[:] = [d for d in dirnames if not any((here / d).resolve() == i for i in self.ignore)
                               and d != ".git"]
                for name in filenames:
                    path = here / name
                    try:
                        st = path.lstat()
                    except FileNotFoundError:
                        continue
                    seen[str(path)] = (st.st_size, st.st_mtime_ns)
        return seen

    def changes(self) -> list[str]:
        after = self._scan()
        added = sorted(set(after) - set(self.before))
        changed = sorted(p for p in set(after) & set(self.before) if after[p] != self.before[p])
        return [f"+ {p}" for p in added] + [f"~ {p}" for p in changed]

    def assert_none(self) -> None:
        changes = self.changes()
        assert changes == [], f"written outside the state directory: {changes[:10]}"


async def assert_still_serving(plnt: Plnt, version: str = "1.2.0", payload: dict[str, Any] | None = None) -> None:
    response = await invoke(plnt, payload)
    assert response.status_code == 200, response.text
    assert response.json()["version"] == version, response.json()


@contextlib.asynccontextmanager
async def live_plnt(repo: AttackRepo, tmp_path: Path, temporal_address: str, namespace: str,
                    **overrides: Any) -> AsyncIterator[Plnt]:
    """`async with live_plnt(...) as plnt`: plnt up with review-responder 1.2.0 Ready, stopped (runners
    and all) when the block ends, however it ends. (It was an async generator used with `async for`:
    a `return` or a failure inside the loop left plnt running until the generator was collected, and
    with it the test's runner.)"""
    settings = settings_for(repo.path, tmp_path / "state", temporal_address, namespace, **overrides)
    async with running_plnt(settings) as plnt:
        await wait_phase(plnt, "Ready", version="1.2.0")
        yield plnt
