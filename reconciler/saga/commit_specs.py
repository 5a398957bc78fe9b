"""What decides trust in a saga, read from plnt's own clone at the commit the saga names.

A saga's input names (action, namespace, name, commit, fingerprint, version); it carries no spec,
backend or trust policy. Each activity asks `CommitSpecs.resolve` for the WorkflowRun, its
PlntBackend and the RecipeTrustPolicies at that commit, through GitSource and the loader (never the
reconciler's memory, so a separate worker with its own clone does the same), and gets
UntrustedSagaInput when the input disagrees: a commit not on the tracked branch, an invalid commit,
a fingerprint or version the commit does not give.

The parsed spec set is cached per commit (a saga's activities all name one commit), so a saga
parses its commit once; the branch check is a `git merge-base --is-ancestor` per activity, so a
force-push that drops a commit stops the sagas that name it.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field

from plnt.core.routes import preview_name
from plnt.core.specs.limits import SpecLimits
from plnt.core.specs.loader import DEFAULT_LIMITS, Problem, SpecSet
from plnt.core.specs.models import Deployable, Gate, PlntBackend, RecipeTrustPolicy, WorkflowRun, run_key
from plnt.reconciler.bulk import in_bulk_thread
from plnt.reconciler.errors import RetryLater, UntrustedSagaInput
from plnt.reconciler.saga.io import SagaRef
from plnt.reconciler.source.commit_trust import CommitVerifier
from plnt.reconciler.source.git import GitSource, SourceError
from plnt.reconciler.source.kubernetes import KubernetesSource


def as_preview(run: WorkflowRun, pr: int) -> WorkflowRun:
    """WorkflowRun `run` as the preview release of pull request `pr`: same spec, name `<name>--pr<N>`."""
    metadata = run.metadata.model_copy(update={"name": preview_name(run.metadata.name, pr)})
    return run.model_copy(update={"metadata": metadata})


@dataclass(frozen=True)
class TrustedSaga:
    """A saga's input as confirmed by the commit: what activities act on."""

    ref: SagaRef
    run: Deployable | None           # None for an uninstall (the commit no longer has the WorkflowRun)
    backend: PlntBackend | None
    policies: tuple[RecipeTrustPolicy, ...]
    # Every backend at the commit: where an uninstall looks when the worker never saw the install.
    backends: tuple[PlntBackend, ...] = ()
    # Where `policies` (and their trusted roots) and `backend` come from when not the saga's commit:
    # a preview's are the tracked branch's, so a pull request cannot trust its own signer.
    policy_commit: str | None = None
    gates: Mapping[str, Gate] = field(default_factory=dict)  # the run's namespace's Gates, by name, at the commit
    dependencies: Mapping[str, Deployable] = field(default_factory=dict)  # dependsOn, by name, as the commit gives them


def _backend_of(run: Deployable, backends: Mapping[str, PlntBackend]) -> PlntBackend | None:
    """The backend a run's release is checked against: its one backend, or a pool's first member
    (the validate step checks that every member is of a type pools deploy on)."""
    members = run.spec.backend.members(backends)
    return backends[members[0]] if members else None


def _gates_of(specs: SpecSet, namespace: str) -> dict[str, Gate]:
    return {gate.metadata.name: gate for gate in specs.gates.values() if gate.metadata.namespace == namespace}


