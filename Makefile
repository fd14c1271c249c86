# ModelDeploy — one command for the demo, one for the tests. Everything else is installed on demand.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export GOTOOLCHAIN := local

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
PYTEST    := $(PY) -m pytest -p no:cacheprovider

.PHONY: help venv binaries iproute2 nftables deps test test-unit test-integration test-e2e lint \
        cluster-up cluster-down demo rehearsal bench-serving bench-serving-shadow bench-operator bench-canary bench-storage bench-chaos crds e2e-kind shellcheck clean

help:
	@echo "make demo        bring up the local cluster and run the main job on it"
	@echo "make test        install what is missing, lint, then run unit, integration and e2e tests"
	@echo "make lint        ruff check + format check, mypy, shellcheck, hadolint, helm lint"
	@echo "make cluster-up / cluster-down   the local Kubernetes cluster alone"
	@echo "make bench-serving / bench-operator / bench-canary   benchmarks (results under bench/results/)"
	@echo "make bench-serving-shadow   only the shadow-copy cost section of bench-serving"
	@echo "make bench-storage   model fetch from the local S3 vs plain boto3; pod-Ready cold vs node cache"
	@echo "make bench-chaos     fault injection on the local cluster: what clients saw, time to resume"
	@echo "make crds        regenerate crds/ from the pydantic API (operator/modeldeploy/api.py)"
	@echo "make rehearsal   the fresh-machine rehearsal: .ci/run on a clone of main with empty Go and binary caches"
	@echo "make e2e-kind    the e2e suite on kind with a GPU worker (docs/gpu-kind.md)"

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade "pip==25.3"
	$(PY) -m pip install --quiet -e '.[server,operator,cluster,dev]'
	@touch $@

venv: $(STAMP)

binaries:
	@tools/build-binaries.sh >/dev/null

iproute2:
	@command -v ip >/dev/null || { echo "installing Debian's iproute2 (the pod network needs ip netns) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq iproute2 >/dev/null; }

# kube-proxy's nftables mode drives the kernel through the `nft` command.
nftables:
	@command -v nft >/dev/null || { echo "installing Debian's nftables (kube-proxy's nftables mode needs nft) ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }

deps: venv binaries iproute2 nftables

# Scenario 1 of the canary suite once more, with the operator installed by the Helm chart (a pod with
# the chart's ServiceAccount token): the chart's RBAC is enough for a real rollout under traffic.
E2E_CHART := E2E_OPERATOR=chart $(PYTEST) tests/e2e/test_canary.py -k good_revision

# lint first, so CI (.ci/run = make test) enforces it
test: deps lint
	$(PYTEST) tests/unit
	$(PYTEST) tests/integration
	$(PYTEST) tests/e2e
	$(PYTEST) tests/chaos
	$(PYTEST) tests/security
	$(E2E_CHART)

test-unit: venv binaries
	$(PYTEST) tests/unit

test-integration: deps
	$(PYTEST) tests/integration

test-e2e: deps
	$(PYTEST) tests/e2e
	$(E2E_CHART)

shellcheck:
	@command -v shellcheck >/dev/null || { echo "installing Debian's shellcheck ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; }

lint: venv binaries shellcheck
	$(VENV)/bin/ruff check operator serving_image tools/localcluster tests bench
	$(VENV)/bin/ruff format --check operator serving_image tools/localcluster tests bench
	shellcheck .ci/run tools/e2e-kind.sh tools/build-binaries.sh tools/fresh-rehearsal.sh
	$(VENV)/bin/hadolint --config tests/unit/chart/hadolint.yaml operator/Dockerfile serving_image/Dockerfile
	"$$(tools/build-binaries.sh)/helm" lint --strict charts/modeldeploy
	MYPYPATH=operator:serving_image:tools $(VENV)/bin/mypy -p modeldeploy -p modelserver -p localcluster

cluster-up: deps
	$(PY) -m localcluster up

cluster-down: venv
	$(PY) -m localcluster down

demo: deps
	$(PY) -m localcluster demo

bench-serving: venv
	$(PY) -m bench.serving
	$(PY) -m bench.serving_cpu
	$(PY) -m bench.serving_shadow

# the shadow mirror's cost alone (also part of bench-serving)
bench-serving-shadow: venv
	$(PY) -m bench.serving_shadow

bench-operator: deps
	$(PY) -m bench.operator

bench-canary: deps
	$(PY) -m bench.canary $(BENCH_CANARY_ARGS)

bench-storage: deps
	$(PY) -m bench.storage

# fault injection (tests/chaos/ and tests/e2e/test_verdict.py), figures into bench/results/chaos.json
bench-chaos: deps
	$(PY) -m bench.chaos

crds: venv
	$(PY) -m modeldeploy.crdgen > crds/modeldeployment.yaml
	$(PY) -m modeldeploy.crdgen --peering > crds/kopfpeering.yaml
	cp crds/*.yaml charts/modeldeploy/crds/

# A fresh machine's CI, rehearsed: clone main, empty Go/binary caches, .ci/run (REHEARSAL_ARGS: --cold-pip, --keep, ...)
rehearsal:
	tools/fresh-rehearsal.sh $(REHEARSAL_ARGS)

# The same e2e suite on kind with a GPU worker (needs docker, kind, nvidia-ctk, helm): docs/gpu-kind.md
e2e-kind: venv
	tools/e2e-kind.sh $(E2E_KIND_ARGS)

clean: cluster-down
	rm -rf .localcluster
