"""charts/plnt with the REAL helm binary (`helm lint --strict`, `helm template`): no cluster.

Across a matrix of values (chartkit.PLNT_CASES: autoscaling, ingress and hooks, ServiceMonitor,
external Temporal with TLS + API key vs plain, PVC, status mirroring, one and several deploy
namespaces, NetworkPolicies on and off) every rendered object passes kubernetes-validate's strict
schemas for Kubernetes 1.33, except the ServiceMonitors and the PodMonitor: monitoring.coreos.com/v1
is a CRD that kubernetes-validate has no schema for, so their fields are checked by hand below against
the Prometheus Operator's API reference (the rest of the observability objects:
test_plnt_observability.py). Nothing is applied to a cluster: there is none here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.charts.chartkit import (
    BASE,
    DNS_LABEL,
    DNS_SUBDOMAIN,
    FROM_CLUSTER,
    FROM_EVERY_NAMESPACE,
    FULLNAME,
    MODEL_SERVER_CASES,
    NAMESPACE,
    PLNT_CASES,
    PLNT_CHART,
    RUNNER_CASES,
    SOURCE_NAMESPACES,
    check_labels,
    helm_template,
    merged,
    render,
    render_model_server,
    render_runner,
    validate_strictly,
)

pytestmark = pytest.mark.integration  # every test runs the real helm binary


def objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], dict[str, Any]]:
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for doc in docs:
        key = (doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"])
        assert key not in out, f"rendered twice: {key}"
        out[key] = doc
    return out


def one(docs: list[dict[str, Any]], kind: str, name: str, namespace: str = NAMESPACE) -> dict[str, Any]:
    return objects(docs)[(kind, namespace, name)]


def container(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    [c] = one(docs, "Deployment", f"{FULLNAME}-{role}")["spec"]["template"]["spec"]["containers"]
    return c


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


# --- lint ----------------------------------------------------------------------------------


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_helm_lint_strict_passes(helm: str, tmp_path: Path, case: str) -> None:
    import subprocess

    values = tmp_path / "values.json"
    values.write_text(json.dumps(PLNT_CASES[case]))
    result = subprocess.run([helm, "lint", "--strict", str(PLNT_CHART), "--namespace", NAMESPACE, "--values", str(values)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "1 chart(s) linted, 0 chart(s) failed" in result.stdout, result.stdout + result.stderr
    notes = [line for line in result.stdout.splitlines() if line.startswith("[")]
    assert notes == ["[INFO] Chart.yaml: icon is recommended"], result.stdout
    assert "WARN" not in result.stderr, result.stderr


def test_required_values_are_named_when_missing(helm: str) -> None:
    result = helm_template(helm, PLNT_CHART, {})
    assert result.returncode != 0 and "git.repo is required" in result.stderr, result.stderr
    result = helm_template(helm, PLNT_CHART, {"git": {"repo": "https://git.example.com/specs.git"}})
    assert result.returncode != 0 and "temporal.address is required" in result.stderr, result.stderr
    result = helm_template(helm, PLNT_CHART, {k: v for k, v in BASE.items() if k != "auth"})
    assert result.returncode != 0 and "auth.tokens.secretName is required" in result.stderr, result.stderr
    # From the cluster: no repository, but the platform ConfigMap.
    result = helm_template(helm, PLNT_CHART, merged(FROM_CLUSTER, {"source": {"platformConfigMap": ""}}))
    assert result.returncode != 0 and "source.platformConfigMap is required with source.kind kubernetes" in result.stderr, \
        result.stderr
    assert helm_template(helm, PLNT_CHART, FROM_CLUSTER).returncode == 0, "git.repo is not required from the cluster"


# --- every manifest, strictly ----------------------------------------------------------------


SERVICE_MONITOR_SPEC = {"selector", "namespaceSelector", "endpoints"}
POD_MONITOR_SPEC = {"selector", "namespaceSelector", "podMetricsEndpoints"}
SERVICE_MONITOR_ENDPOINT = {"port", "path", "scheme", "interval"}
MONITOR_KINDS = {"ServiceMonitor", "PodMonitor"}


def check_service_monitor(doc: dict[str, Any], docs: list[dict[str, Any]]) -> None:
    """By hand: kubernetes-validate has no schema for monitoring.coreos.com/v1 (a CRD). Field names
    and types as the Prometheus Operator's API reference gives them for ServiceMonitorSpec/Endpoint
    and PodMonitorSpec/PodMetricsEndpoint. A ServiceMonitor's `port` names a port of the Service it
    selects; a PodMonitor's a container port of the pods it selects."""
    assert doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["kind"] in MONITOR_KINDS
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert set(doc["metadata"]) == {"name", "namespace", "labels"}
    spec = doc["spec"]
    assert set(spec) == (SERVICE_MONITOR_SPEC if doc["kind"] == "ServiceMonitor" else POD_MONITOR_SPEC)
    assert set(spec["selector"]) == {"matchLabels"}
    selector = spec["selector"]["matchLabels"]
    assert spec["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    if doc["kind"] == "ServiceMonitor":
        [target] = [d for d in docs if d["kind"] == "Service" and selector.items() <= d["metadata"]["labels"].items()]
        port_names = {port["name"] for port in target["spec"]["ports"]}
        [endpoint] = spec["endpoints"]
    else:
        [target] = [d for d in docs if d["kind"] == "Deployment"
                    and selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()]
        port_names = {port["name"] for c in target["spec"]["template"]["spec"]["containers"] for port in c["ports"]}
        [endpoint] = spec["podMetricsEndpoints"]
    assert set(endpoint) - {"authorization"} == SERVICE_MONITOR_ENDPOINT
    if "authorization" in endpoint:  # SafeAuthorization: type + credentials (a SecretKeySelector)
        assert endpoint["authorization"]["type"] == "Bearer"
        assert set(endpoint["authorization"]["credentials"]) == {"name", "key"}
    assert endpoint["path"] == "/metrics" and endpoint["scheme"] == "http"
    assert endpoint["port"] in port_names, (doc["metadata"]["name"], endpoint["port"], port_names)
    assert isinstance(endpoint["interval"], str) and endpoint["interval"].endswith("s")


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_every_manifest_validates_strictly(helm: str, case: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES[case])
    by_key = objects(docs)
    for doc in docs:
        if doc["kind"] in MONITOR_KINDS:
            check_service_monitor(doc, docs)
        else:
            validate_strictly(doc, case)
        check_labels(doc["metadata"]["labels"])
        assert DNS_SUBDOMAIN.match(doc["metadata"]["name"]), doc["metadata"]["name"]
        if doc["kind"] == "Service":
            assert DNS_LABEL.match(doc["metadata"]["name"])
        assert doc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # Nothing cluster-scoped, and nothing this chart must not create.
    assert all(doc["metadata"].get("namespace") for doc in docs)
    kinds = {kind for kind, _, _ in by_key}
    assert not kinds & {"ClusterRole", "ClusterRoleBinding", "Namespace", "CustomResourceDefinition"}, kinds


def test_service_monitor_sends_the_read_token(helm: str) -> None:
    """The gateway and the reconciler serve /metrics behind the caller tokens; the worker's health
    listener has none (tests/charts/test_plnt_observability.py covers the rest of the scraping)."""
    docs = render(helm, PLNT_CHART, PLNT_CASES["all-on"])
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] in MONITOR_KINDS}
    assert set(monitors) == {f"{FULLNAME}-{role}" for role in ("gateway", "reconciler", "worker")}
    for role in ("gateway", "reconciler"):
        monitor = monitors[f"{FULLNAME}-{role}"]
        assert monitor["kind"] == "ServiceMonitor" and monitor["metadata"]["labels"]["release"] == "prometheus"
        assert monitor["spec"]["endpoints"][0]["authorization"] == {
            "type": "Bearer", "credentials": {"name": "plnt-metrics-token", "key": "token"}}
    worker = monitors[f"{FULLNAME}-worker"]
    assert worker["kind"] == "PodMonitor" and "authorization" not in worker["spec"]["podMetricsEndpoints"][0]
    docs = render(helm, PLNT_CHART, PLNT_CASES["tls-no-ca-existing-claim-mirror"])
    for monitor in (d for d in docs if d["kind"] == "ServiceMonitor"):
        assert "authorization" not in monitor["spec"]["endpoints"][0]


