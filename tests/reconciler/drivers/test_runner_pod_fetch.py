"""The runner pod's init container, run for real (no cluster: its command runs as a process here).

A signed recipe is published to a REAL registry (the CNCF distribution OCI registry, or moto's S3),
signed by TestSigstoreAuthority (tests/sigstore_ca.py: a STAND-IN for Sigstore's public services;
the verifier is sigstore-python's). The Helm driver renders the values for it against
RecordingHelm (test_helm_chart.py: a STAND-IN for helm's cluster side, recording the values file),
the REAL helm renders the chart with them, and the test takes the init container's command, args
and env from the rendered Deployment, writes the rendered ConfigMap's (and a stand-in Secret's)
items into a temporary directory standing in for the pod's volume mounts, rewrites ONLY paths under
those mount paths, and runs that exact command with the project's `plnt`. The environment holds
nothing but PATH, LANG and what the container spec sets (so S3 credentials can only come from the
Secret the values name).

What this cannot show without a cluster: the kubelet's mounts, the read-only root filesystem, the
image's contents (the Dockerfile is not built here) and the pod network's reach to the registry.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from plnt.core.specs.models import RecipeTrustPolicy, WorkflowRun
from plnt.reconciler.drivers.helm import HelmDriver
from plnt.reconciler.drivers.protocol import InstallRequest, RecipeTrust
from plnt.reconciler.recipes.archive import pack_recipe_to
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry

from tests.conftest import EXAMPLE
from tests.reconciler.drivers.test_helm_chart import BACKEND, HELM_CANDIDATES, IMAGE, RecordingHelm, by_kind, render
from tests.services import S3_ACCESS_KEY, S3_REGION, S3_SECRET_KEY, OciServer, S3Bucket
from tests.sigstore_ca import TestSigstoreAuthority

pytestmark = pytest.mark.integration  # runs helm and plnt, talks to real registries

SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.3.0"
OTHER_SOURCE = EXAMPLE / "recipes" / "review-responder" / "1.2.0"
IDENTITY, ISSUER = "recipes@pods.plnt.invalid", "https://issuer.pods.plnt.invalid"
ROOT_PATH = "trust/pods-root.json"
SECRET = "recipe-registry"


def trust_policy(name: str, root_path: str, identity: str = IDENTITY) -> RecipeTrustPolicy:
    return RecipeTrustPolicy.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": name},
        "spec": {"recipes": ["review-responder"], "trustRoot": {"trustedRootFile": root_path},
                 "signers": [{"issuer": ISSUER, "identity": identity}]},
    })


def signed_archive(directory: Path, source: Path, authority: TestSigstoreAuthority) -> tuple[Path, Path, str]:
    directory.mkdir(parents=True, exist_ok=True)
    archive = directory / "recipe.tar.gz"
    digest = pack_recipe_to(source, archive)
    bundle = directory / "recipe.tar.gz.sigstore.json"
    bundle.write_text(authority.sign(archive, IDENTITY, ISSUER))
    return archive, bundle, digest


async def driver_docs(helm: str, registry: str, digest: str, trust: RecipeTrust, options: RegistryOptions,
                      secret: str = "") -> list[dict[str, Any]]:
    """The manifests the Helm driver would apply for a canary of review-responder@1.3.0 at `digest`."""
    run = WorkflowRun.model_validate({
        "apiVersion": "plnt.work/v1", "kind": "WorkflowRun", "metadata": {"name": "review-responder", "namespace": "team-a"},
        "spec": {"workflow": {"ref": "review-responder@1.3.0", "registry": registry},
                 "backend": {"cluster": "gpu-cluster-01"}},
    })
    recorder = RecordingHelm()
    driver = HelmDriver(BACKEND, lambda ns, name, fp: run.spec if fp == run.fingerprint() else None, image=IMAGE,
                        runner=recorder, registry_options=options, credentials_secret=secret)
    await driver.install(InstallRequest(
        namespace="team-a", name="review-responder", track="canary", version="1.3.0", spec_fingerprint=run.fingerprint(),
        recipe_digest=digest, recipe_dir="/unused/by/helm", traffic_percent=5, trust=trust))
    [(args, values)] = recorder.upgrades
    assert values["workflow"]["digest"] == digest, "the pod is pinned to the saga's digest"
    return render(helm, args[2], args[3], args[args.index("--namespace") + 1], values)


class PodStandIn:
    """The init container's volume mounts as directories under `root`."""

    def __init__(self, docs: list[dict[str, Any]], root: Path, secrets: dict[str, dict[str, str]]) -> None:
        self.objects = by_kind(docs)
        self.pod = self.objects["Deployment"]["spec"]["template"]["spec"]
        [self.init] = self.pod["initContainers"]
        self.root = root
        self.secrets = secrets
        self.mount_paths = sorted({mount["mountPath"] for mount in self.init["volumeMounts"]}, key=len)

    def host(self, value: str) -> str:
        """A path under one of the init container's mount paths, as a path under root; else unchanged."""
        if any(value == path or value.startswith(path.rstrip("/") + "/") for path in self.mount_paths):
            return str(self.root) + value
        return value

    def mount(self) -> None:
        volumes = {volume["name"]: volume for volume in self.pod["volumes"]}
        config_maps = {doc["metadata"]["name"]: doc for doc in (self.objects["ConfigMap"],
                                                                 self.objects["RecipeTrustConfigMap"])}
        for mount in sorted(self.init["volumeMounts"], key=lambda m: len(m["mountPath"])):  # parents first
            target = Path(self.host(mount["mountPath"]))
            target.mkdir(parents=True, exist_ok=True)
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                data = config_maps[volume["configMap"]["name"]]["data"]
                files = {item["path"]: data[item["key"]] for item in volume["configMap"]["items"]}
            elif "secret" in volume:
                data = self.secrets[volume["secret"]["secretName"]]
                files = {item["path"]: data[item["key"]] for item in volume["secret"]["items"]}
            else:
                assert set(volume) == {"name", "emptyDir"}, volume
                files = {}
            for path, text in files.items():
                (target / path).parent.mkdir(parents=True, exist_ok=True)
                (target / path).write_text(text)

    def environment(self) -> dict[str, str]:
        env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}/usr/bin{os.pathsep}/bin", "LANG": "C.UTF-8"}
        for item in self.init.get("env", []):
            if "value" in item:
                env[item["name"]] = self.host(item["value"])
                continue
            ref = item["valueFrom"]["secretKeyRef"]
            secret = self.secrets.get(ref["name"], {})
            if ref["key"] in secret:
                env[item["name"]] = secret[ref["key"]]
            else:
                assert ref.get("optional"), f"the kubelet would not start the pod: {ref} missing"
        return env

    def run(self) -> subprocess.CompletedProcess[str]:
        self.mount()
        env = self.environment()
        command = shutil.which(self.init["command"][0], path=env["PATH"])
        assert command is not None and Path(command).parent == Path(sys.executable).parent, "the project's plnt"
        return subprocess.run([command, *self.init["command"][1:], *[self.host(arg) for arg in self.init["args"]]],
                              env=env, cwd=self.root, capture_output=True, text=True, timeout=180, check=False,
                              stdin=subprocess.DEVNULL)

    @property
    def runner_recipe(self) -> Path:
        """The directory the runner container serves, through its own mount of the same volume."""
        [runner] = self.pod["containers"]
        recipe = runner["args"][runner["args"].index("--recipe") + 1]
        [mount] = [m for m in runner["volumeMounts"] if m["name"] == "recipe"]
        [init_mount] = [m for m in self.init["volumeMounts"] if m["name"] == "recipe"]
        assert mount.get("readOnly") is True and recipe.startswith(mount["mountPath"] + "/")
        return Path(self.host(init_mount["mountPath"] + recipe[len(mount["mountPath"]):]))


