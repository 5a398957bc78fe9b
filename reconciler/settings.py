"""Settings: built once at the entry point (the CLI) and passed down; nothing else reads os.environ.

Settings is grouped into sections, one per group of options the CLI declares (reconciler/cli/options.py):
`settings.source`, `.trust`, `.review`, `.temporal`, `.registries`, `.gateway`, `.runners`, `.roles` and
`.kubernetes`; what every part uses (state_dir, host, port, spec_limits) stays at the top.

Code builds Settings by section (`Settings(source=SourceSettings(repo=...), ...)`, or a section as a dict).
The flat names the model had before its sections (`Settings(repo=..., temporal_address=...)`) are still
accepted, for tests and benches: FLAT_NAMES says where each goes, and any other name is an error.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from plnt.core.specs.limits import SpecLimits
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

# An --approvers entry: a forge user name, or ORG/TEAM (GitLab: a group's full path, GROUP/SUB/...).
_APPROVER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)*")

_SECTION = ConfigDict(frozen=True, extra="forbid")


class StepTimeouts(BaseModel):
    """Start-to-close timeout of each attempt of each saga step, in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    validate_: float = Field(default=30, gt=0, alias="validate")
    pull_recipe: float = Field(default=300, gt=0)
    install_release: float = Field(default=180, gt=0)
    smoke_test: float = Field(default=900, gt=0)
    promote_release: float = Field(default=180, gt=0)
    set_canary_traffic: float = Field(default=180, gt=0)
    check_gates: float = Field(default=900, gt=0)
    wait_for_dependencies: float = Field(default=3600, gt=0)
    remove_release: float = Field(default=180, gt=0)

    def of(self, step: str) -> float:
        return float(getattr(self, "validate_" if step == "validate" else step))


class RetrySettings(BaseModel):
    """Retry policy of every saga activity (Temporal RetryPolicy)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_interval_s: float = Field(default=2.0, gt=0, description="first retry after this many seconds")
    backoff: float = Field(default=2.0, ge=1, description="each retry waits this factor longer")
    maximum_interval_s: float = Field(default=30.0, gt=0)
    maximum_attempts: int = Field(default=3, ge=1, description="attempts in all, the first included")
    step_timeouts: StepTimeouts = Field(default_factory=StepTimeouts)


def default_llm_venv() -> Path:
    """`.venv-llm` beside plnt's code (where `make install-llm` puts it)."""
    return Path(__file__).resolve().parents[1] / ".venv-llm"


class SourceSettings(BaseModel):
    """Where the specs come from: the spec repository and how to reach it (--repo, --path, --branch,
    --git-*), or the cluster's custom resources (--source kubernetes); --interval."""

    model_config = _SECTION

    kind: Literal["git", "kubernetes"] = Field(
        default="git", description="git: the spec repository; kubernetes: WorkflowRun and ModelDeployment custom "
        "resources listed from the API server (reconciler/source/kubernetes.py)")
    # repr=False: an https URL may carry a token (GitSource gives it only to git).
    repo: str = Field(default="", description="spec repository: a path, file://, https:// or ssh URL", repr=False)
    path: str = Field(default="", description="subdirectory of the repository holding the specs")
    branch: str = "main"
    interval_s: float = Field(default=5.0, gt=0, description="seconds between polls of the repository")
    git_credentials_file: Path | None = Field(
        default=None, description="https token (TOKEN or USER:TOKEN) or ssh private key for the repository")
    git_known_hosts: Path | None = Field(
        default=None, description="ssh known_hosts for the repository's host (without it: trust on first use)")
    namespaces: tuple[str, ...] = Field(
        default=(), description="kubernetes: the namespaces whose custom resources are read; empty: all of them")
    platform_dir: Path | None = Field(
        default=None, description="kubernetes: the directory of PlntBackends and RecipeTrustPolicies (and the "
        "trusted roots and file: registries they name), the operator's: never read from the cluster")

    @model_validator(mode="after")
    def _one_source(self) -> SourceSettings:
        if self.kind == "git" and not self.repo:
            raise ValueError("--repo is required (or --source kubernetes, to read WorkflowRuns from the cluster)")
        if self.kind == "kubernetes":
            if self.platform_dir is None:
                raise ValueError("--source kubernetes needs --platform-dir DIR: the PlntBackends and "
                                 "RecipeTrustPolicies plnt trusts (never read from the cluster)")
            if self.repo:
                raise ValueError("--source kubernetes reads WorkflowRuns from the cluster: drop --repo "
                                 "(backends and trust policies come from --platform-dir)")
        elif self.namespaces or self.platform_dir is not None:
            raise ValueError("--source-namespace and --platform-dir are for --source kubernetes")
        return self


