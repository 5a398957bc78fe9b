#!/usr/bin/env bash
# Builds the binaries of a real Kubernetes control plane for tests/k8s: kube-apiserver,
# kube-controller-manager, kube-scheduler, etcd and kwok, from the Go modules pinned in
# tools/k8s/{kube,etcd,kwok}/go.mod. Needs only Go and the Go module proxy.
#
#   tools/build_k8s.sh           (or: make k8s-bins)
#   tools/build_k8s.sh --check   prints the bin directory if it is built, else exits 1; builds nothing
#
# Progress goes to stderr; the one line on stdout is the bin directory, so `BIN=$(tools/build_k8s.sh)`.
# Beside the binaries, kwok-stages.yaml: kwok's default Node and Pod stages (from the same kwok release),
# which the kwok binary needs as --config when it runs without kwokctl.
# The binaries are kept in $PLNT_K8S_CACHE (default ~/.cache/plnt/k8s)/<key>/bin, the key naming the
# pinned versions; a later run with the same pins prints that directory at once. A build that stops
# halfway leaves no `complete` marker, so the next run builds again. The first build takes minutes
# (see docs/kubernetes.md, "Building the test control plane").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/tools/k8s"

say() { echo "build_k8s: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=tools/build_cache.sh
. "$ROOT/tools/build_cache.sh"

# The version a go.mod requires of a module: the field after its path, not on the right of a `=>`.
pinned() {
  awk -v m="$2" '{ for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/ && $(i - 1) != "=>") { print $(i + 1); exit } }' \
    "$SRC/$1/go.mod"
}

K8S="$(pinned kube k8s.io/kubernetes)"
ETCD="$(pinned etcd go.etcd.io/etcd/server/v3)"
KWOK="$(pinned kwok sigs.k8s.io/kwok)"
if [ -z "$K8S" ] || [ -z "$ETCD" ] || [ -z "$KWOK" ]; then
  die "could not read the pinned versions from $SRC/*/go.mod"
fi

KEY="k8s-${K8S}_etcd-${ETCD}_kwok-${KWOK}"
CACHE="${PLNT_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plnt/k8s}"
DIR="$CACHE/$KEY"
BIN="$DIR/bin"
MARKER="$DIR/complete"

use_cached_build "$DIR" "${1:-}"
command -v go >/dev/null || die "go is not on PATH: the control plane is built from Go modules (Go >= 1.26)"

PARTIAL="$DIR/bin.partial"
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL"

# Static binaries (no C toolchain needed), no module edits behind go.sum's back.
export CGO_ENABLED=0
export GOFLAGS=-mod=readonly

# What hack/lib/version.sh stamps into a release, so /version and `--version` tell the real release.
MAJOR="${K8S#v}"; MAJOR="${MAJOR%%.*}"
MINOR="${K8S#v*.}"; MINOR="${MINOR%%.*}"
KUBE_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  KUBE_LDFLAGS+=" -X $pkg.gitVersion=$K8S -X $pkg.gitMajor=$MAJOR -X $pkg.gitMinor=$MINOR -X $pkg.gitTreeState=clean"
done

started=$SECONDS
build() { # name, module dir under tools/k8s, package, ldflags
  local name="$1" module="$2" pkg="$3" ldflags="$4" t0=$SECONDS
  say "building $name (first time: several minutes)..."
  (cd "$SRC/$module" && go build -trimpath -ldflags "$ldflags" -o "$PARTIAL/$name" "$pkg")
  say "built $name in $((SECONDS - t0))s"
}

say "building into $DIR ($KEY)"
build etcd etcd . "-s -w"
build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$KUBE_LDFLAGS"
build kube-controller-manager kube k8s.io/kubernetes/cmd/kube-controller-manager "$KUBE_LDFLAGS"
build kube-scheduler kube k8s.io/kubernetes/cmd/kube-scheduler "$KUBE_LDFLAGS"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-s -w"

# kwokctl hands kwok these stages itself: node-initialize and a lease heartbeat keep fake Nodes Ready,
# pod-ready/complete/delete move their Pods through their lives. Taken from the module just built.
KWOK_SRC="$(cd "$SRC/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
first=1
for stage in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
             pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
  [ -f "$KWOK_SRC/$stage.yaml" ] || die "kwok $KWOK has no stage $stage.yaml under $KWOK_SRC"
  [ "$first" = 1 ] || echo "---"
  first=0
  cat "$KWOK_SRC/$stage.yaml"
done >"$PARTIAL/kwok-stages.yaml"

rm -rf "$BIN"
mv "$PARTIAL" "$BIN"
# The marker last: its presence means every binary above is there.
printf 'kubernetes %s\netcd %s\nkwok %s\nbuilt %s with %s in %ss\n' \
  "$K8S" "$ETCD" "$KWOK" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(go env GOVERSION)" "$((SECONDS - started))" >"$MARKER"
say "done in $((SECONDS - started))s; $(du -sh "$BIN" | cut -f1) in $BIN"
echo "$BIN"
