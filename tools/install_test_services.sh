#!/usr/bin/env bash
# Install the system packages the test suite starts for real, when they are missing:
#   docker-registry   the CNCF distribution OCI registry (Debian's package), for the OCI tests
#   and the linter ShellCheck (package shellcheck), for tools/e2e_kind.sh (tests/charts)
#   gnupg and openssh-client (gpg, ssh-keygen): signed git commits in the --verify-commits tests
#   chromium: the headless browser the web UI tests (tests/ui) drive through Playwright
#   prometheus (prometheus, promtool): rule checks/tests and the scrape test in tests/observability
#   iproute2 (ip): the pod network namespace of the end-to-end Kubernetes tests (tests/k8s/pod_network.py)
#   gcc: Gitea's SQLite driver is cgo (tools/build_gitea.sh, for tests/forge)
# Run by `make test` (through `make install-test-services`); root or passwordless sudo installs with
# apt-get, anyone else gets the exact command to run. Nothing here is needed by `make up`.
set -euo pipefail

missing=()
command -v docker-registry >/dev/null 2>&1 || missing+=(docker-registry)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
command -v gpg >/dev/null 2>&1 || missing+=(gnupg)                    # signed-commit tests
command -v ssh-keygen >/dev/null 2>&1 || missing+=(openssh-client)    # signed-commit tests
[ -x /usr/bin/chromium ] || missing+=(chromium)                        # web UI tests (tests/ui)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)          # tests/observability
command -v ip >/dev/null 2>&1 || missing+=(iproute2)                 # tests/k8s pod network
command -v "${CC:-cc}" >/dev/null 2>&1 || missing+=(gcc)             # Gitea's cgo SQLite (tests/forge)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -eq 0 ]; then
  SUDO=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  SUDO=(sudo -n)
else
  echo "the tests need: ${missing[*]}; install with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "the tests need: ${missing[*]} (Debian/Ubuntu package names); install them with your package manager" >&2
  exit 1
fi
echo "installing ${missing[*]} (apt-get) for the test suite"
"${SUDO[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
command -v docker-registry >/dev/null
command -v shellcheck >/dev/null
command -v gpg >/dev/null
command -v ssh-keygen >/dev/null
[ -x /usr/bin/chromium ]
command -v promtool >/dev/null