class TrustSettings(BaseModel):
    """--verify-commits: which commits may deploy, and whose signatures count."""

    model_config = _SECTION

    verify_commits: Literal["none", "head", "all"] = Field(
        default="none", description="deploy only signed commits: the newest (head) or every new one (all)")
    allowed_signers: Path | None = Field(default=None, description="trusted SSH signers, git's allowed-signers format")
    gpg_keys: Path | None = Field(default=None, description="directory of trusted OpenPGP public keys")


class ReviewSettings(BaseModel):
    """Pull-request review as deploy approval (reconciler/review/forge.py): where plnt reads approvals and
    writes each rollout's verdict. The token comes from a file or an env var, never the command line."""

    model_config = _SECTION

    forge: Literal["github", "gitlab", "gitea"] | None = Field(default=None, description="the spec repository's forge")
    forge_api_url: str | None = Field(default=None, description="its REST API, e.g. https://api.github.com")
    forge_project: str | None = Field(default=None, description="OWNER/REPO (GitLab: the project's full path)")
    forge_token: SecretStr | None = Field(default=None, description="forge API token (the CLI reads it)")
    require_approval: bool = Field(
        default=False, description="deploy a commit only if its pull request was approved on its head commit and "
        "the plan digest posted there (plnt review) equals the one computed now")
    approvers: tuple[str, ...] = Field(
        default=(), description="with require_approval: only these users and teams (ORG/TEAM; GitLab: a group's "
        "full path) may approve, if they also have write permission (GitLab: Maintainer); empty: anyone with it")
    code_owners: bool = Field(
        default=False, description="with require_approval: each changed file also needs an approval from one of its "
        "CODEOWNERS owners (the file as it was on the tracked branch before the pull request)")
    report_status: bool = Field(
        default=True, description="with a forge: each rollout's verdict as a commit status plnt/NAMESPACE/NAME")
    write_notes: bool = Field(
        default=False, description="record each rollout's outcome as a git note under refs/notes/plnt and push it")
    previews: tuple[str, ...] = Field(
        default=(), description="ref globs deployed as previews (e.g. refs/pull/*/head); X-Plnt-Preview routes to them")


class NotifySettings(BaseModel):
    """Where each rollout transition is sent (reconciler/review/notify.py): signed webhooks and a
    Slack-compatible incoming webhook. Secrets come from files, never the command line."""

    model_config = _SECTION

    webhooks: tuple[str, ...] = Field(default=(), description="URLs that get each transition, HMAC-signed")
    webhook_secret: SecretStr | None = Field(default=None, description="the webhooks' HMAC key (the CLI reads a file)")
    slack_url: SecretStr | None = Field(default=None, description=(
        "a Slack-compatible incoming webhook URL (a secret itself: the CLI reads a file)"))
    timeout_s: float = Field(default=10.0, gt=0, le=120)

    @model_validator(mode="after")
    def _signed(self) -> NotifySettings:
        if self.webhooks and self.webhook_secret is None:
            raise ValueError("--notify-webhook needs --notify-webhook-secret-file: plnt signs what it sends, so a "
                             "receiver can tell it from a forgery")
        bad = [url for url in self.webhooks if not url.startswith(("http://", "https://"))]
        if bad:
            raise ValueError(f"--notify-webhook {bad[0]!r}: give an http:// or https:// URL")
        if self.slack_url is not None and not self.slack_url.get_secret_value().startswith(("http://", "https://")):
            raise ValueError("--notify-slack-url-file: its first line must be an http(s) URL")
        return self


