"""charts/model-server with the REAL helm binary (`helm lint --strict`, `helm template`): no cluster.

One case per runtime and hardware (llama.cpp on CPU and on a GPU, vLLM, TGI and SGLang on GPUs),
with the values a ModelDeployment on a Kubernetes backend produces (canary and stable, s3:// and
oci:// registries, a credentials Secret or none, an emptyDir or a claim for the weights). Every
rendered object passes kubernetes-validate's strict schemas for Kubernetes 1.33 (chartkit), every
pod template the `restricted` Pod Security Standard as chartkit reads it, and the init container's
and the server's exact command lines, probes, GPU limits and placement are asserted. The GPU
runtimes without GPUs, unknown values and the template guards fail the render.

The init container's rendered command also runs for real (the last test): weights signed by the
test Sigstore authority are pushed to the real OCI registry (tests/services.py) with `plnt model
push`, the rendered ConfigMap is written where the pod would mount it, and the exact command runs
with the project's `plnt`; the server's `--model` path then names the fetched file.

Not shown here (no cluster, no image pulled, no GPU): that the images exist and run as uid 10001 on
a read-only root filesystem, that the servers accept these flags, load the weights and answer
/health, that the scheduler finds the GPU resources, and that admission enforces `restricted`.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartkit import (
    ROOT,
    check_labels,
    helm_template,
    merged,
    pod_templates,
    render,
    restricted_problems,
    validate_strictly,
)
from tests.services import OciServer
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = pytest.mark.integration  # every test runs the real helm binary

CHART = ROOT / "charts" / "model-server"
NAMESPACE = "agents"
FINGERPRINT = "sha256:" + "5f" * 32
ROOT_DIGEST = "sha256:" + "ab" * 32
ROOT_JSON = json.dumps({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1", "tlogs": []})
PUBLIC_GOOD = """\
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata: {name: public-signers}
spec:
  recipes: ["smollm*", "qwen*"]
  trustRoot: {publicGood: true}
  signers: [{issuer: "https://token.actions.githubusercontent.com", identity: "https://github.com/acme/models/.github/workflows/sign.yml@refs/heads/main"}]
