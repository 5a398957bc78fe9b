"""Rendering both charts with the REAL helm binary (`helm template`, `helm lint`): no cluster.

Shared by the tests in this directory. The value matrices live here so the manifest, pod-security
and RBAC tests walk the same cases.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PLNT_CHART = ROOT / "charts" / "plnt"
RUNNER_CHART = ROOT / "charts" / "workflow-runner"
MODEL_SERVER_CHART = ROOT / "charts" / "model-server"
K8S_VERSION = "1.33"
RELEASE, NAMESPACE = "prod", "plnt-system"
FULLNAME = "prod-plnt"
HELM_CANDIDATES = [Path(sys.executable).parent / "helm", ROOT / ".venv" / "bin" / "helm"]
POD_TEMPLATE_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}

try:
    import kubernetes_validate
except ImportError:  # pragma: no cover - a missing test dependency, said plainly
    kubernetes_validate = None


def find_helm() -> str:
    for candidate in HELM_CANDIDATES:
        if candidate.is_file():
            return str(candidate)
    pytest.fail(f"the real helm binary is missing (looked at {', '.join(map(str, HELM_CANDIDATES))}): "
                "run tools/install_helm.sh (it installs helm into .venv/bin)")


def helm_template(helm: str, chart: Path, values: dict[str, Any], *, release: str = RELEASE,
                  namespace: str = NAMESPACE, extra: Sequence[str] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, "template", release, str(chart), "--namespace", namespace, "--values", "-", *extra],
                          input=json.dumps(values), capture_output=True, text=True, check=False)


def render(helm: str, chart: Path, values: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    import yaml

    result = helm_template(helm, chart, values, **kwargs)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def validate_strictly(doc: dict[str, Any], case: str) -> None:
    if kubernetes_validate is None:
        pytest.fail("kubernetes-validate is missing: .venv/bin/pip install kubernetes-validate")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except Exception as exc:  # the library's messages embed whole schemas: keep the first line
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        pytest.fail(f"{case}: {doc['kind']} {doc['metadata'].get('name')} fails strict validation for Kubernetes "
                    f"{K8S_VERSION}: {first}")


LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                       r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def check_labels(labels: dict[str, str]) -> None:
    # kubernetes-validate checks types, not label syntax: the API server would.
    for key, value in labels.items():
        assert LABEL_KEY.match(key) and isinstance(value, str) and len(value) <= 63 and LABEL_VALUE.match(value), (key, value)


def pod_templates(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for doc in docs:
        if doc["kind"] in POD_TEMPLATE_KINDS:
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc["spec"]["template"]


# --- the plnt chart's values matrix ----------------------------------------------------------

BASE: dict[str, Any] = {
    "git": {"repo": "https://git.example.com/platform/specs.git"},
    "temporal": {"address": "temporal-frontend.temporal:7233"},
    "auth": {"tokens": {"secretName": "plnt-tokens"}},
}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    def merge(into: dict[str, Any], layer: dict[str, Any]) -> None:
        for key, value in layer.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = copy.deepcopy(value)

    out: dict[str, Any] = {}
    for layer in layers:
        merge(out, layer)
    return out


TLS_AND_API_KEY = {"temporal": {"address": "plnt.a1b2c.tmprl.cloud:7233", "namespace": "plnt.a1b2c",
                                "tls": {"secretName": "temporal-mtls"}, "apiKey": {"secretName": "temporal-api-key"}}}
ALL_SECRETS = {
    "git": {"credentials": {"secretName": "git-deploy-token"}, "webhookSecret": {"secretName": "git-webhook"},
            "verifyCommits": {"mode": "all", "allowedSigners": {"secretName": "plnt-signers"},
                              "gpgKeys": {"secretName": "plnt-gpg-keys"}},
            "writeNotes": True},
    "forge": {"kind": "github", "apiUrl": "https://api.github.com", "project": "platform/specs",
              "token": {"secretName": "plnt-forge-token"}, "requireApproval": True, "reportStatus": False,
              "previews": ["refs/pull/*/head"]},
    "auth": {"internalToken": {"secretName": "plnt-internal"}, "tokens": {"secretName": "plnt-gateway-tokens"}},
}

# source.kind kubernetes: WorkflowRuns and ModelDeployments from the cluster's custom resources; no git.
FROM_CLUSTER: dict[str, Any] = merged({k: v for k, v in BASE.items() if k != "git"}, {
    "source": {"kind": "kubernetes", "platformConfigMap": "plnt-platform"}})
SOURCE_NAMESPACES = ["team-a", "team-b"]

PLNT_CASES: dict[str, dict[str, Any]] = {
    # The chart's defaults plus the two required values: autoscaling, PDB, NetworkPolicies on.
    "defaults": merged(BASE),
    # Everything optional switched off.
    "all-off": merged(BASE, {
        "gateway": {"autoscaling": {"enabled": False}, "podDisruptionBudget": {"enabled": False},
                    "topologySpread": {"enabled": False}},
        "networkPolicy": {"enabled": False},
        "runners": {"autoscaling": {"enabled": False}},  # the workers get no HPA rights
    }),
    # Everything optional switched on, every credential from a named Secret.
    "all-on": merged(BASE, TLS_AND_API_KEY, ALL_SECRETS, {
        "deployNamespaces": ["agents-a", "agents-b", "agents-gpu"],
        "mirrorStatus": {"enabled": True, "namespaces": ["team-a", "team-b"]},
        "reconciler": {"replicas": 2, "persistence": {"enabled": True, "accessModes": ["ReadWriteMany"], "storageClassName": "efs"}},
        "ingress": {"enabled": True, "className": "nginx", "host": "plnt.example.com", "tlsSecretName": "plnt-tls",
                    "annotations": {"nginx.ingress.kubernetes.io/proxy-read-timeout": "300"}, "hooks": {"enabled": True}},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"},
                           "tokenSecret": {"secretName": "plnt-metrics-token"}},
        "runners": {"egress": [{"to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}], "ports": [{"port": 443, "protocol": "TCP"}]}]},
        "modelServers": {"installTimeoutSeconds": 3600, "gpuResource": "amd.com/gpu",
                         "egress": [{"to": [{"ipBlock": {"cidr": "10.30.0.0/16"}}], "ports": [{"port": 4317, "protocol": "TCP"}]}]},
        "networkPolicy": {"temporal": {"to": [{"ipBlock": {"cidr": "203.0.113.0/24"}}]},
                          "gatewayFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]},
        "imagePullSecrets": [{"name": "regcred"}],
        "worker": {"extraArgs": ["--verbose"]},
        "rbac": {"worker": {"listForWait": True}},  # list on the releases' kinds, whatever the cluster
        "image": {"repository": "ghcr.io/acme/plnt", "tag": "0.1.0"},
    }),
    # Mixed: plain Temporal, a ReadWriteOnce PVC (one replica), ingress without hooks, monitor off.
    "pvc-single-ingress-no-hooks": merged(BASE, {
        "reconciler": {"persistence": {"enabled": True}},
        "ingress": {"enabled": True, "host": "plnt.example.com"},
        "gateway": {"autoscaling": {"enabled": False}, "replicas": 3},
    }),
    # TLS without a CA (system CAs), an existing claim, mirror into the deploy namespace itself.
    "tls-no-ca-existing-claim-mirror": merged(BASE, {
        "temporal": {"tls": {"secretName": "temporal-mtls", "caKey": ""}},
        "reconciler": {"persistence": {"enabled": True, "existingClaim": "plnt-state"}},
        "deployNamespaces": ["plnt-runners"],
        "mirrorStatus": {"enabled": True, "namespaces": ["plnt-runners"]},
        "serviceMonitor": {"enabled": True},
        "networkPolicy": {"enabled": False},
    }),
    # Runners deployed into plnt's own namespace (allowed; the Roles have distinct names).
    "deploy-into-own-namespace": merged(BASE, {"deployNamespaces": [NAMESPACE, "agents"],
                                               "mirrorStatus": {"enabled": True, "namespaces": [NAMESPACE]}}),
    # WorkflowRuns from two namespaces of the cluster (one of them a deploy namespace too), the platform
    # ConfigMap's keys placed in subdirectories as the trust policies name them.
    "kubernetes-source": merged(FROM_CLUSTER, {
        "source": {"namespaces": SOURCE_NAMESPACES,
                   "platformItems": [{"key": "local.yaml", "path": "backends/local.yaml"},
                                     {"key": "policy.yaml", "path": "trust/policy.yaml"},
                                     {"key": "demo-trusted-root.json", "path": "trust/demo-trusted-root.json"}]},
        "deployNamespaces": ["plnt-runners", "team-a"],
    }),
}
# source.kind kubernetes over every namespace: the only case with cluster-scoped objects (ClusterRoles).
FROM_EVERY_NAMESPACE: dict[str, Any] = merged(FROM_CLUSTER)


# --- the workflow-runner chart's values matrix: every kind it can render ---------------------

RUNNER_CASES: dict[str, tuple[str, list[str]]] = {
    "defaults": ("review-responder", []),
    "autoscaled-gpu-canary": ("review-responder-canary", [
        "--set", "track=canary", "--set", "autoscaling.targetInvocationsPerSecond=5",
        "--set", "replicas.max=4", "--set", "gpu.count=1", "--set", "gpu.class=nvidia.com/h100"]),
    "ingress": ("review-responder", ["--set", "ingress.enabled=true", "--set", "ingress.host=rr.example.com",
                                     "--set", "ingress.tlsSecretName=rr-tls"]),
    # canary.headerRoute, as plnt's helm driver writes it (the gateway reads it back; nothing renders)
    "canary-cohort": ("review-responder-canary", ["--set", "track=canary", "--set", "workflow.canaryHeader.name=x-cohort",
                                                  "--set", "workflow.canaryHeader.value=testers"]),
    # a PlntBackend with kubernetes.autoscaler kind keda: a KEDA ScaledObject in place of the HPA
    "keda": ("review-responder", ["--set", "autoscaling.targetInFlight=2", "--set", "replicas.max=4",
                                  "--set", "autoscaling.autoscaler=keda",
                                  "--set", "autoscaling.prometheusAddress=http://prometheus.monitoring:9090"]),
}


def render_runner(helm: str, case: str) -> list[dict[str, Any]]:
    release, extra = RUNNER_CASES[case]
    return render(helm, RUNNER_CHART, {}, release=release, namespace="agents", extra=extra)


# --- the model-server chart's values: the bare chart (llama.cpp on CPU) and a GPU canary with a claim
# and registry credentials (tests/charts/test_model_server_chart.py walks every runtime) ---------------

MODEL_SERVER_CASES: dict[str, tuple[str, list[str]]] = {
    "defaults": ("chat", []),
    "vllm-gpu-canary-claim": ("chat-canary", [
        "--set", "track=canary", "--set", "runtime.type=vllm", "--set", "gpu.class=nvidia.com/gpu",
        "--set", "gpu.count=2", "--set", "weights.persistentVolumeClaim=model-weights",
        "--set", "weights.credentialsSecret=model-registry"]),
    "canary-cohort": ("chat-canary", ["--set", "track=canary", "--set", "deployment.canaryHeader.name=x-cohort",
                                      "--set", "deployment.canaryHeader.value=testers"]),
}


def render_model_server(helm: str, case: str) -> list[dict[str, Any]]:
    release, extra = MODEL_SERVER_CASES[case]
    return render(helm, MODEL_SERVER_CHART, {}, release=release, namespace="agents", extra=extra)


# --- the `restricted` Pod Security Standard, field by field (tests/charts/test_pod_security.py) ---

# The volume types `restricted` allows.
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def restricted_problems(template: dict[str, Any]) -> list[str]:
    pod = template["spec"]
    pod_sc = pod.get("securityContext", {})
    problems: list[str] = []
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"{field} is set")
    for volume in pod.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volume {volume['name']} is {kinds}")
    if pod_sc.get("runAsUser") == 0:
        problems.append("pod runAsUser is 0")
    containers = [("container", c) for c in pod["containers"]] + [("initContainer", c) for c in pod.get("initContainers", [])]
    assert pod["containers"], "a pod template without containers"
    for what, c in containers:
        sc = c.get("securityContext", {})
        where = f"{what} {c['name']}"

        def effective(field: str, sc: dict[str, Any] = sc) -> Any:
            return sc.get(field, pod_sc.get(field))

        if effective("runAsNonRoot") is not True:
            problems.append(f"{where}: runAsNonRoot is not true")
        user = effective("runAsUser")
        if not isinstance(user, int) or user == 0:
            problems.append(f"{where}: runAsUser {user!r} is not a numeric non-root uid")
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}: allowPrivilegeEscalation is not false")
        if sc.get("privileged"):
            problems.append(f"{where}: privileged")
        capabilities = sc.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            problems.append(f"{where}: capabilities do not drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            problems.append(f"{where}: adds capabilities {capabilities['add']}")
        seccomp = (effective("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            problems.append(f"{where}: seccompProfile {seccomp!r}")
        # Not part of `restricted`, but the charts promise it: the root filesystem is read-only.
        if sc.get("readOnlyRootFilesystem") is not True:
            problems.append(f"{where}: readOnlyRootFilesystem is not true")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            problems.append(f"{where}: hostPort")
        # Writable scratch: /tmp is an emptyDir (HOME and TMPDIR point there in the plnt image).
        mounts = {m["mountPath"]: m["name"] for m in c.get("volumeMounts", [])}
        emptydirs = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        if mounts.get("/tmp") not in emptydirs:
            problems.append(f"{where}: /tmp is not an emptyDir")
    return problems