class TemporalSettings(BaseModel):
    """Where the sagas run, and how many at once. An external Temporal (address): TLS, client
    certificate, API key, as Temporal's own clients."""

    model_config = _SECTION

    address: str | None = Field(default=None, description="HOST:PORT; None starts the dev server")
    namespace: str = Field(default="default", min_length=1)
    task_queue: str = Field(default="plnt-sagas", min_length=1, description="plnt's saga task queue on Temporal")
    tls: bool = Field(default=False, description="TLS with the system's CAs (implied by the options below)")
    tls_cert: Path | None = Field(default=None, description="client certificate (PEM) for mutual TLS")
    tls_key: Path | None = Field(default=None, description="its private key (PEM)")
    tls_ca: Path | None = Field(default=None, description="CA (PEM) the server's certificate must chain to")
    api_key: SecretStr | None = Field(
        default=None, description="sent as a bearer token (implies TLS); the CLI reads it from a file or an env var")
    max_concurrent_sagas: int = Field(default=8, ge=1)
    retry: RetrySettings = Field(default_factory=RetrySettings)


class RegistrySettings(BaseModel):
    """Registries and recipe archives: how recipes and weights are fetched, and how much."""

    model_config = _SECTION

    s3_endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint; None: AWS")
    s3_region: str | None = None
    oci_insecure_hosts: tuple[str, ...] = Field(
        default=(), description="OCI registries allowed over plain HTTP (host or host:port); loopback is not implied")
    file_registry_roots: tuple[Path, ...] = Field(
        default=(), description="directories under which file:/// registries may be read; none by default")
    max_download_bytes: int = Field(
        default=256 * 2**20, gt=0, description="bytes one recipe fetch may transfer (archive + bundle), any registry")
    timeout_s: float = Field(default=60.0, gt=0)
    max_recipe_bytes: int = Field(default=256 * 2**20, gt=0, description="unpacked size limit of one recipe")
    max_recipe_files: int = Field(default=10_000, gt=0)
    max_recipe_file_bytes: int = Field(default=64 * 2**20, gt=0)


class GatewaySettings(BaseModel):
    """The gateway's bearer tokens, HTTP limits and processes (see plnt.core.auth and plnt.gateway.app);
    its address is Settings.host and Settings.port."""

    model_config = _SECTION

    tokens: tuple[SecretStr, ...] = Field(
        default=(), description="bearer tokens allowed to use every workflow (the CLI reads PLNT_GATEWAY_TOKENS)")
    tokens_file: Path | None = Field(
        default=None, description="token file: one `TOKEN [workflow1,workflow2]` per line, # comments")
    insecure_no_auth: bool = Field(
        default=False, description="allow an open gateway (no tokens) on a non-loopback address")
    max_body_bytes: int = Field(default=2**20, gt=0, description="larger request bodies get 413")
    request_timeout_s: float = Field(
        default=60.0, gt=0, description="504 when a runner sends nothing for this long (streams: between chunks)")
    max_header_bytes: int = Field(default=64 * 1024, gt=0, description="larger request heads get 431")
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="close connections whose request head is not complete within this")
    workers: int = Field(
        default=1, ge=0, le=64, description=(
            "processes answering on the gateway port (SO_REUSEPORT); 0: one per core, at most 4. "
            "`plnt up` defaults to 0; a Settings made in code to 1 (one process)"))
    control_plane_gateway: bool = Field(
        default=False, description=(
            "with workers > 1: plnt up's own process is one of the N on the gateway port; by default "
            "the N are all worker processes and the control plane (reconciler, sagas) answers only them, "
            "on a private loopback port, so a busy reconcile never stalls an invocation"))
    webhook_secret_file: Path | None = Field(
        default=None, description="POST /hooks/git needs a forge signature made with this secret (any caller)")
    cache_affinity: bool = Field(
        default=True, description=(
            "a model's chat completions go to the stable replica that served the conversation's earlier turns "
            "(its KV cache), unless that one is busier; off: the replicas take turns (gateway/affinity.py)"))