def same_tree(left: Path, right: Path) -> bool:
    def files(root: Path) -> dict[str, bytes]:
        return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}

    return files(left) == files(right)


def unique_copy(source: Path, target: Path) -> Path:
    """A copy of an example recipe whose archive no other test publishes: the session's OCI registry
    stores blobs by digest, and other tests tamper with the blobs of the example's archives."""
    shutil.copytree(source, target)
    with (target / "workflow.yaml").open("a") as handle:
        handle.write(f"# {target.name} {uuid.uuid4().hex}\n")
    return target


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    return unique_copy(SOURCE, tmp_path / "recipe-1.3.0")


@pytest.fixture
def other_recipe(tmp_path: Path) -> Path:
    return unique_copy(OTHER_SOURCE, tmp_path / "other-recipe")


@pytest.fixture(scope="module")
def helm() -> str:
    found = next((str(path) for path in HELM_CANDIDATES if path.is_file()), None)
    if found is None:
        pytest.fail("the real helm binary is missing: run tools/install_helm.sh (it installs helm into .venv/bin)")
    return found


@pytest.fixture
def authority() -> TestSigstoreAuthority:
    return TestSigstoreAuthority(name="pods")


def oci_publish(oci: OciServer, directory: Path, source: Path, authority: TestSigstoreAuthority, url: str) -> str:
    archive, bundle, digest = signed_archive(directory, source, authority)
    open_registry(url, RegistryOptions(allow_insecure_http=(oci.address,))).push("review-responder", "1.3.0",
                                                                                    archive, bundle)
    return digest


