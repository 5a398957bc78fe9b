"""Settings: built once at the entry point (the CLI) and passed down; nothing else reads os.environ."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from plnt.core.specs.limits import SpecLimits
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

# An --approvers entry: a forge user name, or ORG/TEAM (GitLab: a group's full path, GROUP/SUB/...).
_APPROVER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.-]*(/[A-Za-z0-9_.][A-Za-z0-9_.-]*)*")


class StepTimeouts(BaseModel):
    """Start-to-close timeout of each attempt of each saga step, in seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    validate_: float = Field(default=30, gt=0, alias="validate")
    pull_recipe: float = Field(default=300, gt=0)
    install_release: float = Field(default=180, gt=0)
    smoke_test: float = Field(default=900, gt=0)
    promote_release: float = Field(default=180, gt=0)
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


class Settings(BaseModel):
    """Everything `plnt up` needs. Defaults are the embedded default: one machine, no cluster."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # repr=False: an https URL may carry a token (GitSource gives it only to git).
    repo: str = Field(description="spec repository: a path, file://, https:// or ssh URL", repr=False)
    path: str = Field(default="", description="subdirectory of the repository holding the specs")
    git_credentials_file: Path | None = Field(
        default=None, description="https token (TOKEN or USER:TOKEN) or ssh private key for the repository")
    verify_commits: Literal["none", "head", "all"] = Field(
        default="none", description="deploy only signed commits: the newest (head) or every new one (all)")
    allowed_signers: Path | None = Field(default=None, description="trusted SSH signers, git's allowed-signers format")
    gpg_keys: Path | None = Field(default=None, description="directory of trusted OpenPGP public keys")
    # Pull-request review as deploy approval (reconciler/review/forge.py): where plnt reads approvals and
    # writes each rollout's verdict. The token comes from a file or an env var, never the command line.
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
    git_known_hosts: Path | None = Field(
        default=None, description="ssh known_hosts for the repository's host (without it: trust on first use)")
    branch: str = "main"
    state_dir: Path = Path(".plnt")
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    interval_s: float = Field(default=5.0, gt=0, description="seconds between polls of the repository")
    temporal_address: str | None = Field(default=None, description="HOST:PORT; None starts the dev server")
    temporal_namespace: str = Field(default="default", min_length=1)
    task_queue: str = Field(default="plnt-sagas", min_length=1, description="plnt's saga task queue on Temporal")
    # An external Temporal (--temporal-address): TLS, client certificate, API key, as Temporal's own clients.
    temporal_tls: bool = Field(default=False, description="TLS with the system's CAs (implied by the options below)")
    temporal_tls_cert: Path | None = Field(default=None, description="client certificate (PEM) for mutual TLS")
    temporal_tls_key: Path | None = Field(default=None, description="its private key (PEM)")
    temporal_tls_ca: Path | None = Field(default=None, description="CA (PEM) the server's certificate must chain to")
    temporal_api_key: SecretStr | None = Field(
        default=None, description="sent as a bearer token (implies TLS); the CLI reads it from a file or an env var")
    max_concurrent_sagas: int = Field(default=8, ge=1)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    runner_start_timeout_s: float = Field(default=30.0, gt=0)
    runner_stop_timeout_s: float = Field(default=10.0, gt=0)
    smoke_request_timeout_s: float = Field(default=30.0, gt=0)
    # Registries and recipe archives.
    s3_endpoint_url: str | None = Field(default=None, description="S3-compatible endpoint; None: AWS")
    s3_region: str | None = None
    oci_insecure_hosts: tuple[str, ...] = Field(
        default=(), description="OCI registries allowed over plain HTTP (host or host:port); loopback is not implied")
    file_registry_roots: tuple[Path, ...] = Field(
        default=(), description="directories under which file:/// registries may be read; none by default")
    max_download_bytes: int = Field(
        default=256 * 2**20, gt=0, description="bytes one recipe fetch may transfer (archive + bundle), any registry")
    registry_timeout_s: float = Field(default=60.0, gt=0)
    max_recipe_bytes: int = Field(default=256 * 2**20, gt=0, description="unpacked size limit of one recipe")
    max_recipe_files: int = Field(default=10_000, gt=0)
    max_recipe_file_bytes: int = Field(default=64 * 2**20, gt=0)
    spec_limits: SpecLimits = Field(default_factory=SpecLimits)
    # Gateway (see plnt.core.auth and plnt.gateway.app).
    gateway_tokens: tuple[SecretStr, ...] = Field(
        default=(), description="bearer tokens allowed to use every workflow (the CLI reads PLNT_GATEWAY_TOKENS)")
    gateway_tokens_file: Path | None = Field(
        default=None, description="token file: one `TOKEN [workflow1,workflow2]` per line, # comments")
    insecure_no_auth: bool = Field(
        default=False, description="allow an open gateway (no tokens) on a non-loopback address")
    gateway_max_body_bytes: int = Field(default=2**20, gt=0, description="larger request bodies get 413")
    gateway_request_timeout_s: float = Field(
        default=60.0, gt=0, description="504 when a runner sends nothing for this long (streams: between chunks)")
    gateway_max_header_bytes: int = Field(default=64 * 1024, gt=0, description="larger request heads get 431")
    gateway_header_timeout_s: float = Field(
        default=10.0, gt=0, description="close connections whose request head is not complete within this")
    gateway_workers: int = Field(
        default=1, ge=0, le=64, description=(
            "processes answering on the gateway port (SO_REUSEPORT); 0: one per core, at most 4. "
            "`plnt up` defaults to 0; a Settings made in code to 1 (one process)"))
    control_plane_gateway: bool = Field(
        default=False, description=(
            "with gateway_workers > 1: plnt up's own process is one of the N on the gateway port; by default "
            "the N are all worker processes and the control plane (reconciler, sagas) answers only them, "
            "on a private loopback port, so a busy reconcile never stalls an invocation"))
    webhook_secret_file: Path | None = Field(
        default=None, description="POST /hooks/git needs a forge signature made with this secret (any caller)")
    # The model backend of local runners: None runs the offline mock backend.
    llm_url: str | None = Field(default=None, description="OpenAI-compatible model server for the runners")
    llm_model: str | None = None
    llm_api_key_env: str | None = Field(default=None, description="NAME of the env var with the API key")
    llm_api_key: SecretStr | None = Field(default=None, description="its value (the CLI reads it); runners get it")
    # ModelDeployments on local backends.
    llm_venv: Path = Field(default_factory=lambda: default_llm_venv(), description=(
        "the model runtime's own virtualenv (llama.cpp's server; `make install-llm` makes it)"))
    weights_budget_bytes: int = Field(
        default=20 * 2**30, gt=0, description="disk the weights store (STATE/weights) may use; a pull past it fails")
    runner_start: Literal["fork", "exec"] = Field(
        default="fork", description="local runners: forked from one pre-imported zygote process (Linux; "
        "milliseconds and a few MiB each) or exec'd as a fresh Python each (~0.5 s CPU, ~35 MiB)")
    runner_env: dict[str, str] = Field(
        default_factory=dict, description="plnt's environment as the CLI found it, filtered by an allowlist "
        "(drivers/spawn.py, allowlisted_env) before any runner sees it")
    # The roles run apart (`plnt reconcile`, `plnt worker`, `plnt gateway`): how they find each other.
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
        "/internal/drain unanswered); otherwise it waits for that, at most runner_stop_timeout_s")
    # Kubernetes backends (the Helm driver).
    helm_binary: str = "helm"
    helm_chart: str | None = Field(default=None, description="workflow-runner chart; None: the one in this checkout")
    helm_model_chart: str | None = Field(
        default=None, description="model-server chart (ModelDeployments); None: the one beside this package")
    model_install_timeout_s: float = Field(
        default=1800.0, gt=0, description="helm --wait of one model-server release (the weights fetch and the "
        "server's start); the saga's install and promote steps of a ModelDeployment are given this plus a margin")
    gpu_resource: str | None = Field(
        default=None, max_length=253,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        description="the extended resource model servers' GPUs are counted in (e.g. amd.com/gpu); None: the GPU "
        "class itself when it is a device plugin's resource, else nvidia.com/gpu (helm_driver.gpu_resource_name)")
    runner_image: str = Field(default="plnt", description="runner image repository for Kubernetes backends")
    runner_image_tag: str = ""
    # --mirror-status: WorkflowRuns as plnt.work/v1 custom resources (plnt.reconciler.control.kube).
    mirror_status: bool = Field(default=False, description="apply WorkflowRun CRs and write their status")
    kubeconfig: Path | None = Field(default=None, description="for --mirror-status; None: in-cluster config")
    runner_registry_secret: str = Field(
        default="", max_length=253, pattern=r"^$|^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
        description="name of a Secret in each Kubernetes backend's namespace with the registry credentials runner "
        "pods fetch their recipe with (keys: see charts/workflow-runner/README.md); empty: none")

    @model_validator(mode="after")
    def _forge_options(self) -> Settings:
        if (self.approvers or self.code_owners) and not self.require_approval:
            raise ValueError("--approvers and --code-owners say who may approve for --require-approval: "
                             "add --require-approval")
        bad = [a for a in self.approvers if not _APPROVER.fullmatch(a)]
        if bad:
            raise ValueError(f"--approvers {', '.join(map(repr, bad))}: each is a user name or ORG/TEAM (GitLab: "
                             "GROUP/SUBGROUP), e.g. --approvers alice,acme/deployers")
        if self.forge is not None:
            missing = [option for option, value in (("--forge-api-url", self.forge_api_url),
                                                     ("--forge-project", self.forge_project),
                                                     ("--forge-token-env or --forge-token-file", self.forge_token))
                       if not value]
            if missing:
                raise ValueError(f"--forge {self.forge} needs {', '.join(missing)}")
        else:
            # (A worker, which has a control URL, takes --previews only to check preview sagas' commits
            # against those refs; the reconciler is what talks to the forge.)
            needs = [option for option, on in (("--require-approval", self.require_approval),
                                               ("--previews", bool(self.previews) and self.control_url is None)) if on]
            if needs:
                raise ValueError(f"{' and '.join(needs)} need{'s' if len(needs) == 1 else ''} a forge: "
                                 "add --forge, --forge-api-url, --forge-project and --forge-token-env")
        return self

    @model_validator(mode="after")
    def _temporal_connection(self) -> Settings:
        if (self.temporal_tls_cert is None) != (self.temporal_tls_key is None):
            raise ValueError("--temporal-tls-cert and --temporal-tls-key go together (a client certificate and its key)")
        external = (self.temporal_tls, self.temporal_tls_cert, self.temporal_tls_ca, self.temporal_api_key)
        if self.temporal_address is None and any(external):
            raise ValueError("TLS and API key options are for an external Temporal: add --temporal-address HOST:PORT")
        return self

    def runner_args(self) -> tuple[str, ...]:
        """Options every local runner gets for its model backend."""
        if self.llm_url is None:
            return ()
        args = ("--backend", "http", "--upstream-url", self.llm_url, "--model", self.llm_model or "")
        return args + (("--api-key-env", self.llm_api_key_env) if self.llm_api_key_env else ())

    @property
    def gateway_url(self) -> str:
        return f"http://{self.host}:{self.port}"
