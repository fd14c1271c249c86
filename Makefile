# ModelDeploy — one command for the demo, one for the tests. Everything else is installed on demand.
SHELL := /bin/bash
.DEFAULT_GOAL := help
export GOTOOLCHAIN := local

VENV      := .venv
PY        := $(VENV)/bin/python
STAMP     := $(VENV)/.installed
PYTEST    := $(PY) -m pytest -p no:cacheprovider

.PHONY: help venv binaries iproute2 nftables deps test test-setup binaries-niced checks-without-binaries \
        test-cluster test-node system-packages test-unit test-integration test-e2e lint lint-code lint-chart \
        cluster-up cluster-down demo images rehearsal bench-serving bench-serving-shadow bench-generate bench-gpu bench-operator bench-canary bench-judge bench-storage bench-chaos crds e2e-kind shellcheck clean

help:
	@echo "make demo        bring up the local cluster and run the main job on it"
	@echo "make test        install what is missing; lint and unit tests beside the binaries build; then the images, integration, e2e, chaos, security, the real node"
	@echo "make lint        ruff check + format check, mypy, shellcheck, hadolint, helm lint"
	@echo "make cluster-up / cluster-down   the local Kubernetes cluster alone"
	@echo "make bench-serving / bench-operator / bench-canary   benchmarks (results under bench/results/)"
	@echo "make bench-serving-shadow   only the shadow-copy cost section of bench-serving"
	@echo "make bench-generate  text generation: modelserver vs transformers serve (CB and naive) vs the decode limit"
	@echo "make bench-gpu       the server's GPU path (needs CUDA): encoders fp16, generation exactness, 0.8 B Llama vs transformers serve"
	@echo "make bench-storage   model fetch from the local S3 vs plain boto3; pod-Ready cold vs node cache"
	@echo "make bench-chaos     fault injection on the local cluster: what clients saw, time to resume; the generation soak"
	@echo "make bench-judge     the statistical judge on the local cluster: false positives (identical) and power (30 % slower)"
	@echo "make test-node   the real-node tier alone: pods in containerd containers of our images (docs/local-cluster.md)"
	@echo "make images      the operator, modelserver and pause images with buildah (no Docker): OCI archives (docs/images.md)"
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

# `make test` in two phases. First, side by side (make -j2): the binaries' build (niced, so the
# checks below keep their core) and, once the virtualenv is there, everything that needs no binary
# (ruff, mypy, shellcheck, hadolint, the unit tests but the chart's). The Go build is CPU-bound on two
# cores while pip, ruff, mypy and pytest mostly use one, so on a fresh machine this hides most of
# them behind the build (docs/local-cluster.md, "Set-up time"). Then, in order, what needs the
# binaries: helm lint, the images (make images: seconds when unchanged), the chart's unit tests, and the
# cluster tiers.
test: system-packages
	@$(MAKE) --no-print-directory -j2 --output-sync=target test-setup
	@$(MAKE) --no-print-directory test-cluster

test-setup: binaries-niced checks-without-binaries

binaries-niced:
	@nice -n 10 tools/build-binaries.sh >/dev/null

checks-without-binaries: lint-code
	$(PYTEST) tests/unit --ignore=tests/unit/chart

test-cluster: deps lint-chart images
	$(PYTEST) tests/unit/chart
	$(PYTEST) tests/integration
	$(PYTEST) tests/e2e
	$(PYTEST) tests/chaos
	$(SECURITY_TESTS)
	$(E2E_CHART)
	$(NODE_TESTS)

# The security tier's pods run on the real node (containerd containers of the images built here): the
# tier passes there unchanged (2 runs, 89 and 104 s; 2026-12-07), so the tenants' fences and the node
# cache's are held by a real kubelet, runtime and hostPath, not by the process agent.
SECURITY_TESTS := LOCALCLUSTER_NODE=containerd flock /tmp/modeldeploy-realnode.lock $(PYTEST) tests/security

# The real-node tier (docs/local-cluster.md "The real node"): pods in containerd containers of the images
# `make images` built, the chart's operator among them, a fake GPU device plugin. The device plugin's own
# Go test first (a fake kubelet). One real kubelet per machine (the device-plugin socket is fixed), so
# every run takes the same lock.
NODE_TESTS := (cd tools/deviceplugin && go test -count=1 .) && \
	MODELDEPLOY_NODE_REQUIRE_IMAGES=1 flock /tmp/modeldeploy-realnode.lock $(PYTEST) tests/node

test-node: deps images
	$(NODE_TESTS)

test-unit: venv binaries
	$(PYTEST) tests/unit

test-integration: deps
	$(PYTEST) tests/integration

test-e2e: deps
	$(PYTEST) tests/e2e
	$(E2E_CHART)

