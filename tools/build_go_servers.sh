#!/usr/bin/env bash
# The test servers built from Go modules (Gitea, the Kubernetes control plane, KEDA), built one after
# the other in the background at the lowest CPU priority, so that a first `make test` runs the tests
# that need none of them meanwhile: tests/conftest.py runs tests/forge and tests/k8s last, and their
# fixtures wait on each build's lock (tools/build_cache.sh) until it is done. Built ones are cached by
# version under ~/.cache/plnt and found at once.
#
#   tools/build_go_servers.sh --background   starts the builds and returns (their output: the log below)
#   tools/build_go_servers.sh                builds them in the foreground
#
# A build that fails here is tried again by its fixture, whose test then fails with the build's output.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/plnt"
LOG="$CACHE/go-servers.log"
SCRIPTS=(build_gitea.sh build_k8s.sh build_keda.sh)  # in the order the tests need them

built() {
  local script
  for script in "${SCRIPTS[@]}"; do
    bash "$ROOT/tools/$script" --check >/dev/null 2>&1 || return 1
  done
}

build_all() {
  local script t0
  for script in "${SCRIPTS[@]}"; do
    t0=$SECONDS
    if nice -n 19 bash "$ROOT/tools/$script" >/dev/null; then
      echo "build_go_servers: tools/$script done in $((SECONDS - t0))s"
    else
      echo "build_go_servers: tools/$script failed (exit $?); its tests build it again and show why"
    fi
  done
}

if built; then
  exit 0
fi
if [ "${1:-}" = --background ]; then
  mkdir -p "$CACHE"
  echo "build_go_servers: building Gitea, the Kubernetes control plane and KEDA in the background" \
       "(first time: about 35 minutes of CPU; the tests that need them run last and wait for them); log: $LOG" >&2
  # setsid: not in the foreground job's process group, so make's end or a Ctrl-C of the tests leaves
  # the builds to finish (a half-done build leaves no marker and would start over).
  setsid bash -c "$(declare -p ROOT SCRIPTS); $(declare -f build_all); build_all" >"$LOG" 2>&1 </dev/null &
  exit 0
fi
build_all
