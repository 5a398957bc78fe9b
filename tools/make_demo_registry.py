"""Rebuild gitops-example's signed demo registry from the recipe sources.

    python tools/make_demo_registry.py

For every `gitops-example/recipes/<name>/<version>/` it packs the deterministic archive into
`gitops-example/registry/<name>/<version>/recipe.tar.gz` and signs it with a DEMO Sigstore
authority made for this run (a test-format trust root: CA, CT log and Rekor keys in memory only).
It writes the demo authority's public trusted-root JSON to `gitops-example/trust/` and the
RecipeTrustPolicy that trusts only the demo identity. The private keys are discarded when the
script ends: nobody can sign more recipes for this demo root, and none is committed.
Running it again makes a new demo root and re-signs everything.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from plnt.reconciler.recipes.archive import pack_recipe_to  # noqa: E402

from tests.sigstore_ca import TestSigstoreAuthority  # noqa: E402

EXAMPLE = ROOT / "gitops-example"
DEMO_IDENTITY = "recipes@demo.plnt.invalid"
DEMO_ISSUER = "https://issuer.demo.plnt.invalid"
TRUSTED_ROOT = "trust/demo-trusted-root.json"

POLICY = f"""\
# Which signers may sign which recipes. This DEMO policy trusts one identity of a demo authority
# whose public trusted root ships next to it ({TRUSTED_ROOT}); the demo's private keys were
# discarded after signing, see tools/make_demo_registry.py. For real recipes use
# `trustRoot: {{publicGood: true}}` (the Sigstore public-good root) and your release identities.
apiVersion: plnt.work/v1
kind: RecipeTrustPolicy
metadata:
  name: demo-recipes
spec:
  recipes: ["review-responder", "post-generator", "booking-triage", "trend-monitor"]
  trustRoot:
    trustedRootFile: {TRUSTED_ROOT}
  signers:
    - issuer: {DEMO_ISSUER}
      identity: {DEMO_IDENTITY}
"""


def main() -> None:
    authority = TestSigstoreAuthority(name="plnt-demo")
    authority.write_trusted_root(EXAMPLE / TRUSTED_ROOT)
    (EXAMPLE / "trust" / "policy.yaml").write_text(POLICY)
    for source in sorted((EXAMPLE / "recipes").glob("*/*/")):
        name, version = source.parent.name, source.name
        target = EXAMPLE / "registry" / name / version
        target.mkdir(parents=True, exist_ok=True)
        archive = target / "recipe.tar.gz"
        digest = pack_recipe_to(source, archive)
        (target / "recipe.tar.gz.sigstore.json").write_text(authority.sign(archive, DEMO_IDENTITY, DEMO_ISSUER))
        print(f"{name}@{version}: {digest}")
    print(f"demo trusted root: {EXAMPLE / TRUSTED_ROOT}")


if __name__ == "__main__":
    main()