# iproute2, nftables, shellcheck, chromium (the dashboard's e2e test drives it headless), buildah and
# debootstrap (make images) and libseccomp's headers (runc's build, tools/build-binaries.sh) in one
# apt-get run (make test; the first three also have a target of their own)
system-packages:
	@missing=""; for p in ip:iproute2 nft:nftables shellcheck:shellcheck chromium:chromium buildah:buildah \
	  debootstrap:debootstrap; do command -v "$${p%%:*}" >/dev/null || missing="$$missing $${p#*:}"; done; \
	test -e /usr/include/seccomp.h || missing="$$missing libseccomp-dev"; \
	if [ -n "$$missing" ]; then echo "installing Debian's$$missing ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; fi

shellcheck:
	@command -v shellcheck >/dev/null || { echo "installing Debian's shellcheck ..."; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq shellcheck >/dev/null; }

lint: lint-code lint-chart

# the checks that need no pinned binary (make test runs them while the binaries build)
lint-code: venv shellcheck
	$(VENV)/bin/ruff check operator serving_image tools/localcluster tests bench
	$(VENV)/bin/ruff format --check operator serving_image tools/localcluster tests bench
	shellcheck .ci/run tools/e2e-kind.sh tools/build-binaries.sh tools/fresh-rehearsal.sh tools/build-images.sh
	$(VENV)/bin/hadolint --config tests/unit/chart/hadolint.yaml operator/Dockerfile serving_image/Dockerfile
	MYPYPATH=operator:serving_image:tools $(VENV)/bin/mypy -p modeldeploy -p modelserver -p localcluster

lint-chart: binaries
	"$$(tools/build-binaries.sh)/helm" lint --strict charts/modeldeploy

cluster-up: deps
	$(PY) -m localcluster up

cluster-down: venv
	$(PY) -m localcluster down

demo: deps images
	$(PY) -m localcluster demo

# mosec and TorchServe (bench.serving_torchserve; it needs Java 17+), the peers of bench.serving_mosec, are
# installed here, for the bench only
bench-serving: venv
	$(PY) -m pip install --quiet "mosec==0.9.8" "torchserve==0.12.0" "torch-model-archiver==0.12.0"
	$(PY) -m bench.serving
	$(PY) -m bench.serving_cpu
	$(PY) -m bench.serving_shadow
	$(PY) -m bench.serving_mosec

# the shadow mirror's cost alone (also part of bench-serving)
bench-serving-shadow: venv
	$(PY) -m bench.serving_shadow

# text generation vs transformers serve (its openai and accelerate dependencies are installed here, for the bench
# only), then guidellm as the load generator against the same servers (it installs beside the venv's pins)
bench-generate: venv
	$(PY) -m pip install --quiet "openai==3.60.0" "accelerate==1.15.0" "guidellm==0.8.1"
	$(PY) -m bench.generate
	taskset -c $$(( $$(nproc) - 1 )) env OMP_NUM_THREADS=1 $(PY) -m bench.generate_bound
	$(PY) -m bench.gen_guidellm

# the server's GPU path; needs a CUDA machine (exits 2 without one): bench/results/gpu.{json,md}
bench-gpu: venv
	$(PY) -m pip install --quiet "openai==3.60.0" "accelerate==1.15.0"
	$(PY) -m bench.gpu

bench-judge: deps
	$(PY) -m bench.judge

bench-operator: deps
	$(PY) -m bench.operator

bench-canary: deps
	$(PY) -m bench.canary $(BENCH_CANARY_ARGS)

bench-storage: deps
	$(PY) -m bench.storage

# fault injection (tests/chaos/ and tests/e2e/test_verdict.py), figures into bench/results/chaos.json; and
# the generation server's 10-minute soak under hostile traffic, into bench/results/gen_soak.json (each runs
# whatever the other found; the target fails if either did)
bench-chaos: deps
	rc=0; $(PY) -m bench.chaos || rc=$$?; $(PY) -m bench.gen_soak --duration-s 600 || rc=$$?; exit $$rc

crds: venv
	$(PY) -m modeldeploy.crdgen > crds/modeldeployment.yaml
	$(PY) -m modeldeploy.crdgen --peering > crds/kopfpeering.yaml
	cp crds/*.yaml charts/modeldeploy/crds/

# The three images built here with buildah, no Docker engine or registry: OCI archives under
# ~/.cache/modeldeploy/images, their names and paths printed (docs/images.md)
images: binaries
	@tools/build-images.sh

# A fresh machine's CI, rehearsed: clone main, empty Go/binary caches, .ci/run (REHEARSAL_ARGS: --cold-pip, --keep, ...)
rehearsal:
	tools/fresh-rehearsal.sh $(REHEARSAL_ARGS)

# The same e2e suite on kind with a GPU worker (needs docker, kind, nvidia-ctk, helm): docs/gpu-kind.md
e2e-kind: venv
	tools/e2e-kind.sh $(E2E_KIND_ARGS)

clean: cluster-down
	rm -rf .localcluster