class CommitSpecs:
    def __init__(self, source: GitSource | KubernetesSource, *, keep: int = 8, limits: SpecLimits = DEFAULT_LIMITS,
                 verifier: CommitVerifier | None = None) -> None:
        self._source = source
        self._verifier = verifier  # --verify-commits: a saga's commit must carry a trusted signature
        self._limits = limits  # the reconciler's: a commit it accepted must not be refused here
        self._keep = keep
        self._cache: OrderedDict[str, tuple[SpecSet, list[Problem]]] = OrderedDict()
        self._lock = asyncio.Lock()  # one parse per commit, even when activities ask at once

    async def resolve(self, ref: SagaRef) -> TrustedSaga:
        commit = ref.commit[:12]
        if ref.preview is not None and ref.action == "deploy":
            # A preview deploys a pull request's commit: it must be on that pull request's ref as plnt
            # fetched it. (A preview's uninstall names a branch commit, checked as any other below.)
            if not await self._in_preview(ref.commit, ref.preview):
                raise UntrustedSagaInput(f"commit {commit} is not on the preview ref of pull request {ref.preview} "
                                         f"(as plnt last fetched {', '.join(self._source.previews) or 'no --previews'}): "
                                         f"plnt previews only the commits of a pull request's ref")
        elif not await self._on_branch(ref.commit):
            raise UntrustedSagaInput(f"commit {commit} is not on branch {self._source.branch!r} of the spec "
                                     f"repository (as plnt last fetched it): plnt deploys only commits of the "
                                     f"branch it tracks")
        if self._verifier is not None and self._verifier.mode != "none":
            verdict = await asyncio.to_thread(self._verifier.verify, self._source.git_dir, ref.commit)
            if not verdict.trusted:
                raise UntrustedSagaInput(verdict.problem() + ": plnt deploys only commits its trusted signers signed")
        specs, problems = await self._load(ref.commit)
        if problems:
            raise UntrustedSagaInput(f"commit {commit} has {len(problems)} spec problem(s) and plnt starts no "
                                     f"saga for it: {problems[0]}")
        key = run_key(ref.namespace, ref.run_name)
        run = specs.deployable(key)
        if ref.preview is not None:
            key = ref.key
            # (Previews are of WorkflowRuns: a pull request's ModelDeployment is not deployed beside the stable.)
            run = as_preview(run, ref.preview) if isinstance(run, WorkflowRun) and ref.action == "deploy" else None
        if ref.action == "uninstall":
            if run is not None:
                raise UntrustedSagaInput(f"WorkflowRun {key} is still in commit {commit}: nothing to uninstall")
            return TrustedSaga(ref, None, None, (), tuple(specs.backends.values()))
        if run is None:
            raise UntrustedSagaInput(f"commit {commit} has no WorkflowRun {key}")
        if ref.fingerprint != run.fingerprint() or ref.version != run.version:
            raise UntrustedSagaInput(
                f"the saga asks for {key} version {ref.version} with fingerprint {ref.fingerprint}; commit {commit} "
                f"gives version {run.version} with fingerprint {run.fingerprint()}")
        if ref.preview is not None:
            # The pull request's WorkflowRun, with the tracked branch's backends and trust policies:
            # what a PR may change is what it would deploy, not who plnt trusts or where it runs.
            branch = ref.policy_commit or await asyncio.to_thread(self._source.branch_head)
            if not await self._on_branch(branch):
                raise UntrustedSagaInput(f"commit {branch[:12]}, whose trust policies the preview names, is not on "
                                         f"branch {self._source.branch!r}: a preview trusts only the tracked branch")
            if self._verifier is not None and self._verifier.mode != "none":
                verdict = await asyncio.to_thread(self._verifier.verify, self._source.git_dir, branch)
                if not verdict.trusted:
                    raise UntrustedSagaInput(f"the tracked branch's head, whose trust policies a preview uses, is "
                                             f"not trusted: {verdict.problem()}")
            base, base_problems = await self._load(branch)
            if base_problems:  # the reconciler deploys nothing from such a commit; nor does a preview
                raise RetryLater(f"the tracked branch's head {branch[:12]} is invalid: no preview until it is fixed")
            return TrustedSaga(ref, run, _backend_of(run, base.backends),
                               tuple(base.trust_policies.values()), tuple(base.backends.values()), policy_commit=branch,
                               gates=_gates_of(specs, ref.namespace))
        dependencies = {name: dep for name in run.spec.depends_on
                        if (dep := specs.deployable(run_key(ref.namespace, name))) is not None}
        return TrustedSaga(ref, run, _backend_of(run, specs.backends),
                           tuple(specs.trust_policies.values()), tuple(specs.backends.values()),
                           gates=_gates_of(specs, ref.namespace),
                           dependencies=dependencies)

    async def _on_branch(self, commit: str) -> bool:
        if await asyncio.to_thread(self._source.is_on_branch, commit):
            return True
        # A worker's clone lags the reconciler's: fetch once before refusing a commit it has not seen.
        try:
            await asyncio.to_thread(self._source.fetch)
        except SourceError as exc:
            raise RetryLater(f"cannot check commit {commit[:12]} against the branch: {exc}") from exc
        return await asyncio.to_thread(self._source.is_on_branch, commit)

    async def _in_preview(self, commit: str, pr: int) -> bool:
        if await asyncio.to_thread(self._source.is_in_preview, commit, pr):
            return True
        try:  # a worker's clone lags the reconciler's, as for the branch
            await asyncio.to_thread(self._source.fetch_previews)
        except SourceError as exc:
            raise RetryLater(f"cannot check commit {commit[:12]} against the preview refs: {exc}") from exc
        return await asyncio.to_thread(self._source.is_in_preview, commit, pr)

    async def _load(self, commit: str) -> tuple[SpecSet, list[Problem]]:
        async with self._lock:
            cached = self._cache.get(commit)
            if cached is None:
                cached = await in_bulk_thread(self._parse, commit)  # low priority: see bulk.py
                self._cache[commit] = cached
                while len(self._cache) > self._keep:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(commit)
            return cached

    def _parse(self, commit: str) -> tuple[SpecSet, list[Problem]]:
        return self._source.load(commit, self._limits)