class RunnerSettings(BaseModel):
    """The local runners: how they start and stop, their model backend (None: the offline mock
    backend), and the model runtime of ModelDeployments on local backends."""

    model_config = _SECTION

    start_timeout_s: float = Field(default=30.0, gt=0)
    stop_timeout_s: float = Field(default=10.0, gt=0)
    smoke_request_timeout_s: float = Field(default=30.0, gt=0)
    start: Literal["fork", "exec"] = Field(
        default="fork", description="local runners: forked from one pre-imported zygote process (Linux; "
        "milliseconds and a few MiB each) or exec'd as a fresh Python each (~0.5 s CPU, ~35 MiB)")
    env: dict[str, str] = Field(
        default_factory=dict, description="plnt's environment as the CLI found it, filtered by an allowlist "
        "(drivers/spawn.py, allowlisted_env) before any runner sees it")
    llm_url: str | None = Field(default=None, description="OpenAI-compatible model server for the runners")
    llm_model: str | None = None
    llm_api_key_env: str | None = Field(default=None, description="NAME of the env var with the API key")
    llm_api_key: SecretStr | None = Field(default=None, description="its value (the CLI reads it); runners get it")
    llm_venv: Path = Field(default_factory=lambda: default_llm_venv(), description=(
        "the model runtime's own virtualenv (llama.cpp's server; `make install-llm` makes it)"))
    weights_budget_bytes: int = Field(
        default=20 * 2**30, gt=0, description="disk the weights store (STATE/weights) may use; a pull past it fails")

    def args(self) -> tuple[str, ...]:
        """Options every local runner gets for its model backend."""
        if self.llm_url is None:
            return ()
        args = ("--backend", "http", "--upstream-url", self.llm_url, "--model", self.llm_model or "")
        return args + (("--api-key-env", self.llm_api_key_env) if self.llm_api_key_env else ())


class RoleSettings(BaseModel):
    """The roles run apart (`plnt reconcile`, `plnt worker`, `plnt gateway`): how they find each other."""

    model_config = _SECTION

    control_url: str | None = Field(default=None, description="the reconciler's control API, for workers and gateways")
    internal_token: SecretStr | None = Field(
        default=None, description="bearer token the roles use with each other: the route watch (GET /internal/routes) "
        "and workers' reports (PUT /internal/runners); the CLI reads it from a file. None: those answer 404")
    lease: Literal["file", "kubernetes"] = Field(
        default="file", description="leader election of `plnt reconcile`: a lock file in the state directory, "
        "or a Kubernetes Lease")
    lease_name: str = Field(default="plnt-reconciler", min_length=1)
    lease_namespace: str | None = Field(default=None, description="Kubernetes namespace of the Lease")
    identity: str = Field(default="", description="this replica's name (lease holder, worker reports); "
                          "default: host name and process id")
    report_interval_s: float = Field(default=2.0, gt=0, description="a worker reports its runners this often")
    drain_grace_s: float = Field(
        default=2.0, ge=0, description="a worker waits this long after a runner leaves the routes before "
        "stopping it when the control plane cannot confirm that every gateway let go of it (POST "
        "/internal/drain unanswered); otherwise it waits for that, at most runners.stop_timeout_s")


class KubernetesSettings(BaseModel):
    """Kubernetes backends (the Helm driver), and --mirror-status: WorkflowRuns as plnt.work/v1 custom
    resources (plnt.reconciler.control.kube)."""

    model_config = _SECTION

    helm_binary: str = "helm"
    helm_chart: str | None = Field(default=None, description="workflow-runner chart; None: the one in this checkout")
    helm_model_chart: str | None = Field(
        default=None, description="model-server chart (ModelDeployments); None: the one beside this package")
    install_timeout_s: float = Field(
        default=150.0, ge=5, le=3600, description="helm --wait of one runner release (image pull, the recipe fetch, "
        "the runner's start) and of every uninstall; a WorkflowRun's install, promote and remove steps are given at "
        "least this plus a margin (helm.runner_step_timeouts)")
    model_install_timeout_s: float = Field(
        default=1800.0, gt=0, description="helm --wait of one model-server release (the weights fetch and the "
        "server's start); the saga's install and promote steps of a ModelDeployment are given this plus a margin")
    gpu_resource: str | None = Field(
        default=None, max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="the extended resource model servers' GPUs are counted in (e.g. amd.com/gpu); None: the GPU "
        "class itself when it is a device plugin's resource, else nvidia.com/gpu (helm_driver.gpu_resource_name)")
    serving_timeout_s: float = Field(
        default=20.0, gt=0, le=120, description="after helm --wait, how long a release's Service may take to answer "
        "as that release (endpoints programmed) before the install or promote step fails and is retried")
    unavailable_wait_s: float = Field(
        default=60.0, ge=0, le=150, description="how long an install, promotion or removal on a Kubernetes "
        "backend is tried again while its API server is unavailable (refused, unreachable, its etcd away) before "
        "the saga step fails")
    runner_image: str = Field(default="plnt", description="runner image repository for Kubernetes backends")
    runner_image_tag: str = ""
    mirror_status: bool = Field(default=False, description="apply WorkflowRun CRs and write their status")
    kubeconfig: Path | None = Field(default=None, description="for --mirror-status; None: in-cluster config")
    runner_registry_secret: str = Field(
        default="", max_length=253, pattern=r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="name of a Secret in each Kubernetes backend's namespace with the registry credentials runner "
        "pods fetch their recipe with (keys: see charts/workflow-runner/README.md); empty: none")