def test_the_default_objects(helm: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES["defaults"])
    names = {(kind, ns, name) for kind, ns, name in objects(docs)}
    expected = {("Deployment", NAMESPACE, f"{FULLNAME}-{role}") for role in ("reconciler", "worker", "gateway")}
    expected |= {("ServiceAccount", NAMESPACE, f"{FULLNAME}-{role}") for role in ("reconciler", "worker", "gateway")}
    expected |= {("Service", NAMESPACE, f"{FULLNAME}-reconciler"), ("Service", NAMESPACE, f"{FULLNAME}-gateway"),
                 ("HorizontalPodAutoscaler", NAMESPACE, f"{FULLNAME}-gateway"),
                 ("PodDisruptionBudget", NAMESPACE, f"{FULLNAME}-gateway"),
                 ("Secret", NAMESPACE, f"{FULLNAME}-internal-token")}
    assert expected <= names
    assert not any(kind in {"Ingress", "ServiceMonitor", "PersistentVolumeClaim"} for kind, _, _ in names)


# --- the roles' command lines: exactly the flags the role commands take ----------------------


RECONCILER_FLAGS = {"--repo", "--branch", "--path", "--state-dir", "--host", "--port", "--temporal-address",
                    "--temporal-namespace", "--temporal-tls-cert", "--temporal-tls-key", "--temporal-tls-ca",
                    "--temporal-api-key-file", "--internal-token-file", "--tokens-file", "--webhook-secret-file",
                    "--lease", "--lease-name", "--lease-namespace", "--mirror-status", "--git-credentials-file",
                    "--verify-commits", "--allowed-signers", "--gpg-keys", "--write-notes", "--forge", "--forge-api-url",
                    "--forge-project", "--forge-token-file", "--require-approval", "--no-report-status", "--previews",
                    "--model-install-timeout"}
FORGE_FLAGS = {"--write-notes", "--forge", "--forge-api-url", "--forge-project", "--forge-token-file", "--require-approval",
               "--no-report-status", "--previews"}
WORKER_FLAGS = {"--repo", "--branch", "--path", "--state-dir", "--temporal-address", "--temporal-namespace",
                "--temporal-tls-cert", "--temporal-tls-key", "--temporal-tls-ca", "--temporal-api-key-file",
                "--control-url", "--internal-token-file", "--host", "--port", "--git-credentials-file",
                "--verify-commits", "--allowed-signers", "--gpg-keys", "--model-install-timeout"}
