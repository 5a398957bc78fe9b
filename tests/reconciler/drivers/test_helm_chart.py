"""charts/workflow-runner with the REAL helm binary (`helm lint`, `helm template`): no cluster.

The manifests checked here are exactly the ones the Helm driver would apply: the driver runs its
`install` against `RecordingHelm`, a stand-in for helm's cluster side that records the
`helm upgrade --install` command line and the values file it wrote, and the test renders that chart with those values, release name and namespace
through `helm template`. Every rendered object passes kubernetes-validate's strict schemas
(Kubernetes 1.33). Nothing is applied to a cluster: there is none on these machines.
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.models import PlntBackend, RecipeTrustPolicy, WorkflowRun
from plnt.reconciler.drivers.helm import (
    DEFAULT_CHART,
    HelmChartError,
    HelmDriver,
    RunnerImage,
    classify,
    render_values,
)
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.recipes.registries import RegistryOptions

from tests.charts.chartkit import restricted_problems

pytestmark = pytest.mark.integration  # every test runs the real helm binary

ROOT = Path(__file__).resolve().parents[3]
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


def trust_policy(name: str, root: dict[str, Any]) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": name},
        "spec": {"recipes": ["review-*"], "trustRoot": root,
                 "signers": [{"issuer": "https://token.actions.githubusercontent.com",
                              "identityRegex": r"^https://github\.com/acme/recipes/.*$"}]},
    })


ROOT_JSON = json.dumps({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1", "tlogs": []})
WITH_ROOT = RecipeTrust(policies=(trust_policy("acme-signers", {"trustedRootFile": "trust/acme-root.json"}),),
                        trusted_roots={"trust/acme-root.json": ROOT_JSON})
PUBLIC_GOOD = RecipeTrust(policies=(trust_policy("public-signers", {"publicGood": True}),))


def install_request(run: WorkflowRun, track: str, trust: RecipeTrust = WITH_ROOT) -> InstallRequest:
    return InstallRequest(namespace=run.metadata.namespace, name=run.metadata.name, track=track, version="1.2.0",
                          spec_fingerprint=run.fingerprint(), recipe_digest="sha256:" + "9a" * 32,
                          recipe_dir="/var/lib/plnt/recipes/9a9a", traffic_percent=5 if track == "canary" else 0,
                          trust=trust)


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
    "in-flight-autoscaled-stable": (workflow_run(
        replicas={"min": 1, "max": 3}, autoscaling={"targetInFlight": 4, "scaleDownAfterSeconds": 30}), "stable"),
    "both-targets-stable": (workflow_run(
        replicas={"min": 1, "max": 5}, autoscaling={"targetInFlight": 2.5, "targetInvocationsPerSecond": 10}), "stable"),
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


async def driver_render(helm: str, run: WorkflowRun, track: str, on: PlntBackend = BACKEND
                        ) -> tuple[list[dict[str, Any]], dict[str, Any], list[str]]:
    """What the driver would apply: its own upgrade command's chart, release, namespace and values."""
    recorder = RecordingHelm()
    driver = HelmDriver(on, lambda ns, name, fp: run.spec if fp == run.fingerprint() else None,
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
    """Objects by kind; the trust policies' ConfigMap (`<release>-recipe-trust`) as "RecipeTrustConfigMap"."""
    objects: dict[str, dict[str, Any]] = {}
    for doc in docs:
        trust = doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-recipe-trust")
        key = "RecipeTrustConfigMap" if trust else doc["kind"]
        assert key not in objects, [d["kind"] for d in docs]
        objects[key] = doc
    return objects


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
    assert set(objects) == {"ConfigMap", "RecipeTrustConfigMap", "Service", "Deployment"} | (
        {"HorizontalPodAutoscaler"} if autoscaled else set())
    assert {doc["metadata"]["name"] for doc in docs} == {release, f"{release}-recipe-trust"}

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
    assert container["args"] == ["--recipe", "/var/lib/plnt/recipe", "--host", "0.0.0.0", "--port", "8080",
                                 "--release-id", release_id, "--drain-on-stop-s", "5"]
    assert {"name": "recipe", "mountPath": "/var/lib/plnt", "readOnly": True} in container["volumeMounts"]
    [init] = pod["spec"]["initContainers"]
    assert init["image"] == container["image"] and init["command"] == ["plnt"]
    assert init["args"] == ["recipe", "fetch", "--registry", "s3://microagents", "--ref", "review-responder@1.2.0",
                            "--digest", "sha256:" + "9a" * 32, "--policy", "/etc/plnt/trust/policies.yaml",
                            "--trust-root", "/etc/plnt/trust/trust/acme-root.json", "--into", "/var/lib/plnt/recipe",
                            "--max-download-mb", "256"]
    assert "nvidia.com/gpu" not in init["resources"].get("limits", {}), "the fetch holds no GPU"
    trust = objects["RecipeTrustConfigMap"]["data"]
    assert set(trust) == {"policies.yaml", "trusted-root-0.json"} and trust["trusted-root-0.json"] == ROOT_JSON
    assert [doc["metadata"]["name"] for doc in yaml.safe_load_all(trust["policies.yaml"])] == ["acme-signers"]
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
        scaling = run.spec.autoscaling
        wanted = [(name, target) for name, target in (("plnt_runner_in_flight_requests", scaling.target_in_flight),
                                                      ("plnt_invocations_per_second", scaling.target_invocations_per_second))
                  if target is not None]
        assert hpa["spec"]["metrics"] == [
            {"type": "Pods", "pods": {"metric": {"name": name}, "target": {"type": "AverageValue", "averageValue": f"{target:g}"}}}
            for name, target in wanted]
        window = int(scaling.scale_down_after_seconds)  # one pod fewer per window, as the local autoscaler
        assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": window, "policies": [
            {"type": "Pods", "value": 1, "periodSeconds": window}]}}
    else:
        assert deployment["spec"]["replicas"] == run.spec.replicas.min


