"""Model weights pulled from a real local registry through the WeightsStore, against a raw copy.

Starts a real OCI registry (docker-registry, CNCF distribution; the default) or a real S3 emulator
(moto_server, `--registry s3`) on 127.0.0.1, writes ~200 MiB of seeded random weights in several
files, signs their OMS manifest with a test Sigstore authority made for this run, publishes them
(`publish_weights`), then times, in one run and from the same source:
  - raw copy: every file read through the source (`read(name, 0)`) and written out, no hashing;
  - store pull: `WeightsStore.pull` into an empty store: signature verified, every byte hashed as it
    arrives, fsync, blobs renamed into place, the model directory assembled and checked;
  - cut + resume: a pull whose transfer is cut at 50% of the bytes (a wrapper around the real source
    whose iterator raises RegistryUnavailable there: a FAKE fault standing in for a dropped
    connection), then the pull that resumes it (ranged reads; the kept bytes hashed again);
  - cached pull: the same weights again (nothing transferred; the model directory is re-checked).

    python bench/weights_pull.py [--registry oci|s3] [--files 4] [--file-mib 50] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import how_it_ran, print_json  # noqa: E402
from plnt.core.specs.models import RecipeTrustPolicy
from plnt.reconciler.drivers.processes import free_port  # noqa: E402
from plnt.reconciler.errors import RegistryUnavailable  # noqa: E402
from plnt.reconciler.recipes.registries import RegistryOptions  # noqa: E402
from plnt.reconciler.recipes.trust import VerifiedWeights, verify_weights_signature  # noqa: E402
from plnt.reconciler.recipes.weights import SIGNATURE_NAME, WeightsSource, WeightsStore  # noqa: E402
from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory  # noqa: E402
from plnt.reconciler.recipes.weights_sources import open_weights_source, publish_weights  # noqa: E402
from recipe_pull import start  # noqa: E402

from tests.sigstore_ca import TestSigstoreAuthority  # noqa: E402

NAME, VERSION = "bench-model", "1.0.0"
IDENTITY, ISSUER = "models@bench.plnt.invalid", "https://issuer.bench.plnt.invalid"
MiB = 1 << 20


class CutAt:
    """FAKE fault: the real source, whose transfer breaks off after `after` bytes of this pull."""

    def __init__(self, source: WeightsSource, after: int) -> None:
        self.source, self.left = source, after

    def describe(self) -> str:
        return self.source.describe()

    def signature(self) -> bytes | None:
        return self.source.signature()

    def read(self, name: str, offset: int) -> Iterator[bytes]:
        for chunk in self.source.read(name, offset):
            if len(chunk) >= self.left:
                yield chunk[:self.left]
                raise RegistryUnavailable("bench: transfer cut at 50%")
            self.left -= len(chunk)
            yield chunk


def mbps(size: int, seconds: float) -> float:
    return size / seconds / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--registry", choices=["oci", "s3"], default="oci")
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--file-mib", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    how = how_it_ran("weights_pull.py", vars(args), [
        f"registry: {'docker-registry (CNCF distribution 2.8), oci://' if args.registry == 'oci' else 'moto_server, s3://'} "
        "on 127.0.0.1, plain HTTP; store and scratch files on the same local disk (tempfile)",
        "same source for every row; raw copy = source.read + write, no hashing, no fsync; pull = WeightsStore.pull",
        "cut: a FAKE fault (a wrapper raising after 50% of the bytes); MB = 10^6 bytes"])
    work = Path(tempfile.mkdtemp(prefix="plnt-bench-weights-"))
    procs: list[Any] = []
    try:
        port = free_port()
        if args.registry == "oci":
            (work / "oci").mkdir()
            (work / "oci.yml").write_text(f"version: 0.1\nlog: {{level: error, accesslog: {{disabled: true}}}}\n"
                                          f"storage: {{filesystem: {{rootdirectory: {work / 'oci'}}}}}\n"
                                          f"http: {{addr: 127.0.0.1:{port}}}\n")
            procs.append(start(["docker-registry", "serve", str(work / "oci.yml")], f"http://127.0.0.1:{port}/v2/",
                               work / "oci.log", work))
            url, options = f"oci://127.0.0.1:{port}/bench", RegistryOptions(allow_insecure_http=(f"127.0.0.1:{port}",))
        else:
            os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1")
            moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
            procs.append(start([moto, "-H", "127.0.0.1", "-p", str(port)], f"http://127.0.0.1:{port}/moto-api/",
                               work / "moto.log", work))
            import boto3

            boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}").create_bucket(Bucket="bench")
            url, options = "s3://bench/models", RegistryOptions(s3_endpoint_url=f"http://127.0.0.1:{port}",
                                                                 s3_region="us-east-1")
        print(f"# registry: {url}")

        author = work / "author"
        rng = random.Random(20251201)
        for index in range(args.files):
            path = author / f"model-{index + 1:05d}-of-{args.files:05d}.safetensors"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(rng.randbytes(args.file_mib * MiB))
        (author / "tokenizer").mkdir()
        (author / "tokenizer" / "tokenizer.json").write_bytes(rng.randbytes(2 * MiB))
        authority = TestSigstoreAuthority(name="bench-weights")
        manifest = manifest_of_directory(author, NAME, ignore=(SIGNATURE_NAME,))
        (author / SIGNATURE_NAME).write_text(authority.sign_dsse(manifest.statement(), PAYLOAD_TYPE, IDENTITY, ISSUER))
        total = sum((author / f.name).stat().st_size for f in manifest.files)
        started = time.perf_counter()
        publish_weights(author, url, NAME, VERSION, options)
        push_s = time.perf_counter() - started

        policy = RecipeTrustPolicy.model_validate({
            "apiVersion": "plnt.work/v1", "kind": "RecipeTrustPolicy", "metadata": {"name": "bench"},
            "spec": {"recipes": [NAME], "trustRoot": {"trustedRootFile": "root.json"},
                     "signers": [{"issuer": ISSUER, "identity": IDENTITY}]}})
        root_bytes = authority.trusted_root_json().encode()

        def verify(bundle: bytes | None) -> VerifiedWeights:
            return verify_weights_signature(bundle, model=NAME, policies=[policy], load_trusted_root=lambda _p: root_bytes,
                                            pin=manifest.root_digest)

        def source() -> WeightsSource:
            return open_weights_source(url, NAME, VERSION, options)

        rows: dict[str, list[float]] = {"raw_copy_s": [], "pull_s": [], "cut_s": [], "resume_s": [], "cached_s": []}
        resume_bytes: list[tuple[int, int]] = []
        for run in range(args.repeat):
            raw_dir = work / f"raw-{run}"
            started = time.perf_counter()
            reader = source()
            reader.signature()
            for item in manifest.files:
                target = raw_dir / item.name
                target.parent.mkdir(parents=True, exist_ok=True)
                with open(target, "wb") as out:
                    for chunk in reader.read(item.name, 0):
                        out.write(chunk)
            rows["raw_copy_s"].append(time.perf_counter() - started)
            shutil.rmtree(raw_dir)

            store = WeightsStore(work / f"store-{run}", budget_bytes=4 * total)
            started = time.perf_counter()
            pulled = store.pull(source(), verify)
            rows["pull_s"].append(time.perf_counter() - started)
            assert pulled.transferred_bytes == total

            started = time.perf_counter()
            pulled = store.pull(source(), verify)
            rows["cached_s"].append(time.perf_counter() - started)
            assert pulled.transferred_bytes == 0

            cut_store = WeightsStore(work / f"cut-{run}", budget_bytes=4 * total)
            started = time.perf_counter()
            try:
                cut_store.pull(CutAt(source(), total // 2), verify)
                raise SystemExit("the cut did not happen")
            except RegistryUnavailable:
                rows["cut_s"].append(time.perf_counter() - started)
            started = time.perf_counter()
            resumed = cut_store.pull(source(), verify)
            rows["resume_s"].append(time.perf_counter() - started)
            resume_bytes.append((resumed.transferred_bytes, resumed.resumed_bytes))
            shutil.rmtree(work / f"store-{run}")
            shutil.rmtree(work / f"cut-{run}")

        def median(key: str) -> float:
            return statistics.median(rows[key])

        transferred, kept = resume_bytes[-1]
        print(f"weights: {len(manifest.files)} files, {total / MiB:.1f} MiB ({total} bytes); "
              f"publish_weights: {push_s:.2f} s ({mbps(total, push_s):.0f} MB/s)")
        print(f"{'':34} {'time (median)':>14} {'MB/s':>8}")
        print(f"{'raw copy (no hashing)':34} {median('raw_copy_s'):>12.2f} s {mbps(total, median('raw_copy_s')):>8.0f}")
        print(f"{'store pull (hash, verify, fsync)':34} {median('pull_s'):>12.2f} s {mbps(total, median('pull_s')):>8.0f}")
        print(f"{'pull cut at 50%':34} {median('cut_s'):>12.2f} s {mbps(total // 2, median('cut_s')):>8.0f}")
        print(f"{'resume (rest of the bytes)':34} {median('resume_s'):>12.2f} s {mbps(transferred, median('resume_s')):>8.0f}"
              f"   {transferred} bytes transferred, {kept} kept and re-hashed")
        print(f"{'cached pull (nothing transferred)':34} {median('cached_s'):>12.2f} s {mbps(total, median('cached_s')):>8.0f}"
              "   (MB/s of the model re-checked)")
        print_json(how, {"registry": url, "total_bytes": total, "publish_s": round(push_s, 3),
                         "resume_transferred_bytes": transferred, "resume_kept_bytes": kept,
                         **{key: [round(v, 3) for v in values] for key, values in rows.items()}})
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