async def test_the_rendered_init_container_fetches_the_pinned_recipe_from_a_real_oci_registry(
    helm: str, oci_registry: OciServer, authority: TestSigstoreAuthority, tmp_path: Path, recipe: Path,
) -> None:
    url = f"oci://{oci_registry.address}/pods-{uuid.uuid4().hex[:8]}"
    digest = oci_publish(oci_registry, tmp_path / "pub", recipe, authority, url)
    trust = RecipeTrust(policies=(trust_policy("pods", ROOT_PATH),), trusted_roots={ROOT_PATH: authority.trusted_root_json()})
    options = RegistryOptions(allow_insecure_http=(oci_registry.address,))
    pod = PodStandIn(await driver_docs(helm, url, digest, trust, options), tmp_path / "pod", {})

    result = pod.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"fetched review-responder@1.3.0 ({digest}) signed by {IDENTITY}" in result.stdout
    assert "--trust-root" in pod.init["args"] and "--oci-insecure-host" in pod.init["args"]
    assert same_tree(pod.runner_recipe, recipe), "the runner serves exactly the published recipe"
    assert sorted(p.name for p in pod.runner_recipe.parent.iterdir()) == ["recipe"], "fetch's staging is gone"

    # Without the operator's plain-HTTP allowance (plnt's setting) the pod refuses to talk HTTP.
    strict = PodStandIn(await driver_docs(helm, url, digest, trust, RegistryOptions()), tmp_path / "strict", {})
    result = strict.run()
    assert result.returncode == 1 and "--oci-insecure-host" in result.stderr, result.stdout + result.stderr


async def test_a_recipe_swapped_in_the_registry_after_the_saga_verified_it_is_refused(
    helm: str, oci_registry: OciServer, authority: TestSigstoreAuthority, tmp_path: Path, recipe: Path,
    other_recipe: Path,
) -> None:
    """The registry now serves another archive under the same tag, validly signed: the pin stops it."""
    url = f"oci://{oci_registry.address}/pods-{uuid.uuid4().hex[:8]}"
    verified = oci_publish(oci_registry, tmp_path / "pub", recipe, authority, url)
    trust = RecipeTrust(policies=(trust_policy("pods", ROOT_PATH),), trusted_roots={ROOT_PATH: authority.trusted_root_json()})
    docs = await driver_docs(helm, url, verified, trust, RegistryOptions(allow_insecure_http=(oci_registry.address,)))
    swapped = oci_publish(oci_registry, tmp_path / "swap", other_recipe, authority, url)
    assert swapped != verified
    pod = PodStandIn(docs, tmp_path / "pod", {})
    result = pod.run()
    assert result.returncode == 1, result.stdout + result.stderr
    assert "error: IntegrityMismatch" in result.stderr and verified in result.stderr and swapped in result.stderr
    assert not pod.runner_recipe.exists() or not any(pod.runner_recipe.iterdir())


@pytest.mark.parametrize(("case", "expected"), [
    ("wrong-identity", "error: VerificationFailed: wrong-identity"),
    ("other-root", "error: VerificationFailed: untrusted-root"),
    ("tampered-digest", "error: IntegrityMismatch"),
])
async def test_a_policy_that_does_not_match_or_a_tampered_digest_fails_with_the_reason(
    helm: str, oci_registry: OciServer, authority: TestSigstoreAuthority, tmp_path: Path, case: str, expected: str,
    recipe: Path,
) -> None:
    url = f"oci://{oci_registry.address}/pods-{uuid.uuid4().hex[:8]}"
    digest = oci_publish(oci_registry, tmp_path / "pub", recipe, authority, url)
    root_json = (TestSigstoreAuthority(name="elsewhere") if case == "other-root" else authority).trusted_root_json()
    identity = "someone-else@pods.plnt.invalid" if case == "wrong-identity" else IDENTITY
    trust = RecipeTrust(policies=(trust_policy("pods", ROOT_PATH, identity),), trusted_roots={ROOT_PATH: root_json})
    docs = await driver_docs(helm, url, digest, trust, RegistryOptions(allow_insecure_http=(oci_registry.address,)))
    if case == "tampered-digest":  # someone edits the rendered Deployment's pin
        deployment = by_kind(docs)["Deployment"]
        args = deployment["spec"]["template"]["spec"]["initContainers"][0]["args"]
        args[args.index("--digest") + 1] = "sha256:" + "0" * 64
    pod = PodStandIn(docs, tmp_path / "pod", {})
    result = pod.run()
    assert result.returncode == 1 and expected in result.stderr, result.stdout + result.stderr
    assert not pod.runner_recipe.exists() or not any(pod.runner_recipe.iterdir()), "nothing lands in the volume"


