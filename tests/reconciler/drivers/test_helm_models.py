"""ModelDeployments on Kubernetes backends: the Helm driver's model-server releases.

Three layers, each saying what stands in for what:

- The driver against the FAKE helm of test_helm_driver.py (`FakeHelm`: scripted answers in helm 4.1's
  shapes, every argv and values file recorded; no cluster): the values `render_model_values` makes,
  install / promote / remove / live of model-server releases, the refusals.
- The driver's own values for each runtime rendered by the REAL helm (`helm template` of
  charts/model-server) and validated as the chart tests do (kubernetes-validate strict for 1.33, label
  syntax, the `restricted` checks), with the init container's and the server's exact command lines.
- The saga's REAL activities (validate, pull_recipe, install_release) for a ModelDeployment on a
  Kubernetes backend, from a real git repository, with weights signed by the test Sigstore authority
  (tests/sigstore_ca.py: a STAND-IN for Fulcio, Rekor and an OIDC issuer) and pushed to the REAL OCI
  registry (tests/services.py); helm is `RecordingHelm` (test_helm_chart.py: a STAND-IN for helm's
  cluster side). The values the saga made are rendered by the real helm and the init container's exact
  command runs with the project's `plnt` (test_runner_pod_fetch.PodStandIn): it fetches and verifies
  the weights, and the file the llama.cpp server is told to load is the signed one.

Not shown (no cluster, no images, no GPUs): that the API server admits these objects, the scheduler
places them, the images run the servers with these flags, and `helm upgrade --wait` sees them ready.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.models import ModelDeployment, PlntBackend, RecipeTrustPolicy
from plnt.reconciler.drivers.helm import (
    DEFAULT_MODEL_CHART,
    MODEL_STEP_MARGIN_S,
    HelmConfigError,
    HelmDriver,
    SpecCache,
    gpu_resource_name,
    model_resources,
    model_step_timeouts,
    render_model_values,
)
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.errors import DriverError, InvalidSpec
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.state import ModelServing

from tests.charts.chartkit import check_labels, find_helm, restricted_problems, validate_strictly
from tests.reconciler.drivers.test_helm_driver import (
    IMAGE,
    NOT_FOUND,
    NOW,
    TARGET,
    FakeHelm,
    history_json,
    list_json,
    status_json,
)

ROOT_DIGEST = "sha256:" + "ab" * 32
ROOT_JSON = json.dumps({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1", "tlogs": []})
POLICY = RecipeTrustPolicy.model_validate({
    "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "model-signers"},
    "spec": {"recipes": ["smollm*", "qwen*"], "trustRoot": {"trustedRootFile": "trust/models-root.json"},
             "signers": [{"issuer": "https://issuer.example", "identity": "models@acme.example"}]},
})
RECIPES_ONLY = RecipeTrustPolicy.model_validate({
    "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "recipe-signers"},
    "spec": {"recipes": ["review-*"], "trustRoot": {"publicGood": True},
             "signers": [{"issuer": "https://issuer.example", "identity": "release@acme.example"}]},
})
TRUST = RecipeTrust(policies=(POLICY,), trusted_roots={"trust/models-root.json": ROOT_JSON})
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
DEDICATED = {"key": "dedicated", "operator": "Equal", "value": "models", "effect": "NoSchedule"}
RESOURCES = {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}}

BACKEND = PlntBackend.model_validate({
    "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
    "spec": {"type": "kubernetes",
             "gpuClasses": ["nvidia.com/gpu", "nvidia.com/h100", "nvidia.com/l4", "amd.com/gpu"],
             "kubernetes": {"context": "prod", "namespace": "agents", "kubeconfig": "/etc/plnt/kubeconfig"},
             "nodeSelector": {"cloud.example.com/pool": "models"}, "tolerations": [GPU_TAINT]},
})


def model(name: str = "chat", runtime: dict[str, Any] | None = None, backend: dict[str, Any] | None = None,
          version: str = "1.0.0", registry: str = "oci://registry.example.com/models", **spec: Any) -> ModelDeployment:
    return ModelDeployment.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"model": {"registry": registry, "name": "smollm2", "version": version, "rootDigest": ROOT_DIGEST},
                 "runtime": runtime or {"type": "llama.cpp", "contextLength": 4096},
                 "backend": {"cluster": "gpu-cluster-01", **(backend or {})}, **spec},
    })


def request(run: ModelDeployment, track: str = "canary", model_file: str = "weights/smollm2-q8_0.gguf",
            trust: RecipeTrust = TRUST) -> InstallRequest:
    """What install_release's `_install_model` sends for a Kubernetes model (no local directory)."""
    runtime, source = run.spec.runtime, run.spec.model
    return InstallRequest(
        namespace=run.metadata.namespace, name=run.metadata.name, track=track, version=run.version,
        spec_fingerprint=run.fingerprint(), recipe_digest=source.root_digest, recipe_dir="",
        traffic_percent=run.spec.canary.traffic_percent if track == "canary" else 0, trust=trust,
        model=ModelServing(runtime=runtime.type, model_file=model_file if runtime.type == "llama.cpp" else "",
                           alias=run.metadata.name, context_length=runtime.context_length, threads=runtime.threads,
                           args=tuple(runtime.args), registry=source.registry, model_name=source.name))


def driver(fake: Any, *runs: ModelDeployment, **settings: Any) -> HelmDriver:
    specs = SpecCache()
    for run in runs:
        specs.remember(run)
    return HelmDriver(BACKEND, specs, image=IMAGE, runner=fake, clock=lambda: NOW, model_resources=RESOURCES,
                      **settings)


def model_upgrade_argv(release: str, track: str, path: str, timeout: str = "1800s",
                       chart: str = DEFAULT_MODEL_CHART) -> list[str]:
    """A model release's upgrade: the model's own helm wait (`model_timeout_s`, default 30 minutes)."""
    return ["upgrade", "--install", release, chart, *TARGET, "--values", path, "--reset-values",
            "--labels", f"plnt.work/managed-by=plnt,plnt.work/model-deployment=chat,"
                        f"plnt.work/model-deployment-namespace=team-a,plnt.work/track={track}",
            "--wait", "--timeout", timeout, "--history-max", "10", "-o", "json"]


CHAT = model()
CHAT_NEXT = model(version="1.1.0")

