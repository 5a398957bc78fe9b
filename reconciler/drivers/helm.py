"""Helm driver: each release is a Helm release of charts/workflow-runner (a WorkflowRun's runner) or
of charts/model-server (a ModelDeployment's model server) on a Kubernetes backend.

One HelmDriver serves one PlntBackend of type kubernetes (its context, kubeconfig and namespace).

Mapping. Every WorkflowRun on a backend lands in the backend's Kubernetes namespace. The release
is named after the WorkflowRun: `<name>` (stable) and `<name>-canary` (canary); the Kubernetes
objects take the release's name. plnt's own namespace is kept in the values
(`workflow.namespace`) and in the label `plnt.work/workflow-namespace`. Two WorkflowRuns of the same
name in different plnt namespaces on one backend would share a release name: the second one gets
HelmConfigError naming the owner, and the first one's release is never touched. Release names must
be DNS-1035 labels of at most 53 characters, for both tracks (so `name` is at most 46).

Values seam. `InstallRequest` is shared by both drivers and carries no spec, so the driver asks a
`SpecLookup` for the WorkflowRun spec by (namespace, name, spec fingerprint) and checks the
fingerprint: the values come from exactly the spec the saga deploys. `render_values` is the pure
function from (request, spec, backend, image, registry settings) to values; tests render the chart
with it.

Recipe in the pod. The runner pod's init container runs `plnt recipe fetch` with the saga's pinned
digest, the RecipeTrustPolicies covering the recipe that the saga verified with (`request.trust`,
read from the saga's commit; rendered into a ConfigMap with the trusted roots they name), plnt's
registry settings, and registry credentials from a Secret named by `credentials_secret` (never
the credentials themselves). A `file:` registry cannot be reached from a pod: InvalidSpec.

Tracing. When the worker's environment asks for traces (the plnt chart's tracing.*), the runner
container gets the same filtered OTEL_* variables a local runner gets (`tracing_values`), so a
request's trace goes on from the gateway into the pod; nothing at all when it does not. Releases
pick a change up at their next install (a new version, canary or promote).

Models. An InstallRequest with `model` set is a ModelDeployment's release: `render_model_values`
renders charts/model-server (its own chart, `model_chart`), named and placed exactly as a runner
(`<name>`, `<name>-canary`; the backend's placement merged with the spec's), its init container
running `plnt model fetch` with the saga's root-digest pin, the same trust and registry values as a
runner's recipe fetch, and the same credentials Secret. Its endpoint is the release's Service on
port 8000 (the OpenAI API); its Release carries the ModelServing read back from the values, so the
gateway routes to it as to a local model server. GPU classes mean what they mean for runners (the
GPU pool's node label, GPUs counted in nvidia.com/gpu) unless the class is itself a device plugin's
resource name (nvidia.com/gpu, amd.com/gpu, ...): see `gpu_resource_name`. Its `helm upgrade --wait`
(and the rollback of a stuck model release) has a timeout of its own, `model_timeout_s` (the setting
`model_install_timeout_s`, default 30 minutes): the pod's fetch of the weights and the server's start
must fit in it. The saga's install and promote steps of a ModelDeployment are given that plus
MODEL_STEP_MARGIN_S (`model_step_timeouts`, applied by the reconciler to the saga's input).

Waiting and recovery. Installs run `helm upgrade --install --wait` WITHOUT --atomic
(--rollback-on-failure in helm 4): a canary that does not become ready stays as it is (pods,
events) until the saga removes it, and a retried install upgrades over a `failed` release. A release
left `pending-*` by a helm process that died (activity timeout, worker crash) is recovered by
`recover_stuck`: rolled back to its last good revision, or uninstalled if it never had one. A
pending release younger than the helm timeout may be a live operation and is left alone (retry).

Errors. Transient cluster problems and locks are DriverError (retryable); a chart or values the
chart rejects is HelmChartError; a backend that cannot work as configured (no such context, no
kubeconfig, RBAC, a name owned by someone else, no helm binary) is HelmConfigError. Both are
NeedsHuman. Anything unrecognised is DriverError: the saga's retry policy bounds it.

Works with helm >= 3.13 (release labels, uninstall --ignore-not-found) and helm 4.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml
from plnt.core import telemetry
from plnt.core.specs.models import (
    Autoscaling,
    BackendPlacement,
    Deployable,
    KubernetesTarget,
    ModelDeploymentSpec,
    PlntBackend,
    WorkflowRunSpec,
    spec_fingerprint,
)
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.drivers.serving import wait_serving
from plnt.reconciler.errors import (
    ClusterUnavailable,
    DriverError,
    InvalidSpec,
    LiveStateUnknown,
    NeedsHuman,
    PlntError,
    UnknownBackend,
)
from plnt.reconciler.recipes.registries import RegistryOptions
from plnt.reconciler.recipes.trust import policies_for
from plnt.reconciler.settings import StepTimeouts
from plnt.reconciler.state import LiveWorkflow, ModelServing, Release, Track

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_CHART = str(Path(__file__).resolve().parents[2] / "charts" / "workflow-runner")
DEFAULT_MODEL_CHART = str(Path(__file__).resolve().parents[2] / "charts" / "model-server")
RELEASE_NAME_MAX = 53  # Helm's limit (release names end up in labels with suffixes)
UNAVAILABLE_POLL_S = 2.0  # a helm command is tried again this often while the cluster is unavailable
# helm enforces its own --timeout; the helm process is killed this long after it, to cover its exit.
HELM_EXIT_MARGIN_S = 20.0
# What a model release's install or promote step needs beyond the model's helm --wait: helm's exit,
# and one more helm call with the runners' timeout (150 s by default) and the status/list calls
# around it: promote's uninstall of the canary, or install's uninstall of a stuck release. (A stuck
# model release rolled back first waits the model's timeout twice: that attempt may time out, and
# the step's retry finds the rollback done, or still pending and young: retried again.)
MODEL_STEP_MARGIN_S = 300.0
RUNNER_STEP_MARGIN_S = 30.0  # helm's exit, the serving check; see runner_step_timeouts
CANARY_SUFFIX = "-canary"
RUNNER_SERVICE_NAME = "plnt-runner"  # runner pods' OTEL_SERVICE_NAME, as a local runner's default
# Where the runner reads its recipe: a directory in the chart's emptyDir (mounted at /var/lib/plnt),
# which the init container fills with `plnt recipe fetch` (a subdirectory, so fetch's staging sits
# beside it on the same filesystem).
RECIPE_DIR_IN_POD = "/var/lib/plnt/recipe"
MODELS_DIR_IN_POD = "/models"  # the model-server chart's weights volume: the model in /models/<model name>
MODEL_PORT = 8000  # the model-server chart's Service port (the OpenAI API)
# GPU classes that are themselves the extended resource a device plugin advertises: the model-server
# chart counts GPUs in them. Any other class (e.g. nvidia.com/h100) is the GPU pool's node label, as in
# the workflow-runner chart, and the GPUs are counted in nvidia.com/gpu.
DEVICE_PLUGIN_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe")
MANAGED_LABEL = ("plnt.work/managed-by", "plnt")  # Helm release label: which releases are plnt's
LIST_MAX = 4096
PENDING = ("pending-install", "pending-upgrade", "pending-rollback")
GOOD = ("deployed", "superseded")
# helm --wait gave up on a release's resources (helm 3: "timed out waiting for the condition", helm 4:
# "context deadline exceeded" / "not ready").
_WAIT_TIMED_OUT = re.compile(r"timed out waiting for the condition|context deadline exceeded|\bnot ready\b")  # revisions a stuck release can roll back to

# Service names are DNS-1035 labels: a letter first.
_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# A Kubernetes qualified name (label key): optional DNS-subdomain prefix, then a name.
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class HelmChartError(NeedsHuman):
    """The chart or its values were rejected (schema, template, invalid manifest): fix the spec or chart."""


class HelmConfigError(NeedsHuman):
    """The backend cannot work as configured (context, kubeconfig, RBAC, helm binary, a name owned by
    another WorkflowRun or ModelDeployment): someone must change the backend or the cluster."""


class _InProgress(DriverError):
    """Helm's lock: another install/upgrade/rollback holds the release."""


