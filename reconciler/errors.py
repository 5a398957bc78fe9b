"""Errors whose type says what happens next.

    PlntError
    ├── RetryLater        transient: the same step may succeed if tried again (runner slow to start, port taken)
    │   ├── DriverError           a release driver failed in a way that may pass
    │   │   └── ClusterUnavailable    a Kubernetes API server (or its storage) is not answering: waited out
    │   ├── RegistryUnavailable   a registry did not answer or broke the transfer off
    │   ├── RegistryAuthFailed    a registry refused plnt's credentials (401/403): fix them, plnt retries
    │   ├── LiveStateUnknown      a backend's live state could not be read: unknown, never "gone"
    │   └── GateUnavailable       a gate's source (Prometheus, a webhook, a judge model) did not answer
    └── NeedsHuman        a dead end: retrying cannot help until someone changes the spec or the recipe
        ├── InvalidSpec           the spec fails validation
        ├── UnknownBackend        spec.backend.cluster names no PlntBackend
        ├── GpuClassUnavailable   the backend does not offer the GPU class asked for
        ├── RecipeNotFound        no such name@version in the registry
        ├── InvalidRecipe         the recipe's workflow.yaml or module does not load
        ├── IntegrityMismatch     the recipe's digest differs from spec.workflow.integrityHash
        ├── DigestMismatch        a registry served bytes whose digest differs from what it announced
        ├── DownloadRefused       more bytes than the cap (a download, or metadata read whole), or a redirect plnt refuses
        ├── UnsafeArchive         a recipe archive that safe extraction refuses (traversal, links, bombs)
        ├── VerificationFailed    no valid signature from a trusted signer (fails closed)
        ├── UntrustedSagaInput    a saga's input disagrees with the commit it names (forged or stale)
        ├── GateUnusable          a gate's source answered something no verdict can come from (a query
        │                         with no or several series, a webhook body that is not {pass, reason})
        └── DependencyFailed      a dependency (dependsOn) of this rollout failed at the same commit

Saga activities turn NeedsHuman into a non-retryable Temporal ApplicationError whose `type` is the
class name, so the retry policy stops at once and the status shows why.
"""

from __future__ import annotations


class PlntError(Exception):
    """Base of every error plnt raises on purpose."""

    retryable = True


class RetryLater(PlntError):
    retryable = True


class DriverError(RetryLater):
    """A release driver failed in a way that may pass (process start, health check, port)."""


class ClusterUnavailable(DriverError):
    """A backend's API server refused the connection, or it (or etcd behind it) did not answer: an
    outage or a control-plane upgrade. Nothing was done; the Helm driver waits it out, then retries."""


class RegistryUnavailable(RetryLater):
    pass


class RegistryAuthFailed(RetryLater):
    """A registry answered 401/403. Retryable: credentials get fixed or rotated without a new commit."""


class LiveStateUnknown(RetryLater):
    """A backend's live state could not be read (cluster unreachable, RBAC): nothing is known, so
    nothing may be planned from it (no restore, no uninstall)."""


class GateUnavailable(RetryLater):
    """A gate's source (Prometheus, a webhook, a judge model) did not answer, timed out or answered a
    server error: the gate is tried again; a canary is never promoted on a gate that did not answer."""


class NeedsHuman(PlntError):
    retryable = False


class InvalidSpec(NeedsHuman):
    pass


class UnknownBackend(NeedsHuman):
    pass


class GpuClassUnavailable(NeedsHuman):
    pass


class RecipeNotFound(NeedsHuman):
    pass


class InvalidRecipe(NeedsHuman):
    pass


class IntegrityMismatch(NeedsHuman):
    pass


class DigestMismatch(NeedsHuman):
    pass


class DownloadRefused(NeedsHuman):
    """A download stopped by plnt: more bytes than max_download_bytes, metadata read whole (a bundle,
    a model.sig, an OCI manifest, a trusted root) over its cap (registries.read_bounded), or a
    redirect to another host or from HTTPS to HTTP."""


class UnsafeArchive(NeedsHuman):
    pass


class VerificationFailed(NeedsHuman):
    """`reason` is one of: unsigned, invalid-bundle, tampered, wrong-identity, wrong-issuer,
    untrusted-root, no-policy."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class ModelNotServing(NeedsHuman):
    """A WorkflowRun's model (spec.model) has no promoted release and its rollout has ended."""


class UntrustedSagaInput(NeedsHuman):
    """A saga (or activity) input that plnt's own clone does not confirm: a commit not on the tracked
    branch, a fingerprint or version the commit does not give, a release it did not make. Nothing installs."""


class GateUnusable(NeedsHuman):
    """A gate's source answered something no verdict can come from: a query with no series or several,
    a value that is not a number, a webhook body that is not {"pass": bool, "reason": str}."""


class DependencyFailed(NeedsHuman):
    """A WorkflowRun or ModelDeployment this one depends on (dependsOn) was rolled back or failed at
    the same commit: this rollout does not go on without it."""


NON_RETRYABLE_ERROR_TYPES = [
    cls.__name__
    for cls in (InvalidSpec, UnknownBackend, GpuClassUnavailable, RecipeNotFound, InvalidRecipe, IntegrityMismatch,
                DigestMismatch, DownloadRefused, UnsafeArchive, VerificationFailed, ModelNotServing, UntrustedSagaInput,
                GateUnusable, DependencyFailed)
]
