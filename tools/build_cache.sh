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
