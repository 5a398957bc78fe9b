"""Every pod template BOTH charts render (charts/plnt across its values matrix, charts/workflow-runner
across its own) passes the `restricted` Pod Security Standard, checked field by field as the
standard lists them (https://kubernetes.io/docs/concepts/security/pod-security-standards/, v1.25+
profile), on the effective settings (a container's securityContext over the pod's).

This is a reading of the rendered manifests with the real helm; no admission controller ran
(there is no API server here), so the enforcement itself is not exercised.
"""

from __future__ import annotations

import pytest

from tests.charts.chartkit import PLNT_CASES, PLNT_CHART, RUNNER_CASES, pod_templates, render, render_runner, restricted_problems

pytestmark = pytest.mark.integration  # every test runs the real helm binary

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