# The flat names Settings had before its sections, and where each is now: SECTION.FIELD. Only
# Settings._flat_names reads it (tests and benches still say `Settings(repo=..., port=0, ...)`).
FLAT_NAMES: dict[str, str] = {
    **{name: f"source.{name}" for name in
       ("repo", "path", "branch", "interval_s", "git_credentials_file", "git_known_hosts")},
    **{name: f"trust.{name}" for name in ("verify_commits", "allowed_signers", "gpg_keys")},
    **{name: f"review.{name}" for name in
       ("forge", "forge_api_url", "forge_project", "forge_token", "require_approval", "approvers", "code_owners",
        "report_status", "write_notes", "previews")},
    "temporal_address": "temporal.address", "temporal_namespace": "temporal.namespace",
    "task_queue": "temporal.task_queue", "temporal_tls": "temporal.tls", "temporal_tls_cert": "temporal.tls_cert",
    "temporal_tls_key": "temporal.tls_key", "temporal_tls_ca": "temporal.tls_ca",
    "temporal_api_key": "temporal.api_key", "max_concurrent_sagas": "temporal.max_concurrent_sagas",
    "retry": "temporal.retry",
    **{name: f"registries.{name}" for name in
       ("s3_endpoint_url", "s3_region", "oci_insecure_hosts", "file_registry_roots", "max_download_bytes",
        "max_recipe_bytes", "max_recipe_files", "max_recipe_file_bytes")},
    "registry_timeout_s": "registries.timeout_s",
    "gateway_tokens": "gateway.tokens", "gateway_tokens_file": "gateway.tokens_file",
    "insecure_no_auth": "gateway.insecure_no_auth", "gateway_max_body_bytes": "gateway.max_body_bytes",
    "gateway_request_timeout_s": "gateway.request_timeout_s", "gateway_max_header_bytes": "gateway.max_header_bytes",
    "gateway_header_timeout_s": "gateway.header_timeout_s", "gateway_workers": "gateway.workers",
    "control_plane_gateway": "gateway.control_plane_gateway", "webhook_secret_file": "gateway.webhook_secret_file",
    "gateway_cache_affinity": "gateway.cache_affinity",
    "runner_start_timeout_s": "runners.start_timeout_s", "runner_stop_timeout_s": "runners.stop_timeout_s",
    "smoke_request_timeout_s": "runners.smoke_request_timeout_s", "runner_start": "runners.start",
    "runner_env": "runners.env",
    **{name: f"runners.{name}" for name in
       ("llm_url", "llm_model", "llm_api_key_env", "llm_api_key", "llm_venv", "weights_budget_bytes")},
    **{name: f"roles.{name}" for name in
       ("control_url", "internal_token", "lease", "lease_name", "lease_namespace", "identity", "report_interval_s",
        "drain_grace_s")},
    **{name: f"kubernetes.{name}" for name in
       ("helm_binary", "helm_chart", "helm_model_chart", "install_timeout_s", "model_install_timeout_s", "gpu_resource", "serving_timeout_s",
        "unavailable_wait_s", "runner_image", "runner_image_tag", "mirror_status", "kubeconfig", "runner_registry_secret")},
}


