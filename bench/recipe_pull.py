"""Recipe verification time, and pull time for 1 MB and 20 MB archives from each registry.

Starts a real S3 emulator (moto_server) and a real OCI registry (docker-registry, CNCF
distribution) on 127.0.0.1, packs recipes with incompressible knowledge files of the given sizes,
signs them with a test Sigstore authority made for this run, pushes them to file://, s3:// and
oci://, then times in one run:
  - verify: `verify_recipe` on one archive digest + bundle (offline; the Verifier is cached per root);
  - fetch: the registry transfer alone (with the digest computed while downloading);
  - pull: the whole pipeline into an empty cache (fetch, pin check, verify, safe extract, load);
  - cached pull: the same version again (no transfer; signature verified again).

    python bench/recipe_pull.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import how_it_ran, print_json  # noqa: E402
from plnt.core.specs.models import RecipeTrustPolicy, WorkflowSource
from plnt.reconciler.drivers.processes import free_port  # noqa: E402
from plnt.reconciler.recipes.archive import archive_digest, pack_recipe_to  # noqa: E402
from plnt.reconciler.recipes.pull import RecipeCache, pull_recipe  # noqa: E402
from plnt.reconciler.recipes.registries import RegistryOptions, open_registry  # noqa: E402
from plnt.reconciler.recipes.trust import verify_recipe  # noqa: E402

from tests.sigstore_ca import TestSigstoreAuthority  # noqa: E402

IDENTITY, ISSUER = "bench@recipes.test", "https://issuer.test"


def start(argv: list[str], ready_url: str, log: Path, cwd: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT, cwd=cwd)  # noqa: SIM115
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(ready_url, timeout=1, trust_env=False).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"{argv[0]} did not start; see {log}")


def ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:8.1f} ms"


def raw_ms(values: list[float]) -> list[float]:
    return [round(v * 1000, 2) for v in values]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    how = how_it_ran("recipe_pull.py", vars(args), [
        "real registries on 127.0.0.1: file://, moto_server (s3://), docker-registry (oci://)",
        "pull: into an empty cache (fetch, pin check, verify, extract, load); cached pull: the same version again"])
    rows: list[dict[str, object]] = []
    work = Path(tempfile.mkdtemp(prefix="plnt-bench-pull-"))
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        s3_port, oci_port = free_port(), free_port()
        moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
        procs.append(start([moto, "-H", "127.0.0.1", "-p", str(s3_port)], f"http://127.0.0.1:{s3_port}/moto-api/",
                           work / "moto.log", work))
        (work / "oci").mkdir()
        (work / "oci.yml").write_text(f"version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\n"
                                      f"storage: {{filesystem: {{rootdirectory: {work / 'oci'}}}}}\n"
                                      f"http: {{addr: 127.0.0.1:{oci_port}}}\n")
        procs.append(start(["docker-registry", "serve", str(work / "oci.yml")], f"http://127.0.0.1:{oci_port}/v2/",
                           work / "oci.log", work))
        import boto3

        boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_port}").create_bucket(Bucket="bench")
        # The operator names the local registry (plain HTTP) and the directory of the file registry.
        options = RegistryOptions(s3_endpoint_url=f"http://127.0.0.1:{s3_port}",
                                  allow_insecure_http=(f"127.0.0.1:{oci_port}",), file_roots=(str(work),))
        registries = {"file": f"file://{work / 'registry'}", "s3": "s3://bench/recipes",
                      "oci": f"oci://127.0.0.1:{oci_port}/bench"}

        authority = TestSigstoreAuthority(name="bench")
        policy = RecipeTrustPolicy.model_validate({
            "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "bench"},
            "spec": {"recipes": ["*"], "trustRoot": {"trustedRootFile": "root.json"},
                     "signers": [{"issuer": ISSUER, "identity": IDENTITY}]}})
        root_bytes = authority.trusted_root_json().encode()

        print(f"{'size':>6} {'registry':<8} {'fetch (median)':>15} {'pull (median)':>15} {'cached pull':>13}")
        verify_times: list[float] = []
        for size_mb in (1, 20):
            source = work / f"src-{size_mb}"
            shutil.copytree(ROOT / "gitops-example" / "recipes" / "review-responder" / "1.2.0", source)
            # Incompressible, and the same bytes every run (seeded).
            (source / "knowledge" / "blob.bin").write_bytes(random.Random(size_mb).randbytes(size_mb * 2**20))
            version = f"1.2.{size_mb}"
            text = (source / "workflow.yaml").read_text().replace("version: 1.2.0", f"version: {version}")
            (source / "workflow.yaml").write_text(text)
            archive = work / f"recipe-{size_mb}.tar.gz"
            pack_recipe_to(source, archive)
            bundle = archive.with_name(archive.name + ".sigstore.json")
            bundle.write_text(authority.sign(archive, IDENTITY, ISSUER))
            digest = archive_digest(archive).removeprefix("sha256:")
            bundle_bytes = bundle.read_bytes()
            for _ in range(50):
                started = time.perf_counter()
                verify_recipe(digest, bundle_bytes, recipe="review-responder", policies=[policy],
                              load_trusted_root=lambda _p: root_bytes)
                verify_times.append(time.perf_counter() - started)
            for kind, url in registries.items():
                registry = open_registry(url, options)
                registry.push("review-responder", version, archive, bundle)
                fetches, pulls, cached = [], [], []
                for i in range(args.repeat):
                    dest = work / f"fetch-{kind}-{size_mb}-{i}"
                    started = time.perf_counter()
                    registry.fetch("review-responder", version, dest)
                    fetches.append(time.perf_counter() - started)
                    cache = RecipeCache(work / f"cache-{kind}-{size_mb}-{i}")
                    source_ref = WorkflowSource(ref=f"review-responder@{version}", registry=url)
                    for target in (pulls, cached):
                        started = time.perf_counter()
                        pull_recipe(source_ref, commit="bench", cache=cache, policies=[policy],
                                    read_from_repo=lambda _c, _p: root_bytes, export_from_repo=lambda *_: False,
                                    registry_options=options)
                        target.append(time.perf_counter() - started)
                print(f"{size_mb:>4}MB {kind:<8} {ms(fetches):>15} {ms(pulls):>15} {ms(cached):>13}")
                rows.append({"size_mb": size_mb, "registry": kind, "fetch_ms": raw_ms(fetches),
                             "pull_ms": raw_ms(pulls), "cached_pull_ms": raw_ms(cached)})
        print(f"\nverify_recipe (offline, cached Verifier): median {statistics.median(verify_times) * 1000:.2f} ms "
              f"over {len(verify_times)} verifications")
        print_json(how, {"pulls": rows, "verify_ms": raw_ms(verify_times)})
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
