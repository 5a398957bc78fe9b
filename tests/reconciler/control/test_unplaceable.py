"""A run whose replicas do not fit its backends starts no saga: the missing capacity is in its status,
and what runs keeps serving. Real parts and stand-ins as in test_quiet_pass.py (no Temporal client:
a pass that started a saga would fail on it)."""

from __future__ import annotations

from pathlib import Path

from plnt.core.status import Phase
from plnt.reconciler.plan.diff import Action
from plnt.reconciler.plan.placement import GpusFree, NodeFree

from tests.conftest import SpecRepo
from tests.reconciler.control.test_quiet_pass import in_sync

RUN_FILE = "workflowruns/review-responder.yaml"
NEW_RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {name: summarizer}
spec:
  workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
  backend: {cluster: local}
  replicas: {min: 2}
"""


async def test_an_upgrade_and_an_install_that_cannot_be_placed(spec_repo: SpecRepo, tmp_path: Path) -> None:
    reconciler, statuses, _, driver = in_sync(spec_repo, tmp_path)
    await reconciler.reconcile_once()
    # The backend now declares room for 2 replicas; review-responder asks for 3, and a new run for 2.
    spec_repo.replace("backends/local.yaml", "type: local", "type: local\n  capacity: {replicas: 2}")
    spec_repo.replace(RUN_FILE, "replicas: {min: 1, max: 1}", "replicas: {min: 3, max: 3}")
    spec_repo.write("workflowruns/summarizer.yaml", NEW_RUN)
    spec_repo.commit("more replicas than the backend has room for")

    items = {item.key: item for item in await reconciler.reconcile_once()}

    upgrade = items["default/review-responder"]
    assert upgrade.action is Action.SCALE and not upgrade.needs_saga  # (replicas only: a scale in place)
    assert upgrade.unplaceable == "needs 1 more replica slot: local has 0 free (local: 0 of 2)"
    status = statuses.get("default/review-responder")
    assert status is not None and status.phase is Phase.READY and status.version == "1.2.0"
    assert status.message == ("Ready 1.2.0 keeps serving; cannot be placed: needs 1 more replica slot: local has "
                              "0 free (local: 0 of 2)")
    assert status.last_error == "cannot be placed: needs 1 more replica slot: local has 0 free (local: 0 of 2)"
    # The release that serves is untouched.
    live = (await driver.live())["default/review-responder"]
    assert live.stable is not None and live.stable.version == "1.2.0"

    # The running release goes first: 2 of its 3 would fit, so it fails and keeps holding the 1 slot it
    # runs on; the new run wants 2 and 1 is left.
    install = items["default/summarizer"]
    assert install.action is Action.INSTALL and install.unplaceable is not None
    new = statuses.get("default/summarizer")
    assert new is not None and new.phase is Phase.FAILED and new.version is None
    assert new.message == new.last_error == "cannot be placed: needs 1 more replica slot: local has 0 free (local: 0 of 2)"
    assert reconciler.running_sagas == set()


GPU_RUN = """\
apiVersion: plnt.work/v1
kind: WorkflowRun
metadata: {name: trainer}
spec:
  workflow: {ref: review-responder@1.2.0, registry: "file:registry"}
  backend: {cluster: local, gpuClass: nvidia.com/h100, gpuCount: 1, nodeSelector: {gpu: fast}}
"""


async def test_the_loop_places_by_the_free_gpus_read_and_falls_back_when_the_reading_fails(
        spec_repo: SpecRepo, tmp_path: Path) -> None:
    """The reconciler's wiring of `observe_gpus`, with a stand-in reading (the reading of a real cluster:
    tests/k8s/test_gpu_headroom_on_cluster.py): asked for the backends of runs wanting GPUs, its
    answer bounds the placement; a reading that raises leaves the declared capacity alone."""
    reconciler, statuses, _, _ = in_sync(spec_repo, tmp_path)
    await reconciler.reconcile_once()
    asked: list[list[str]] = []

    async def none_free(backends: dict[str, object]) -> dict[str, GpusFree | str]:
        asked.append(sorted(backends))
        # the fast Node full, 1 free on a Node the run's nodeSelector leaves out
        return {name: {"nvidia.com/h100": (NodeFree("n1", 0, {"gpu": "fast"}), NodeFree("n2", 1, {"gpu": "slow"}))}
                for name in backends}

    reconciler.observe_gpus = none_free
    spec_repo.replace("backends/local.yaml", "type: local", "type: local\n  gpuClasses: [nvidia.com/h100]")
    spec_repo.write("workflowruns/trainer.yaml", GPU_RUN)
    spec_repo.commit("a run asking for a GPU")
    items = {item.key: item for item in await reconciler.reconcile_once()}
    assert asked == [["local"]]
    why = ("needs 1 more GPU of class nvidia.com/h100: local has 0 free (local: 0 observed on the Nodes matching "
           "the run's nodeSelector {gpu: fast}, 1 on other Nodes)")
    assert items["default/trainer"].unplaceable == why
    status = statuses.get("default/trainer")
    assert status is not None and status.phase is Phase.FAILED and status.last_error == f"cannot be placed: {why}"

    async def broken(backends: dict[str, object]) -> dict[str, GpusFree | str]:
        raise RuntimeError("reader crashed")

    reconciler.observe_gpus = broken
    spec_repo.replace("backends/local.yaml", "gpuClasses: [nvidia.com/h100]",
                      "gpuClasses: [nvidia.com/h100]\n  capacity: {gpus: {nvidia.com/h100: 0}}")
    spec_repo.commit("declared: no GPU; the reading now fails")
    items = {item.key: item for item in await reconciler.reconcile_once()}
    assert items["default/trainer"].unplaceable == ("needs 1 more GPU of class nvidia.com/h100: local has 0 free "
                                                    "(local: 0 of 0)")  # by the declared capacity alone
