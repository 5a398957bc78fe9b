#!/usr/bin/env bash
# Builds KEDA's operator and metrics adapter for tests/k8s (scaling a release on the in-flight gauge
# through a real Prometheus and the real HPA controller), from `github.com/kedacore/keda/v2` at the
# release pinned in tools/keda/go.mod, through that wrapper module. Needs only Go and the Go module proxy.
#
#   tools/build_keda.sh           (or: make keda-bin)
#   tools/build_keda.sh --check   prints the bin directory if it is built, else exits 1; builds nothing
#
# Progress goes to stderr; the one line on stdout is the bin directory, so `BIN=$(tools/build_keda.sh)`.
# The bin directory holds `keda-operator`, `keda-adapter` and `crds/` (KEDA's CustomResourceDefinitions,
# ScaledObject among them, copied from the same release's config/crd/bases).
# Kept in $PLNT_KEDA_CACHE (default ~/.cache/plnt/keda)/keda-<version>/bin; a later run with the same
# pin prints that directory at once. A build that stops halfway leaves no `complete` marker, so the next
# run builds again. The first build takes minutes (see docs/kubernetes.md, "Autoscaling on in-flight requests").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/tools/keda"

say() { echo "build_keda: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=tools/build_cache.sh
. "$ROOT/tools/build_cache.sh"

MODULE=github.com/kedacore/keda/v2
VERSION="$(pinned_version "$SRC/go.mod" "$MODULE")"
[ -n "$VERSION" ] || die "could not read the pinned KEDA version from $SRC/go.mod"

KEY="keda-${VERSION}"
CACHE="${PLNT_KEDA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plnt/keda}"
DIR="$CACHE/$KEY"
BIN="$DIR/bin"
MARKER="$DIR/complete"

use_cached_build "$DIR" "${1:-}"
command -v go >/dev/null || die "go is not on PATH: KEDA is built from its Go module (Go >= 1.26)"

# Static binaries (no C toolchain needed), no module edits behind go.sum's back.
export CGO_ENABLED=0
export GOFLAGS=-mod=readonly
MODDIR="$(cd "$SRC" && go mod download -json "$MODULE" | awk -F'"' '$2 == "Dir" { print $4 }')"
[ -d "$MODDIR" ] || die "go mod download $MODULE@$VERSION gave no directory"

# KEDA pins its Kubernetes libraries with replace lines, which the wrapper must carry.
require_directives "$MODDIR/go.mod" "$SRC/go.mod" "KEDA $VERSION"

PARTIAL="$DIR/bin.partial"
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL/crds"

# What KEDA's Makefile stamps in, so the operator's start-up line tells the real release.
LDFLAGS="-s -w -X $MODULE/version.Version=${VERSION#v} -X $MODULE/version.GitCommit=release"

started=$SECONDS
build() { # name, package
  local name="$1" pkg="$2" t0=$SECONDS
  say "building $name $VERSION (first time: several minutes)..."
  (cd "$SRC" && go build -trimpath -ldflags "$LDFLAGS" -o "$PARTIAL/$name" "$pkg")
  say "built $name in $((SECONDS - t0))s"
}

say "building into $DIR ($KEY)"
build keda-operator "$MODULE/cmd/operator"
build keda-adapter "$MODULE/cmd/adapter"

# The CRDs of the same release (ScaledObject, TriggerAuthentication...), for the test cluster to apply.
for crd in "$MODDIR"/config/crd/bases/*.yaml; do
  cp "$crd" "$PARTIAL/crds/"
done
[ -f "$PARTIAL/crds/keda.sh_scaledobjects.yaml" ] || die "KEDA $VERSION has no keda.sh_scaledobjects.yaml under $MODDIR/config/crd/bases"
chmod -R u+w "$PARTIAL/crds"

rm -rf "$BIN"
mv "$PARTIAL" "$BIN"
# The marker last: its presence means every file above is there.
printf 'keda %s\nbuilt %s with %s in %ss\n' \
  "$VERSION" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(go env GOVERSION)" "$((SECONDS - started))" >"$MARKER"
say "done in $((SECONDS - started))s; $(du -sh "$BIN" | cut -f1) in $BIN"
echo "$BIN"
