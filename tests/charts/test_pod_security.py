"""Every pod template BOTH charts render (charts/plnt across its values matrix, charts/workflow-runner
across its own) passes the `restricted` Pod Security Standard, checked field by field as the
standard lists them (https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.25+
profile), on the effective settings (a container's securityContext over the pod's).

This is a reading of the rendered manifests with the real helm; no admission controller ran
(there is no API server here), so the enforcement itself is not exercised.
"""

from __future__ import annotations

from typing import Any

import pytest

from .chartkit import PLNT_CASES, PLNT_CHART, RUNNER_CASES, pod_templates, render, render_runner

pytestmark = pytest.mark.integration  # every test runs the real helm binary

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


def test_the_check_catches_what_it_claims() -> None:
    good = {"spec": {"securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
                     "volumes": [{"name": "tmp", "emptyDir": {}}],
                     "containers": [{"name": "c", "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                                     "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                         "capabilities": {"drop": ["ALL"]}}}]}}
    assert restricted_problems(good) == []
    bad = {"spec": {"hostNetwork": True, "securityContext": {"runAsUser": 0},
                    "volumes": [{"name": "h", "hostPath": {"path": "/"}}],
                    "containers": [{"name": "c", "ports": [{"containerPort": 80, "hostPort": 80}],
                                    "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}, "privileged": True}}]}}
    found = " | ".join(restricted_problems(bad))
    for needle in ("hostNetwork", "volume h", "pod runAsUser is 0", "runAsNonRoot", "allowPrivilegeEscalation", "privileged",
                   "drop ALL", "SYS_ADMIN", "seccompProfile", "readOnlyRootFilesystem", "hostPort", "/tmp"):
        assert needle in found, needle


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_plnt_pod_templates_are_restricted(helm: str, case: str) -> None:
    templates = dict(pod_templates(render(helm, PLNT_CHART, PLNT_CASES[case])))
    assert set(templates) == {"Deployment/prod-plnt-reconciler", "Deployment/prod-plnt-worker", "Deployment/prod-plnt-gateway"}
    for name, template in templates.items():
        assert restricted_problems(template) == [], f"{case}: {name}"
        assert template["spec"]["securityContext"]["runAsUser"] == 10001, "the image's USER"


@pytest.mark.parametrize("case", sorted(RUNNER_CASES))
def test_workflow_runner_pod_templates_are_restricted(helm: str, case: str) -> None:
    templates = dict(pod_templates(render_runner(helm, case)))
    assert templates, "the workflow-runner chart renders a pod template"
    for name, template in templates.items():
        assert restricted_problems(template) == [], f"{case}: {name}"
        # Runner pods never talk to the Kubernetes API.
        assert template["spec"]["automountServiceAccountToken"] is False
