"""Attacks on the saga through a live plnt: recipe code run inside plnt, and sagas (or single
activities) forged by anyone who can reach plnt's Temporal namespace.

Real parts only: a live `plnt up` (in-process `start()`), the real embedded Temporal dev server, a
real git repository, recipes signed by a trust root made for the test, real runner processes. The
attacker is a second Temporal client (and, for single activities, a worker of its own).
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from plnt.core.specs.loader import load_directory
from plnt.reconciler.app import Plnt
from plnt.reconciler.saga.io import saga_workflow_id
from plnt.reconciler.saga.temporal_server import connect
from temporalio import workflow
from temporalio.client import Client, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.attacks.live import AttackRepo, OutsideWrites, assert_still_serving, live_plnt
from tests.conftest import EXAMPLE
from tests.e2e.harness import wait_for, wait_phase
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = pytest.mark.integration

RUN = "default/review-responder"


def recipe_with_marker(tmp_path: Path, version: str, markers: Path) -> Path:
    """The example recipe `version`, whose steps.py appends the pid of whatever imports it to `markers`."""
    source = tmp_path / f"recipe-{version}-{uuid.uuid4().hex[:6]}"
    shutil.copytree(EXAMPLE / "recipes" / "review-responder" / version, source)
    steps = source / "steps.py"
    steps.write_text(f"import os\nwith open({str(markers)!r}, 'a') as _m:\n    _m.write(f'{{os.getpid()}}\\n')\n"
                     + steps.read_text())
    return source


def marker_pids(markers: Path) -> set[int]:
    return {int(line) for line in markers.read_text().split()} if markers.exists() else set()


def recipe_modules(plnt: Plnt, before: set[str]) -> list[str]:
    """Modules imported in this (plnt's) process since `before` from a recipe: by the name the
    runner's loader gives them, or by a file under plnt's recipe cache."""
    recipes = str(plnt.state.recipes)
    return [name for name, module in list(sys.modules.items()) if name not in before
            and (name.startswith("plnt_recipe_") or str(getattr(module, "__file__", "") or "").startswith(recipes))]


async def test_recipe_code_runs_only_in_runner_processes(attack_repo: AttackRepo, tmp_path: Path,
                                                         temporal_address: str, temporal_namespace: str) -> None:
    markers = tmp_path / "markers" / "imported-by.pids"
    markers.parent.mkdir()
    modules_before = set(sys.modules)
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        attack_repo.publish("review-responder", "1.3.0", recipe_with_marker(tmp_path, "1.3.0", markers))
        attack_repo.deploy("review-responder@1.3.0")
        outside = OutsideWrites([tmp_path], ignore=[plnt.state.root, markers.parent])
        plnt.reconciler.wake()
        await wait_phase(plnt, "Ready", version="1.3.0", timeout=90)
        stable = plnt.driver.snapshot()[RUN].stable
        assert stable is not None and stable.version == "1.3.0"
        pids = marker_pids(markers)
        # Imported by the runner serving 1.3.0 (the canary, promoted as it is), never by plnt.
        assert pids == {stable.pid}, f"imported by {pids}; runner {stable.pid}; plnt {os.getpid()}"
        assert os.getpid() not in pids
        assert recipe_modules(plnt, modules_before) == []
        await assert_still_serving(plnt, "1.3.0")
        outside.assert_none()


async def in_sync(plnt: Plnt) -> None:
    """After Ready, the reconciler's next pass says "in sync": wait for it, so that the status
    compared before and after an attack is one the reconciler itself leaves alone."""
    await wait_for(lambda: plnt.statuses.get(RUN).message == "1.2.0 in sync",  # type: ignore[union-attr]
                   what="review-responder 1.2.0 in sync")


class Attack:
    """A second Temporal client aimed at plnt's namespace and task queue, and what must not change."""

    def __init__(self, plnt: Plnt, client: Client, tmp_path: Path) -> None:
        self.plnt = plnt
        self.client = client
        self.outside = OutsideWrites([tmp_path], ignore=[plnt.state.root])
        self.status = plnt.statuses.get(RUN).public()  # type: ignore[union-attr]
        self.releases = plnt.driver.snapshot()
        self.runner_logs = sorted(p.name for p in plnt.state.runner_logs.iterdir())

    async def forge_saga(self, payload: dict[str, Any], workflow_id: str | None = None) -> str:
        """Starts DeploySaga with `payload` as plnt's own reconciler would; returns the refusal."""
        handle = await self.client.start_workflow(
            "DeploySaga", payload, id=workflow_id or saga_workflow_id("default", "review-responder"),
            task_queue=self.plnt.settings.temporal.task_queue, execution_timeout=timedelta(seconds=60))
        with pytest.raises(WorkflowFailureError) as caught:
            await handle.result()
        cause = caught.value.cause
        assert isinstance(cause, ApplicationError) and cause.type == "UntrustedSagaInput", cause
        return cause.message

    async def assert_nothing_changed(self) -> None:
        assert self.plnt.statuses.get(RUN).public() == self.status  # type: ignore[union-attr]
        assert self.plnt.driver.snapshot() == self.releases
        assert sorted(p.name for p in self.plnt.state.runner_logs.iterdir()) == self.runner_logs  # no runner started
        await assert_still_serving(self.plnt, "1.2.0")
        self.outside.assert_none()


def evil_registry(tmp_path: Path, markers: Path) -> tuple[Path, TestSigstoreAuthority]:
    """A `file:///` registry outside the repository with review-responder 1.3.0 signed by the
    attacker's own authority; its steps.py leaves a marker if anything imports it."""
    authority = TestSigstoreAuthority(name="evil")
    registry = tmp_path / "evil-registry"
    entry = registry / "review-responder" / "1.3.0"
    entry.mkdir(parents=True)
    from plnt.reconciler.recipes.archive import pack_recipe_to

    pack_recipe_to(recipe_with_marker(tmp_path, "1.3.0", markers), entry / "recipe.tar.gz")
    (entry / "recipe.tar.gz.sigstore.json").write_text(
        authority.sign(entry / "recipe.tar.gz", "attacker@evil.invalid", "https://evil.invalid"))
    return registry, authority


def attacker_commit(attack_repo: AttackRepo, registry: Path, authority: TestSigstoreAuthority) -> tuple[str, dict[str, Any]]:
    """A commit on a branch of the attacker's (not the tracked one): the WorkflowRun on 1.3.0 from the
    evil registry and a trust policy for the evil signer. Returns it and the saga fields it gives."""
    repo = attack_repo.repo
    repo.git("checkout", "-q", "-b", "attacker")
    authority.write_trusted_root(repo.path / "trust" / "attack-trusted-root.json")
    repo.replace("trust/policy.yaml", "recipes@attack.plnt.invalid", "attacker@evil.invalid")
    repo.replace("trust/policy.yaml", "https://issuer.attack.plnt.invalid", "https://evil.invalid")
    commit = attack_repo.deploy("review-responder@1.3.0", registry=f"file://{registry}")
    specs, problems = load_directory(repo.path)
    repo.git("checkout", "-q", "main")
    assert problems == [], problems
    run = specs.workflow_runs[RUN]
    return commit, {"fingerprint": run.fingerprint(), "version": run.spec.workflow.version,
                    "spec": run.model_dump(mode="json", by_alias=True),
                    "trust_policies": {n: p.model_dump(mode="json", by_alias=True) for n, p in specs.trust_policies.items()}}


async def test_forged_sagas_are_refused_and_change_nothing(attack_repo: AttackRepo, tmp_path: Path,
                                                           temporal_address: str, temporal_namespace: str) -> None:
    markers = tmp_path / "evil-imported-by.pids"
    registry, authority = evil_registry(tmp_path, markers)
    evil_commit, evil = attacker_commit(attack_repo, registry, authority)
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        main = attack_repo.repo.git("rev-parse", "main")
        # The attacker's commit is even in plnt's clone (as after a fetch of every branch): still not the branch.
        assert plnt.reconciler._source.resolve("attacker") == evil_commit
        await in_sync(plnt)
        attack = Attack(plnt, await connect(temporal_address, temporal_namespace), tmp_path)
        base = {"action": "deploy", "namespace": "default", "name": "review-responder",
                "fingerprint": evil["fingerprint"], "version": "1.3.0"}

        # (a) a commit that is not on the tracked branch, and one that does not exist at all
        message = await attack.forge_saga({**base, "commit": evil_commit})
        assert message == (f"refused: commit {evil_commit[:12]} is not on branch 'main' of the spec repository "
                           f"(as plnt last fetched it): plnt deploys only commits of the branch it tracks")
        message = await attack.forge_saga({**base, "commit": "0" * 40})
        assert message.startswith("refused: commit 000000000000 is not on branch 'main'")
        # (b) the branch's own commit, with the attacker's fingerprint and version
        message = await attack.forge_saga({**base, "commit": main})
        assert message.startswith(f"refused: the saga asks for {RUN} version 1.3.0 with fingerprint "
                                  f"{evil['fingerprint']}; commit {main[:12]} gives version 1.2.0")
        # (c) the old input shape: the spec (a file:/// registry) and a trust policy of the attacker's
        message = await attack.forge_saga({**base, "commit": main, "spec": evil["spec"],
                                           "backends": {}, "trust_policies": evil["trust_policies"]})
        assert message.startswith("refused: the saga input is not a plnt SagaInput (it names a commit; it carries "
                                  "no spec, backend or trust policy)")
        assert "trust_policies" in message and "Extra inputs are not permitted" in message
        # (d) a valid input under another workflow id, to run beside plnt's own saga
        message = await attack.forge_saga({**base, "commit": main, "fingerprint": plnt.statuses.get(RUN).deployed_fingerprint,  # type: ignore[union-attr]
                                           "version": "1.2.0"}, workflow_id="plnt-default-review-responder-2")
        assert message == ("refused: a saga for default/review-responder runs as workflow "
                           "plnt-default-review-responder, not plnt-default-review-responder-2")

        await attack.assert_nothing_changed()
        assert not markers.exists()  # the evil recipe was never even unpacked, let alone imported
        assert not any(p.name.startswith(".staging") for p in plnt.state.recipes.iterdir())


async def schedule_on(args: list[Any]) -> Any:
    """From inside the attacker's workflow: one of plnt's activities, on plnt's task queue."""
    activity_name, payload, queue = args
    return await workflow.execute_activity(
        activity_name, payload, task_queue=queue, start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=1))


