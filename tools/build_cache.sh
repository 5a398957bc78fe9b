# shellcheck shell=bash
# Sourced by tools/build_*.sh: a built tool is kept in a directory of its own per pinned version,
# DIR/bin, finished when DIR/complete exists (written last, so a build stopped halfway is redone).
#
#   use_cached_build DIR [--check] [prerequisite checks...]
# prints DIR/bin and exits 0 when it is built; with --check and not built, says so and exits 1;
# otherwise creates DIR and takes DIR/.lock, so that a second build starting at once waits there,
# then finds the first one's marker and prints DIR/bin.

use_cached_build() {
  local dir="$1" mode="${2:-}"
  if [ -f "$dir/complete" ]; then
    echo "$dir/bin"
    exit 0
  fi
  if [ "$mode" = --check ]; then
    say "not built yet: $dir/bin"
    exit 1
  fi
  mkdir -p "$dir"
  if command -v flock >/dev/null; then
    exec 9>"$dir/.lock"
    flock 9
    if [ -f "$dir/complete" ]; then
      echo "$dir/bin"
      exit 0
    fi
  fi
}

# The version a wrapper go.mod requires of a module: the field after its path, not on the right of a `=>`.
#   pinned_version GO_MOD MODULE
pinned_version() {
  awk -v m="$2" '{ for (i = 1; i < NF; i++) if ($i == m && $(i + 1) ~ /^v/ && $(i - 1) != "=>") { print $(i + 1); exit } }' "$1"
}

# A dependant's build ignores a dependency's replace and exclude lines: a wrapper module must carry the
# built module's own, or the build silently takes versions it was never built with. Dies naming the
# lines of MODULE_GO_MOD that WRAPPER_GO_MOD lacks (one-line and block forms, compared without comments).
#   require_directives MODULE_GO_MOD WRAPPER_GO_MOD WHAT
require_directives() {
  local missing
  missing="$(comm -23 <(_directives "$1") <(_directives "$2"))"
  if [ -n "$missing" ]; then
    die "$2 lacks these lines of $3's go.mod; copy them over, then run go mod tidy there:
$missing"
  fi
}

_directives() {
  sed 's|[[:space:]]*//.*||' "$1" | awk '
    /^(replace|exclude) \($/ { block = $1; next }
    block != "" && /^\)$/ { block = ""; next }
    block != "" && NF { $1 = $1; print block " " $0; next }
    /^(replace|exclude) / { $1 = $1; print }' | sort
}
