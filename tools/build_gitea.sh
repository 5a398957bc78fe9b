#!/usr/bin/env bash
# Builds Gitea, a real git forge, for tests/forge: `code.gitea.io/gitea` at the release pinned in
# tools/gitea/go.mod, through that wrapper module. Needs Go, the Go module proxy and a C compiler
# (SQLite is cgo: the `sqlite sqlite_unlock_notify` tags, as Gitea's own Makefile builds it).
# The API needs no npm-built front end: the test server reads its templates and options from the
# module's own directory, which this script prints beside the binary.
#
#   tools/build_gitea.sh           (or: make gitea-bin)
#   tools/build_gitea.sh --check   prints the bin directory if it is built, else exits 1; builds nothing
#
# Progress goes to stderr; the one line on stdout is the bin directory, so `BIN=$(tools/build_gitea.sh)`.
# The bin directory holds `gitea` and `static-root` (the module directory: templates/, options/).
# Kept in $PLNT_GITEA_CACHE (default ~/.cache/plnt/gitea)/gitea-<version>/bin; a later run with the
# same pin prints that directory at once. A build that stops halfway leaves no `complete` marker, so
# the next run builds again. The first build takes minutes (see docs/review-and-approval.md, "Against a real Gitea").
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SRC="$ROOT/tools/gitea"

say() { echo "build_gitea: $*" >&2; }
die() { say "$*"; exit 1; }
# shellcheck source=tools/build_cache.sh
. "$ROOT/tools/build_cache.sh"

VERSION="$(pinned_version "$SRC/go.mod" code.gitea.io/gitea)"
[ -n "$VERSION" ] || die "could not read the pinned Gitea version from $SRC/go.mod"

TAGS="sqlite sqlite_unlock_notify"
KEY="gitea-${VERSION}"
CACHE="${PLNT_GITEA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/plnt/gitea}"
DIR="$CACHE/$KEY"
BIN="$DIR/bin"
MARKER="$DIR/complete"

use_cached_build "$DIR" "${1:-}"
command -v go >/dev/null || die "go is not on PATH: Gitea is built from its Go module (Go >= 1.26)"
command -v "${CC:-cc}" >/dev/null || die "no C compiler (${CC:-cc}): Gitea's SQLite driver is cgo; install gcc"

export GOFLAGS=-mod=readonly
MODDIR="$(cd "$SRC" && go mod download -json code.gitea.io/gitea | awk -F'"' '$2 == "Dir" { print $4 }')"
[ -d "$MODDIR" ] || die "go mod download code.gitea.io/gitea@$VERSION gave no directory"

require_directives "$MODDIR/go.mod" "$SRC/go.mod" "Gitea $VERSION"

PARTIAL="$DIR/bin.partial"
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL"

started=$SECONDS
say "building gitea $VERSION into $DIR (first time: several minutes)..."
# What Gitea's Makefile passes for a SQLite build.
(cd "$SRC" && CGO_ENABLED=1 CGO_CFLAGS="$(go env CGO_CFLAGS) -DSQLITE_MAX_VARIABLE_NUMBER=32766" \
  go build -trimpath -tags "$TAGS" \
  -ldflags "-s -w -X main.Version=${VERSION#v} -X 'main.Tags=$TAGS'" \
  -o "$PARTIAL/gitea" code.gitea.io/gitea)
ln -s "$MODDIR" "$PARTIAL/static-root"
"$PARTIAL/gitea" --version >&2

rm -rf "$BIN"
mv "$PARTIAL" "$BIN"
# The marker last: its presence means the binary above is there.
printf 'gitea %s\ntags %s\nbuilt %s with %s in %ss\n' \
  "$VERSION" "$TAGS" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(go env GOVERSION)" "$((SECONDS - started))" >"$MARKER"
say "built in $((SECONDS - started))s; $(du -sh "$BIN/gitea" | cut -f1) in $BIN"
echo "$BIN"