@workflow.defn(name="Forger", sandboxed=False)
class Forger:
    """The attacker's own workflow, on the attacker's own worker and task queue."""

    @workflow.run
    async def run(self, args: list[Any]) -> Any:
        return await schedule_on(args)


@workflow.defn(name="DeploySaga", sandboxed=False)
class Impostor:
    """The same, named DeploySaga and started under plnt's workflow id, but on the attacker's queue:
    e.g. to install a canary and promote it without plnt's smoke test."""

    @workflow.run
    async def run(self, args: list[Any]) -> Any:
        return await schedule_on(args)


async def test_forged_activities_on_plnt_s_task_queue_are_refused(attack_repo: AttackRepo, tmp_path: Path,
                                                                  temporal_address: str, temporal_namespace: str) -> None:
    async with live_plnt(attack_repo, tmp_path, temporal_address, temporal_namespace) as plnt:
        client = await connect(temporal_address, temporal_namespace)
        await in_sync(plnt)
        attack = Attack(plnt, client, tmp_path)
        main = attack_repo.repo.git("rev-parse", "main")
        status = plnt.statuses.get(RUN)
        assert status is not None
        # A reference plnt itself would make: the branch's commit, its fingerprint and version.
        ref = {"action": "deploy", "namespace": "default", "name": "review-responder", "commit": main,
               "fingerprint": status.deployed_fingerprint, "version": "1.2.0"}
        stable_digest = plnt.driver.snapshot()[RUN].stable.recipe_digest  # type: ignore[union-attr]
        plnt_saga = saga_workflow_id("default", "review-responder")
        queue = f"attacker-{uuid.uuid4().hex[:8]}"
        forged = [
            # status that says whatever the attacker likes
            (Forger, "record_phase", {"namespace": "default", "name": "review-responder", "phase": "Ready",
                                      "fields": {"version": "6.6.6", "endpoint": "http://evil.invalid"}},
             "record_phase runs only as a local activity of plnt's own DeploySaga"),
            # the serving release removed, by a step of a deploy or of an uninstall
            (Forger, "remove_release", {"saga": ref, "track": "stable"},
             f"remove_release for {RUN} runs only in plnt's DeploySaga {plnt_saga}, not in workflow Forger forger-"),
            (Forger, "remove_release", {"saga": {**ref, "action": "uninstall", "fingerprint": None, "version": None},
                                        "track": "stable"}, "runs only in plnt's DeploySaga"),
            # a canary installed, then promoted without the smoke test, by an impostor of plnt's saga
            (Impostor, "install_release", {"saga": ref, "track": "canary", "recipe_digest": stable_digest},
             f"install_release for {RUN}: workflow {plnt_saga} runs on task queue {queue!r}, not plnt's "
             f"{plnt.settings.temporal.task_queue!r}"),
            (Impostor, "promote_release", {"saga": ref, "track": "canary"}, f"runs on task queue {queue!r}"),
            # traffic sent by plnt to an endpoint of the attacker's choosing
            (Impostor, "smoke_test", {"saga": ref}, f"runs on task queue {queue!r}"),
            # a canary's share of live traffic moved outside plnt's saga (a stepped canary's step)
            (Impostor, "set_canary_traffic", {"saga": ref, "step": 1}, f"runs on task queue {queue!r}"),
            (Forger, "set_canary_traffic", {"saga": ref, "step": 1}, "runs only in plnt's DeploySaga"),
            # gates asked outside plnt's saga (a webhook signed with plnt's key, a query of its choosing)
            (Impostor, "check_gates", {"saga": ref, "step": 1}, f"runs on task queue {queue!r}"),
            (Forger, "check_gates", {"saga": ref, "step": 1}, "runs only in plnt's DeploySaga"),
            (Forger, "wait_for_dependencies", {"saga": ref}, "runs only in plnt's DeploySaga"),
        ]
        async with Worker(client, task_queue=queue, workflows=[Forger, Impostor], activities=[],
                          workflow_runner=UnsandboxedWorkflowRunner()):
            for workflow_class, name, payload, expected in forged:
                workflow_id = plnt_saga if workflow_class is Impostor else f"forger-{uuid.uuid4().hex[:8]}"
                with pytest.raises(WorkflowFailureError) as caught:
                    await client.execute_workflow(workflow_class.run, [name, payload, plnt.settings.temporal.task_queue],
                                                  id=workflow_id, task_queue=queue)
                cause = caught.value.cause
                assert isinstance(cause, ActivityError) and isinstance(cause.cause, ApplicationError), name
                assert cause.cause.type == "UntrustedSagaInput", cause.cause
                assert expected in cause.cause.message, cause.cause.message
        await attack.assert_nothing_changed()