# case -> (the ModelDeployment, the server's image, command and args, the GPU limit, the node selector)
CASES: dict[str, tuple[ModelDeployment, str, list[str], list[str], tuple[str, int] | None, dict[str, str]]] = {
    "llama.cpp-cpu": (
        model(runtime={"type": "llama.cpp", "contextLength": 4096, "threads": 8, "args": ["--parallel", "2"]},
              backend={"nodeSelector": {"cloud.example.com/pool": "cpu-models", "zone": "a"},
                       "tolerations": [DEDICATED, GPU_TAINT]}),
        "ghcr.io/ggml-org/llama.cpp:server-b8840", ["/app/llama-server"],
        ["--model", "/models/smollm2/weights/smollm2-q8_0.gguf", "--alias", "chat", "--host", "0.0.0.0", "--port",
         "8000", "--ctx-size", "4096", "--threads", "8", "--parallel", "2"],
        None, {"cloud.example.com/pool": "cpu-models", "zone": "a"}),
    "llama.cpp-gpu": (
        model(backend={"gpuClass": "nvidia.com/gpu", "gpuCount": 1}),
        "ghcr.io/ggml-org/llama.cpp:server-cuda-b8840", ["/app/llama-server"],
        ["--model", "/models/smollm2/weights/smollm2-q8_0.gguf", "--alias", "chat", "--host", "0.0.0.0", "--port",
         "8000", "--ctx-size", "4096", "--n-gpu-layers", "999"],
        ("nvidia.com/gpu", 1), {"cloud.example.com/pool": "models"}),
    "vllm-h100": (
        model(runtime={"type": "vllm", "contextLength": 32768, "args": ["--gpu-memory-utilization", "0.9"]},
              backend={"gpuClass": "nvidia.com/h100", "gpuCount": 2}),
        "vllm/vllm-openai:v0.11.0", ["vllm", "serve"],
        ["/models/smollm2", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--max-model-len", "32768", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9"],
        # nvidia.com/h100 is a node label of the GPU pool, as for runners: the GPUs count as nvidia.com/gpu.
        ("nvidia.com/gpu", 2), {"cloud.example.com/pool": "models", "nvidia.com/h100": "true"}),
    "tgi-l4-own-image": (
        model(runtime={"type": "tgi", "image": "registry.internal:5000/tgi:3.2.3-acme"},
              backend={"gpuClass": "nvidia.com/l4", "gpuCount": 1}),
        "registry.internal:5000/tgi:3.2.3-acme", ["text-generation-launcher"],
        ["--model-id", "/models/smollm2", "--hostname", "0.0.0.0", "--port", "8000", "--max-input-tokens", "2047",
         "--max-total-tokens", "2048"],
        ("nvidia.com/gpu", 1), {"cloud.example.com/pool": "models", "nvidia.com/l4": "true"}),
    "sglang-amd": (
        model(runtime={"type": "sglang", "contextLength": 8192, "args": ["--mem-fraction-static=0.85"]},
              backend={"gpuClass": "amd.com/gpu", "gpuCount": 4}),
        "lmsysorg/sglang:v0.5.19-cu129", ["python3", "-m", "sglang.launch_server"],
        ["--model-path", "/models/smollm2", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--context-length", "8192", "--tp-size", "4", "--mem-fraction-static=0.85"],
        ("amd.com/gpu", 4), {"cloud.example.com/pool": "models"}),
}


# --- the values (FakeHelm) ---------------------------------------------------------------------


def test_render_model_values_is_the_request_the_spec_and_plnts_settings() -> None:
    """A pure function: no helm at all."""
    run = CASES["llama.cpp-cpu"][0]
    options = RegistryOptions(s3_endpoint_url="http://minio.storage:9000", s3_region="eu-west-1",
                              allow_insecure_http=("registry.local:5000",))
    values = render_model_values(request(run), run.spec, BACKEND, IMAGE, resources=RESOURCES,
                                 registry_options=options, credentials_secret="model-registry")
    policies = values["weights"].pop("policies")
    assert [doc["metadata"]["name"] for doc in yaml.safe_load_all(policies)] == ["model-signers"]
    assert values == {
        "deployment": {"name": "chat", "namespace": "team-a", "specFingerprint": run.fingerprint(),
                       "releaseId": request(run).release_id, "trafficPercent": 5},
        "track": "canary",
        "model": {"registry": "oci://registry.example.com/models", "name": "smollm2", "version": "1.0.0",
                  "rootDigest": ROOT_DIGEST},
        "runtime": {"type": "llama.cpp", "image": "", "modelFile": "weights/smollm2-q8_0.gguf", "contextLength": 4096,
                    "threads": 8, "args": ["--parallel", "2"]},
        "image": {"repository": "ghcr.io/acme/plnt", "tag": "0.1.0", "pullPolicy": "IfNotPresent"},
        "gpu": {"class": "", "count": 0, "resourceName": ""},
        # The backend's defaults, the spec's choices win; tolerations of both without duplicates.
        "nodeSelector": {"cloud.example.com/pool": "cpu-models", "zone": "a"},
        "tolerations": [GPU_TAINT, DEDICATED],
        "replicas": 1,
        "autoscaling": {},
        "resources": RESOURCES,
        "service": {"port": 8000},
        "weights": {"trustedRoots": {"trust/models-root.json": ROOT_JSON},
                    "s3": {"endpointUrl": "http://minio.storage:9000", "region": "eu-west-1"},
                    "ociInsecureHosts": ["registry.local:5000"], "credentialsSecret": "model-registry"},
    }


def test_an_autoscaled_model_gets_the_charts_hpa_values() -> None:
    run = model(replicas={"min": 2, "max": 6}, autoscaling={"targetInFlight": 3, "scaleDownAfterSeconds": 90})
    values = render_model_values(request(run, "stable"), run.spec, BACKEND, IMAGE)
    assert (values["replicas"], values["autoscaling"]) == (
        2, {"targetInFlight": 3, "maxReplicas": 6, "scaleDownAfterSeconds": 90})


@pytest.mark.parametrize(("gpu_class", "configured", "expected"), [
    ("", None, ""),
    ("nvidia.com/gpu", None, ""),            # a device plugin's resource: counted in the class itself
    ("amd.com/gpu", None, ""),
    ("nvidia.com/mig-1g.10gb", None, ""),
    ("nvidia.com/h100", None, "nvidia.com/gpu"),  # a node label, as for runners on the same backend
    ("a100-80gb", None, "nvidia.com/gpu"),
    ("amd.com/mi300x", "amd.com/gpu", "amd.com/gpu"),  # the driver's setting wins
])
def test_gpu_resource_name_keeps_a_gpu_class_meaning_what_it_means_for_runners(
        gpu_class: str, configured: str | None, expected: str) -> None:
    assert gpu_resource_name(gpu_class, configured) == expected


@pytest.mark.parametrize(("change", "error", "message"), [
    ({"registry": "file:///srv/models"}, InvalidSpec,
     "spec.model.registry: 'file:///srv/models' cannot be reached from a Kubernetes model-server pod"),
    ({"trust": RecipeTrust(policies=(RECIPES_ONLY,))}, InvalidSpec,
     "no RecipeTrustPolicy covering model 'smollm2' came with the install"),
    ({"trust": RecipeTrust(policies=(POLICY,))}, InvalidSpec, "trustedRootFile 'trust/models-root.json' was not read"),
    ({"pin": "sha256:" + "cd" * 32}, DriverError, "are not what the spec pins"),
    ({"gpu_class": "NVIDIA H100"}, InvalidSpec, "label key"),
])
def test_render_model_values_refuses_what_a_pod_could_not_fetch_or_verify(
        change: dict[str, Any], error: type[Exception], message: str) -> None:
    run = model(registry=change.get("registry", "oci://registry.example.com/models"),
                backend={"gpuClass": change["gpu_class"], "gpuCount": 1} if "gpu_class" in change else None)
    req = request(run, trust=change.get("trust", TRUST))
    if "pin" in change:
        req = req.model_copy(update={"recipe_digest": change["pin"]})
    with pytest.raises(error, match=message):
        render_model_values(req, run.spec, BACKEND, IMAGE)


async def test_install_upgrades_the_model_server_chart_and_the_release_serves_openai_on_8000() -> None:
    """Against the FAKE helm: the argv, the values file, and the Release read back from the values."""
    fake = FakeHelm().expect("status", "chat-canary", rc=1, stderr=NOT_FOUND).expect("upgrade", stdout="{}")
    release = await driver(fake, CHAT).install(request(CHAT))
    fake.done()
    assert fake.calls[1] == model_upgrade_argv("chat-canary", "canary", fake.values_paths[0])
    assert fake.values_files == [render_model_values(request(CHAT), CHAT.spec, BACKEND, IMAGE, resources=RESOURCES)]
    assert release.model_dump() == {
        "release_id": request(CHAT).release_id, "namespace": "team-a", "name": "chat", "track": "canary",
        "version": "1.0.0", "spec_fingerprint": CHAT.fingerprint(), "recipe_digest": ROOT_DIGEST,
        "recipe_dir": "/models/smollm2", "endpoint": "http://chat-canary.agents.svc.cluster.local:8000",
        "traffic_percent": 5, "pid": None, "pid_start": None, "port": None, "park_after_s": None, "parked": False,
        "model": {"runtime": "llama.cpp", "model_file": "weights/smollm2-q8_0.gguf", "alias": "chat",
                  "context_length": 4096, "threads": None, "args": (), "memory_mib": None,
                  "registry": "oci://registry.example.com/models",
                  "model_name": "smollm2"},
        "llm_model": None, "canary_header": None, "shadow_percent": 0,
        "replicas": 1, "replicas_max": None, "more_replicas": (), "placement": None, "backend": None,
    }
    # What the saga's smoke test and the gateway call: the model's own OpenAI API on the Service.
    assert release.model is not None and release.endpoint.endswith(":8000")


async def test_a_model_canarys_shadow_share_rides_in_its_values_and_is_read_back() -> None:
    """Against the FAKE helm: canary.shadowPercent is in the release's values (the chart's schema takes
    it; no template renders it), and the Release read back from them carries it to the gateway's route."""
    import jsonschema

    shadowed = request(CHAT).model_copy(update={"traffic_percent": 0, "shadow_percent": 100})
    fake = FakeHelm().expect("status", "chat-canary", rc=1, stderr=NOT_FOUND).expect("upgrade", stdout="{}")
    release = await driver(fake, CHAT).install(shadowed)
    [values] = fake.values_files
    assert (values["deployment"]["trafficPercent"], values["deployment"]["shadowPercent"]) == (0, 100)
    schema = json.loads((Path(__file__).resolve().parents[3] / "charts/model-server/values.schema.json").read_text())
    # The deployment's part (helm adds the chart's defaults to the rest): its definitions beside it.
    jsonschema.validate(values["deployment"], {**schema["properties"]["deployment"], "definitions": schema["definitions"]})
    assert (release.traffic_percent, release.shadow_percent) == (0, 100)
    assert "shadowPercent" not in render_model_values(request(CHAT), CHAT.spec, BACKEND, IMAGE)["deployment"]


async def test_install_of_an_identical_model_release_is_a_no_op_and_other_values_upgrade() -> None:
    """Against the FAKE helm: a deployed release with the same values and chart version is left alone."""
    values = render_model_values(request(CHAT), CHAT.spec, BACKEND, IMAGE, resources=RESOURCES)
    fake = (FakeHelm().expect("status", "chat-canary", stdout=status_json("chat-canary", "deployed", 1, values))
            .expect("list", stdout=list_json(("chat-canary", 1, "deployed", "model-server-0.1.0"))))
    await driver(fake, CHAT).install(request(CHAT))
    fake.done()
    # A release made by the workflow-runner chart's version is not "the same chart".
    fake = (FakeHelm().expect("status", "chat-canary", stdout=status_json("chat-canary", "deployed", 1, values))
            .expect("list", stdout=list_json(("chat-canary", 1, "deployed", "workflow-runner-0.1.0")))
            .expect("upgrade"))
    await driver(fake, CHAT).install(request(CHAT))
    fake.done()
    assert fake.calls[2][3] == DEFAULT_MODEL_CHART


async def test_install_needs_a_model_deployment_spec_and_refuses_another_owners_release() -> None:
    """Against the FAKE helm: a request and spec of different kinds, and a release of team-b's `chat`."""
    from tests.reconciler.drivers.test_helm_driver import RUN

    specs = SpecCache()
    specs.remember(RUN)
    # A model-server request whose fingerprint names a WorkflowRun's spec.
    confused = request(CHAT).model_copy(update={"name": RUN.metadata.name, "namespace": RUN.metadata.namespace,
                                                "spec_fingerprint": RUN.fingerprint()})
    with pytest.raises(DriverError, match="not a ModelDeployment's"):
        await HelmDriver(BACKEND, specs, runner=FakeHelm()).install(confused)
    theirs = model().model_copy(update={"metadata": CHAT.metadata.model_copy(update={"namespace": "team-b"})})
    other = render_model_values(request(theirs), theirs.spec, BACKEND, IMAGE)
    fake = FakeHelm().expect("status", "chat-canary", stdout=status_json("chat-canary", "deployed", 1, other))
    with pytest.raises(HelmConfigError, match="belongs to team-b/chat"):
        await driver(fake, CHAT).install(request(CHAT))
    assert fake.commands() == ["status chat-canary"], "never upgraded over someone else's release"


async def test_promote_upgrades_stable_with_the_canarys_values_then_removes_the_canary() -> None:
    """Against the FAKE helm: the canary's exact values become the stable release's (share 0)."""
    canary = render_model_values(request(CHAT_NEXT), CHAT_NEXT.spec, BACKEND, IMAGE, resources=RESOURCES)
    old = render_model_values(request(CHAT, "stable"), CHAT.spec, BACKEND, IMAGE, resources=RESOURCES)
    fake = (FakeHelm()
            .expect("status", "chat-canary", stdout=status_json("chat-canary", "deployed", 1, canary))
            .expect("status", "chat", stdout=status_json("chat", "deployed", 3, old))
            .expect("upgrade", stdout="{}")
            .expect("uninstall", "chat-canary"))
    release = await driver(fake, CHAT, CHAT_NEXT).promote("team-a", "chat")
    fake.done()
    assert fake.calls[2] == model_upgrade_argv("chat", "stable", fake.values_paths[0])
    # The new stable pods fetch and load the weights (the model's wait); the canary only stops.
    assert fake.calls[3] == ["uninstall", "chat-canary", *TARGET, "--wait", "--timeout", "150s", "--ignore-not-found"]
    [promoted] = fake.values_files
    assert promoted == {**canary, "track": "stable", "deployment": {**canary["deployment"], "trafficPercent": 0}}
    assert (release.track, release.version, release.traffic_percent) == ("stable", "1.1.0", 0)
    assert release.endpoint == "http://chat.agents.svc.cluster.local:8000"
    assert release.release_id == request(CHAT_NEXT).release_id, "a promoted canary keeps its id"


@pytest.mark.parametrize(("floor", "ceiling"), [(3, 4), (6, 6)], ids=["within the ceiling", "above it"])
async def test_scaling_an_autoscaled_model_raises_the_hpa_floor_and_the_ceiling_below_it(
        helm: str, floor: int, ceiling: int) -> None:
    """Against the FAKE helm; the values rendered by the REAL helm (its chart refuses max < min). On
    the real kube-controller-manager: tests/k8s/test_hpa_on_cluster.py."""
    scaled = model(replicas={"min": 2, "max": 4}, autoscaling={"targetInFlight": 3})
    deployed = render_model_values(request(scaled, "stable"), scaled.spec, BACKEND, IMAGE)
    fake = FakeHelm().expect("status", "chat", stdout=status_json("chat", "deployed", 1, deployed)).expect("upgrade")
    release = await driver(fake, scaled).set_replicas("team-a", "chat", floor)
    fake.done()
    [values] = fake.values_files
    assert (values["replicas"], values["autoscaling"]["maxReplicas"]) == (floor, ceiling)
    assert {k: v for k, v in values.items() if k not in ("replicas", "autoscaling")} == \
        {k: v for k, v in deployed.items() if k not in ("replicas", "autoscaling")}
    assert release.replicas == floor
    from tests.charts.chartkit import render

    hpa = kinds(render(helm, Path(DEFAULT_MODEL_CHART), values, release="chat", namespace="agents"))
    assert (hpa["HorizontalPodAutoscaler"]["spec"]["minReplicas"],
            hpa["HorizontalPodAutoscaler"]["spec"]["maxReplicas"]) == (floor, ceiling)


async def test_remove_uninstalls_a_model_release_of_its_own_only() -> None:
    """Against the FAKE helm: a failed canary is uninstalled; a stable release that is gone is no error."""
    values = render_model_values(request(CHAT), CHAT.spec, BACKEND, IMAGE)
    fake = (FakeHelm().expect("status", "chat-canary", stdout=status_json("chat-canary", "failed", 2, values))
            .expect("uninstall", "chat-canary"))
    await driver(fake, CHAT).remove("team-a", "chat", "canary")
    fake.done()
    assert fake.calls[1] == ["uninstall", "chat-canary", *TARGET, "--wait", "--timeout", "150s", "--ignore-not-found"]
    fake = FakeHelm().expect("status", "chat", rc=1, stderr=NOT_FOUND)
    await driver(fake, CHAT).remove("team-a", "chat", "stable")
    fake.done()


async def test_a_model_release_waits_its_own_timeout_and_is_live_that_long() -> None:
    """Against the FAKE helm: a model release's upgrade waits `model_timeout_s`; a pending model release
    is a live helm until that wait and 120 s have passed (here 20 minutes old: live under the default
    30 minutes, stuck under 10, then rolled back with the model's wait and upgraded)."""
    fake = FakeHelm().expect("status", "chat-canary", rc=1, stderr=NOT_FOUND).expect("upgrade")
    await driver(fake, CHAT, model_timeout_s=2400).install(request(CHAT))
    fake.done()
    assert fake.calls[1] == model_upgrade_argv("chat-canary", "canary", fake.values_paths[0], "2400s")

    values = render_model_values(request(CHAT), CHAT.spec, BACKEND, IMAGE, resources=RESOURCES)
    pending = status_json("chat-canary", "pending-upgrade", 3, values)  # last deployed 20 minutes before NOW
    fake = FakeHelm().expect("status", "chat-canary", stdout=pending)
    with pytest.raises(DriverError, match="pending-upgrade since 1198s ago; treated as stuck after 1920s"):
        await driver(fake, CHAT).install(request(CHAT))
    assert fake.commands() == ["status chat-canary"], "no rollback of a helm that may still be waiting"

    fake = (FakeHelm().expect("status", "chat-canary", stdout=pending)
            .expect("history", "chat-canary", stdout=history_json((2, "deployed", "Upgrade complete"),
                                                                  (3, "pending-upgrade", "Preparing upgrade")))
            .expect("rollback", "chat-canary", "2")
            .expect("upgrade"))
    await driver(fake, CHAT, model_timeout_s=600).install(request(CHAT))
    fake.done()
    assert fake.calls[2] == ["rollback", "chat-canary", "2", *TARGET, "--wait", "--timeout", "600s", "--history-max", "10"]
    assert fake.calls[3] == model_upgrade_argv("chat-canary", "canary", fake.values_paths[0], "600s")


def test_model_step_timeouts_cover_the_models_wait_and_leave_the_other_steps() -> None:
    from plnt.reconciler.settings import StepTimeouts

    defaults = StepTimeouts()
    steps = model_step_timeouts(defaults, 1800)
    assert MODEL_STEP_MARGIN_S == 300
    assert (steps.install_release, steps.promote_release) == (2100, 2100)
    assert steps.model_copy(update={"install_release": 180, "promote_release": 180}) == defaults
    # The margin covers helm's exit after its wait plus one runner-timeout helm call (promote's uninstall).
    assert MODEL_STEP_MARGIN_S >= 20 + 150 + 20
    # Never lower than what the settings already give.
    raised = StepTimeouts(install_release=5000)
    assert (model_step_timeouts(raised, 600).install_release, model_step_timeouts(raised, 600).promote_release) == (5000, 900)


async def test_plnts_model_settings_reach_the_helm_driver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """make_driver_set (what `plnt up` and `plnt worker` use) with `run_helm` replaced by the FAKE helm
    (no process runs) and `wait_serving` by a FAKE that records what it was asked (no Service here):
    the model chart, the model timeout, the GPU resource setting and the serving timeout reach the
    model release's upgrade; a LocalDriver that is never started."""
    import shutil

    from plnt.core.specs.loader import SpecSet
    from plnt.reconciler.app import make_driver_set
    from plnt.reconciler.drivers import helm as helm_driver
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.settings import Settings
    from plnt.reconciler.state import StateDir

    chart = tmp_path / "charts" / "model-server"
    shutil.copytree(DEFAULT_MODEL_CHART, chart)
    state = StateDir(tmp_path / "state").ensure()
    settings = Settings(repo=str(tmp_path), state_dir=state.root, helm_model_chart=str(chart),
                        model_install_timeout_s=2400, gpu_resource="amd.com/gpu", runner_image="ghcr.io/acme/plnt",
                        runner_image_tag="0.1.0", serving_timeout_s=7)
    fake = FakeHelm().expect("status", "chat-canary", rc=1, stderr=NOT_FOUND).expect("upgrade")
    asked: list[tuple[str, float]] = []

    async def wait_serving(release: Any, timeout_s: float) -> None:
        asked.append((release.endpoint, timeout_s))

    monkeypatch.setattr(helm_driver, "wait_serving", wait_serving)
    kills: list[float] = []

    def run_helm(args: Any, *, helm: str, timeout_s: float) -> Any:
        kills.append(timeout_s)
        return fake(args)

    monkeypatch.setattr(helm_driver, "run_helm", run_helm)
    run = CASES["vllm-h100"][0]
    drivers = make_driver_set(settings, LocalDriver(state), state)
    drivers.assign(SpecSet(model_deployments={run.key: run}, backends={BACKEND.metadata.name: BACKEND}))
    await drivers.install(request(run))
    fake.done()
    assert fake.calls[1] == model_upgrade_argv("chat-canary", "canary", fake.values_paths[0], "2400s", str(chart))
    [values] = fake.values_files
    assert values["gpu"] == {"class": "nvidia.com/h100", "count": 2, "resourceName": "amd.com/gpu"}
    assert kills == [170.0, 2420.0], "status with the runners' timeout, the upgrade with the model's"
    assert asked == [("http://chat-canary.agents.svc.cluster.local:8000", 7)]


def test_model_settings_defaults_and_refusals() -> None:
    from plnt.reconciler.settings import Settings

    settings = Settings(repo=".")
    assert (settings.kubernetes.model_install_timeout_s, settings.kubernetes.gpu_resource,
            settings.kubernetes.helm_model_chart) == (1800, None, None)
    for bad in ({"model_install_timeout_s": 0}, {"gpu_resource": "gpu"}, {"gpu_resource": "Nvidia.com/gpu"},
                {"gpu_resource": ""}):
        with pytest.raises(ValueError):
            Settings(repo=".", **bad)


def test_the_flags_reach_the_settings_of_each_role(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`plnt up`, `plnt reconcile` and `plnt worker` in-process (typer's CliRunner) with what would start
    them replaced by a recorder (a FAKE: nothing starts): --model-install-timeout and --gpu-resource land
    in the Settings; a bad resource name is a usage error."""
    from plnt.reconciler.cli import main as cli
    from plnt.reconciler.cli import roles as cli_roles
    from plnt.reconciler.cli import up as cli_up
    from typer.testing import CliRunner

    seen: dict[str, Any] = {}

    async def up(settings: Any) -> None:
        seen["up"] = settings

    monkeypatch.setattr(cli_up, "serve", up)
    monkeypatch.setattr(cli_roles, "run_role", lambda start, settings, what: seen.__setitem__(what, settings))
    repo = ["--repo", str(tmp_path)]
    commands = {
        "up": ["up", *repo, "--state-dir", str(tmp_path / "up"), "--model-install-timeout", "3600",
               "--gpu-resource", "amd.com/gpu"],
        "reconcile": ["reconcile", *repo, "--model-install-timeout", "3600"],
        "worker": ["worker", *repo, "--model-install-timeout", "3600", "--gpu-resource", "amd.com/gpu"],
    }
    for what, argv in commands.items():
        result = CliRunner().invoke(cli.app, argv, catch_exceptions=False)
        assert result.exit_code == 0, (what, result.output)
        assert seen[what].kubernetes.model_install_timeout_s == 3600, what
    assert seen["up"].kubernetes.gpu_resource == seen["worker"].kubernetes.gpu_resource == "amd.com/gpu"
    assert CliRunner().invoke(cli.app, ["reconcile", *repo]).exit_code == 0
    assert seen["reconcile"].kubernetes.model_install_timeout_s == 1800 and seen["reconcile"].kubernetes.gpu_resource is None
    del seen["worker"]
    result = CliRunner().invoke(cli.app, ["worker", *repo, "--gpu-resource", "gpu"])
    assert result.exit_code == 2 and "worker" not in seen and "pattern" in result.output, result.output


async def test_live_reads_runner_and_model_releases_alike() -> None:
    """Against the FAKE helm: one `helm list`, each release's values read back as its Release."""
    from tests.reconciler.drivers.test_helm_driver import RUN
    from tests.reconciler.drivers.test_helm_driver import values as runner_values

    fake = (FakeHelm()
            .expect("list", stdout=list_json(("chat", 4, "deployed", "model-server-0.1.0"),
                                             ("review-responder-canary", 2, "deployed", "workflow-runner-0.1.0")))
            .expect("get", "values", "chat", stdout=json.dumps(
                render_model_values(request(CHAT, "stable"), CHAT.spec, BACKEND, IMAGE)))
            .expect("get", "values", "review-responder-canary", stdout=json.dumps(runner_values())))
    live = await driver(fake, CHAT).live()
    fake.done()
    stable = live["team-a/chat"].stable
    assert stable is not None and stable.model is not None and live["team-a/chat"].canary is None
    assert (stable.endpoint, stable.version, stable.recipe_digest) == (
        "http://chat.agents.svc.cluster.local:8000", "1.0.0", ROOT_DIGEST)
    runner = live[RUN.key].canary
    assert runner is not None and runner.model is None and runner.endpoint.endswith(".svc.cluster.local")


async def test_a_model_on_kubernetes_gets_an_openai_route_from_the_driver_set(tmp_path: Path) -> None:
    """DriverSet with the FAKE helm and a real LocalDriver that is never started: the gateway's route
    for a model-server release is an OpenAI pass-through to its Service."""
    from plnt.core.specs.loader import SpecSet
    from plnt.reconciler.app import build_route_table
    from plnt.reconciler.drivers.driver_set import DriverSet
    from plnt.reconciler.drivers.local import LocalDriver
    from plnt.reconciler.state import StateDir
    from plnt.reconciler.status_store import StatusStore

    state = StateDir(tmp_path / "state").ensure()
    fake = FakeHelm().expect("status", "chat-canary", rc=1, stderr=NOT_FOUND).expect("upgrade")
    drivers = DriverSet(LocalDriver(state), state,
                        lambda backend, lookup: HelmDriver(backend, lookup, image=IMAGE, runner=fake))
    drivers.assign(SpecSet(model_deployments={CHAT.key: CHAT}, backends={BACKEND.metadata.name: BACKEND}))
    assert isinstance(drivers.driver_for("team-a", "chat"), HelmDriver)
    await drivers.install(request(CHAT))
    fake.done()
    route = build_route_table(drivers.snapshot(), StatusStore(state.status_file)).lookup("chat", "team-a")
    assert route is not None and route.protocol == "openai" and route.traffic_percent == 5
    assert route.canary is not None and route.canary.endpoint == "http://chat-canary.agents.svc.cluster.local:8000"
    assert route.fallback is None

    # spec.fallback rides on the route (the reconciled commit's, by key), also when the release record did not
    # change (a rebuild reuses routes), and through the route table document every gateway process follows.
    from plnt.gateway.route_watch import Published, parse_doc_and_table

    built: dict = {}
    statuses = StatusStore(state.status_file)
    for fallbacks, expected in (({CHAT.key: "small"}, "small"), ({CHAT.key: "tiny"}, "tiny"), ({}, None)):
        table = build_route_table(drivers.snapshot(), statuses, built, None, fallbacks)
        route = table.lookup("chat", "team-a")
        assert route is not None and route.fallback == expected
        followed = parse_doc_and_table(Published("e", 1, tuple(table), ()).json)[1].lookup("chat", "team-a")
        assert followed == route


def test_release_records_made_before_the_model_source_was_recorded_still_load() -> None:
    from plnt.reconciler.state import Release

    old = {"release_id": "default.smollm2.1.0.0.16399c583483", "namespace": "default", "name": "smollm2",
           "track": "stable", "version": "1.0.0", "spec_fingerprint": "sha256:" + "1" * 64,
           "recipe_digest": ROOT_DIGEST, "recipe_dir": "/var/lib/plnt/weights/models/ab", "endpoint": "http://127.0.0.1:1",
           "model": {"runtime": "llama.cpp", "model_file": "model.gguf", "alias": "smollm2", "context_length": 2048,
                     "threads": 2, "args": []}}
    serving = Release.model_validate(old).model
    assert serving is not None and (serving.registry, serving.model_name) == ("", "")


# --- the real helm: the driver's values for each runtime ------------------------------------------


@pytest.fixture(scope="module")
def helm() -> str:
    return find_helm()


async def driver_docs(helm: str, run: ModelDeployment, track: str = "canary") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """What the driver would apply: its own upgrade's chart, release, namespace and values, rendered."""
    from tests.charts.chartkit import render

    fake = FakeHelm().expect("status", rc=1, stderr=NOT_FOUND).expect("upgrade")
    await driver(fake, run).install(request(run, track))
    args, [values] = fake.calls[1], fake.values_files
    release, chart, namespace = args[2], Path(args[3]), args[args.index("--namespace") + 1]
    return render(helm, chart, values, release=release, namespace=namespace), values


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out = {doc["kind"]: doc for doc in docs}
    assert len(out) == len(docs), [doc["kind"] for doc in docs]
    return out


@pytest.mark.integration
@pytest.mark.parametrize("case", sorted(CASES))
async def test_the_drivers_values_render_validate_and_run_what_the_runtime_needs(helm: str, case: str) -> None:
    """The driver installs against the FAKE helm (its values file recorded); the REAL helm renders them."""
    run, image, command, args, gpus, node_selector = CASES[case]
    docs, values = await driver_docs(helm, run)
    for doc in docs:
        validate_strictly(doc, case)
        check_labels(doc["metadata"]["labels"])
        assert doc["metadata"]["namespace"] == "agents"
    objects = kinds(docs)
    assert set(objects) == {"ConfigMap", "Deployment", "Service"}
    assert {doc["metadata"]["name"] for doc in docs} == {"chat-canary", "chat-canary-weights-trust"}
    deployment = objects["Deployment"]
    template = deployment["spec"]["template"]
    assert restricted_problems(template) == [], case
    pod = template["spec"]
    assert deployment["metadata"]["annotations"]["plnt.work/root-digest"] == ROOT_DIGEST
    assert deployment["metadata"]["annotations"]["plnt.work/release-id"] == request(run).release_id
    assert template["metadata"]["labels"]["plnt.work/track"] == "canary"
    assert objects["Service"]["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]

    # The init container fetches exactly the pinned weights, verified with the saga's policies.
    [init] = pod["initContainers"]
    assert (init["image"], init["command"]) == ("ghcr.io/acme/plnt:0.1.0", ["plnt"])
    assert init["args"] == ["model", "fetch", "--registry", "oci://registry.example.com/models", "--name", "smollm2",
                            "--version", "1.0.0", "--root-digest", ROOT_DIGEST, "--policy",
                            "/etc/plnt/trust/policies.yaml", "--trust-root", "/etc/plnt/trust/trust/models-root.json",
                            "--into", "/models/smollm2"]
    trust = objects["ConfigMap"]["data"]
    assert trust["trusted-root-0.json"] == ROOT_JSON
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(trust["policies.yaml"])] == ["model-signers"]
    assert json.dumps(init["resources"]).count("gpu") == 0, "the fetch holds no GPU"

    # The server: the runtime's image, command and arguments; GPUs and placement from spec and backend.
    [server] = pod["containers"]
    assert (server["image"], server["command"], server["args"]) == (image, command, args)
    limits = server["resources"]["limits"]
    assert {k: v for k, v in limits.items() if k != "memory"} == ({gpus[0]: gpus[1]} if gpus else {})
    assert pod.get("nodeSelector", {}) == node_selector
    assert pod["tolerations"] == values["tolerations"] and GPU_TAINT in pod["tolerations"]


@pytest.mark.integration
async def test_the_stable_release_the_promotion_makes_renders_beside_the_canary(helm: str) -> None:
    """The promotion against the FAKE helm; both releases' values rendered by the REAL helm."""
    run = CASES["vllm-h100"][0]
    canary_docs, canary = await driver_docs(helm, run)
    old = render_model_values(request(CHAT, "stable"), CHAT.spec, BACKEND, IMAGE)
    fake = (FakeHelm().expect("status", "chat-canary", stdout=status_json("chat-canary", "deployed", 1, canary))
            .expect("status", "chat", stdout=status_json("chat", "deployed", 1, old))
            .expect("upgrade").expect("uninstall"))
    await driver(fake, run, CHAT).promote("team-a", "chat")
    from tests.charts.chartkit import render

    stable_docs = render(helm, Path(DEFAULT_MODEL_CHART), fake.values_files[0], release="chat", namespace="agents")
    names = [{(d["kind"], d["metadata"]["name"]) for d in docs} for docs in (canary_docs, stable_docs)]
    assert not names[0] & names[1], "one namespace holds both releases"
    selectors = [kinds(docs)["Service"]["spec"]["selector"] for docs in (canary_docs, stable_docs)]
    pods = [kinds(docs)["Deployment"]["spec"]["template"]["metadata"]["labels"] for docs in (canary_docs, stable_docs)]
    assert selectors[0].items() <= pods[0].items() and not selectors[0].items() <= pods[1].items()
    assert selectors[1].items() <= pods[1].items() and not selectors[1].items() <= pods[0].items()


@pytest.mark.integration
@pytest.mark.parametrize("runtime", ["vllm", "tgi", "sglang"])
async def test_a_gpu_runtime_without_gpus_is_also_refused_by_the_chart(helm: str, runtime: str) -> None:
    """validate refuses it first (below); the chart is the second line, and the driver maps its
    failure to a chart error for a human."""
    from plnt.reconciler.drivers.helm import HelmChartError, classify

    from tests.charts.chartkit import helm_template

    run = model(runtime={"type": runtime})
    values = render_model_values(request(run), run.spec, BACKEND, IMAGE)
    result = helm_template(helm, Path(DEFAULT_MODEL_CHART), values, release="chat-canary", namespace="agents")
    assert result.returncode != 0 and "spec.backend.gpuCount" in result.stderr, result.stderr
    assert isinstance(classify("upgrade", "chat-canary", result.stderr), HelmChartError)


# --- the saga's real activities on a Kubernetes backend -------------------------------------------

MODELS_POLICY = "trust/k8s-models-policy.yaml"
MODELS_ROOT = "trust/k8s-models-root.json"


def repo_with_model(spec_repo: Any, authority: Any, registry: str, root: str, *, runtime: str = "llama.cpp",
                    gpu: str = "", trust_policy: str = "k8s-models") -> str:
    """The example repository with a Kubernetes backend, a policy for the models and ModelDeployment
    `chat` on that backend; returns the commit."""
    authority.write_trusted_root(spec_repo.path / MODELS_ROOT)
    from tests.reconciler.cli.test_cli_model import NAME
    from tests.reconciler.recipes.test_recipe_fetch import IDENTITY as identity  # the signer test_cli_model signs with
    from tests.reconciler.recipes.test_recipe_fetch import ISSUER
    spec_repo.write(MODELS_POLICY, (
        "apiVersion: plnt.work/v1\nkind: RecipeTrustPolicy\nmetadata: {name: k8s-models}\n"
        f"spec:\n  recipes: [{NAME}]\n  trustRoot: {{trustedRootFile: {MODELS_ROOT}}}\n"
        f"  signers: [{{issuer: '{ISSUER}', identity: '{identity}'}}]\n"))
    spec_repo.write("trust/other-policy.yaml", (
        "apiVersion: plnt.work/v1\nkind: RecipeTrustPolicy\nmetadata: {name: others}\n"
        f"spec:\n  recipes: [qwen*]\n  trustRoot: {{trustedRootFile: {MODELS_ROOT}}}\n"
        f"  signers: [{{issuer: '{ISSUER}', identity: '{identity}'}}]\n"))
    spec_repo.write("backends/gpu-cluster.yaml", (
        "apiVersion: plnt.work/v1\nkind: PlntBackend\nmetadata: {name: gpu-cluster-01}\n"
        "spec:\n  type: kubernetes\n  gpuClasses: [nvidia.com/h100]\n"
        "  kubernetes: {context: prod, namespace: agents}\n"))
    spec_repo.write("modeldeployments/chat.yaml", (
        "apiVersion: plnt.work/v1\nkind: ModelDeployment\nmetadata: {name: chat, namespace: default}\nspec:\n"
        f"  model: {{registry: '{registry}', name: {NAME}, version: 1.0.0, rootDigest: '{root}', "
        f"trustPolicy: {trust_policy}}}\n"
        f"  runtime: {{type: {runtime}, contextLength: 1024}}\n"
        f"  backend: {{cluster: gpu-cluster-01{gpu}}}\n"))
    return str(spec_repo.commit("chat on kubernetes"))


def model_ref(spec_repo: Any) -> Any:
    from plnt.core.specs.loader import load_directory
    from plnt.reconciler.saga.io import SagaRef

    specs, problems = load_directory(spec_repo.path)
    assert problems == [], problems
    run = specs.model_deployments["default/chat"]
    return SagaRef(action="deploy", namespace="default", name="chat", commit=spec_repo.git("rev-parse", "HEAD"),
                   fingerprint=run.fingerprint(), version=run.version)


class Kit:
    """The real activities with a DriverSet whose Helm driver runs against RecordingHelm (a STAND-IN
    for helm's cluster side: no release exists, upgrades are recorded)."""

    def __init__(self, tmp_path: Path, spec_repo: Any, oci_address: str) -> None:
        from plnt.reconciler.drivers.driver_set import DriverSet
        from plnt.reconciler.drivers.local import LocalDriver
        from plnt.reconciler.recipes.weights import WeightsStore
        from plnt.reconciler.saga.activities import SagaActivities
        from plnt.reconciler.saga.commit_specs import CommitSpecs
        from plnt.reconciler.source.git import GitSource
        from plnt.reconciler.state import StateDir
        from plnt.reconciler.status_store import StatusStore

        from tests.reconciler.drivers.test_helm_chart import RecordingHelm

        source = GitSource(str(spec_repo.path), tmp_path / "clone")
        source.fetch()
        state = StateDir(tmp_path / "state").ensure()
        self.options = RegistryOptions(allow_insecure_http=(oci_address,))
        self.helm = RecordingHelm()
        self.drivers = DriverSet(LocalDriver(state), state, lambda backend, lookup: HelmDriver(
            backend, lookup, image=IMAGE, runner=self.helm, registry_options=self.options))
        self.weights = WeightsStore(state.root / "weights", budget_bytes=1 << 30)
        self.activities = SagaActivities(
            driver=self.drivers, statuses=StatusStore(state.status_file), commit_specs=CommitSpecs(source),
            export_from_repo=source.export, read_from_repo=source.read_file, recipe_cache=state.recipes,
            supported_backend_types=("local", "kubernetes"), saga_task_queue=None, registry_options=self.options,
            weights=self.weights)

    async def run(self, activity: str, request: Any) -> Any:
        from temporalio.testing import ActivityEnvironment

        return await ActivityEnvironment().run(getattr(self.activities, activity), request)

    async def refused(self, activity: str, request: Any) -> tuple[str, str]:
        from temporalio.exceptions import ApplicationError

        with pytest.raises(ApplicationError) as caught:
            await self.run(activity, request)
        assert caught.value.non_retryable, caught.value
        return str(caught.value.type), caught.value.message


@pytest.fixture
def pushed(tmp_path: Path, oci_registry: Any) -> tuple[Any, str, str, dict[str, bytes]]:
    """Weights (one model.gguf) signed by the test Sigstore authority and pushed with `plnt model
    push` to the real OCI registry: (authority, registry URL, root digest, the files)."""
    from tests.reconciler.cli import test_cli_model as cli_model
    from tests.sigstore_ca import TestSigstoreAuthority

    authority = TestSigstoreAuthority("helm-models")
    files = cli_model.author_dir(tmp_path / "author", "helm-models")
    root = cli_model.sign_with_manifest_command(authority, tmp_path / "author")
    registry = f"oci://{oci_registry.address}/helm-models/t{os.urandom(4).hex()}"
    result = cli_model.plnt("model", "push", tmp_path / "author", "--to", registry, "--name", cli_model.NAME,
                            "--version", cli_model.VERSION, "--oci-insecure-host", oci_registry.address)
    assert result.exit_code == 0, result.stderr
    return authority, registry, root, files


@pytest.mark.integration
async def test_the_saga_deploys_a_model_to_kubernetes_and_the_pod_would_fetch_what_was_signed(
        spec_repo: Any, tmp_path: Path, oci_registry: Any, pushed: tuple[Any, str, str, dict[str, bytes]]) -> None:
    """validate, pull_recipe and install_release for real; helm is RecordingHelm; then the recorded
    values rendered by the real helm, and the init container's exact command run with `plnt`."""
    from plnt.reconciler.saga.io import InstallInput, PullInput, ValidateInput

    from tests.reconciler.drivers.test_runner_pod_fetch import PodStandIn

    authority, registry, root, files = pushed
    repo_with_model(spec_repo, authority, registry, root)
    kit = Kit(tmp_path, spec_repo, oci_registry.address)
    ref = model_ref(spec_repo)

    validated = await kit.run("validate", ValidateInput(saga=ref))
    assert (validated.backend_type, validated.version) == ("kubernetes", "1.0.0")
    pulled = await kit.run("pull_recipe", PullInput(saga=ref))
    assert (pulled.digest, pulled.transferred_bytes) == (root, 0)
    assert pulled.signer.startswith("recipes@fetch.plnt.invalid")
    assert list((kit.weights.root / "blobs").iterdir()) == [], "the pod fetches the weights: plnt's store stays empty"
    release = await kit.run("install_release", InstallInput(saga=ref, track="canary", recipe_digest=pulled.digest))
    assert release.endpoint == "http://chat-canary.agents.svc.cluster.local:8000"
    assert release.model is not None and release.model.model_file == "model.gguf", "named by the signed manifest"

    [(args, values)] = kit.helm.upgrades
    assert args[3] == DEFAULT_MODEL_CHART and values["model"]["rootDigest"] == root
    assert [d["metadata"]["name"] for d in yaml.safe_load_all(values["weights"]["policies"])] == ["k8s-models"]
    assert values["weights"]["trustedRoots"] == {MODELS_ROOT: (spec_repo.path / MODELS_ROOT).read_text()}
    assert values["weights"]["ociInsecureHosts"] == [oci_registry.address]

    from tests.charts.chartkit import render

    docs = render(find_helm(), Path(args[3]), values, release=args[2], namespace=args[args.index("--namespace") + 1])
    pod = PodStandIn(docs, tmp_path / "pod", secrets={})
    pod.objects["RecipeTrustConfigMap"] = pod.objects["ConfigMap"]  # this chart's only ConfigMap
    result = pod.run()
    assert result.returncode == 0, result.stderr
    [server] = pod.pod["containers"]
    model_arg = server["args"][server["args"].index("--model") + 1]
    assert Path(pod.host(model_arg)).read_bytes() == files["model.gguf"], "the server loads the signed file"


@pytest.mark.integration
async def test_pull_on_kubernetes_fails_closed_on_a_pin_the_signed_manifest_does_not_have(
        spec_repo: Any, tmp_path: Path, oci_registry: Any, pushed: tuple[Any, str, str, dict[str, bytes]]) -> None:
    """Real activities, registry and signature; helm is RecordingHelm (a STAND-IN), never reached."""
    from plnt.reconciler.saga.io import InstallInput, PullInput

    authority, registry, _, _ = pushed
    other = "sha256:" + "0" * 64
    repo_with_model(spec_repo, authority, registry, other)
    kit = Kit(tmp_path, spec_repo, oci_registry.address)
    ref = model_ref(spec_repo)
    kind, message = await kit.refused("pull_recipe", PullInput(saga=ref))
    assert kind == "VerificationFailed" and "pin-mismatch" in message, message
    # An install called without a verified pull verifies the manifest again: nothing reaches helm.
    kind, message = await kit.refused("install_release", InstallInput(saga=ref, track="canary", recipe_digest=other))
    assert kind == "VerificationFailed" and "pin-mismatch" in message, message
    assert kit.helm.upgrades == []


@pytest.mark.integration
@pytest.mark.parametrize(("registry", "runtime", "gpu", "policy", "expected"), [
    ("file:///srv/models", "llama.cpp", "", "k8s-models",
     "spec.model.registry: 'file:///srv/models' cannot be reached from a model-server pod"),
    (None, "vllm", "", "k8s-models", "spec.backend.gpuCount: runtime vllm serves on GPUs only"),
    (None, "tgi", "", "k8s-models", "spec.backend.gpuCount: runtime tgi serves on GPUs only"),
    (None, "sglang", "", "k8s-models", "spec.backend.gpuCount: runtime sglang serves on GPUs only"),
    (None, "llama.cpp", "", "others", "spec.model.trustPolicy: RecipeTrustPolicy 'others' does not list model"),
])
async def test_validate_refuses_a_model_a_kubernetes_pod_could_not_serve(
        spec_repo: Any, tmp_path: Path, registry: str | None, runtime: str, gpu: str, policy: str,
        expected: str) -> None:
    """Real activities and repository; no registry is reached (validate reads the commit only)."""
    from plnt.reconciler.saga.io import ValidateInput

    from tests.sigstore_ca import TestSigstoreAuthority

    repo_with_model(spec_repo, TestSigstoreAuthority("validate"), registry or "oci://registry.example.com/models",
                    ROOT_DIGEST, runtime=runtime, gpu=gpu, trust_policy=policy)
    kit = Kit(tmp_path, spec_repo, "127.0.0.1:1")
    kind, message = await kit.refused("validate", ValidateInput(saga=model_ref(spec_repo)))
    assert kind == "InvalidSpec" and expected in message, message


@pytest.mark.integration
async def test_validate_accepts_a_gpu_runtime_with_gpus_on_kubernetes(spec_repo: Any, tmp_path: Path) -> None:
    """Real activities and repository (RecordingHelm, a STAND-IN, is never reached)."""
    from plnt.reconciler.saga.io import ValidateInput

    from tests.sigstore_ca import TestSigstoreAuthority

    repo_with_model(spec_repo, TestSigstoreAuthority("validate-ok"), "s3://models/prod", ROOT_DIGEST, runtime="vllm",
                    gpu=", gpuClass: nvidia.com/h100, gpuCount: 2")
    kit = Kit(tmp_path, spec_repo, "127.0.0.1:1")
    validated = await kit.run("validate", ValidateInput(saga=model_ref(spec_repo)))
    assert validated.backend_type == "kubernetes" and validated.spec["backend"]["gpuCount"] == 2


async def test_spec_runtime_resources_become_the_servers_requests_and_limits_beside_its_gpus(helm: str) -> None:
    """spec.runtime.resources wins over plnt's setting; the chart adds the GPU limit to them (REAL helm
    renders the values the driver gave the FAKE helm)."""
    run = model(runtime={"type": "vllm", "resources": {"memoryMiB": 24576, "cpu": 4}},
                backend={"gpuClass": "nvidia.com/gpu", "gpuCount": 1})
    docs, _ = await driver_docs(helm, run)
    container = next(c for c in kinds(docs)["Deployment"]["spec"]["template"]["spec"]["containers"])
    assert container["resources"]["requests"] == {"memory": "24576Mi", "cpu": "4"}
    assert container["resources"]["limits"] == {"memory": "24576Mi", "nvidia.com/gpu": 1}
    assert model_resources(model().spec) is None  # none asked: the driver's setting applies