class _NotFound(DriverError):
    """The release does not exist."""


# --- names and values ------------------------------------------------------------------------


@dataclass(frozen=True)
class RunnerImage:
    repository: str = "plnt"
    tag: str = ""  # empty: the chart's appVersion
    pull_policy: str = "IfNotPresent"


def release_name(name: str, track: Track) -> str:
    """`name` (stable) or `name-canary`; raises InvalidSpec unless BOTH tracks' names are valid."""
    canary = f"{name}{CANARY_SUFFIX}"
    problem = None
    if not _DNS1035.match(name):
        problem = f"{name!r} is not a DNS-1035 label (lowercase letters, digits, '-'; a letter first)"
    elif len(canary) > RELEASE_NAME_MAX:
        problem = (f"release name {canary!r} is {len(canary)} characters; Helm allows {RELEASE_NAME_MAX}, "
                   f"so a WorkflowRun or ModelDeployment on a Kubernetes backend needs a name of at most "
                   f"{RELEASE_NAME_MAX - len(CANARY_SUFFIX)} characters")
    if problem:
        raise InvalidSpec(f"metadata.name: {problem}")
    return canary if track == "canary" else name


def render_values(
    request: InstallRequest,
    spec: WorkflowRunSpec,
    backend: PlntBackend,
    image: RunnerImage,
    *,
    resources: dict[str, Any] | None = None,
    registry_options: RegistryOptions = RegistryOptions(),
    credentials_secret: str = "",
    tracing: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The workflow-runner values for one release: pure, and exactly what `install` passes to helm.

    The pod's init container fetches exactly `request.recipe_digest` and verifies it against
    `request.trust` (the policies the saga verified with), reaching the registry with plnt's own
    registry settings; credentials only as the name of a Secret in the backend's namespace.
    `tracing`: `tracing_values(...)` of the worker's environment (empty: no `tracing` key at all)."""
    placement = placement_values(spec.backend, backend)
    autoscaling = autoscaling_values(spec.autoscaling, backend)
    return {
        "workflow": {
            "name": request.name,
            "namespace": request.namespace,
            "ref": spec.workflow.ref,
            "version": request.version,
            "registry": spec.workflow.registry,
            "digest": request.recipe_digest,
            "specFingerprint": request.spec_fingerprint,
            "releaseId": request.release_id,
            "trafficPercent": request.traffic_percent,
            **canary_header_values(request.canary_header),
            **({"shadowPercent": request.shadow_percent} if request.shadow_percent else {}),
        },
        "track": request.track,
        "image": image_values(image),
        "runner": {"port": 8080},
        **placement,
        **pool_replicas(request, backend, {"min": spec.replicas.min, "max": spec.replicas.max or spec.replicas.min}),
        "autoscaling": autoscaling,
        "resources": resources or {},
        "service": {"port": 80},
        "recipeFetch": recipe_fetch_values(request, spec, registry_options, credentials_secret),
        **(tracing or {}),
    }


def tracing_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """The workflow-runner chart's `tracing` block from plnt's own environment (the worker's OTEL_*,
    set by the plnt chart's tracing.*): only telemetry.RUNNER_ENV_NAMES, the list the local driver
    passes to its runners (never OTEL_EXPORTER_OTLP_HEADERS, client keys or certificates: recipe code
    runs in the pod), with OTEL_SERVICE_NAME plnt-runner (the worker's own is plnt-worker). `{}` when
    `environ` asks for no traces: the values, and so the pods, stay exactly as without tracing."""
    if not telemetry.wanted(environ):
        return {}
    env = {name: value for name, value in environ.items() if name in telemetry.RUNNER_ENV_NAMES}
    env["OTEL_SERVICE_NAME"] = RUNNER_SERVICE_NAME
    return {"tracing": {"env": dict(sorted(env.items()))}}


def recipe_fetch_values(request: InstallRequest, spec: WorkflowRunSpec, options: RegistryOptions,
                        credentials_secret: str) -> dict[str, Any]:
    """The chart's `recipeFetch` values: what the init container's `plnt recipe fetch` needs."""
    source = spec.workflow
    pod_reachable(source.registry, "spec.workflow.registry", "runner pod", "recipe",
                  f"WorkflowRuns on backend {spec.backend.cluster!r}")
    return {
        **trust_values(request.trust, source.name, "spec.workflow.ref", "recipe", "runner pod"),
        **registry_values(options, credentials_secret),
        "maxDownloadMB": -(-options.max_download_bytes // 2**20),  # whole MiB, rounded up
    }


def model_resources(spec: ModelDeploymentSpec) -> dict[str, Any] | None:
    """Kubernetes requests and limits from spec.runtime.resources (None: the driver's setting)."""
    wanted = spec.runtime.resources
    if wanted is None:
        return None
    memory = f"{wanted.memory_mi_b}Mi"
    requests: dict[str, Any] = {"memory": memory, **({"cpu": f"{wanted.cpu:g}"} if wanted.cpu else {})}
    return {"requests": requests, "limits": {"memory": memory}}


def render_model_values(
    request: InstallRequest,
    spec: ModelDeploymentSpec,
    backend: PlntBackend,
    image: RunnerImage,
    *,
    resources: dict[str, Any] | None = None,
    registry_options: RegistryOptions = RegistryOptions(),
    credentials_secret: str = "",
    gpu_resource: str | None = None,
) -> dict[str, Any]:
    """The model-server values for one ModelDeployment release: pure, and exactly what `install`
    passes to helm. Everything but the image, the placement and the replicas comes from the request
    (what the saga verified: the root-digest pin, the trust policies, the model file named by the
    signed manifest), checked against the spec it was made from. `image` is plnt's own (the init
    container's `plnt model fetch`); `gpu_resource`: see `gpu_resource_name`."""
    serving = request.model
    if serving is None:
        raise DriverError(f"{request.namespace}/{request.name}: a model-server release needs the request's model")
    source = spec.model
    if (serving.registry, serving.model_name, request.version, request.recipe_digest) != \
            (source.registry, source.name, source.version, source.root_digest):
        raise DriverError(f"{request.namespace}/{request.name}: the install request's weights ({serving.model_name}@"
                          f"{request.version} {request.recipe_digest[:19]} from {serving.registry!r}) are not what "
                          f"the spec pins ({source.name}@{source.version} {source.root_digest[:19]})")
    pod_reachable(source.registry, "spec.model.registry", "model-server pod", "weights",
                  f"ModelDeployments on backend {spec.backend.cluster!r}")
    placement = placement_values(spec.backend, backend)
    placement["gpu"]["resourceName"] = gpu_resource_name(placement["gpu"]["class"], gpu_resource)
    runtime: dict[str, Any] = {"type": serving.runtime, "image": spec.runtime.image or "",
                               "modelFile": serving.model_file, "contextLength": serving.context_length,
                               "args": list(serving.args)}
    if serving.threads is not None:
        runtime["threads"] = serving.threads
    return {
        "deployment": {
            "name": request.name,
            "namespace": request.namespace,
            "specFingerprint": request.spec_fingerprint,
            "releaseId": request.release_id,
            "trafficPercent": request.traffic_percent,
            **canary_header_values(request.canary_header),
            **({"shadowPercent": request.shadow_percent} if request.shadow_percent else {}),
        },
        "track": request.track,
        "model": {"registry": serving.registry, "name": serving.model_name, "version": request.version,
                  "rootDigest": request.recipe_digest},
        "runtime": runtime,
        "image": image_values(image),
        **placement,
        **pool_replicas(request, backend, spec.replicas.min),  # a model server never scales to zero
        "autoscaling": ({"targetInFlight": spec.autoscaling.target_in_flight, "maxReplicas": spec.replicas.max,
                         "scaleDownAfterSeconds": spec.autoscaling.scale_down_after_seconds,
                         **autoscaler_values(backend)}
                        if spec.autoscaling is not None and spec.autoscaling.target_in_flight is not None else {}),
        "resources": resources or {},
        "service": {"port": MODEL_PORT},
        "weights": {
            **trust_values(request.trust, source.name, "spec.model", "model", "model-server pod"),
            **registry_values(registry_options, credentials_secret),
        },
    }


def pool_replicas(request: InstallRequest, backend: PlntBackend, replicas: Any) -> dict[str, Any]:
    """`replicas` as the spec gives them (`replicas` of the chart's shape), or for a pool's release on
    this backend (`request.placement`) its own count, and the whole `placement` kept in the values:
    the cluster is the record a promotion, a re-placement or a restarted plnt reads back. A pool's
    canary runs one pod (on the first placed backend); a pool's HPA floor and ceiling are the placed
    count (plnt's placement decides where replicas go, not each backend's HPA)."""
    if request.placement is None:
        return {"replicas": replicas}
    count = 1 if request.track == "canary" else request.placement.get(backend.metadata.name, 0)
    if count < 1:
        raise DriverError(f"{request.namespace}/{request.name}: the placement {request.placement} puts no "
                          f"{request.track} replica on backend {backend.metadata.name!r}")
    return {"replicas": chart_replicas(replicas, count), "placement": dict(request.placement)}


def chart_replicas(shape: Any, count: int) -> Any:
    """`count` in the chart's shape of `replicas`: a model server's number, a runner's {min, max}."""
    return {"min": count, "max": count} if isinstance(shape, dict) else count


def backend_api_client(target: KubernetesTarget) -> Any:
    """A Kubernetes API client with a backend's own credentials: its kubeconfig and context, else
    plnt's in-cluster service account (what its helm calls use)."""
    from kubernetes import client as k8s
    from kubernetes import config

    if target.kubeconfig or target.context:
        return config.new_client_from_config(config_file=target.kubeconfig, context=target.context)
    configuration = k8s.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return k8s.ApiClient(configuration)


def gpu_resource_name(gpu_class: str, configured: str | None = None) -> str:
    """The model-server chart's `gpu.resourceName`: `configured` when the driver is given one; else
    empty (the chart counts GPUs in the class itself) when the class is a device plugin's resource
    name (DEVICE_PLUGIN_RESOURCES, nvidia.com/mig-*); else nvidia.com/gpu, which makes the class the
    GPU pool's node label: what a gpuClass means for a runner on the same backend (the workflow-runner
    chart), so `nvidia.com/h100` selects the H100 nodes instead of asking for a resource no device
    plugin advertises."""
    if configured is not None:
        return configured
    if not gpu_class or gpu_class in DEVICE_PLUGIN_RESOURCES or gpu_class.startswith("nvidia.com/mig-"):
        return ""
    return "nvidia.com/gpu"


def runner_step_timeouts(timeouts: StepTimeouts, install_timeout_s: float) -> StepTimeouts:
    """The saga's step timeouts for a WorkflowRun: install_release, promote_release and remove_release
    at least `install_timeout_s` (helm's --wait of a runner release, and of an uninstall) plus
    RUNNER_STEP_MARGIN_S. With the default (150 s) they stay as they are (180 s)."""
    floor = install_timeout_s + RUNNER_STEP_MARGIN_S
    return timeouts.model_copy(update={step: max(timeouts.of(step), floor)
                                       for step in ("install_release", "promote_release", "remove_release")})


def model_step_timeouts(timeouts: StepTimeouts, model_timeout_s: float) -> StepTimeouts:
    """The saga's step timeouts for a ModelDeployment: install_release and promote_release at least
    `model_timeout_s` (the helm --wait of a model release: weights fetch and server start) plus
    MODEL_STEP_MARGIN_S; the other steps as they are."""
    floor = model_timeout_s + MODEL_STEP_MARGIN_S
    return timeouts.model_copy(update={step: max(timeouts.of(step), floor) for step in ("install_release", "promote_release")})


def image_values(image: RunnerImage) -> dict[str, str]:
    return {"repository": image.repository, "tag": image.tag, "pullPolicy": image.pull_policy}


def autoscaling_values(scaling: Autoscaling | None, backend: PlntBackend) -> dict[str, Any]:
    """The workflow-runner chart's `autoscaling` values: each target the spec sets (none: no
    autoscaling) and what the backend's cluster scales with (autoscaler_values)."""
    if scaling is None:
        return {}
    targets = {"targetInFlight": scaling.target_in_flight,
               "targetInvocationsPerSecond": scaling.target_invocations_per_second}
    return {**{key: value for key, value in targets.items() if value is not None},
            "scaleDownAfterSeconds": scaling.scale_down_after_seconds, **autoscaler_values(backend)}


def autoscaler_values(backend: PlntBackend) -> dict[str, Any]:
    """Both charts' `autoscaling.autoscaler` and `autoscaling.prometheusAddress`, from the backend's
    `kubernetes.autoscaler`: nothing for `hpa` (the charts' default: their HPA on Pods metrics, and a
    release's values exactly as before KEDA was an option); `keda` with its Prometheus, for which the
    charts render a KEDA ScaledObject instead of the HPA."""
    target = backend.spec.kubernetes
    if target is None or target.autoscaler.kind == "hpa":
        return {}
    return {"autoscaler": "keda", "prometheusAddress": target.autoscaler.prometheus_address}


def placement_values(placement: BackendPlacement, backend: PlntBackend) -> dict[str, Any]:
    """`gpu`, `nodeSelector` and `tolerations` of both charts: the backend's defaults first, the spec's
    own choices win (tolerations of both, without duplicates); the GPU class label is the chart's."""
    gpu_class = placement.gpu_class or ""
    if gpu_class and not _LABEL_KEY.match(gpu_class):
        raise InvalidSpec(
            f"spec.backend.gpuClass: {gpu_class!r} must be a Kubernetes label key (the GPU pool's nodes "
            f"carry it as `{gpu_class}: \"true\"`), e.g. nvidia.com/h100"
        )
    tolerations: list[dict[str, Any]] = []
    for toleration in [*backend.spec.tolerations, *placement.tolerations]:
        entry = toleration.model_dump(mode="json", exclude_none=True)
        if entry not in tolerations:
            tolerations.append(entry)
    return {
        "gpu": {"class": gpu_class, "count": placement.gpu_count},
        "nodeSelector": {**backend.spec.node_selector, **placement.node_selector},
        "tolerations": tolerations,
    }


def pod_reachable(registry: str, field: str, pod: str, kind: str, who: str) -> None:
    """A pod sees neither plnt's spec repository nor plnt's disk: a `file:` registry is InvalidSpec."""
    if registry.startswith("file:"):
        raise InvalidSpec(f"{field}: {registry!r} cannot be reached from a Kubernetes {pod}, which fetches and "
                          f"verifies its {kind} itself; publish the {kind} to an s3:// or oci:// registry for {who}")


def trust_values(trust: RecipeTrust, name: str, field: str, kind: str, pod: str) -> dict[str, Any]:
    """`policies` and `trustedRoots` for a pod's own fetch: the policies the saga verified `name` with
    that cover it (what `plnt recipe fetch` / `plnt model fetch` apply) and each trusted root they name."""
    covering = policies_for(name, trust.policies)
    if not covering:
        raise InvalidSpec(
            f"{field}: no RecipeTrustPolicy covering {kind} {name!r} came with the install; the {pod} verifies the "
            f"signature itself and needs the policies the saga verified it with")
    roots: dict[str, str] = {}
    for policy in covering:
        path = policy.spec.trust_root.trusted_root_file
        if path is None:
            continue
        if path not in trust.trusted_roots:
            raise InvalidSpec(f"RecipeTrustPolicy {policy.metadata.name}: spec.trustRoot.trustedRootFile {path!r} was "
                              f"not read from the commit; the {pod} cannot verify the {kind} without it")
        roots[path] = trust.trusted_roots[path]
    documents = [p.model_dump(mode="json", by_alias=True, exclude_none=True) for p in covering]
    return {"policies": yaml.safe_dump_all(documents, sort_keys=True), "trustedRoots": roots}


def registry_values(options: RegistryOptions, credentials_secret: str) -> dict[str, Any]:
    """plnt's own registry settings for a pod's fetch; credentials only as the name of a Secret."""
    return {
        "s3": {"endpointUrl": options.s3_endpoint_url or "", "region": options.s3_region or ""},
        "ociInsecureHosts": list(options.allow_insecure_http),
        "credentialsSecret": credentials_secret,
    }


# --- running helm ------------------------------------------------------------------------------

HelmRunner = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


def wait_seconds(args: Sequence[str], default: float) -> float:
    """The `--timeout Ns` helm is given in `args` (what it waits at most), else `default`."""
    if "--timeout" in args[:-1]:
        value = args[list(args).index("--timeout") + 1]
        if value.endswith("s") and value[:-1].isdigit():
            return float(value[:-1])
    return default


def helm_runner(helm: str, timeout_s: float) -> HelmRunner:
    """The driver's default runner: the real helm, killed HELM_EXIT_MARGIN_S after the --timeout it was
    given (`timeout_s` for calls without one)."""
    return lambda args: run_helm(args, helm=helm, timeout_s=wait_seconds(args, timeout_s) + HELM_EXIT_MARGIN_S)


def run_helm(args: Sequence[str], *, helm: str = "helm", timeout_s: float | None = None) -> subprocess.CompletedProcess[str]:
    """Run `helm ARGS`: the driver's only subprocess call (tests pass their own runner instead)."""
    try:
        return subprocess.run([helm, *args], capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=timeout_s, check=False)
    except FileNotFoundError as exc:
        raise HelmConfigError(f"no helm binary at {helm!r}: install helm 3.13+ (tools/install_helm.sh in this repo)") from exc
    except subprocess.TimeoutExpired as exc:
        # subprocess.run killed helm; the release may be left pending-*, which the next install recovers.
        raise DriverError(f"helm {args[0] if args else ''} did not finish within {timeout_s:.0f}s") from exc


def error_line(stderr: str, limit: int = 600) -> str:
    """Helm's error (from the last `Error:` line on; helm 4 spreads template and schema errors over
    several lines) on one line, else the last non-empty line: never whole logs."""
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    starts = [index for index, line in enumerate(lines) if line.startswith("Error:")]
    if starts:
        lines = lines[starts[-1]:]
        lines[0] = lines[0][len("Error:"):].strip()
        lines = [line for line in lines if not line.startswith("Use --debug flag")]
    elif lines:
        lines = lines[-1:]
    return _clip(" ".join(lines) or "(no output)", limit)


def _clip(message: str, limit: int) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."


def classify(command: str, release: str, stderr: str, backend: str | None = None) -> PlntError:
    """Map a failed helm command to the error whose type says what happens next."""
    message = error_line(stderr)
    text = stderr.lower()
    where = f"helm {command} {release}: {message}"
    # The cluster refuses who we are, or we refuse the cluster: retrying cannot help; the backend's
    # kubeconfig (or the credentials it names) needs fixing.
    if re.search(r"x509: |certificate has expired|the server has asked for the client to provide credentials"
                 r"|\bunauthorized\b|exec plugin: invalid apiversion|getting credentials: exec", text):
        named = f"backend {backend!r}: " if backend else ""
        return HelmConfigError(f"{named}{where} (the cluster's certificate or plnt's credentials for it are refused: "
                               "check the kubeconfig this backend names)")
    if "another operation (install/upgrade/rollback) is in progress" in text:
        return _InProgress(where)
    # Schema violations, template failures (helm 3: `template: F:L:C: executing`, helm 4: `F:L:C
    # executing "F" at <...>`), and manifests the API server refuses as invalid.
    if re.search(r"values don't meet the specifications of the schema|execution error at|executing \"|template: \S+:\d+"
                 r"|parse error|error converting yaml to json|unable to build kubernetes objects|field is immutable"
                 r"| is invalid: |error validating data", text):
        return HelmChartError(where)
    if "release: not found" in text or re.search(r"release \S+ not found|release not loaded", text):
        return _NotFound(where)
    if re.search(r'context "[^"]*" does not exist|stat .*: no such file or directory|invalid configuration'
                 r'|no configuration has been provided', text):
        return HelmConfigError(where)
    if re.search(r"\bforbidden\b|invalid ownership metadata|cannot be imported into the current release"
                 r'|namespaces "[^"]+" not found|^error: path "[^"]*" not found', text, re.MULTILINE):
        return HelmConfigError(where)
    # The API server is away (refused, unreachable) or cannot reach its storage: an outage to wait out.
    if re.search(r"kubernetes cluster unreachable|connect: connection refused|etcdserver: |"
                 r"the server was unable to return a response|the server is currently unable to handle the request",
                 text):
        return ClusterUnavailable(where)
    # TLS/i-o timeouts, wait timeouts, throttling, and anything unknown: may pass on a later attempt.
    return DriverError(where)


# --- parsing helm's JSON ---------------------------------------------------------------------


@dataclass(frozen=True)
class HelmStatus:
    """The parts of `helm status -o json` (a release record) the driver uses."""

    name: str
    namespace: str
    revision: int
    status: str
    config: dict[str, Any]
    last_deployed: datetime | None

    @property
    def pending(self) -> bool:
        return self.status in PENDING


@dataclass(frozen=True)
class HelmListEntry:
    name: str
    namespace: str
    revision: int
    status: str
    chart: str
    app_version: str
    updated: str = ""  # when this revision was made: a release uninstalled and installed again restarts at 1


# Statuses of a release whose revision before still serves behind its Service (helm lists the new one).
SERVING_WHILE_PENDING = frozenset({"pending-upgrade", "pending-rollback"})


@dataclass(frozen=True)
class HelmRevision:
    revision: int
    status: str
    chart: str
    description: str


def parse_time(value: Any) -> datetime | None:
    """Go's RFC 3339 time with nanoseconds (`2025-11-29T21:52:30.285454174Z`) as an aware datetime."""
    if not isinstance(value, str) or not value:
        return None
    match = re.match(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:\d{2})$", value)
    if not match:
        return None
    fraction = (match.group(2) or ".0")[:7]  # Python keeps microseconds
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(f"{match.group(1)}{fraction}{zone}")


def parse_status(stdout: str) -> HelmStatus:
    data = json.loads(stdout)
    info = data.get("info") or {}
    return HelmStatus(
        name=data["name"],
        namespace=data.get("namespace", ""),
        revision=int(data.get("version", 0)),
        status=str(info.get("status", "unknown")),
        config=data.get("config") or {},
        last_deployed=parse_time(info.get("last_deployed")) or parse_time(info.get("first_deployed")),
    )


def parse_list(stdout: str) -> list[HelmListEntry]:
    # `helm list -o json` prints revision as a string; an empty list is `[]`.
    return [
        HelmListEntry(name=item["name"], namespace=item.get("namespace", ""), revision=int(item.get("revision", 0)),
                      status=item.get("status", "unknown"), chart=item.get("chart", ""),
                      app_version=item.get("app_version", ""), updated=str(item.get("updated", "")))
        for item in (json.loads(stdout or "[]") or [])
    ]


def parse_history(stdout: str) -> list[HelmRevision]:
    return [
        HelmRevision(revision=int(item["revision"]), status=item.get("status", "unknown"), chart=item.get("chart", ""),
                     description=item.get("description", ""))
        for item in (json.loads(stdout or "[]") or [])
    ]


def parse_values(stdout: str) -> dict[str, Any]:
    # `helm get values -o json` prints `null` for a release installed without values.
    return json.loads(stdout or "null") or {}


def chart_version(chart: str) -> str | None:
    """`name-version` of a chart directory (as `helm list` prints it), or None for a remote chart."""
    path = Path(chart) / "Chart.yaml"
    if not path.is_file():
        return None
    meta = yaml.safe_load(path.read_text())
    return f"{meta['name']}-{meta['version']}"


# --- the spec seam ---------------------------------------------------------------------------

AnySpec = WorkflowRunSpec | ModelDeploymentSpec
# (namespace, name, spec fingerprint) -> the WorkflowRun or ModelDeployment spec with that fingerprint, or None.
SpecLookup = Callable[[str, str, str], "AnySpec | None"]
CanaryLeaving = Callable[[Release, Release], Awaitable[None]]  # (the promoted stable, the canary about to go)


@dataclass
class SpecCache:
    """A SpecLookup the reconciler fills with every WorkflowRun and ModelDeployment it starts a saga for."""

    _specs: dict[tuple[str, str, str], AnySpec] = field(default_factory=dict)

    def remember(self, run: Deployable) -> None:
        self._specs[(run.metadata.namespace, run.metadata.name, run.fingerprint())] = run.spec

    def __call__(self, namespace: str, name: str, fingerprint: str) -> AnySpec | None:
        return self._specs.get((namespace, name, fingerprint))


# --- the driver ------------------------------------------------------------------------------


class HelmDriver:
    def __init__(
        self,
        backend: PlntBackend,
        specs: SpecLookup,
        *,
        chart: str = DEFAULT_CHART,
        model_chart: str = DEFAULT_MODEL_CHART,
        image: RunnerImage | None = None,
        resources: dict[str, Any] | None = None,
        model_resources: dict[str, Any] | None = None,
        gpu_resource: str | None = None,
        registry_options: RegistryOptions = RegistryOptions(),
        credentials_secret: str = "",
        helm: str = "helm",
        timeout_s: float = 150.0,  # under the saga's 3-minute install/promote/remove activity timeouts
        model_timeout_s: float = 1800.0,  # model releases: see model_step_timeouts
        stuck_after_s: float | None = None,
        runner: HelmRunner | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        environ: Mapping[str, str] | None = None,
        serving_timeout_s: float | None = None,
        unavailable_wait_s: float = 0.0,
    ) -> None:
        """`chart` renders WorkflowRuns' releases, `model_chart` ModelDeployments'; `resources` and
        `model_resources` are their servers' cpu/memory; `gpu_resource`: see `gpu_resource_name`.
        `timeout_s` is helm's --timeout for runner releases and every uninstall, `model_timeout_s` for
        the upgrades and rollbacks of model-server releases (their pods fetch weights, then load them).
        `environ` (default: this process's) is read once for the runner pods' tracing (`tracing_values`).
        `serving_timeout_s`: an installed or promoted release counts only once its Service answers as
        that release within this many seconds (serving.py; plnt's composition gives the setting
        `kubernetes.serving_timeout_s`); None: helm's --wait alone, for a caller that cannot reach the
        Services. `unavailable_wait_s`: how long an install, promotion or removal is tried again while
        the cluster is unavailable (ClusterUnavailable; the setting `kubernetes.unavailable_wait_s`)."""
        if backend.spec.type != "kubernetes" or backend.spec.kubernetes is None:
            raise UnknownBackend(f"backend {backend.metadata.name!r} is of type {backend.spec.type}; "
                                 "the Helm driver needs type: kubernetes")
        self._backend = backend
        self._target = backend.spec.kubernetes
        self._specs = specs
        self._charts = {"workflow": (chart, chart_version(chart)), "deployment": (model_chart, chart_version(model_chart))}
        self._image = image or RunnerImage()
        self._resources = resources
        self._model_resources = model_resources
        self._gpu_resource = gpu_resource
        self._registry_options = registry_options
        self._credentials_secret = credentials_secret
        self._timeouts = {"workflow": timeout_s, "deployment": model_timeout_s}
        # A pending release younger than this may belong to a helm that is still running (the saga's
        # step timeout does not stop a helm the activity started).
        self._stuck_after = {key: stuck_after_s if stuck_after_s is not None else wait + 120.0
                             for key, wait in self._timeouts.items()}
        self._run = runner or helm_runner(helm, timeout_s)
        self._clock = clock
        self._serving_timeout_s = serving_timeout_s
        self._unavailable_wait_s = unavailable_wait_s
        self._locks: dict[str, asyncio.Lock] = {}
        self._tracing = tracing_values(os.environ if environ is None else environ)
        # (release, revision, updated) -> its values. `updated` too: a canary uninstalled and installed again
        # is revision 1 again, and a worker (whose reads are a saga's steps only) read the old one's values.
        self._live_values: dict[tuple[str, int, str], dict[str, Any]] = {}
        self._values_reads: dict[tuple[str, int], asyncio.Future[dict[str, Any]]] = {}  # reads in flight

    @property
    def namespace(self) -> str:
        return self._target.namespace

    def endpoint(self, release: str) -> str:
        return f"http://{release}.{self.namespace}.svc.{self._target.cluster_domain}"

    # --- the driver interface ---------------------------------------------------------------

    async def install(self, request: InstallRequest) -> Release:
        return await self._waiting_out_outages(f"install {request.namespace}/{request.name} ({request.track})",
                                               lambda: self._install(request))

    async def promote(self, namespace: str, name: str, *, canary_leaving: CanaryLeaving | None = None) -> Release:
        """The canary's values as the stable release, then the canary uninstalled; `canary_leaving`
        (the promoted stable, the canary) runs in between, once the stable serves: the routes let go
        of the canary there before its pods go."""
        return await self._waiting_out_outages(f"promote {namespace}/{name}",
                                               lambda: self._promote(namespace, name, canary_leaving))

    async def set_traffic(self, namespace: str, name: str, percent: int, *,
                          canary_header: tuple[str, str] | None) -> Release:
        return await self._waiting_out_outages(f"set traffic {namespace}/{name} to {percent}%",
                                               lambda: self._set_traffic(namespace, name, percent, canary_header))

    async def remove(self, namespace: str, name: str, track: Track) -> None:
        await self._waiting_out_outages(f"remove {namespace}/{name} ({track})",
                                        lambda: self._remove(namespace, name, track))

    async def set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        return await self._waiting_out_outages(f"scale {namespace}/{name} to {replicas}",
                                               lambda: self._set_replicas(namespace, name, replicas))

    async def _set_replicas(self, namespace: str, name: str, replicas: int) -> Release:
        """The stable release upgraded with its own values but the replica count (the Deployment's
        `replicas`, or with an HPA its floor, its ceiling raised to the floor when below): the same
        pods, more or fewer of them."""
        stable = release_name(name, "stable")
        async with self._lock(namespace, name):
            values = await self._deployed_values(stable, namespace, name, "stable",
                                                 f"no deployed stable release to scale to {replicas} replicas")
            if _owner_key(values) == "deployment":
                changed = values.get("replicas") != replicas
                values["replicas"] = replicas
                scaling = values.get("autoscaling") or {}
                if scaling.get("targetInFlight") and int(scaling.get("maxReplicas") or 0) < replicas:
                    # (the model-server chart refuses a ceiling below the floor)
                    scaling["maxReplicas"] = replicas
                    changed = True
            else:
                counts = values.setdefault("replicas", {})
                high = max(replicas, int(counts.get("max") or replicas))
                changed = (counts.get("min"), counts.get("max")) != (replicas, high)
                counts.update({"min": replicas, "max": high})
            if changed:
                await self._upgrade(stable, values)
            return self._release(stable, values)

    async def place(self, values_of_pool: dict[str, Any], placement: dict[str, int]) -> Release:
        """A pool's stable release on this backend: the release whose values (read from any backend of
        the pool: its canary on promotion, a stable on a re-placement) are `values_of_pool`, as the
        stable track with this backend's count of `placement` and this backend's own node placement.
        Installed or upgraded (helm --wait), or left as it is when it already runs exactly so."""
        return await self._waiting_out_outages(f"place {_owner_of(values_of_pool)} on {self._backend.metadata.name}",
                                               lambda: self._place(values_of_pool, placement))

    async def _place(self, values_of_pool: dict[str, Any], placement: dict[str, int]) -> Release:
        key = _owner_key(values_of_pool)
        owner = values_of_pool[key]
        namespace, name = owner["namespace"], owner["name"]
        spec = self._specs(namespace, name, owner["specFingerprint"])
        if spec is None or not spec.backend.pooled:
            raise DriverError(f"{namespace}/{name}: no pool's spec with fingerprint {owner['specFingerprint'][:19]} is "
                              "known to the Helm driver (yet)")
        count = placement.get(self._backend.metadata.name, 0)
        if count < 1:
            raise DriverError(f"{namespace}/{name}: the placement {placement} puts no replica on backend "
                              f"{self._backend.metadata.name!r}")
        values = json.loads(json.dumps(values_of_pool))
        values["track"] = "stable"
        values[key]["trafficPercent"] = 0
        for cohort in ("canaryHeader", "shadowPercent"):
            values[key].pop(cohort, None)
        values.update(placement_values(spec.backend, self._backend))  # this backend's nodes, not the canary's
        if key == "deployment":
            values["gpu"]["resourceName"] = gpu_resource_name(values["gpu"]["class"], self._gpu_resource)
        values["replicas"] = chart_replicas(values_of_pool["replicas"], count)
        values["placement"] = dict(placement)
        stable = release_name(name, "stable")
        async with self._lock(namespace, name):
            await self._stable_as(stable, namespace, name, values)
            return await self._serving(self._release(stable, values))

    async def _stable_as(self, stable: str, namespace: str, name: str, values: dict[str, Any]) -> None:
        """The stable release deployed with `values` (upgraded, a stuck one recovered first), or left as
        it is when it already runs them with this driver's chart. Under the WorkflowRun's lock."""
        current = await self.status(stable)
        if current is not None:
            self._check_owner(stable, current.config, namespace, name, "stable")
            if current.pending:
                await self.recover_stuck(stable, current)
        if not (current is not None and current.status == "deployed" and current.config == values
                and await self._same_chart(stable, values)):
            await self._upgrade(stable, values)

    async def track_values(self, namespace: str, name: str, track: Track) -> dict[str, Any] | None:
        """The values of this WorkflowRun's (or ModelDeployment's) deployed release of `track` here, or
        None when it has none deployed (a release of another owner: HelmConfigError)."""
        release = release_name(name, track)
        current = await self.status(release)
        if current is None or current.status != "deployed":
            return None
        self._check_owner(release, current.config, namespace, name, track)
        return current.config

    def release_of(self, namespace: str, name: str, track: Track, values: dict[str, Any]) -> Release:
        """The Release of this WorkflowRun's `track` release here, deployed with `values`."""
        return self._release(release_name(name, track), values)

    async def _install(self, request: InstallRequest) -> Release:
        release = release_name(request.name, request.track)
        values = self._values(request)
        async with self._lock(request.namespace, request.name):
            current = await self.status(release)
            if current is not None:
                self._check_owner(release, current.config, request.namespace, request.name, request.track)
                if current.status == "deployed" and current.config == values and await self._same_chart(release, values):
                    log.info("helm-install-skipped release=%s (deployed with identical values)", release)
                    return await self._serving(self._release(release, values))
                if current.pending:
                    await self.recover_stuck(release, current)
            await self._upgrade(release, values)
            return await self._serving(self._release(release, values))

    async def _set_traffic(self, namespace: str, name: str, percent: int,
                           canary_header: tuple[str, str] | None) -> Release:
        """The canary release upgraded with its own values but the share and the cohort: the charts'
        templates read neither `trafficPercent` nor `canaryHeader` (no pod changes, so the default step
        timeout holds); the gateway reads them from the release's values."""
        canary = release_name(name, "canary")
        async with self._lock(namespace, name):
            values = await self._deployed_values(canary, namespace, name, "canary",
                                                 f"no deployed canary to give {percent}% of the traffic")
            owner = values[_owner_key(values)]
            if owner.get("trafficPercent") != percent or _canary_header(owner) != canary_header:
                owner["trafficPercent"] = percent
                owner.pop("canaryHeader", None)
                owner.update(canary_header_values(canary_header))
                await self._upgrade(canary, values)
            return self._release(canary, values)

    async def _promote(self, namespace: str, name: str, canary_leaving: CanaryLeaving | None = None) -> Release:
        stable, canary = release_name(name, "stable"), release_name(name, "canary")
        async with self._lock(namespace, name):
            canary_status = await self.status(canary)
            if canary_status is None:
                stable_status = await self.status(stable)
                if stable_status is not None and stable_status.status == "deployed":
                    self._check_owner(stable, stable_status.config, namespace, name, "stable")
                    return self._release(stable, stable_status.config)  # promoted already: a retry finds its work
                raise DriverError(f"{namespace}/{name}: no canary to promote")
            self._check_owner(canary, canary_status.config, namespace, name, "canary")
            if canary_status.status != "deployed":
                raise DriverError(f"{namespace}/{name}: canary {canary} is {canary_status.status}, not deployed")
            # The exact values the canary was verified with, as the stable track.
            values = json.loads(json.dumps(canary_status.config))
            values["track"] = "stable"
            values[_owner_key(values)]["trafficPercent"] = 0
            await self._stable_as(stable, namespace, name, values)
            promoted = await self._serving(self._release(stable, values))  # before the canary's Service goes
            if canary_leaving is not None:
                await canary_leaving(promoted, self._release(canary, canary_status.config))
            await self._uninstall(canary)
            return promoted

    async def _remove(self, namespace: str, name: str, track: Track) -> None:
        release = release_name(name, track)
        async with self._lock(namespace, name):
            current = await self.status(release)
            if current is None:
                return
            self._check_owner(release, current.config, namespace, name, track)
            await self._uninstall(release)

    async def live(self) -> dict[str, LiveWorkflow]:
        """plnt's deployed releases in the backend's namespace (found by their Helm release label).

        Raises LiveStateUnknown when helm cannot read them (cluster unreachable, RBAC, a release whose
        values cannot be read): an empty answer would read as "every release is gone"."""
        try:
            return await self._live()
        except (PlntError, ValueError) as exc:  # ValueError: helm printed something that is not its JSON
            raise LiveStateUnknown(
                f"backend {self._backend.metadata.name!r} (namespace {self.namespace}): Helm's live state cannot be "
                f"read: {exc}; check the cluster is reachable and the kubeconfig's credentials may list releases "
                f"and read secrets there"
            ) from exc

    async def _live(self) -> dict[str, LiveWorkflow]:
        result = await self._helm(
            ["list", *self._target_flags(), "--selector", "=".join(MANAGED_LABEL), "--max", str(LIST_MAX),
             "-o", "json"], release="")
        found: dict[str, LiveWorkflow] = {}
        entries = parse_list(result.stdout)
        listed = {(entry.name, entry.revision, entry.updated) for entry in entries}
        for entry in entries:
            revision, updated = entry.revision, entry.updated
            if entry.status in SERVING_WHILE_PENDING and entry.revision > 1:
                # An upgrade under way (a worker's promotion or scale, with the roles apart): until the new
                # pods are ready the Service serves those of the revision before, which is what runs. (Read
                # as not live, the reconciler's routes lost the stable for the upgrade: 503s.)
                revision, updated = entry.revision - 1, ""
                listed.add((entry.name, revision, updated))
            elif entry.status != "deployed":
                # pending-install: an install in flight or stuck (the next install recovers it); failed:
                # the next install upgrades over it, and remove() uninstalls it whatever its status.
                log.warning("helm-release-not-live release=%s status=%s", entry.name, entry.status)
                continue
            try:
                values = await self._revision_values(entry.name, revision, updated)
            except _NotFound:
                continue  # uninstalled between list and get
            try:
                release = self._release(entry.name, values)
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("helm-release-unreadable release=%s error=%s", entry.name, exc)
                continue
            key = f"{release.namespace}/{release.name}"
            live = found.get(key) or LiveWorkflow(namespace=release.namespace, name=release.name)
            found[key] = live.model_copy(update={release.track: release})
        # Revisions no longer listed (superseded, uninstalled) are forgotten.
        self._live_values = {key: v for key, v in self._live_values.items() if key in listed}
        return found

    async def _revision_values(self, release: str, revision: int, updated: str) -> dict[str, Any]:
        """A revision's values never change: read once, so an idle pass costs one `helm list`, not a
        `get values` per release; and once only when a pass and a saga step read it at the same time."""
        key = (release, revision, updated)
        if (known := self._live_values.get(key)) is not None:
            return known
        reading = self._values_reads.get(key)
        if reading is None:
            reading = self._values_reads[key] = asyncio.ensure_future(self.values(release, revision=revision))
            reading.add_done_callback(lambda _done: self._values_reads.pop(key, None))
        values = await asyncio.shield(reading)
        self._live_values[key] = values
        return values

    # --- helm operations ---------------------------------------------------------------------

    async def status(self, release: str) -> HelmStatus | None:
        try:
            result = await self._helm(["status", release, *self._target_flags(), "-o", "json"], release=release)
        except _NotFound:
            return None
        return parse_status(result.stdout)

    async def values(self, release: str, revision: int | None = None) -> dict[str, Any]:
        pinned = ["--revision", str(revision)] if revision is not None else []
        result = await self._helm(["get", "values", release, *pinned, *self._target_flags(), "-o", "json"],
                                  release=release)
        return parse_values(result.stdout)

    async def recover_stuck(self, release: str, status: HelmStatus | None = None) -> None:
        """Unstick a release a dead helm left pending-*: roll back to its last good revision, or
        uninstall it if it never had one. A young pending release is a live operation: DriverError."""
        status = status or await self.status(release)
        if status is None or not status.pending:
            return
        key = _owner_key(status.config)
        if status.last_deployed is not None:
            age = (self._clock() - status.last_deployed).total_seconds()
            if age < self._stuck_after[key]:
                raise DriverError(f"helm release {release} is {status.status} since {age:.0f}s ago; "
                                  f"treated as stuck after {self._stuck_after[key]:.0f}s")
        result = await self._helm(["history", release, *self._target_flags(), "--max", "256", "-o", "json"],
                                  release=release)
        good = [rev.revision for rev in parse_history(result.stdout)
                if rev.status in GOOD and rev.revision != status.revision]
        if good:
            target = max(good)
            log.warning("helm-recover release=%s status=%s action=rollback to_revision=%s", release, status.status, target)
            await self._helm(["rollback", release, str(target), *self._target_flags(), "--wait",
                              "--timeout", self._timeout(key), "--history-max", "10"], release=release)
        else:
            log.warning("helm-recover release=%s status=%s action=uninstall (no good revision)", release, status.status)
            await self._uninstall(release)

    async def _upgrade(self, release: str, values: dict[str, Any]) -> None:
        try:
            try:
                await self._upgrade_once(release, values)
            except _InProgress:
                status = await self.status(release)
                if status is None or not status.pending:
                    raise
                await self.recover_stuck(release, status)
                await self._upgrade_once(release, values)
        except DriverError as exc:
            if not _WAIT_TIMED_OUT.search(str(exc)):
                raise
            why = await asyncio.to_thread(self._why_pods_wait, release)
            raise type(exc)(f"{exc}; {why}" if why else str(exc)) from exc

    def _why_pods_wait(self, release: str) -> str:
        """Why the release's pods are not ready, as the cluster says (the scheduler's reason for a
        Pending pod, e.g. `Insufficient nvidia.com/gpu`; a container's waiting reason): helm's --wait
        only says it timed out. Empty when the pods cannot be read (RBAC, cluster away)."""
        try:
            from kubernetes import client as k8s

            with backend_api_client(self._target) as api:
                pods = k8s.CoreV1Api(api).list_namespaced_pod(
                    self.namespace, label_selector=f"app.kubernetes.io/instance={release}", limit=20,
                    _request_timeout=10).items
        except Exception as exc:  # the explanation is a courtesy: never hide helm's own error behind it
            log.info("helm-wait-reason-unavailable release=%s error=%s", release, type(exc).__name__)
            return ""
        reasons = []
        for pod in pods:
            for condition in pod.status.conditions or []:
                if condition.type == "PodScheduled" and condition.status != "True":
                    reasons.append(f"pod {pod.metadata.name} is not scheduled ({condition.reason}): {condition.message}")
            for container in [*(pod.status.init_container_statuses or []), *(pod.status.container_statuses or [])]:
                waiting = container.state.waiting if container.state else None
                if waiting is not None and waiting.reason not in (None, "PodInitializing", "ContainerCreating"):
                    reasons.append(f"pod {pod.metadata.name} container {container.name}: {waiting.reason}"
                                   + (f": {waiting.message}" if waiting.message else ""))
        return _clip("; ".join(dict.fromkeys(reasons)), 600)

    async def _upgrade_once(self, release: str, values: dict[str, Any]) -> None:
        key = _owner_key(values)
        owner = values[key]
        kind = "workflow" if key == "workflow" else "model-deployment"
        labels = ",".join([
            "=".join(MANAGED_LABEL),
            f"plnt.work/{kind}={owner['name']}",
            f"plnt.work/{kind}-namespace={owner['namespace']}",
            f"plnt.work/track={values['track']}",
        ])
        chart = self._charts[key][0]
        fd, path = tempfile.mkstemp(prefix=f"plnt-values-{release}-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(values, handle, sort_keys=True)
            await self._helm(
                ["upgrade", "--install", release, chart, *self._target_flags(),
                 "--values", path, "--reset-values", "--labels", labels,
                 "--wait", "--timeout", self._timeout(key), "--history-max", "10", "-o", "json"],
                release=release,
            )
        finally:
            Path(path).unlink(missing_ok=True)

    async def _uninstall(self, release: str) -> None:
        self._live_values = {key: v for key, v in self._live_values.items() if key[0] != release}
        try:
            # Pods that stop need no fetch or load: the runners' timeout, whatever the release.
            await self._helm(["uninstall", release, *self._target_flags(), "--wait", "--timeout",
                              self._timeout("workflow"), "--ignore-not-found"], release=release)
        except _NotFound:
            pass  # gone already: what remove() wants

    async def _same_chart(self, release: str, values: dict[str, Any]) -> bool:
        """Whether the release runs this driver's version of the chart `values` are for (unknown for a
        remote chart: no)."""
        version = self._charts[_owner_key(values)][1]
        if version is None:
            return False
        result = await self._helm(["list", *self._target_flags(), "--filter", f"^{re.escape(release)}$", "-o", "json"],
                                  release=release)
        return any(entry.name == release and entry.chart == version for entry in parse_list(result.stdout))

    async def _helm(self, args: list[str], *, release: str) -> subprocess.CompletedProcess[str]:
        result = await asyncio.to_thread(self._run, args)
        if result.returncode != 0:
            raise classify(args[0], release, result.stderr or "", self._backend.metadata.name)
        return result

    async def _waiting_out_outages(self, what: str, step: Callable[[], Awaitable[T]]) -> T:
        """`step` (an install, promotion or removal: each safe to run again from the top), tried again
        while the cluster is unavailable, for at most `unavailable_wait_s`: an API server restarting
        must not fail, and roll back, a good canary. Live reads do not wait (a pass must not stall)."""
        waiting_since: float | None = None
        while True:
            try:
                return await step()
            except ClusterUnavailable as error:
                now = time.monotonic()
                waiting_since = now if waiting_since is None else waiting_since
                if now - waiting_since >= self._unavailable_wait_s:
                    raise
                log.warning("helm-cluster-unavailable backend=%s %s waited=%.0fs: %s; trying again",
                            self._backend.metadata.name, what, now - waiting_since, error)
                await asyncio.sleep(UNAVAILABLE_POLL_S)

    # --- internals ---------------------------------------------------------------------------

    def _target_flags(self) -> list[str]:
        flags = ["--namespace", self._target.namespace]
        if self._target.context:
            flags += ["--kube-context", self._target.context]
        if self._target.kubeconfig:
            flags += ["--kubeconfig", self._target.kubeconfig]
        return flags

    def _timeout(self, key: str) -> str:
        """helm's --timeout for a release whose values' owner block is `key` (see `_owner_key`)."""
        return f"{int(self._timeouts[key])}s"

    def _values(self, request: InstallRequest) -> dict[str, Any]:
        """The values of the request's chart: a model server's for a ModelDeployment, else a runner's."""
        spec = self._spec_for(request)
        if request.model is not None:
            if not isinstance(spec, ModelDeploymentSpec):
                raise DriverError(f"{request.namespace}/{request.name}: a model-server install for a spec that is not "
                                  "a ModelDeployment's")
            return render_model_values(request, spec, self._backend, self._image,
                                       resources=model_resources(spec) or self._model_resources,
                                       registry_options=self._registry_options,
                                       credentials_secret=self._credentials_secret, gpu_resource=self._gpu_resource)
        if not isinstance(spec, WorkflowRunSpec):
            raise DriverError(f"{request.namespace}/{request.name}: a runner install for a spec that is not a "
                              "WorkflowRun's")
        return render_values(request, spec, self._backend, self._image, resources=self._resources,
                             registry_options=self._registry_options, credentials_secret=self._credentials_secret,
                             tracing=self._tracing)

    def _spec_for(self, request: InstallRequest) -> AnySpec:
        spec = self._specs(request.namespace, request.name, request.spec_fingerprint)
        if spec is None:
            raise DriverError(f"{request.namespace}/{request.name}: no spec with fingerprint "
                              f"{request.spec_fingerprint[:19]} is known to the Helm driver (yet)")
        if spec_fingerprint(spec) != request.spec_fingerprint:
            raise DriverError(f"{request.namespace}/{request.name}: the spec lookup returned a spec with another "
                              "fingerprint than the install request's")
        placed_here = spec.backend.pooled and self._backend.metadata.name in (request.placement or {})
        if spec.backend.cluster != self._backend.metadata.name and not placed_here:
            raise UnknownBackend(f"{request.namespace}/{request.name} runs on backend {spec.backend.cluster!r}; this "
                                 f"Helm driver serves {self._backend.metadata.name!r}")
        return spec

    async def _deployed_values(self, release: str, namespace: str, name: str, track: Track, missing: str) -> dict[str, Any]:
        """A copy of the values of `release`, deployed and owned by this WorkflowRun's `track`, to upgrade
        it with; DriverError `missing` when it is not deployed."""
        current = await self.status(release)
        if current is None or current.status != "deployed":
            raise DriverError(f"{namespace}/{name}: {missing}")
        self._check_owner(release, current.config, namespace, name, track)
        return json.loads(json.dumps(current.config))

    def _check_owner(self, release: str, config: dict[str, Any], namespace: str, name: str, track: Track) -> None:
        key = _owner_key(config)
        block = config.get(key) if isinstance(config.get(key), dict) else {}
        owner = (block.get("namespace"), block.get("name"), config.get("track"))
        if owner != (namespace, name, track):
            who = f"{owner[0]}/{owner[1]} ({owner[2]})" if block else "something that is not a plnt runner or model server"
            raise HelmConfigError(
                f"helm release {release} in namespace {self.namespace} belongs to {who}, not {namespace}/{name} "
                f"({track}); WorkflowRun and ModelDeployment names must be unique per Kubernetes backend"
            )

    async def _serving(self, release: Release) -> Release:
        """`release` once its Service answers as it (serving.py), or DriverError (the step is retried)."""
        if self._serving_timeout_s is None:
            return release
        problem = await wait_serving(release, self._serving_timeout_s)
        if problem is not None:
            raise DriverError(
                f"helm release {release_name(release.name, release.track)} in namespace {self.namespace} is deployed "
                f"and its pods are Ready, but {release.endpoint} did not answer as release {release.release_id} within "
                f"{self._serving_timeout_s:g}s ({problem}). plnt's worker, smoke test and gateway must reach the "
                f"backend's Services: run them in the cluster, or set PlntBackend {self._backend.metadata.name!r} "
                "kubernetes.clusterDomain to the domain those Services resolve under where plnt runs, and let plnt's "
                "traffic in through the namespace's NetworkPolicy")
        return release

    def _release(self, release: str, values: dict[str, Any]) -> Release:
        """The Release a deployed release's values describe (a runner's, or a model server's)."""
        port = int(values.get("service", {}).get("port", 80))
        endpoint = self.endpoint(release) + ("" if port == 80 else f":{port}")
        placement = values.get("placement")
        # A pool's release on this backend: the pool's placement, and this backend as where it runs.
        pool = {"placement": dict(placement), "backend": self._backend.metadata.name} if placement else {}
        if _owner_key(values) == "deployment":
            deployment, model, runtime = values["deployment"], values["model"], values["runtime"]
            return Release(
                release_id=deployment["releaseId"],
                namespace=deployment["namespace"],
                name=deployment["name"],
                track=values["track"],
                version=model["version"],
                spec_fingerprint=deployment["specFingerprint"],
                recipe_digest=model["rootDigest"],
                recipe_dir=f"{MODELS_DIR_IN_POD}/{model['name']}",
                endpoint=endpoint,
                traffic_percent=int(deployment.get("trafficPercent", 0)),
                canary_header=_canary_header(deployment) if values["track"] == "canary" else None,
                shadow_percent=int(deployment.get("shadowPercent", 0)) if values["track"] == "canary" else 0,
                model=ModelServing(runtime=runtime["type"], model_file=runtime.get("modelFile", ""),
                                   alias=deployment["name"], context_length=int(runtime["contextLength"]),
                                   threads=runtime.get("threads"), args=tuple(runtime.get("args", ())),
                                   registry=model["registry"], model_name=model["name"]),
                replicas=max(1, int(values.get("replicas", 1))),
                **pool,
            )
        workflow = values["workflow"]
        return Release(
            release_id=workflow["releaseId"],
            namespace=workflow["namespace"],
            name=workflow["name"],
            track=values["track"],
            version=workflow["version"],
            spec_fingerprint=workflow["specFingerprint"],
            recipe_digest=workflow["digest"],
            recipe_dir=RECIPE_DIR_IN_POD,
            endpoint=endpoint,
            traffic_percent=int(workflow.get("trafficPercent", 0)),
            canary_header=_canary_header(workflow) if values["track"] == "canary" else None,
            shadow_percent=int(workflow.get("shadowPercent", 0)) if values["track"] == "canary" else 0,
            replicas=max(1, int(values.get("replicas", {}).get("min", 1))),
            **pool,
        )

    def _lock(self, namespace: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault(f"{namespace}/{name}", asyncio.Lock())


def canary_header_values(header: tuple[str, str] | None) -> dict[str, Any]:
    """canary.headerRoute in a release's values (absent when there is none); _canary_header reads it back."""
    return {"canaryHeader": {"name": header[0], "value": header[1]}} if header else {}


def _canary_header(owner: dict[str, Any]) -> tuple[str, str] | None:
    header = owner.get("canaryHeader")
    if isinstance(header, dict) and isinstance(header.get("name"), str) and isinstance(header.get("value"), str):
        return header["name"], header["value"]
    return None


def _owner_of(values: dict[str, Any]) -> str:
    owner = values.get(_owner_key(values)) or {}
    return f"{owner.get('namespace')}/{owner.get('name')}"


def _owner_key(values: dict[str, Any]) -> str:
    """Which block of a release's values names its owner: `deployment` (model-server), else `workflow`."""
    return "deployment" if isinstance(values.get("deployment"), dict) else "workflow"