KEDA_BACKEND = backend(kubernetes={"context": "prod", "namespace": "agents",
                                   "autoscaler": {"kind": "keda", "prometheusAddress": "http://prometheus.monitoring:9090"}})
# A Deployment's pods are <release>-<pod-template-hash>-<suffix>.
STABLE_POD, CANARY_POD = "review-responder-6d9f8b7c5-x2k7q", "review-responder-canary-58c9d4f6b-p4z8m"


@pytest.mark.parametrize("case", ["gpu-autoscaled-canary", "in-flight-autoscaled-stable", "both-targets-stable"])
async def test_a_keda_backend_gets_a_scaled_object_on_the_release_pods_series_instead_of_the_hpa(
        helm: str, case: str) -> None:
    run, track = CASES[case]
    docs, values, _ = await driver_render(helm, run, track, KEDA_BACKEND)
    release = "review-responder" + ("-canary" if track == "canary" else "")
    objects = by_kind(docs)
    assert "HorizontalPodAutoscaler" not in objects  # KEDA makes and drives the HPA itself
    assert "replicas" not in objects["Deployment"]["spec"]  # so helm upgrades never fight its count
    scaled = objects["ScaledObject"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1" and scaled["metadata"]["name"] == release
    check_labels(scaled["metadata"]["labels"])
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": release}
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (run.spec.replicas.min, run.spec.replicas.max)
    scaling = run.spec.autoscaling
    window = int(scaling.scale_down_after_seconds)
    assert spec["advanced"]["horizontalPodAutoscalerConfig"] == {"name": release, "behavior": {"scaleDown": {
        "stabilizationWindowSeconds": window, "policies": [{"type": "Pods", "value": 1, "periodSeconds": window}]}}}
    pods = f'namespace="agents",pod=~"{release}-[a-z0-9]+-[a-z0-9]+"'
    wanted = [(name, query, target) for name, query, target in (
        ("in-flight", f"sum(plnt_runner_in_flight_requests{{{pods}}})", scaling.target_in_flight),
        ("invocations-per-second", f"sum(rate(plnt_runner_invocations_total{{{pods}}}[1m]))",
         scaling.target_invocations_per_second)) if target is not None]
    assert spec["triggers"] == [
        {"type": "prometheus", "name": name, "metricType": "AverageValue",
         "metadata": {"serverAddress": "http://prometheus.monitoring:9090", "query": query, "threshold": f"{target:g}"}}
        for name, query, target in wanted]
    assert values["autoscaling"]["autoscaler"] == "keda"
    # The pod matcher (PromQL regexes are anchored) takes this release's pods only, never the other track's.
    matcher = re.search(r'pod=~"([^"]+)"', spec["triggers"][0]["metadata"]["query"]).group(1)  # type: ignore[union-attr]
    mine, other = (CANARY_POD, STABLE_POD) if track == "canary" else (STABLE_POD, CANARY_POD)
    assert re.fullmatch(matcher, mine) and not re.fullmatch(matcher, other)


async def test_the_default_autoscaler_renders_the_hpa_with_the_values_unchanged(helm: str) -> None:
    run, track = CASES["in-flight-autoscaled-stable"]
    docs, values, _ = await driver_render(helm, run, track)
    assert {"HorizontalPodAutoscaler"} <= set(by_kind(docs)) and "ScaledObject" not in by_kind(docs)
    assert values["autoscaling"] == {"targetInFlight": 4, "scaleDownAfterSeconds": 30}  # as before KEDA was an option


def test_the_keda_autoscaler_without_a_prometheus_fails_the_render_naming_it(helm: str) -> None:
    run, track = CASES["in-flight-autoscaled-stable"]
    values = render_values(install_request(run, track), run.spec, KEDA_BACKEND, IMAGE)
    del values["autoscaling"]["prometheusAddress"]
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0 and "prometheusAddress" in result.stderr, result.stderr


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


# --- the matrix: every combination the driver can produce -----------------------------------

# Every combination of six dimensions; the registry kind alternates by parity, so each (secret,
# root) pair is rendered with both s3 and oci (64 renders rather than 128).
MATRIX = [(*dims, ("s3", "oci")[sum(dims[i] == pair[1] for i, pair in enumerate(DIMS)) % 2])
          for DIMS in [(("stable", "canary"), ("gpu", "cpu"), ("autoscaled", "fixed"), ("ingress", "no-ingress"),
                        ("secret", "no-secret"), ("root", "public-good"))]
          for dims in itertools.product(*DIMS)]


def matrix_values(track: str, gpu: str, scaling: str, ingress: str, secret: str, root: str,
                  registry: str) -> tuple[str, dict[str, Any]]:
    spec: dict[str, Any] = {"replicas": {"min": 1, "max": 4}}
    spec["workflow"] = {"ref": "review-responder@1.2.0",
                        "registry": "s3://microagents/prod" if registry == "s3" else "oci://registry.example.com/recipes"}
    if gpu == "gpu":
        spec["backend"] = {"cluster": "gpu-cluster-01", "gpuClass": "nvidia.com/h100", "gpuCount": 2}
    if scaling == "autoscaled":
        spec["autoscaling"] = {"targetInvocationsPerSecond": 25}
    run = workflow_run(**spec)
    values = render_values(
        install_request(run, track, WITH_ROOT if root == "root" else PUBLIC_GOOD), run.spec, BACKEND, IMAGE,
        resources={"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
        registry_options=RegistryOptions(s3_endpoint_url="https://s3.eu-west-1.amazonaws.com", s3_region="eu-west-1",
                                         allow_insecure_http=("registry.internal:5000",)),
        credentials_secret="recipe-registry" if secret == "secret" else "")
    if ingress == "ingress":
        values["ingress"] = {"enabled": True, "className": "nginx", "host": "rr.example.com", "tlsSecretName": "rr-tls"}
    return "review-responder" + ("-canary" if track == "canary" else ""), values


async def test_the_matrix_renders_lints_and_validates_strictly_and_every_pod_is_restricted(
    helm: str, validate: Any, tmp_path: Path,
) -> None:
    assert len(MATRIX) == 64 and {c[-1] for c in MATRIX if c[4:6] == ("secret", "root")} == {"s3", "oci"}

    def render_one(combination: tuple[str, ...]) -> list[dict[str, Any]]:
        release, values = matrix_values(*combination)
        return render(helm, release, str(CHART), "agents", values)

    with ThreadPoolExecutor(max_workers=2) as pool:  # helm runs as processes: render in parallel
        rendered = list(pool.map(render_one, MATRIX))
    validated: set[str] = set()
    for combination, docs in zip(MATRIX, rendered, strict=True):
        track, gpu, scaling, ingress, secret, root, registry = combination
        for doc in docs:
            text = json.dumps(doc, sort_keys=True)
            if text in validated:  # the same object from another combination (e.g. a Service)
                continue
            validated.add(text)
            try:
                validate(doc, K8S_VERSION, strict=True)
            except Exception as exc:
                pytest.fail(f"{combination}: {doc['kind']} fails strict validation: {str(exc).splitlines()[0]}")
            check_labels(doc["metadata"]["labels"])
        objects = by_kind(docs)
        assert ("Ingress" in objects) == (ingress == "ingress") and (
            "HorizontalPodAutoscaler" in objects) == (scaling == "autoscaled"), combination
        pod = objects["Deployment"]["spec"]["template"]["spec"]
        assert len([*pod.get("initContainers", []), *pod["containers"]]) >= 2, "an init container and the runner"
        assert restricted_problems({"spec": pod}) == [], combination
        [init] = pod["initContainers"]
        args = init["args"]
        assert ("--trust-root" in args) == (root == "root"), combination
        assert args[args.index("--s3-endpoint-url") + 1] == "https://s3.eu-west-1.amazonaws.com"
        assert args[args.index("--oci-insecure-host") + 1] == "registry.internal:5000"
        env = {item["name"]: item for item in init["env"]}
        mounts = {mount["name"] for mount in init["volumeMounts"]}
        aws = {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
        assert (aws <= set(env)) == (secret == "secret" and registry == "s3"), combination
        assert ("registry-credentials" in mounts) == (secret == "secret" and registry == "oci"), combination
        for name in aws & set(env):
            assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "recipe-registry" and "value" not in env[name]
        trust = objects["RecipeTrustConfigMap"]["data"]
        text = json.dumps(objects["RecipeTrustConfigMap"]) + json.dumps(objects["ConfigMap"])
        assert "recipe-registry" not in text, "ConfigMaps name no credentials"
        assert ("trusted-root-0.json" in trust) == (root == "root")
        assert "nvidia.com/gpu" not in json.dumps(init["resources"])
        limits = pod["containers"][0]["resources"]["limits"]
        assert ("nvidia.com/gpu" in limits) == (gpu == "gpu")
    # helm lint --strict on a spread of the matrix (each run ~0.1 s): every value of every dimension
    for index, combination in enumerate(MATRIX):
        if index % 7:
            continue
        _, values = matrix_values(*combination)
        path = tmp_path / "values.json"
        path.write_text(json.dumps(values))
        result = subprocess.run([helm, "lint", "--strict", str(CHART), "--values", str(path)],
                                capture_output=True, text=True, check=False)
        assert result.returncode == 0 and "0 chart(s) failed" in result.stdout, (combination, result.stdout + result.stderr)
        assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout


async def test_several_trusted_roots_are_mounted_beside_the_policies_without_trust_root(helm: str) -> None:
    """Two policies with different trusted roots: each root at its own path relative to the policies
    file, where `plnt recipe fetch` looks for it (one --trust-root cannot name both)."""
    run, track = CASES["cpu-fixed-stable"]
    trust = RecipeTrust(
        policies=(trust_policy("acme", {"trustedRootFile": "trust/acme-root.json"}),
                  trust_policy("partner", {"trustedRootFile": "partners/root.json"})),
        trusted_roots={"trust/acme-root.json": ROOT_JSON, "partners/root.json": ROOT_JSON.replace("[]", "[1]")})
    objects = by_kind(render(helm, "review-responder", str(CHART), "agents",
                             render_values(install_request(run, track, trust), run.spec, BACKEND, IMAGE)))
    pod = objects["Deployment"]["spec"]["template"]["spec"]
    assert "--trust-root" not in pod["initContainers"][0]["args"]
    [volume] = [v for v in pod["volumes"] if v["name"] == "recipe-trust"]
    assert volume["configMap"]["items"] == [
        {"key": "policies.yaml", "path": "policies.yaml"},
        {"key": "trusted-root-0.json", "path": "partners/root.json"},
        {"key": "trusted-root-1.json", "path": "trust/acme-root.json"},
    ]
    data = objects["RecipeTrustConfigMap"]["data"]
    assert data["trusted-root-0.json"] == trust.trusted_roots["partners/root.json"]


@pytest.mark.parametrize(("change", "expected"), [
    (lambda v: v["recipeFetch"].update(credentials={"key": "x"}), "additional properties 'credentials' not allowed"),
    (lambda v: v["recipeFetch"].update(credentialsSecret="Not_A_Name"), "credentialsSecret"),
    (lambda v: v["recipeFetch"].update(policies=""), "policies"),
    (lambda v: v["recipeFetch"].update(maxDownloadMB=0), "maxDownloadMB"),
    (lambda v: v["recipeFetch"]["s3"].update(endpoint="x"), "additional properties 'endpoint' not allowed"),
    (lambda v: v["workflow"].update(registry="file:registry"), "registry"),
])
def test_schema_rejects_bad_recipe_fetch_values(helm: str, change: Any, expected: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    change(values)
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert expected in result.stderr, result.stderr


def test_a_trusted_root_path_leaving_the_mount_fails_the_render(helm: str) -> None:
    run, track = CASES["cpu-fixed-stable"]
    values = render_values(install_request(run, track), run.spec, BACKEND, IMAGE)
    values["recipeFetch"]["trustedRoots"] = {"trust/../../etc/passwd": ROOT_JSON}
    result = helm_template(helm, "review-responder", str(CHART), "agents", values)
    assert result.returncode != 0 and "without . or .. segments" in result.stderr, result.stderr
    assert isinstance(classify("upgrade", "review-responder", result.stderr), HelmChartError)