async def test_several_trusted_roots_resolve_beside_the_policies(
    helm: str, oci_registry: OciServer, authority: TestSigstoreAuthority, tmp_path: Path, recipe: Path,
) -> None:
    """Two covering policies with different roots (no single --trust-root): the right one accepts."""
    url = f"oci://{oci_registry.address}/pods-{uuid.uuid4().hex[:8]}"
    digest = oci_publish(oci_registry, tmp_path / "pub", recipe, authority, url)
    other = TestSigstoreAuthority(name="partner")
    trust = RecipeTrust(policies=(trust_policy("partner", "partners/root.json"), trust_policy("pods", ROOT_PATH)),
                        trusted_roots={"partners/root.json": other.trusted_root_json(),
                                       ROOT_PATH: authority.trusted_root_json()})
    pod = PodStandIn(await driver_docs(helm, url, digest, trust, RegistryOptions(allow_insecure_http=(oci_registry.address,))),
                     tmp_path / "pod", {})
    assert "--trust-root" not in pod.init["args"]
    result = pod.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert same_tree(pod.runner_recipe, recipe)


async def test_s3_credentials_come_only_from_the_secret_the_values_name(
    helm: str, s3_bucket: S3Bucket, authority: TestSigstoreAuthority, tmp_path: Path, recipe: Path,
) -> None:
    """moto's S3 (a stand-in for Amazon S3): the init container's env has AWS credentials only
    through secretKeyRef to the Secret named by plnt's setting (a stand-in dict for that Secret)."""
    archive, bundle, digest = signed_archive(tmp_path / "pub", recipe, authority)
    url = s3_bucket.url(f"pods-{uuid.uuid4().hex[:8]}")
    options = RegistryOptions(s3_endpoint_url=s3_bucket.endpoint_url, s3_region=S3_REGION)
    open_registry(url, options).push("review-responder", "1.3.0", archive, bundle)
    trust = RecipeTrust(policies=(trust_policy("pods", ROOT_PATH),), trusted_roots={ROOT_PATH: authority.trusted_root_json()})
    docs = await driver_docs(helm, url, digest, trust, options, secret=SECRET)
    text = yaml.safe_dump_all(docs)
    assert S3_SECRET_KEY not in text and S3_ACCESS_KEY not in text, "no credentials in any manifest"
    pod = PodStandIn(docs, tmp_path / "pod", {SECRET: {"AWS_ACCESS_KEY_ID": S3_ACCESS_KEY,
                                                       "AWS_SECRET_ACCESS_KEY": S3_SECRET_KEY}})
    env = pod.environment()
    assert env["AWS_ACCESS_KEY_ID"] == S3_ACCESS_KEY and "AWS_SESSION_TOKEN" not in env
    assert [k for k in env if k.startswith("AWS_")] == ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
    result = pod.run()
    assert result.returncode == 0, result.stdout + result.stderr
    assert same_tree(pod.runner_recipe, recipe)


async def test_oci_credentials_come_from_the_secrets_docker_config(
    helm: str, authority: TestSigstoreAuthority, tmp_path: Path, recipe: Path,
) -> None:
    """An OCI registry that demands Basic auth: LyingOci (tests/oci_liar.py), a STAND-IN for an
    htpasswd-protected registry, serving honestly. The Secret's `.dockerconfigjson` is mounted as
    $HOME/.docker/config.json, which plnt's OCI client (oras) reads; without it the fetch is refused."""
    import base64
    import json

    from tests.oci_liar import LyingOci

    archive, bundle, digest = signed_archive(tmp_path / "pub", recipe, authority)
    trust = RecipeTrust(policies=(trust_policy("pods", ROOT_PATH),), trusted_roots={ROOT_PATH: authority.trusted_root_json()})
    with LyingOci() as oci:
        oci.publish("plnt/review-responder", "1.3.0", archive.read_bytes(), bundle.read_bytes())
        oci.basic_auth = "robot:correct-horse"
        options = RegistryOptions(allow_insecure_http=(oci.address,))
        url = f"oci://{oci.address}/plnt"
        auth = base64.b64encode(b"robot:correct-horse").decode()
        docker_config = json.dumps({"auths": {oci.address: {"auth": auth}}})

        docs = await driver_docs(helm, url, digest, trust, options, secret=SECRET)
        assert "correct-horse" not in yaml.safe_dump_all(docs) and auth not in yaml.safe_dump_all(docs)
        pod = PodStandIn(docs, tmp_path / "pod", {SECRET: {".dockerconfigjson": docker_config}})
        assert not [k for k in pod.environment() if k.startswith("AWS_")], "no S3 credentials for an OCI registry"
        result = pod.run()
        assert result.returncode == 0, result.stdout + result.stderr
        assert same_tree(pod.runner_recipe, recipe)

        anonymous = PodStandIn(await driver_docs(helm, url, digest, trust, options), tmp_path / "anonymous", {})
        result = anonymous.run()
        assert result.returncode == 1 and "RegistryAuthFailed" in result.stderr and "401" in result.stderr, \
            result.stdout + result.stderr