class Settings(BaseModel):
    """Everything `plnt up` needs. Defaults are the embedded default: one machine, no cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: SourceSettings
    trust: TrustSettings = Field(default_factory=TrustSettings)
    review: ReviewSettings = Field(default_factory=ReviewSettings)
    notify: NotifySettings = Field(default_factory=NotifySettings)
    state_dir: Path = Path(".plnt")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    runners: RunnerSettings = Field(default_factory=RunnerSettings)
    registries: RegistrySettings = Field(default_factory=RegistrySettings)
    spec_limits: SpecLimits = Field(default_factory=SpecLimits)
    gateway: GatewaySettings = Field(default_factory=GatewaySettings)
    roles: RoleSettings = Field(default_factory=RoleSettings)
    kubernetes: KubernetesSettings = Field(default_factory=KubernetesSettings)

    @model_validator(mode="before")
    @classmethod
    def _flat_names(cls, data: Any) -> Any:
        """Each flat name (FLAT_NAMES) moved into its section, beside what that section was given."""
        if not isinstance(data, dict) or not data.keys() & FLAT_NAMES.keys():
            return data
        data = dict(data)
        for flat in data.keys() & FLAT_NAMES.keys():
            section, field = FLAT_NAMES[flat].split(".")
            given = data.get(section) or {}
            data[section] = {**(dict(given) if isinstance(given, BaseModel) else given), field: data.pop(flat)}
        return data

    @model_validator(mode="after")
    def _forge_options(self) -> Settings:
        review = self.review
        if (review.approvers or review.code_owners) and not review.require_approval:
            raise ValueError("--approvers and --code-owners say who may approve for --require-approval: "
                             "add --require-approval")
        bad = [a for a in review.approvers if not _APPROVER.fullmatch(a)]
        if bad:
            raise ValueError(f"--approvers {', '.join(map(repr, bad))}: each is a user name or ORG/TEAM (GitLab: "
                             "GROUP/SUBGROUP), e.g. --approvers alice,acme/deployers")
        if review.forge is not None:
            missing = [option for option, value in (("--forge-api-url", review.forge_api_url),
                                                     ("--forge-project", review.forge_project),
                                                     ("--forge-token-env or --forge-token-file", review.forge_token))
                       if not value]
            if missing:
                raise ValueError(f"--forge {review.forge} needs {', '.join(missing)}")
        else:
            # (A worker, which has a control URL, takes --previews only to check preview sagas' commits
            # against those refs; the reconciler is what talks to the forge.)
            needs = [option for option, on in (("--require-approval", review.require_approval),
                                               ("--previews", bool(review.previews) and self.roles.control_url is None))
                     if on]
            if needs:
                raise ValueError(f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a forge: "
                                 "add --forge, --forge-api-url, --forge-project and --forge-token-env")
        return self

    @model_validator(mode="after")
    def _kubernetes_source(self) -> Settings:
        """In the cluster there are no commits: approval is the cluster's RBAC on the custom resources,
        and what git gives (signed commits, pull requests, notes) has nothing to act on."""
        if self.source.kind != "kubernetes":
            return self
        review, trust = self.review, self.trust
        git_only = [option for option, on in (
            ("--require-approval", review.require_approval), ("--verify-commits", trust.verify_commits != "none"),
            ("--previews", bool(review.previews)), ("--write-notes", review.write_notes),
            ("--forge", review.forge is not None), ("--allowed-signers", trust.allowed_signers is not None),
            ("--gpg-keys", trust.gpg_keys is not None), ("--path", bool(self.source.path)),
            ("--branch", self.source.branch != "main"),
            ("--git-credentials-file", self.source.git_credentials_file is not None),
            ("--git-known-hosts", self.source.git_known_hosts is not None)) if on]
        if git_only:
            raise ValueError(f"{', '.join(git_only)} {'is' if len(git_only) == 1 else 'are'} for --source git: with "
                             "--source kubernetes there are no commits or pull requests, and the cluster's RBAC on "
                             "WorkflowRuns is the approval (docs/kubernetes.md)")
        return self

    @model_validator(mode="after")
    def _temporal_connection(self) -> Settings:
        temporal = self.temporal
        if (temporal.tls_cert is None) != (temporal.tls_key is None):
            raise ValueError("--temporal-tls-cert and --temporal-tls-key go together (a client certificate and its key)")
        external = (temporal.tls, temporal.tls_cert, temporal.tls_ca, temporal.api_key)
        if temporal.address is None and any(external):
            raise ValueError("TLS and API key options are for an external Temporal: add --temporal-address HOST:PORT")
        return self

    @property
    def gateway_url(self) -> str:
        return f"http://{self.host}:{self.port}"