GATEWAY_FLAGS = {"--control-url", "--internal-token-file", "--host", "--port", "--tokens-file"}


def mounted_file(deployment: dict[str, Any], container_: dict[str, Any], path: str) -> tuple[str, str]:
    """(Secret name, key) behind a file path the container is given: the mount and its Secret volume."""
    mounts = [m for m in container_["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, (path, container_["volumeMounts"])
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mounts[0]["name"]]
    key = path[len(mounts[0]["mountPath"].rstrip("/")) + 1:]
    assert {"key": key, "path": key} in volume["secret"]["items"], (path, volume)
    return volume["secret"]["secretName"], key


def test_command_lines_with_every_option(helm: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES["all-on"])
    control_url = f"http://{FULLNAME}-reconciler.{NAMESPACE}.svc:8080"

    deployment = one(docs, "Deployment", f"{FULLNAME}-reconciler")
    reconciler = container(docs, "reconciler")
    args = reconciler["args"]
    assert args[0] == "reconcile" and "command" not in reconciler  # the image's ENTRYPOINT is plnt
    assert {a for a in args if a.startswith("--")} == RECONCILER_FLAGS
    assert flag(args, "--repo") == "https://git.example.com/platform/specs.git"
    assert (flag(args, "--branch"), flag(args, "--path"), flag(args, "--state-dir")) == ("main", ".", "/var/lib/plnt")
    assert (flag(args, "--host"), flag(args, "--port")) == ("0.0.0.0", "8080")
    assert flag(args, "--temporal-address") == "plnt.a1b2c.tmprl.cloud:7233"
    assert flag(args, "--temporal-namespace") == "plnt.a1b2c"
    assert (flag(args, "--lease"), flag(args, "--lease-name"), flag(args, "--lease-namespace")) == \
        ("kubernetes", f"{FULLNAME}-reconciler", NAMESPACE)
    for option, secret in [("--temporal-tls-cert", ("temporal-mtls", "tls.crt")), ("--temporal-tls-key", ("temporal-mtls", "tls.key")),
                           ("--temporal-tls-ca", ("temporal-mtls", "ca.crt")), ("--temporal-api-key-file", ("temporal-api-key", "api-key")),
                           ("--internal-token-file", ("plnt-internal", "token")), ("--tokens-file", ("plnt-gateway-tokens", "tokens")),
                           ("--webhook-secret-file", ("git-webhook", "webhook-secret")),
                           ("--git-credentials-file", ("git-deploy-token", "credentials")),
                           ("--allowed-signers", ("plnt-signers", "allowed_signers")),
                           ("--forge-token-file", ("plnt-forge-token", "token"))]:
        assert mounted_file(deployment, reconciler, flag(args, option)) == secret, option
    assert (flag(args, "--forge"), flag(args, "--forge-api-url"), flag(args, "--forge-project"), flag(args, "--previews")) == \
        ("github", "https://api.github.com", "platform/specs", "refs/pull/*/head")
    [state] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "state"]
    assert state == {"name": "state", "persistentVolumeClaim": {"claimName": f"{FULLNAME}-reconciler-state"}}
    assert one(docs, "PersistentVolumeClaim", f"{FULLNAME}-reconciler-state")["spec"]["accessModes"] == ["ReadWriteMany"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}, "a new pod cannot be ready while an old one leads"

    deployment = one(docs, "Deployment", f"{FULLNAME}-worker")
    worker = container(docs, "worker")
    args = worker["args"]
    assert args[0] == "worker" and {a for a in args if a.startswith("--")} == WORKER_FLAGS | {"--gpu-resource", "--verbose"}
    assert (flag(args, "--model-install-timeout"), flag(args, "--gpu-resource")) == ("3600", "amd.com/gpu")
    assert flag(reconciler["args"], "--model-install-timeout") == "3600", "the reconciler sizes the saga's steps with it"
    assert args[-1] == "--verbose", "extraArgs come last"
    assert flag(args, "--control-url") == control_url and flag(args, "--port") == "8081"
    assert mounted_file(deployment, worker, flag(args, "--temporal-tls-key")) == ("temporal-mtls", "tls.key")
    assert mounted_file(deployment, worker, flag(args, "--internal-token-file")) == ("plnt-internal", "token")
    assert mounted_file(deployment, worker, flag(args, "--git-credentials-file")) == ("git-deploy-token", "credentials")
    assert flag(args, "--verify-commits") == "all" and flag(args, "--gpg-keys") == "/etc/plnt/gpg-keys"
    [keys] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "gpg-keys"]
    assert keys["secret"]["secretName"] == "plnt-gpg-keys", "the whole Secret: one file per public key"

    deployment = one(docs, "Deployment", f"{FULLNAME}-gateway")
    gateway = container(docs, "gateway")
    args = gateway["args"]
    assert args[0] == "gateway" and {a for a in args if a.startswith("--")} == GATEWAY_FLAGS
    assert flag(args, "--control-url") == control_url and flag(args, "--port") == "8000"
    assert mounted_file(deployment, gateway, flag(args, "--tokens-file")) == ("plnt-gateway-tokens", "tokens")
    # A named internal token: the chart does not make one.
    assert not [d for d in docs if d["kind"] == "Secret"]