"""
ROOTED = {"weights": {"policies": PUBLIC_GOOD.replace("publicGood: true", "trustedRootFile: trust/models-root.json"),
                      "trustedRoots": {"trust/models-root.json": ROOT_JSON}}}
POOL = {"nodeSelector": {"cloud.example.com/pool": "models"}}

# What plnt writes for a ModelDeployment `chat` in plnt namespace team-a (the layers below vary it).
BASE: dict[str, Any] = {
    "deployment": {"name": "chat", "namespace": "team-a", "specFingerprint": FINGERPRINT,
                   "releaseId": "team-a.chat.1.0.0.5f5f5f5f5f5f", "trafficPercent": 0},
    "track": "stable",
    "model": {"registry": "oci://registry.example.com/models", "name": "smollm2", "version": "1.0.0",
              "rootDigest": ROOT_DIGEST},
    "runtime": {"type": "llama.cpp", "modelFile": "smollm2-q8_0.gguf", "contextLength": 4096, "args": []},
    "image": {"repository": "ghcr.io/acme/plnt", "tag": "0.1.0", "pullPolicy": "IfNotPresent"},
    "gpu": {"class": "", "count": 0},
    "nodeSelector": {},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "models", "effect": "NoSchedule"}],
    "replicas": 1,
    "resources": {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"memory": "16Gi"}},
    "weights": {"policies": PUBLIC_GOOD, "trustedRoots": {}},
}
GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
S3 = {"model": {"registry": "s3://acme-models/prod"},
      "weights": {"s3": {"endpointUrl": "https://s3.eu-west-1.amazonaws.com", "region": "eu-west-1"},
                  "credentialsSecret": "model-registry"}}
OCI_SECRET = {"weights": {"credentialsSecret": "model-registry", "ociInsecureHosts": ["registry.internal:5000"]}}

# case -> (release, values, the server's image, command and args, the GPU resource and count, node selector)
CASES: dict[str, tuple[str, dict[str, Any], str, list[str], list[str], tuple[str, int] | None, dict[str, str]]] = {
    "llama.cpp-cpu": (
        "chat", merged(BASE, POOL, ROOTED, {"runtime": {"threads": 8, "args": ["--parallel", "2"]}}),
        "ghcr.io/ggml-org/llama.cpp:server-b8840", ["/app/llama-server"],
        ["--model", "/models/smollm2/smollm2-q8_0.gguf", "--alias", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--ctx-size", "4096", "--threads", "8", "--parallel", "2"],
        None, {"cloud.example.com/pool": "models"}),
    "llama.cpp-gpu-canary": (
        "chat-canary", merged(BASE, POOL, ROOTED, S3, {"track": "canary", "deployment": {"trafficPercent": 5},
                                         "gpu": {"class": "nvidia.com/gpu", "count": 1},
                                         "tolerations": [*BASE["tolerations"], GPU_TAINT]}),
        "ghcr.io/ggml-org/llama.cpp:server-cuda-b8840", ["/app/llama-server"],
        ["--model", "/models/smollm2/smollm2-q8_0.gguf", "--alias", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--ctx-size", "4096", "--n-gpu-layers", "999"],
        ("nvidia.com/gpu", 1), {"cloud.example.com/pool": "models"}),
    "vllm-gpu-canary": (
        "chat-canary", merged(BASE, POOL, S3, {
            "track": "canary", "model": {"name": "qwen3-8b"},
            "runtime": {"type": "vllm", "modelFile": "", "contextLength": 32768, "args": ["--gpu-memory-utilization", "0.9"]},
            "gpu": {"class": "nvidia.com/h100", "count": 2, "resourceName": "nvidia.com/gpu"},
            "tolerations": [GPU_TAINT]}),
        "vllm/vllm-openai:v0.11.0", ["vllm", "serve"],
        ["/models/qwen3-8b", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--max-model-len", "32768", "--tensor-parallel-size", "2", "--gpu-memory-utilization", "0.9"],
        ("nvidia.com/gpu", 2), {"cloud.example.com/pool": "models", "nvidia.com/h100": "true"}),
    "tgi-gpu": (
        "chat", merged(BASE, ROOTED, OCI_SECRET, {
            "runtime": {"type": "tgi", "modelFile": "", "image": "registry.internal:5000/tgi:3.2.3-acme"},
            "gpu": {"class": "a100-80gb", "count": 1},
            "weights": {"persistentVolumeClaim": "model-weights"}}),
        "registry.internal:5000/tgi:3.2.3-acme", ["text-generation-launcher"],
        ["--model-id", "/models/smollm2", "--hostname", "0.0.0.0", "--port", "8000", "--max-input-tokens", "4095",
         "--max-total-tokens", "4096"],
        ("nvidia.com/gpu", 1), {"a100-80gb": "true"}),
    "sglang-gpu": (
        "chat", merged(BASE, POOL, {
            "runtime": {"type": "sglang", "modelFile": "", "contextLength": 8192, "args": ["--mem-fraction-static=0.85"]},
            "gpu": {"class": "amd.com/gpu", "count": 4}, "weights": {"sizeLimit": "60Gi"},
            "shm": {"sizeLimit": "16Gi"}}),
        "lmsysorg/sglang:v0.5.19-cu129", ["python3", "-m", "sglang.launch_server"],
        ["--model-path", "/models/smollm2", "--served-model-name", "chat", "--host", "0.0.0.0", "--port", "8000",
         "--context-length", "8192", "--tp-size", "4", "--mem-fraction-static=0.85"],
        ("amd.com/gpu", 4), {"cloud.example.com/pool": "models"}),
}


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for doc in docs:
        assert doc["kind"] not in out, [d["kind"] for d in docs]
        out[doc["kind"]] = doc
    return out


def render_case(helm: str, case: str) -> list[dict[str, Any]]:
    release, values, *_ = CASES[case]
    return render(helm, CHART, values, release=release, namespace=NAMESPACE)


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = by_kind(docs)["Deployment"]["spec"]["template"]["spec"]
    return spec


def failure(helm: str, values: dict[str, Any], release: str = "chat") -> str:
    result = helm_template(helm, CHART, values, release=release, namespace=NAMESPACE)
    assert result.returncode != 0, result.stdout[:400]
    return result.stderr


# --- lint ------------------------------------------------------------------------------------


def test_helm_lint_passes_with_only_the_icon_info(helm: str, tmp_path: Path) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [line for line in result.stdout.splitlines() if line.startswith("[")] == ["[INFO] Chart.yaml: icon is recommended"]
    for case, (_, values, *_rest) in CASES.items():
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        result = subprocess.run([helm, "lint", "--strict", str(CHART), "--values", str(path)],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, (case, result.stdout + result.stderr)
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, (case, result.stdout)


# --- render: each runtime, strictly valid, exact commands --------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_runtime_renders_validates_strictly_and_runs_what_it_should(helm: str, case: str) -> None:
    release, values, image, command, args, gpus, node_selector = CASES[case]
    docs = render_case(helm, case)
    for doc in docs:
        validate_strictly(doc, case)
        check_labels(doc["metadata"]["labels"])
        assert doc["metadata"]["namespace"] == NAMESPACE
    objects = by_kind(docs)
    assert set(objects) == {"ConfigMap", "Service", "Deployment"}
    assert {doc["metadata"]["name"] for doc in docs} == {release, f"{release}-weights-trust"}

    track = values["track"]
    deployment = objects["Deployment"]
    template = deployment["spec"]["template"]
    pod = template["spec"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "model-server", "app.kubernetes.io/instance": release,
                        "plnt.work/model-deployment": "chat", "plnt.work/track": track}
    assert objects["Service"]["spec"]["selector"] == selector and selector.items() <= template["metadata"]["labels"].items()
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/version"] == "1.0.0" and labels["plnt.work/model-deployment-namespace"] == "team-a"
        assert labels["plnt.work/spec-fingerprint"] == "5f" * 6 and labels["plnt.work/runtime"] == values["runtime"]["type"]
        assert labels["app.kubernetes.io/component"] == "model-server" and labels["app.kubernetes.io/managed-by"] == "Helm"
    assert deployment["metadata"]["annotations"] == {"plnt.work/release-id": "team-a.chat.1.0.0.5f5f5f5f5f5f",
                                                     "plnt.work/spec-fingerprint": FINGERPRINT,
                                                     "plnt.work/root-digest": ROOT_DIGEST}
    assert deployment["spec"]["replicas"] == 1
    assert objects["Service"]["spec"]["type"] == "ClusterIP"
    assert objects["Service"]["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]

    # The init container: the plnt image, `plnt model fetch` with the pin, the policy and the directory.
    [init] = pod["initContainers"]
    model = values["model"]
    assert (init["name"], init["image"], init["command"]) == ("fetch-weights", "ghcr.io/acme/plnt:0.1.0", ["plnt"])
    expected_init = ["model", "fetch", "--registry", model["registry"], "--name", model["name"], "--version", "1.0.0",
                     "--root-digest", ROOT_DIGEST, "--policy", "/etc/plnt/trust/policies.yaml"]
    if values["weights"]["trustedRoots"]:
        expected_init += ["--trust-root", "/etc/plnt/trust/trust/models-root.json"]
    expected_init += ["--into", f"/models/{model['name']}"]
    if model["registry"].startswith("s3://"):
        expected_init += ["--s3-endpoint-url", "https://s3.eu-west-1.amazonaws.com", "--s3-region", "eu-west-1"]
    expected_init += [arg for host in values["weights"].get("ociInsecureHosts", []) for arg in ("--oci-insecure-host", host)]
    assert init["args"] == expected_init
    assert json.dumps(init["resources"]).count("gpu") == 0, "the fetch holds no GPU"
    assert init["resources"]["requests"] == {"cpu": "2", "memory": "8Gi"}

    # The server: its image, command and args for the runtime, the chart's flags before spec.runtime.args.
    [server] = pod["containers"]
    assert (server["name"], server["image"], server["command"], server["args"]) == ("server", image, command, args)
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] == 1800, "30 minutes to load the weights"
    env = {item["name"]: item["value"] for item in server["env"]}
    assert env["HF_HUB_OFFLINE"] == "1" and env["HOME"] == "/cache" and env["TMPDIR"] == "/tmp"
    assert ("VLLM_NO_USAGE_STATS" in env) == (values["runtime"]["type"] == "vllm")
    assert (env.get("USAGE_STATS") == "off") == (values["runtime"]["type"] == "tgi")

    # GPUs: the limit in the chosen resource; placement: the backend's and the spec's selectors, tolerations.
    limits = server["resources"]["limits"]
    assert limits["memory"] == "16Gi"
    if gpus is None:
        assert set(limits) == {"memory"}, "llama.cpp with gpu.count 0 runs on CPU"
    else:
        assert {k: v for k, v in limits.items() if k != "memory"} == {gpus[0]: gpus[1]}
    assert pod.get("nodeSelector", {}) == node_selector
    assert pod.get("tolerations", []) == values["tolerations"]

    # Volumes: the weights read-write for the fetch, read-only for the server; scratch where written.
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    init_mounts = {m["mountPath"]: m for m in init["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is True and "readOnly" not in init_mounts["/models"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    claim = values["weights"].get("persistentVolumeClaim")
    if claim:
        assert volumes["models"] == {"name": "models", "persistentVolumeClaim": {"claimName": claim}}
        assert mounts["/models"]["subPath"] == init_mounts["/models"]["subPath"] == "sha256-" + "ab" * 32
    else:
        assert "subPath" not in mounts["/models"] and set(volumes["models"]) == {"name", "emptyDir"}
        assert volumes["models"]["emptyDir"].get("sizeLimit") == values["weights"].get("sizeLimit")
    gpu_runtime = values["runtime"]["type"] != "llama.cpp"
    assert set(mounts) == {"/models", "/tmp", "/cache"} | ({"/dev/shm"} if gpu_runtime else set())
    if gpu_runtime:
        assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": values.get("shm", {}).get("sizeLimit", "4Gi")}
    trust = objects["ConfigMap"]["data"]
    assert trust["policies.yaml"] == values["weights"]["policies"]
    assert (trust.get("trusted-root-0.json") == ROOT_JSON) == bool(values["weights"]["trustedRoots"])


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pod_is_restricted_and_never_talks_to_the_api(helm: str, case: str) -> None:
    templates = dict(pod_templates(render_case(helm, case)))
    assert set(templates) == {f"Deployment/{CASES[case][0]}"}
    for name, template in templates.items():
        assert restricted_problems(template) == [], f"{case}: {name}"
        spec = template["spec"]
        assert spec["securityContext"]["runAsUser"] == 10001 and spec["securityContext"]["fsGroup"] == 10001
        assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
        for container in [*spec["initContainers"], *spec["containers"]]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True
            writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
            assert writable <= {"/tmp", "/cache", "/dev/shm", "/models"}, (container["name"], writable)


def test_canary_and_stable_coexist_with_distinct_names_and_selectors(helm: str) -> None:
    stable = by_kind(render(helm, CHART, BASE, release="chat", namespace=NAMESPACE))
    canary = by_kind(render(helm, CHART, merged(BASE, {"track": "canary", "model": {"version": "1.1.0-rc.1+build.5"}}),
                            release="chat-canary", namespace=NAMESPACE))
    names = [{(d["kind"], d["metadata"]["name"]) for d in objects.values()} for objects in (stable, canary)]
    assert not names[0] & names[1], "one namespace holds both releases"
    pods = [objects["Deployment"]["spec"]["template"]["metadata"]["labels"] for objects in (stable, canary)]
    for mine, other, objects in ((pods[0], pods[1], stable), (pods[1], pods[0], canary)):
        for selector in (objects["Deployment"]["spec"]["selector"]["matchLabels"], objects["Service"]["spec"]["selector"]):
            assert selector.items() <= mine.items() and not selector.items() <= other.items()
    assert pods[1]["app.kubernetes.io/version"] == "1.1.0-rc.1_build.5"
    check_labels(pods[1])


# --- GPUs: the mapping, and the GPU runtimes without GPUs --------------------------------------


@pytest.mark.parametrize(("gpu", "resource", "node_label"), [
    ({"class": "", "count": 1}, "nvidia.com/gpu", None),
    ({"class": "h100", "count": 1}, "nvidia.com/gpu", "h100"),  # a plain class is the pool's node label
    ({"class": "nvidia.com/gpu", "count": 2}, "nvidia.com/gpu", None),
    ({"class": "amd.com/gpu", "count": 1}, "amd.com/gpu", None),  # vendor.tld/resource: the resource itself
    ({"class": "nvidia.com/mig-1g.10gb", "count": 3}, "nvidia.com/mig-1g.10gb", None),
    ({"class": "nvidia.com/h100", "count": 1}, "nvidia.com/h100", None),  # see the README: resourceName below
    ({"class": "nvidia.com/h100", "count": 1, "resourceName": "nvidia.com/gpu"}, "nvidia.com/gpu", "nvidia.com/h100"),
])
def test_gpu_class_and_count_map_to_a_resource_limit_and_a_node_label(helm: str, gpu: dict[str, Any], resource: str,
                                                                      node_label: str | None) -> None:
    values = merged(BASE, {"runtime": {"type": "vllm", "modelFile": ""}, "gpu": gpu})
    pod = pod_spec(render(helm, CHART, values, release="chat", namespace=NAMESPACE))
    [server], [init] = pod["containers"], pod["initContainers"]
    assert server["resources"]["limits"] == {"memory": "16Gi", resource: gpu["count"]}
    assert pod.get("nodeSelector", {}) == ({node_label: "true"} if node_label else {})
    assert resource not in json.dumps(init["resources"])
    assert ("--tensor-parallel-size" in server["args"]) == (gpu["count"] > 1)


@pytest.mark.parametrize("runtime", ["vllm", "tgi", "sglang"])
def test_a_gpu_runtime_without_gpus_fails_to_render_naming_the_field(helm: str, runtime: str) -> None:
    stderr = failure(helm, merged(BASE, {"runtime": {"type": runtime, "modelFile": ""}, "gpu": {"class": "nvidia.com/gpu"}}))
    assert (f"runtime.type {runtime} serves on GPUs only: gpu.count (the ModelDeployment's spec.backend.gpuCount) "
            "must be at least 1, not 0") in stderr, stderr


# --- the schema and the template guards ------------------------------------------------------


@pytest.mark.parametrize(("change", "expected"), [
    ({"replicaCount": 2}, "additional properties 'replicaCount' not allowed"),
    ({"runtime": {"gpuLayers": 99}}, "additional properties 'gpuLayers' not allowed"),
    ({"runtime": {"type": "ollama"}}, "value must be one of 'llama.cpp', 'vllm', 'tgi', 'sglang'"),
    ({"runtime": {"images": {"mlx": "x"}}}, "additional properties 'mlx' not allowed"),
    ({"runtime": {"contextLength": 64}}, "minimum"),
    ({"runtime": {"modelFile": "weights.safetensors"}}, "modelFile"),
    ({"gpu": {"count": "2"}}, "got string, want integer"),
    ({"gpu": {"resourceName": "gpu"}}, "resourceName"),
    ({"track": "blue"}, "track"),
    ({"model": {"registry": "file:models"}}, "registry"),
    ({"model": {"rootDigest": "sha256:ABC"}}, "rootDigest"),
    ({"weights": {"credentials": {"key": "x"}}}, "additional properties 'credentials' not allowed"),
    ({"weights": {"persistentVolumeClaim": "Not_A_Claim"}}, "persistentVolumeClaim"),
    ({"shm": {"sizeLimit": "lots"}}, "sizeLimit"),
])
def test_schema_refuses_unknown_keys_wrong_types_and_bad_values(helm: str, change: dict[str, Any], expected: str) -> None:
    stderr = failure(helm, merged(BASE, change))
    assert "values don't meet the specifications of the schema" in stderr and expected in stderr, stderr


@pytest.mark.parametrize(("change", "release", "expected"), [
    ({"runtime": {"args": ["--alias=other"]}}, "chat",
     "runtime.args: --alias is set by the chart for llama.cpp"),
    ({"runtime": {"type": "vllm", "args": ["--served-model-name", "x"]}, "gpu": {"count": 1}}, "chat",
     "runtime.args: --served-model-name is set by the chart for vllm"),
    ({"runtime": {"type": "tgi", "args": ["--max-input-length=100"]}, "gpu": {"count": 1}}, "chat",
     "runtime.args: --max-input-length is set by the chart for tgi"),
    ({"runtime": {"type": "sglang", "args": ["--tp", "2"]}, "gpu": {"count": 1}}, "chat",
     "runtime.args: --tp is set by the chart for sglang"),
    ({"runtime": {"modelFile": ""}}, "chat", "runtime.modelFile: llama.cpp loads one .gguf file"),
    ({"runtime": {"modelFile": "sub/../../etc/x.gguf"}}, "chat", "must be a relative path without . or .. segments"),
    (merged(ROOTED, {"weights": {"trustedRoots": {"trust/../../etc/passwd": ROOT_JSON}}}), "chat",
     "weights.trustedRoots: \"trust/../../etc/passwd\" must be a relative path"),
    ({}, "9-lives", "must be a DNS-1035 label"),
])
def test_template_guards_fail_the_render(helm: str, change: dict[str, Any], release: str, expected: str) -> None:
    stderr = failure(helm, merged(BASE, change), release=release)
    assert expected in stderr, stderr


# --- registry credentials: only by reference to a Secret ----------------------------------------


@pytest.mark.parametrize(("layer", "kind"), [(S3, "s3"), (OCI_SECRET, "oci"), ({}, "none")])
def test_registry_credentials_come_from_the_secret_only(helm: str, layer: dict[str, Any], kind: str) -> None:
    docs = render(helm, CHART, merged(BASE, layer), release="chat", namespace=NAMESPACE)
    pod = pod_spec(docs)
    [init], [server] = pod["initContainers"], pod["containers"]
    env = {item["name"]: item for item in init["env"]}
    aws = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
    assert aws & set(env) == (aws if kind == "s3" else set())
    for name in aws & set(env):
        assert "value" not in env[name] and env[name]["valueFrom"]["secretKeyRef"]["name"] == "model-registry"
        assert env[name]["valueFrom"]["secretKeyRef"].get("optional", False) == (name == "AWS_SESSION_TOKEN")
    volumes = {v["name"]: v for v in pod["volumes"]}
    if kind == "oci":
        assert volumes["registry-credentials"]["secret"] == {
            "secretName": "model-registry", "items": [{"key": ".dockerconfigjson", "path": "config.json"}]}
        assert {"name": "registry-credentials", "mountPath": "/tmp/.docker", "readOnly": True} in init["volumeMounts"]
    else:
        assert "registry-credentials" not in volumes
    assert env["HOME"] == {"name": "HOME", "value": "/tmp"}
    assert "model-registry" not in json.dumps(server) + json.dumps(by_kind(docs)["ConfigMap"]), "the server gets none"


# --- the init container's command, run for real -------------------------------------------------


def test_the_rendered_fetch_command_puts_the_file_the_server_loads(helm: str, tmp_path: Path,
                                                                   oci_registry: OciServer) -> None:
    """The exact init container command (args, env, the ConfigMap's files where the pod mounts them)
    with the project's `plnt`, against weights pushed to the real OCI registry; then a pin the
    weights do not have: exit 1, and the model directory stays empty."""
    cli_model = pytest.importorskip("tests.reconciler.cli.test_cli_model", reason="`plnt model` (cli_model.py) is not here")
    from tests.reconciler.drivers.test_runner_pod_fetch import PodStandIn

    authority = TestSigstoreAuthority("model-server-chart")
    files = cli_model.author_dir(tmp_path / "author", "chart")
    root = cli_model.sign_with_manifest_command(authority, tmp_path / "author")
    registry = f"oci://{oci_registry.address}/chart/t{os.urandom(4).hex()}"
    pushed = cli_model.plnt("model", "push", tmp_path / "author", "--to", registry, "--name", cli_model.NAME,
                            "--version", cli_model.VERSION, "--oci-insecure-host", oci_registry.address)
    assert pushed.exit_code == 0, pushed.stderr
    policy = cli_model.policy_file(tmp_path / "spec-repo", authority)
    policy_doc = yaml.safe_load(policy.read_text())
    root_path = policy_doc["spec"]["trustRoot"]["trustedRootFile"]

    def pod(pin: str, where: Path) -> PodStandIn:
        values = merged(BASE, {
            "model": {"registry": registry, "name": cli_model.NAME, "version": cli_model.VERSION, "rootDigest": pin},
            "runtime": {"modelFile": "model.gguf"},
            "weights": {"policies": policy.read_text(), "ociInsecureHosts": [oci_registry.address],
                        "trustedRoots": {root_path: (policy.parent / root_path).read_text()}}})
        docs = render(helm, CHART, values, release="chat", namespace=NAMESPACE)
        stand_in = PodStandIn(docs, where, secrets={})
        stand_in.objects["RecipeTrustConfigMap"] = stand_in.objects["ConfigMap"]  # this chart's only ConfigMap
        return stand_in

    fetch = pod(root, tmp_path / "pod")
    result = fetch.run()
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"fetched model {cli_model.NAME}@{cli_model.VERSION} ({root}) signed by ")
    # What the server container loads, through its own (read-only) mount of the same volume.
    [server] = fetch.pod["containers"]
    model_arg = server["args"][server["args"].index("--model") + 1]
    assert model_arg == f"/models/{cli_model.NAME}/model.gguf"
    assert Path(fetch.host(model_arg)).read_bytes() == files["model.gguf"]
    assert cli_model.model_files(Path(fetch.host(f"/models/{cli_model.NAME}"))) == files

    refused = pod("sha256:" + "0" * 64, tmp_path / "other-pod")
    result = refused.run()
    assert result.returncode == 1 and "VerificationFailed: pin-mismatch" in result.stderr, result.stderr
    assert list(Path(refused.host("/models")).iterdir()) == []


# --- autoscaling: an HPA on the servers' in-flight requests ----------------------------------------


def test_autoscaling_makes_an_hpa_on_in_flight_requests_that_owns_the_count(helm: str) -> None:
    docs = by_kind(render(helm, CHART, merged(BASE, {"replicas": 2, "autoscaling": {
        "targetInFlight": 3, "maxReplicas": 5, "scaleDownAfterSeconds": 120}}), release="chat", namespace=NAMESPACE))
    assert "replicas" not in docs["Deployment"]["spec"]  # the HPA owns it
    hpa = docs["HorizontalPodAutoscaler"]
    validate_strictly(hpa, "autoscaled")
    assert hpa["apiVersion"] == "autoscaling/v2" and hpa["metadata"]["name"] == "chat"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    assert hpa["spec"]["metrics"] == [{"type": "Pods", "pods": {"metric": {"name": "plnt_model_in_flight_requests"},
                                                                "target": {"type": "AverageValue", "averageValue": "3"}}}]
    assert hpa["spec"]["behavior"]["scaleDown"] == {"stabilizationWindowSeconds": 120,
                                                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}
    plain = by_kind(render(helm, CHART, BASE, release="chat", namespace=NAMESPACE))
    assert "HorizontalPodAutoscaler" not in plain and plain["Deployment"]["spec"]["replicas"] == 1


def test_autoscaling_max_below_the_floor_fails_the_render(helm: str) -> None:
    stderr = failure(helm, merged(BASE, {"replicas": 3, "autoscaling": {"targetInFlight": 2, "maxReplicas": 2}}))
    assert "autoscaling.maxReplicas (2) must be >= replicas (3)" in stderr, stderr


# model-server pods are <release>-<pod-template-hash>-<suffix>: each query is summed over the release's own pods.
RUNTIME_SERIES = {"llama.cpp": ("llamacpp:requests_processing", "llamacpp:requests_deferred"),
                  "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
                  "sglang": ("sglang:num_running_reqs", "sglang:num_queue_reqs"),
                  "tgi": ("tgi_batch_current_size", "tgi_queue_size")}


@pytest.mark.parametrize("case", ["llama.cpp-cpu", "vllm-gpu-canary", "tgi-gpu", "sglang-gpu"])
def test_autoscaler_keda_makes_a_scaled_object_on_the_runtimes_own_series_instead_of_the_hpa(
        helm: str, case: str) -> None:
    release, values, *_ = CASES[case]
    keda = {"replicas": 2, "autoscaling": {"targetInFlight": 3, "maxReplicas": 5, "scaleDownAfterSeconds": 120,
                                           "autoscaler": "keda", "prometheusAddress": "http://prometheus.monitoring:9090"}}
    docs = by_kind(render(helm, CHART, merged(values, keda), release=release, namespace=NAMESPACE))
    assert "HorizontalPodAutoscaler" not in docs and "replicas" not in docs["Deployment"]["spec"]
    scaled = docs["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["metadata"]["name"] == release
    check_labels(scaled["metadata"]["labels"])
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": release}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (2, 5)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"] == {"name": release, "behavior": {"scaleDown": {
        "stabilizationWindowSeconds": 120, "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}]}}}
    running, waiting = RUNTIME_SERIES[values["runtime"]["type"]]
    pods = f'namespace="{NAMESPACE}",pod=~"{release}-[a-z0-9]+-[a-z0-9]+"'
    assert spec["triggers"] == [{"type": "prometheus", "name": "in-flight", "metricType": "AverageValue", "metadata": {
        "serverAddress": "http://prometheus.monitoring:9090", "query": f"sum({running}{{{pods}}}) + sum({waiting}{{{pods}}})",
        "threshold": "3"}}]


def test_autoscaler_keda_without_a_prometheus_or_with_max_below_the_floor_fails_the_render(helm: str) -> None:
    keda = {"targetInFlight": 2, "maxReplicas": 4, "autoscaler": "keda"}
    assert "prometheusAddress" in failure(helm, merged(BASE, {"autoscaling": keda}))
    stderr = failure(helm, merged(BASE, {"replicas": 3, "autoscaling": {
        **keda, "maxReplicas": 2, "prometheusAddress": "http://prometheus:9090"}}))
    assert "autoscaling.maxReplicas (2) must be >= replicas (3)" in stderr, stderr


# --- drain on stop: out of the Service's endpoints before the server stops -------------------------


def _server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [server] = [c for c in by_kind(docs)["Deployment"]["spec"]["template"]["spec"]["containers"] if c["name"] == "server"]
    return server


def test_a_deleted_pod_keeps_answering_while_it_leaves_the_service(helm: str) -> None:
    """A preStop sleep of drainOnStopSeconds (default 5) before the server's SIGTERM: the EndpointSlice
    controller takes the terminating pod out meanwhile, and requests under way finish. The sleep action
    exists from Kubernetes 1.30: below, and with 0, none is rendered. (No kubelet runs here: the wait
    itself is unproven; tests/k8s/test_hpa_on_cluster.py has the real API server accept the field.)"""
    docs = render(helm, CHART, BASE, release="chat", namespace=NAMESPACE, extra=("--kube-version", "1.35.0"))
    assert _server(docs)["lifecycle"] == {"preStop": {"sleep": {"seconds": 5}}}
    validate_strictly(by_kind(docs)["Deployment"], "drain on stop")
    pod = by_kind(docs)["Deployment"]["spec"]["template"]["spec"]
    assert pod.get("terminationGracePeriodSeconds", 30) > 5  # (the sleep counts against the grace)
    longer = render(helm, CHART, merged(BASE, {"drainOnStopSeconds": 12}), extra=("--kube-version", "1.35.0"))
    assert _server(longer)["lifecycle"]["preStop"]["sleep"]["seconds"] == 12
    for values, kube in ((merged(BASE, {"drainOnStopSeconds": 0}), "1.35.0"), (BASE, "1.29.0")):
        assert "lifecycle" not in _server(render(helm, CHART, values, extra=("--kube-version", kube))), (values, kube)
