"""charts/workflow-runner with the REAL helm binary (`helm lint`, `helm template`): no cluster.

The manifests checked here are exactly the ones the Helm driver would apply: the driver runs its
`install` against `RecordingHelm`, a stand-in for helm's cluster side that records the
`helm upgrade --install` command line and the values file it wrote, and the test renders that chart with those values, release name and namespace
through `helm template`. Every rendered object passes kubernetes-validate's strict schemas
(Kubernetes 1.33). Nothing is applied to a cluster: there is none on these machines.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.reconciler.driver import InstallRequest
from plnt.reconciler.helm_driver import (
    DEFAULT_CHART,
    HelmChartError,
    HelmDriver,
    RunnerImage,
    classify,
    render_values,
)
from plnt.reconciler.specs import PlntBackend, WorkflowRun

pytestmark = pytest.mark.integration  # every test runs the real helm binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "workflow-runner"
K8S_VERSION = "1.33"
HELM_CANDIDATES = [Path(sys.executable).parent / "helm", ROOT / ".venv" / "bin" / "helm"]

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - a missing test dependency, said plainly
    kubernetes_validate = None


@pytest.fixture(scope="module")
def helm() -> str:
    for candidate in HELM_CANDIDATES:
        if candidate.is_file():
            return str(candidate)
    pytest.fail(f"the real helm binary is missing (looked at {', '.join(map(str, HELM_CANDIDATES))}): "
                "run tools/install_helm.sh (it installs helm into .venv/bin)")


@pytest.fixture(scope="module")
def validate() -> Any:
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is missing: .venv/bin/pip install kubernetes-validate")
    return kubernetes_validate.validate


def backend(**spec: Any) -> PlntBackend:
    return PlntBackend.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "PlntBackend", "metadata": {"name": "gpu-cluster-01"},
        "spec": {"type": "kubernetes", "kubernetes": {"context": "prod", "namespace": "agents"},
                 "gpuClasses": ["nvidia.com/h100", "nvidia.com/l4"], **spec},
    })


def workflow_run(name: str = "review-responder", **spec: Any) -> WorkflowRun:
    return WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": name, "namespace": "team-a"},
        "spec": {"workflow": {"ref": f"{name}@1.2.0", "registry": "s3://microagents"},
                 "backend": {"cluster": "gpu-cluster-01"}, **spec},
    })


def install_request(run: WorkflowRun, track: str) -> InstallRequest:
    return InstallRequest(namespace=run.metadata.namespace, name=run.metadata.name, track=track, version="1.2.0",
                          spec_fingerprint=run.fingerprint(), recipe_digest="sha256:" + "9a" * 32,
                          recipe_dir="/var/lib/plnt/recipes/9a9a", traffic_percent=5 if track == "canary" else 0)


IMAGE = RunnerImage(repository="ghcr.io/acme/plnt", tag="0.1.0", pull_policy="IfNotPresent")
BACKEND = backend(nodeSelector={"cloud.example.com/pool": "agents"},
                  tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])

CASES: dict[str, tuple[WorkflowRun, str]] = {
    "gpu-autoscaled-canary": (workflow_run(
        backend={"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/h100", "gpuCount": 2,
                 "nodeSelector": {"pool": "agent-workflows"},
                 "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "agents", "effect": "NoExecute"}]},
        replicas={"min": 1, "max": 4}, autoscaling={"targetInvocationsPerSecond": 25}), "canary"),
    "gpu-autoscaled-stable": (workflow_run(
        backend={"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/l4", "gpuCount": 1},
        replicas={"min": 2, "max": 6}, autoscaling={"targetInvocationsPerSecond": 2.5}), "stable"),
    "cpu-fixed-stable": (workflow_run(replicas={"min": 3}), "stable"),
    "cpu-fixed-canary": (workflow_run(
        backend={"cluster": "gpu-cluster-01", "nodeSelector": {"cloud.example.com/pool": "cpu"}},
        replicas={"min": 1, "max": 3}), "canary"),
}


class RecordingHelm:
    """Stands in for the cluster side of helm: no release exists, upgrades are recorded with the
    content of the values file the driver wrote (it is deleted after the call)."""

    def __init__(self) -> None:
        self.upgrades: list[tuple[list[str], dict[str, Any]]] = []

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        args = list(args)
        if args[0] == "status":
            return subprocess.CompletedProcess(["helm", *args], 1, "", "Error: release: not found\n")
        if args[0] == "upgrade":
            values = json.loads(Path(args[args.index("--values") + 1]).read_text())
            self.upgrades.append((args, values))
            return subprocess.CompletedProcess(["helm", *args], 0, "{}", "")
        raise AssertionError(f"unexpected helm call {args}")


async def driver_render(helm: str, run: WorkflowRun, track: str) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """What the driver would apply: its own upgrade command's chart, release, namespace and values."""
    recorder = RecordingHelm()
    driver = HelmDriver(BACKEND, lambda ns, name, fp: run.spec if fp == run.fingerprint() else None,
                        image=IMAGE, runner=recorder)
    await driver.install(install_request(run, track))
    [(args, values)] = recorder.upgrades
    release, chart = args[2], args[3]
    namespace = args[args.index("--namespace") + 1]
    docs = render(helm, release, chart, namespace, values)
    return docs, values, args