def test_command_lines_plain(helm: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES["all-off"])
    args = container(docs, "reconciler")["args"]
    assert {a for a in args if a.startswith("--")} == RECONCILER_FLAGS - {
        "--temporal-tls-cert", "--temporal-tls-key", "--temporal-tls-ca", "--temporal-api-key-file",
        "--webhook-secret-file", "--mirror-status", "--git-credentials-file", "--verify-commits", "--allowed-signers",
        "--gpg-keys"} - FORGE_FLAGS
    assert mounted_file(one(docs, "Deployment", f"{FULLNAME}-reconciler"), container(docs, "reconciler"),
                        flag(args, "--tokens-file")) == ("plnt-tokens", "tokens")
    assert flag(args, "--temporal-namespace") == "default"
    [state] = [v for v in one(docs, "Deployment", f"{FULLNAME}-reconciler")["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "state"]
    assert state == {"name": "state", "emptyDir": {}}
    # The generated internal token: one Secret, mounted by all three roles.
    [secret] = [d for d in docs if d["kind"] == "Secret"]
    assert secret["metadata"]["name"] == f"{FULLNAME}-internal-token" and len(secret["data"]["token"]) >= 64
    for role in ("reconciler", "worker", "gateway"):
        deployment = one(docs, "Deployment", f"{FULLNAME}-{role}")
        c = container(docs, role)
        assert mounted_file(deployment, c, flag(c["args"], "--internal-token-file")) == (f"{FULLNAME}-internal-token", "token")


def test_model_server_settings_default_and_reach_both_roles(helm: str) -> None:
    """The reconciler (the saga's step timeouts) and the workers (helm's wait) get the same timeout;
    --gpu-resource only when set, and only the workers (they render the values)."""
    docs = render(helm, PLNT_CHART, PLNT_CASES["defaults"])
    defaults = yaml.safe_load((PLNT_CHART / "values.yaml").read_text())["modelServers"]
    assert defaults == {"installTimeoutSeconds": 1800, "gpuResource": "", "egress": []}
    for role in ("reconciler", "worker"):
        args = container(docs, role)["args"]
        assert flag(args, "--model-install-timeout") == "1800" and "--gpu-resource" not in args, role
    assert "--model-install-timeout" not in container(docs, "gateway")["args"]
    reconciler = container(render(helm, PLNT_CHART, PLNT_CASES["all-on"]), "reconciler")
    assert "--gpu-resource" not in reconciler["args"]


def test_tls_without_ca_uses_system_cas(helm: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES["tls-no-ca-existing-claim-mirror"])
    for role in ("reconciler", "worker"):
        args = container(docs, role)["args"]
        assert flag(args, "--temporal-tls-cert") and "--temporal-tls-ca" not in args
        assert "--temporal-api-key-file" not in args
    [state] = [v for v in one(docs, "Deployment", f"{FULLNAME}-reconciler")["spec"]["template"]["spec"]["volumes"]
               if v["name"] == "state"]
    assert state["persistentVolumeClaim"] == {"claimName": "plnt-state"}
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]


@pytest.mark.parametrize("case", sorted(PLNT_CASES))
def test_probes_resources_and_service_accounts(helm: str, case: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES[case])
    for role, port in (("reconciler", 8080), ("worker", 8081), ("gateway", 8000)):
        deployment = one(docs, "Deployment", f"{FULLNAME}-{role}")
        pod = deployment["spec"]["template"]["spec"]
        c = container(docs, role)
        assert c["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
        for probe in ("startupProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/healthz", "port": "http"}, (role, probe)
        # A standby reconciler fails /readyz: the control API Service routes to the Lease holder only.
        ready = "/readyz" if role == "reconciler" else "/healthz"
        assert c["readinessProbe"]["httpGet"] == {"path": ready, "port": "http"}, role
        assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
        assert c["image"] == ("ghcr.io/acme/plnt:0.1.0" if case == "all-on" else "plnt:0.1.0")
        assert pod["serviceAccountName"] == f"{FULLNAME}-{role}"
        account = one(docs, "ServiceAccount", f"{FULLNAME}-{role}")
        # Only roles that call the API get a token.
        assert pod["automountServiceAccountToken"] is (role != "gateway")
        assert account["automountServiceAccountToken"] is (role != "gateway")
        assert deployment["spec"]["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "plnt", "app.kubernetes.io/instance": "prod", "app.kubernetes.io/component": role}
        env = {e["name"]: e["value"] for e in c["env"]}
        assert env["HOME"] == "/tmp" and env["TMPDIR"] == "/tmp" and env["HELM_CACHE_HOME"].startswith("/tmp/")


# --- the spec source: git (the default) or the cluster's custom resources -----------------------


FROM_CLUSTER_RECONCILER_FLAGS = {"--source", "--source-namespace", "--platform-dir", "--state-dir", "--host", "--port",
                                 "--temporal-address", "--temporal-namespace", "--internal-token-file", "--tokens-file",
                                 "--lease", "--lease-name", "--lease-namespace", "--model-install-timeout"}
FROM_CLUSTER_WORKER_FLAGS = {"--source", "--source-namespace", "--platform-dir", "--state-dir", "--temporal-address",
                             "--temporal-namespace", "--control-url", "--internal-token-file", "--host", "--port",
                             "--model-install-timeout"}
GIT_FLAGS = {"--repo", "--branch", "--path", "--git-credentials-file", "--webhook-secret-file", "--mirror-status",
             "--verify-commits", "--allowed-signers", "--gpg-keys"} | FORGE_FLAGS


def platform_mount(deployment: dict[str, Any], container_: dict[str, Any]) -> dict[str, Any]:
    """The volume mounted read-only at the container's --platform-dir."""
    directory = flag(container_["args"], "--platform-dir")
    [mount] = [m for m in container_["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    [volume] = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]]
    return volume


def source_namespaces(args: list[str]) -> list[str]:
    return [args[i + 1] for i, arg in enumerate(args) if arg == "--source-namespace"]


def test_command_lines_reading_the_cluster(helm: str) -> None:
    """source.kind kubernetes: --source kubernetes, each namespace, the platform ConfigMap as --platform-dir
    (reconciler and workers alike: a worker checks a saga's input against the cluster's objects); no git flag."""
    values = PLNT_CASES["kubernetes-source"]
    docs = render(helm, PLNT_CHART, values)
    for role, flags in (("reconciler", FROM_CLUSTER_RECONCILER_FLAGS), ("worker", FROM_CLUSTER_WORKER_FLAGS)):
        c = container(docs, role)
        args = c["args"]
        assert {a for a in args if a.startswith("--")} == flags, role
        assert args[:3] == [{"reconciler": "reconcile"}.get(role, role), "--source", "kubernetes"]
        assert source_namespaces(args) == SOURCE_NAMESPACES and flag(args, "--platform-dir") == "/etc/plnt/platform"
        volume = platform_mount(one(docs, "Deployment", f"{FULLNAME}-{role}"), c)
        assert volume["configMap"] == {"name": "plnt-platform", "defaultMode": 0o440, "items": values["source"]["platformItems"]}
    gateway = one(docs, "Deployment", f"{FULLNAME}-gateway")["spec"]["template"]["spec"]
    assert not [v for v in gateway["volumes"] if "configMap" in v], "the gateway reads no specs"
    # Every namespace: no --source-namespace; every key of the ConfigMap at the directory's top.
    docs = render(helm, PLNT_CHART, FROM_EVERY_NAMESPACE)
    for role in ("reconciler", "worker"):
        c = container(docs, role)
        assert flag(c["args"], "--source") == "kubernetes" and source_namespaces(c["args"]) == []
        assert platform_mount(one(docs, "Deployment", f"{FULLNAME}-{role}"), c)["configMap"] == {
            "name": "plnt-platform", "defaultMode": 0o440}


def test_reading_the_cluster_reaches_no_git_host(helm: str) -> None:
    """The reconciler's and workers' NetworkPolicies lose the git egress (22, and 443 stays for registries)."""
    for values, git in ((PLNT_CASES["kubernetes-source"], False), (PLNT_CASES["defaults"], True)):
        docs = render(helm, PLNT_CHART, values)
        for role in ("reconciler", "worker"):
            [policy] = [d["spec"] for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{FULLNAME}-{role}"]
            assert (any((22, "TCP") in ports(rule) for rule in policy["egress"])) is git, role


def test_git_is_the_default_source_and_renders_as_before(helm: str) -> None:
    """source.kind git, said or not, renders the same objects; no --source, --platform-dir or platform volume."""
    fixed = {"auth": {"internalToken": {"secretName": "plnt-internal"}}}  # the generated token differs per render
    for case in ("defaults", "all-on", "tls-no-ca-existing-claim-mirror"):
        unsaid = helm_template(helm, PLNT_CHART, merged(PLNT_CASES[case], fixed))
        said = helm_template(helm, PLNT_CHART, merged(PLNT_CASES[case], fixed, {"source": {"kind": "git", "namespaces": []}}))
        assert unsaid.returncode == said.returncode == 0 and unsaid.stdout == said.stdout, case
        docs = render(helm, PLNT_CHART, PLNT_CASES[case])
        for role in ("reconciler", "worker"):
            args = container(docs, role)["args"]
            assert args[1:7] == ["--repo", "https://git.example.com/platform/specs.git", "--branch", "main", "--path", "."]
            assert not {"--source", "--source-namespace", "--platform-dir"} & set(args), (case, role)
            volumes = one(docs, "Deployment", f"{FULLNAME}-{role}")["spec"]["template"]["spec"]["volumes"]
            assert not [v for v in volumes if v["name"] == "platform"], (case, role)
        assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"].endswith("-source")]
    defaults = yaml.safe_load((PLNT_CHART / "values.yaml").read_text())["source"]
    assert defaults == {"kind": "git", "namespaces": [], "platformConfigMap": "", "platformItems": []}


def test_reading_every_namespace_validates_strictly_and_lints(helm: str, tmp_path: Path) -> None:
    """The one case with cluster-scoped objects (test_every_manifest_validates_strictly walks the others)."""
    import subprocess

    for doc in render(helm, PLNT_CHART, FROM_EVERY_NAMESPACE):
        if doc["kind"] not in MONITOR_KINDS:
            validate_strictly(doc, "kubernetes-every-namespace")
        check_labels(doc["metadata"]["labels"])
        assert bool(doc["metadata"].get("namespace")) is (doc["kind"] not in ("ClusterRole", "ClusterRoleBinding")), doc["kind"]
    values = tmp_path / "values.json"
    values.write_text(json.dumps(FROM_EVERY_NAMESPACE))
    result = subprocess.run([helm, "lint", "--strict", str(PLNT_CHART), "--namespace", NAMESPACE, "--values", str(values)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0 and "WARN" not in result.stdout + result.stderr, result.stdout + result.stderr


# --- gateway scaling ---------------------------------------------------------------------------


def test_gateway_hpa_pdb_and_spread(helm: str) -> None:
    docs = render(helm, PLNT_CHART, PLNT_CASES["defaults"])
    deployment = one(docs, "Deployment", f"{FULLNAME}-gateway")
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}
    hpa = one(docs, "HorizontalPodAutoscaler", f"{FULLNAME}-gateway")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": f"{FULLNAME}-gateway"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    pdb = one(docs, "PodDisruptionBudget", f"{FULLNAME}-gateway")
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    pod = deployment["spec"]["template"]["spec"]
    assert {c["topologyKey"] for c in pod["topologySpreadConstraints"]} == {"topology.kubernetes.io/zone", "kubernetes.io/hostname"}
    assert all(c["labelSelector"]["matchLabels"] == selector for c in pod["topologySpreadConstraints"])
    [term] = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == selector

    docs = render(helm, PLNT_CHART, PLNT_CASES["pvc-single-ingress-no-hooks"])
    assert one(docs, "Deployment", f"{FULLNAME}-gateway")["spec"]["replicas"] == 3
    assert not [d for d in docs if d["kind"] == "HorizontalPodAutoscaler"]


# --- ingress -------------------------------------------------------------------------------------


def test_ingress_with_and_without_hooks(helm: str) -> None:
    ingress = one(render(helm, PLNT_CHART, PLNT_CASES["all-on"]), "Ingress", f"{FULLNAME}-gateway")
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "plnt.example.com" and ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"hosts": ["plnt.example.com"], "secretName": "plnt-tls"}]
    paths = {(p["path"], p["pathType"]): p["backend"]["service"]["name"] for p in rule["http"]["paths"]}
    # Only the webhook reaches the reconciler; the rest of the control API stays inside.
    assert paths == {("/hooks/git", "Exact"): f"{FULLNAME}-reconciler", ("/", "Prefix"): f"{FULLNAME}-gateway"}

    ingress = one(render(helm, PLNT_CHART, PLNT_CASES["pvc-single-ingress-no-hooks"]), "Ingress", f"{FULLNAME}-gateway")
    assert [p["backend"]["service"]["name"] for p in ingress["spec"]["rules"][0]["http"]["paths"]] == [f"{FULLNAME}-gateway"]


# --- NetworkPolicies -------------------------------------------------------------------------


def role_peer(role: str) -> dict[str, Any]:
    return {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "plnt", "app.kubernetes.io/instance": "prod",
                                            "app.kubernetes.io/component": role}}}


def ports(rule: dict[str, Any]) -> set[tuple[Any, str]]:
    return {(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]}


def test_network_policies(helm: str) -> None:
    values = PLNT_CASES["all-on"]
    docs = render(helm, PLNT_CHART, values)
    policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    assert set(policies) == {(NAMESPACE, f"{FULLNAME}-{n}") for n in ("default-deny", "gateway", "reconciler", "worker")} | \
        {(ns, f"{FULLNAME}-{pods}") for ns in values["deployNamespaces"] for pods in ("runners", "model-servers")}
    deny = policies[(NAMESPACE, f"{FULLNAME}-default-deny")]
    assert deny == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "plnt", "app.kubernetes.io/instance": "prod"}},
                    "policyTypes": ["Ingress", "Egress"]}
    for spec in policies.values():
        assert spec["policyTypes"] == ["Ingress", "Egress"]

    # The control API: only gateways and workers, and the ingress controller for hooks.
    reconciler = policies[(NAMESPACE, f"{FULLNAME}-reconciler")]
    assert reconciler["ingress"][0] == {"from": [role_peer("gateway"), role_peer("worker")], "ports": [{"port": 8080, "protocol": "TCP"}]}
    defaults = yaml.safe_load((PLNT_CHART / "values.yaml").read_text())
    assert reconciler["ingress"][1] == {"from": defaults["networkPolicy"]["ingressController"],
                                        "ports": [{"port": 8080, "protocol": "TCP"}]}
    # serviceMonitor.enabled: Prometheus's pods scrape the control API's /metrics.
    prometheus = {"from": defaults["networkPolicy"]["prometheusFrom"], "ports": [{"port": 8080, "protocol": "TCP"}]}
    assert reconciler["ingress"][2] == prometheus
    assert len(reconciler["ingress"]) == 3
    no_hooks = render(helm, PLNT_CHART, PLNT_CASES["pvc-single-ingress-no-hooks"])
    [spec] = [d["spec"] for d in no_hooks if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{FULLNAME}-reconciler"]
    assert spec["ingress"] == [reconciler["ingress"][0]], "no ingress controller without hooks"
    egress_ports = set().union(*(ports(rule) for rule in reconciler["egress"]))
    assert egress_ports == {(53, "UDP"), (53, "TCP"), (443, "TCP"), (6443, "TCP"), (7233, "TCP"), (22, "TCP")}
    [temporal] = [r for r in reconciler["egress"] if ports(r) == {(7233, "TCP")}]
    assert temporal["to"] == [{"ipBlock": {"cidr": "203.0.113.0/24"}}]

    gateway = policies[(NAMESPACE, f"{FULLNAME}-gateway")]
    assert gateway["ingress"] == [{"ports": [{"port": 8000, "protocol": "TCP"}],
                                   "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}}]},
                                  {**prometheus, "ports": [{"port": 8000, "protocol": "TCP"}]}], \
        "gatewayFrom narrows the gateway: Prometheus is let in beside it"
    assert {"to": [role_peer("reconciler")], "ports": [{"port": 8080, "protocol": "TCP"}]} in gateway["egress"]
    assert policies[(NAMESPACE, f"{FULLNAME}-worker")]["ingress"] == [
        {**prometheus, "ports": [{"port": 8081, "protocol": "TCP"}]}], "nothing but Prometheus calls a worker"
    no_monitor = render(helm, PLNT_CHART, PLNT_CASES["defaults"])
    [worker_policy] = [d["spec"] for d in no_monitor if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == f"{FULLNAME}-worker"]
    assert "ingress" not in worker_policy, "without a monitor nothing calls a worker"

    # Runner pods: from gateways and workers only; out to DNS, registries and runners.egress.
    runner_pods = render_runner(helm, "defaults")
    [runner_deployment] = [d for d in runner_pods if d["kind"] == "Deployment"]
    runner_labels = runner_deployment["spec"]["template"]["metadata"]["labels"]
    for namespace in values["deployNamespaces"]:
        spec = policies[(namespace, f"{FULLNAME}-runners")]
        assert spec["podSelector"]["matchLabels"].items() <= runner_labels.items(), \
            "the policy selects the pods the workflow-runner chart renders"
        assert spec["ingress"] == [{"from": [role_peer("gateway"), role_peer("worker")], "ports": [{"port": 8080, "protocol": "TCP"}]}]
        assert [ports(r) for r in spec["egress"]] == [{(53, "UDP"), (53, "TCP")}, {(443, "TCP")}, {(443, "TCP")}]
        assert spec["egress"][2]["to"] == [{"ipBlock": {"cidr": "10.20.0.0/16"}}]
    runner_port = runner_deployment["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    assert runner_port == 8080 == values.get("runners", {}).get("port", 8080)
    # Gateways and workers may reach runner and model-server pods in every deploy namespace, on their ports.
    for role in ("gateway", "worker"):
        for name, port in (("workflow-runner", 8080), ("model-server", 8000)):
            [to_pods] = [r for r in policies[(NAMESPACE, f"{FULLNAME}-{role}")]["egress"]
                         if any("podSelector" in p and p["podSelector"]["matchLabels"].get("app.kubernetes.io/name") == name
                                for p in r.get("to", []))]
            assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in to_pods["to"]] == \
                values["deployNamespaces"], (role, name)
            assert to_pods["ports"] == [{"port": port, "protocol": "TCP"}], (role, name)

    assert not [d for d in render(helm, PLNT_CHART, PLNT_CASES["all-off"]) if d["kind"] == "NetworkPolicy"]


def test_model_server_pods_get_a_policy_of_their_own(helm: str) -> None:
    """Model-server pods (ModelDeployments): in on 8000 from gateways and workers only; out DNS, the
    registries (the init container fetches the weights) and modelServers.egress, nothing else by default.
    Checked against renders of the model-server chart: its pods' labels and the port its server listens on."""
    for case, extra in (("defaults", []), ("all-on", [[{"ipBlock": {"cidr": "10.30.0.0/16"}}]])):
        values = PLNT_CASES[case]
        docs = render(helm, PLNT_CHART, values)
        policies = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "NetworkPolicy"}
        for namespace in values.get("deployNamespaces", ["plnt-runners"]):
            policy = policies[(namespace, f"{FULLNAME}-model-servers")]
            spec = policy["spec"]
            check_labels(policy["metadata"]["labels"])
            assert spec["policyTypes"] == ["Ingress", "Egress"]
            assert spec["podSelector"] == {"matchLabels": {"app.kubernetes.io/name": "model-server",
                                                           "app.kubernetes.io/part-of": "plnt"}}
            assert spec["ingress"] == [{"from": [role_peer("gateway"), role_peer("worker")],
                                        "ports": [{"port": 8000, "protocol": "TCP"}]}]
            assert [ports(r) for r in spec["egress"]] == [{(53, "UDP"), (53, "TCP")}, {(443, "TCP")}] + \
                [{(4317, "TCP")}] * len(extra)
            assert [r.get("to") for r in spec["egress"][2:]] == extra
    for case in MODEL_SERVER_CASES:
        model_docs = render_model_server(helm, case)
        [deployment] = [d for d in model_docs if d["kind"] == "Deployment"]
        pod = deployment["spec"]["template"]
        selector = spec["podSelector"]["matchLabels"]  # the same in every deploy namespace (above)
        assert selector.items() <= pod["metadata"]["labels"].items(), "the policy selects the pods the model-server chart renders"
        [server] = pod["spec"]["containers"]
        assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
        [service] = [d for d in model_docs if d["kind"] == "Service"]
        assert service["spec"]["ports"][0]["targetPort"] == "http"
        # The runner policy selects no model-server pod, nor the reverse.
        assert pod["metadata"]["labels"]["app.kubernetes.io/name"] != "workflow-runner"


# --- values.schema.json and the template guards: helm's real errors -----------------------------


@pytest.mark.parametrize(("change", "expected"), [
    ({"replicaCount": 3}, "additional properties 'replicaCount' not allowed"),
    ({"gateway": {"autoscaling": {"maxReplicas": "10"}}}, "got string, want integer"),
    ({"gateway": {"autoscalling": {"enabled": False}}}, "additional properties 'autoscalling' not allowed"),
    ({"networkPolicy": {"enabled": "yes"}}, "got string, want boolean"),
    ({"deployNamespaces": ["Team_A"]}, "deployNamespaces"),
    ({"deployNamespaces": []}, "minItems"),
    ({"temporal": {"address": "temporal"}}, "temporal/address"),
    ({"temporal": {"tls": {"secretName": "Bad Name"}}}, "secretName"),
    ({"networkPolicy": {"temporal": {"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "namspaceSelector": {}}]}}},
     "additional properties 'namspaceSelector' not allowed"),
    ({"networkPolicy": {"git": {"ports": [{"port": 70000}]}}}, "git"),
    ({"mirrorStatus": {"namespaces": "team-a"}}, "got string, want array"),
    ({"reconciler": {"persistence": {"accessModes": ["ReadWriteAll"]}}}, "accessModes"),
    ({"serviceMonitor": {"labels": {"release": 3}}}, "got number, want string"),
    ({"fullnameOverride": "a-very-long-name-that-exceeds-forty-characters"}, "fullnameOverride"),
    ({"ingress": {"host": "https://plnt.example.com"}}, "host"),
    ({"git": {"verifyCommits": {"mode": "latest"}}}, "mode"),
    ({"forge": {"kind": "bitbucket"}}, "kind"),
    ({"forge": {"apiUrl": "api.github.com"}}, "apiUrl"),
    ({"modelServers": {"installTimeoutSeconds": 0}}, "installTimeoutSeconds"),
    ({"modelServers": {"installTimeoutSeconds": "30m"}}, "got string, want integer"),
    ({"modelServers": {"gpuResource": "gpu"}}, "gpuResource"),
    ({"modelServers": {"port": 9000}}, "additional properties 'port' not allowed"),
    ({"source": {"kind": "cluster"}}, "kind"),
    ({"source": {"namespaces": "team-a"}}, "got string, want array"),
    ({"source": {"namespaces": ["Team_A"]}}, "namespaces"),
    ({"source": {"platformConfigMap": "Platform Specs"}}, "platformConfigMap"),
    ({"source": {"platformItems": [{"key": "policy.yaml", "path": "../policy.yaml"}]}}, "platformItems"),
    ({"source": {"platformItems": [{"key": "policy.yaml"}]}}, "missing property 'path'"),
])
def test_schema_rejects_unknown_keys_and_wrong_types(helm: str, change: dict[str, Any], expected: str) -> None:
    result = helm_template(helm, PLNT_CHART, merged(BASE, change))
    assert result.returncode != 0
    assert "values don't meet the specifications of the schema" in result.stderr and expected in result.stderr, result.stderr


@pytest.mark.parametrize(("change", "expected"), [
    ({"reconciler": {"replicas": 2, "persistence": {"enabled": True}}}, "needs accessModes [ReadWriteMany] (or reconciler.replicas: 1)"),
    ({"mirrorStatus": {"enabled": True}}, "mirrorStatus.enabled needs mirrorStatus.namespaces"),
    ({"gateway": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "maxReplicas (2) must be >= minReplicas (5)"),
    ({"git": {"verifyCommits": {"mode": "head"}}}, "git.verifyCommits.mode needs trusted signers"),
    ({"forge": {"kind": "gitlab", "apiUrl": "https://gitlab.example/api/v4", "project": "a/b"}},
     "forge.kind needs forge.apiUrl, forge.project and forge.token.secretName"),
    ({"forge": {"requireApproval": True}}, "forge.requireApproval and forge.previews need a forge"),
    # What only means something with git is refused from the cluster, named (plnt itself refuses it too).
    ({"source": {"kind": "kubernetes", "platformConfigMap": "plnt-platform"}},
     "git.repo is for source.kind git: with source.kind kubernetes there are no commits or pull requests"),
    ({"git": {"repo": ""}, "source": {"kind": "kubernetes", "platformConfigMap": "p"},
      "mirrorStatus": {"enabled": True, "namespaces": ["team-a"]}, "ingress": {"enabled": True, "hooks": {"enabled": True}},
      "forge": {"kind": "github", "apiUrl": "https://api.github.com", "project": "a/b", "token": {"secretName": "t"}}},
     "forge.kind, ingress.hooks.enabled, mirrorStatus.enabled are for source.kind git"),
    ({"git": {"repo": "", "writeNotes": True, "credentials": {"secretName": "git-token"}},
      "source": {"kind": "kubernetes", "platformConfigMap": "p"}},
     "git.credentials.secretName, git.writeNotes are for source.kind git"),
])
def test_template_guards(helm: str, change: dict[str, Any], expected: str) -> None:
    result = helm_template(helm, PLNT_CHART, merged(BASE, change))
    assert result.returncode != 0 and expected in result.stderr, result.stderr


def test_runner_cases_cover_every_optional_kind(helm: str) -> None:
    kinds = {doc["kind"] for case in RUNNER_CASES for doc in render_runner(helm, case)}
    assert {"HorizontalPodAutoscaler", "Ingress", "Deployment", "Service", "ConfigMap"} <= kinds