def render(helm: str, release: str, chart: str, namespace: str, values: dict[str, Any],
           extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    result = helm_template(helm, release, chart, namespace, values, extra)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def helm_template(helm: str, release: str, chart: str, namespace: str, values: dict[str, Any],
                  extra: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", release, chart, "--namespace", namespace, "--values", "-", *extra],
                          input=json.dumps(values), capture_output=True, text=True, check=False)


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = [doc["kind"] for doc in docs]
    assert len(kinds) == len(set(kinds)), kinds
    return {doc["kind"]: doc for doc in docs}


LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def check_labels(labels: dict[str, str]) -> None:
    # kubernetes-validate checks types, not label syntax: the API server would.
    for key, value in labels.items():
        assert LABEL_KEY.match(key) and isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.match(value), (key, value)


# --- lint ------------------------------------------------------------------------------------


def test_helm_lint_passes_with_only_the_icon_info(helm: str) -> None:
    result = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    notes = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert notes == ["[INFO] Chart.yaml: icon is recommended"], result.stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


async def test_helm_lint_passes_with_driver_values(helm: str, tmp_path: Path) -> None:
    _, values, _ = await driver_render(helm, *CASES["gpu-autoscaled-canary"])
    path = tmp_path / "values.json"
    path.write_text(json.dumps(values))
    result = subprocess.run([helm, "lint", "--strict", str(CHART), "--values", str(path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


# --- render: exactly the driver's manifests --------------------------------------------------


@pytest.mark.parametrize("case", sorted(CASES))
async def test_driver_manifests_render_and_validate_strictly(helm: str, validate: Any, case: str) -> None:
    run, track = CASES[case]
    docs, values, args = await driver_render(helm, run, track)
    assert args[3] == DEFAULT_CHART == str(CHART)
    assert values == render_values(install_request(run, track), run.spec, BACKEND, IMAGE), \
        "the driver passes exactly render_values(...)"
    for doc in docs:
        try:
            validate(doc, K8S_VERSION, strict=True)
        except Exception as exc:  # the library's messages embed whole schemas: keep the first line
            pytest.fail(f"{case}: {doc['kind']} fails strict validation for Kubernetes {K8S_VERSION}: "
                        f"{str(exc).splitlines()[0]}")
        check_labels(doc["metadata"]["labels"])
        assert doc["metadata"]["namespace"] == "agents"

    objects = by_kind(docs)
    release = "review-responder" + ("-canary" if track == "canary" else "")
    autoscaled = run.spec.autoscaling is not None
    assert set(objects) == {"ConfigMap", "Service", "Deployment"} | ({"HorizontalPodAutoscaler"} if autoscaled else set())
    assert {doc["metadata"]["name"] for doc in docs} == {release}

    deployment = objects["Deployment"]
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector == {"app.kubernetes.io/name": "workflow-runner", "app.kubernetes.io/instance": release,
                        "plnt.work/workflow": "review-responder", "plnt.work/track": track}
    assert objects["Service"]["spec"]["selector"] == selector
    assert selector.items() <= pod["metadata"]["labels"].items()
    for doc in docs:
        labels = doc["metadata"]["labels"]
        assert labels["plnt.work/track"] == track and labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/version"] == "1.2.0" and labels["plnt.work/workflow-namespace"] == "team-a"

    assert container["image"] == "ghcr.io/acme/plnt:0.1.0"
    assert container["command"] == ["python", "-m", "plnt.runner"]
    release_id = install_request(run, track).release_id
    assert container["args"] == ["--recipe", "/recipe", "--host", "0.0.0.0", "--port", "8080", "--release-id", release_id]
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert objects["Service"]["spec"]["ports"] == [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}]
    config = objects["ConfigMap"]["data"]
    assert config["PLNT_RECIPE_REF"] == "review-responder@1.2.0" and config["PLNT_RECIPE_REGISTRY"] == "s3://microagents"
    assert config["PLNT_RECIPE_DIGEST"] == "sha256:" + "9a" * 32 and config["PLNT_RELEASE_ID"] == release_id

    # GPU: limits and the class label as a node selector; backend and spec selectors merged.
    placement = run.spec.backend
    limits = container["resources"].get("limits", {})
    node_selector = pod["spec"].get("nodeSelector", {})
    if placement.gpu_count:
        assert limits["nvidia.com/gpu"] == placement.gpu_count
        assert node_selector[placement.gpu_class] == "true"
    else:
        assert "nvidia.com/gpu" not in limits and not any("nvidia" in key for key in node_selector)
    assert node_selector.items() >= {**BACKEND.spec.node_selector, **placement.node_selector}.items()
    tolerations = pod["spec"]["tolerations"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    for toleration in placement.tolerations:
        assert toleration.model_dump(mode="json", exclude_none=True) in tolerations

    # Replicas: the HPA owns them when autoscaling is set, else the Deployment runs `min`.
    if autoscaled:
        assert "replicas" not in deployment["spec"]
        hpa = objects["HorizontalPodAutoscaler"]
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": release}
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (run.spec.replicas.min, run.spec.replicas.max)
        [metric] = hpa["spec"]["metrics"]
        target = run.spec.autoscaling.target_invocations_per_second
        assert metric == {"type": "Pods", "pods": {"metric": {"name": "plnt_invocations_per_second"},
                                                   "target": {"type": "AverageValue", "averageValue": f"{target:g}"}}}
    else:
        assert deployment["spec"]["replicas"] == run.spec.replicas.min


async def test_canary_and_stable_coexist_with_distinct_names_and_selectors(helm: str) -> None:
    run = CASES["gpu-autoscaled-canary"][0]
    stable, _, _ = await driver_render(helm, run, "stable")
    canary, _, _ = await driver_render(helm, run, "canary")
    stable_names = {(doc["kind"], doc["metadata"]["name"]) for doc in stable}
    canary_names = {(doc["kind"], doc["metadata"]["name"]) for doc in canary}
    assert not stable_names & canary_names, "one namespace holds both releases"

    def pods_and_selectors(docs: list[dict[str, Any]]) -> tuple[dict[str, str], list[dict[str, str]]]:
        objects = by_kind(docs)
        pod_labels = objects["Deployment"]["spec"]["template"]["metadata"]["labels"]
        return pod_labels, [objects["Deployment"]["spec"]["selector"]["matchLabels"], objects["Service"]["spec"]["selector"]]

    stable_pods, stable_selectors = pods_and_selectors(stable)
    canary_pods, canary_selectors = pods_and_selectors(canary)
    for selector in stable_selectors:
        assert selector.items() <= stable_pods.items() and not selector.items() <= canary_pods.items()
    for selector in canary_selectors:
        assert selector.items() <= canary_pods.items() and not selector.items() <= stable_pods.items()
    assert stable_pods["plnt.work/track"] == "stable" and canary_pods["plnt.work/track"] == "canary"


async def test_optional_ingress_renders_and_validates(helm: str, validate: Any) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    values["ingress"] = {"enabled": True, "className": "nginx", "host": "rr.example.com", "tlsSecretName": "rr-tls"}
    objects = by_kind(render(helm, "review-responder", str(CHART), "agents", values))
    ingress = objects["Ingress"]
    validate(ingress, K8S_VERSION, strict=True)
    assert ingress["spec"]["rules"][0]["host"] == "rr.example.com"
    assert ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {
        "name": "review-responder", "port": {"name": "http"}}
    assert "Ingress" not in by_kind(render(helm, "review-responder", str(CHART), "agents",
                                           render_values(install_request(run, track), run.spec, BACKEND, IMAGE)))


async def test_prerelease_build_version_makes_a_valid_label(helm: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    values["workflow"]["version"] = "1.3.0-rc.1+build.5"
    for doc in render(helm, "review-responder", str(CHART), "agents", values):
        assert doc["metadata"]["labels"]["app.kubernetes.io/version"] == "1.3.0-rc.1_build.5"
        check_labels(doc["metadata"]["labels"])


# --- the schema and template guards, and how the driver classifies them -----------------------


@pytest.mark.parametrize(("change", "expected"), [
    (lambda v: v.update(replicaCount=3), "additional properties 'replicaCount' not allowed"),
    (lambda v: v["gpu"].update(cuont=1), "additional properties 'cuont' not allowed"),
    (lambda v: v["gpu"].update(count="2"), "got string, want integer"),
    (lambda v: v["replicas"].update(min=0), "minimum"),
    (lambda v: v.update(track="blue"), "track"),
    (lambda v: v["autoscaling"].update(targetInvocationsPerSecond="fast"), "got string, want number"),
    (lambda v: v["workflow"].update(digest="md5:abc"), "digest"),
    (lambda v: v["gpu"].update({"class": "NVIDIA H100"}), "class"),
])
def test_schema_rejects_unknown_keys_and_wrong_types(helm: str, change: Any, expected: str) -> None:
    run, track = CASES["gpu-autoscaled-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    change(values)
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr and expected in result.stderr, result.stderr
    # The driver turns helm's real error into a dead end for a human, naming the key.
    error = classify("upgrade", "review-responder", result.stderr)
    assert isinstance(error, HelmChartError) and not error.retryable and expected in str(error)


def test_template_guards_fail_as_chart_errors(helm: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    values["replicas"] = {"min": 3, "max": 2}
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0 and "replicas.max (2) must be >= replicas.min (3)" in result.stderr
    assert isinstance(classify("upgrade", "review-responder", result.stderr), HelmChartError)
    values["replicas"] = {"min": 1, "max": 1}
    result = helm_template(helm, "9-lives", str(CHART), "agents", values)
    assert result.returncode != 0 and "DNS-1035" in result.stderr
    assert isinstance(classify("upgrade", "9-lives", result.stderr), HelmChartError)


def test_a_broken_template_is_a_chart_error(helm: str, tmp_path: Path) -> None:
    # helm 4 prints template failures as `Error: FILE:LINE:COL` + `executing "FILE" at <...>` lines.
    import shutil

    chart = tmp_path / "workflow-runner"
    shutil.copytree(CHART, chart)
    (chart / "templates" / "broken.yaml").write_text("{{ .Values.nope.x }}\n")
    run, track = CASES["cpu-fixed-stable"]
    result = helm_template(helm, "review-responder", str(chart), "agents",
                           render_values(install_request(run, track), run.spec, BACKEND, IMAGE))
    assert result.returncode != 0 and "nil pointer evaluating" in result.stderr, result.stderr
    error = classify("upgrade", "review-responder", result.stderr)
    assert isinstance(error, HelmChartError) and "broken.yaml" in str(error) and "nil pointer" in str(error)
