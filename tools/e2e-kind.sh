#!/usr/bin/env bash
# The e2e suite on a real kind cluster with a GPU worker (`make e2e-kind`).
#
#   tools/e2e-kind.sh [options] [-- PYTEST_ARGS...]
#
# Steps: check prerequisites -> create the kind cluster from kind-config.yaml (reused if it exists) ->
# NVIDIA container toolkit inside the GPU worker (as nvkind does) -> NVIDIA device plugin, wait for
# nvidia.com/gpu allocatable -> build both images and `kind load` them -> Prometheus (deploy/prometheus)
# -> the CRDs (server-side apply) and our chart -> tests/e2e with E2E_KUBECONFIG pointing at the cluster.
# Needs a host with an NVIDIA driver, Docker and the NVIDIA container toolkit (see docs/gpu-kind.md).
set -Eeuo pipefail

REPO="$(cd "${BASH_SOURCE[0]%/*}/.." && pwd)"
CLUSTER_NAME="${KIND_CLUSTER_NAME:-modeldeploy}"
STATE_DIR="${E2E_KIND_STATE_DIR:-$REPO/.e2e-kind}"
IMAGE_TAG="${E2E_IMAGE_TAG:-dev}"
SERVING_BASE_IMAGE="${SERVING_BASE_IMAGE:-}"   # empty: the Dockerfile's default (a CUDA base)
DEVICE_PLUGIN_VERSION="${DEVICE_PLUGIN_VERSION:-0.17.1}"
GPU_WAIT_S="${GPU_WAIT_S:-300}"
PYTHON="${PYTHON:-$REPO/.venv/bin/python}"
RELEASE=modeldeploy
RELEASE_NAMESPACE=modeldeploy-system
PROMETHEUS_LOCAL_PORT="${PROMETHEUS_LOCAL_PORT:-19090}"
CHECK_ONLY=0
SKIP_BUILD=0
DELETE_AFTER=0
PYTEST_ARGS=()

usage() {
  cat <<USAGE
usage: tools/e2e-kind.sh [options] [-- PYTEST_ARGS...]

Runs tests/e2e against a kind cluster with a GPU worker (kind-config.yaml).

options:
  --check             only check the prerequisites (docker, kind, nvidia-ctk, helm, kubectl)
  --name NAME         kind cluster name (default: \$KIND_CLUSTER_NAME or modeldeploy)
  --skip-build        do not build the images (load the existing modeldeploy/*:$IMAGE_TAG)
  --delete            delete the kind cluster at the end (default: keep it for inspection)
  -h, --help          this help

environment: E2E_IMAGE_TAG (dev), SERVING_BASE_IMAGE, DEVICE_PLUGIN_VERSION ($DEVICE_PLUGIN_VERSION),
GPU_WAIT_S (300), PYTHON (.venv/bin/python), E2E_KIND_STATE_DIR (.e2e-kind), PROMETHEUS_LOCAL_PORT (19090).
USAGE
}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'e2e-kind: %s\n' "$*" >&2; exit "${2:-1}"; }

while (($#)); do
  case "$1" in
    --check) CHECK_ONLY=1 ;;
    --name)
      (($# >= 2)) || die "--name needs a value" 2
      CLUSTER_NAME="$2"; shift ;;
    --name=*) CLUSTER_NAME="${1#--name=}" ;;
    --skip-build) SKIP_BUILD=1 ;;
    --delete) DELETE_AFTER=1 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) usage >&2; die "unknown option: $1" 2 ;;
  esac
  shift
done
[[ "$CLUSTER_NAME" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "invalid cluster name: $CLUSTER_NAME" 2

# ------------------------------------------------------------------------------------------ prerequisites
declare -A HINT=(
  [docker]="Docker Engine: https://docs.docker.com/engine/install/"
  [kind]="kind: go install sigs.k8s.io/kind@latest (or https://kind.sigs.k8s.io/docs/user/quick-start/)"
  [nvidia-ctk]="NVIDIA Container Toolkit: https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html"
  [helm]="helm v3: tools/build-binaries.sh builds it (add the printed directory to PATH)"
  [kubectl]="kubectl: tools/build-binaries.sh builds it (add the printed directory to PATH)"
)
missing=()
for tool in docker kind nvidia-ctk helm kubectl; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if ((${#missing[@]})); then
  {
    printf 'e2e-kind: missing prerequisites: %s\n' "${missing[*]}"
    for tool in "${missing[@]}"; do printf '  %-10s %s\n' "$tool" "${HINT[$tool]}"; done
  } >&2
  exit 3
fi
docker info >/dev/null 2>&1 || die "docker is installed but its daemon does not answer (docker info failed)" 3
[[ -x "$PYTHON" ]] || die "no Python at $PYTHON (make venv, or set PYTHON)" 3
if ((CHECK_ONLY)); then
  log "prerequisites present: docker kind nvidia-ctk helm kubectl"
  exit 0
fi

mkdir -p "$STATE_DIR"
KUBECONFIG="$STATE_DIR/kubeconfig"
export KUBECONFIG
PF_PID=""
cleanup() {
  if [[ -n "$PF_PID" ]]; then kill "$PF_PID" 2>/dev/null || true; fi
  if ((DELETE_AFTER)); then
    log "deleting kind cluster $CLUSTER_NAME"
    kind delete cluster --name "$CLUSTER_NAME" || true
  fi
}
trap cleanup EXIT

# ------------------------------------------------------------------------------------------ cluster
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
  log "reusing kind cluster $CLUSTER_NAME"
  kind export kubeconfig --name "$CLUSTER_NAME" --kubeconfig "$KUBECONFIG"
else
  log "creating kind cluster $CLUSTER_NAME from kind-config.yaml"
  kind create cluster --name "$CLUSTER_NAME" --config "$REPO/kind-config.yaml" --kubeconfig "$KUBECONFIG" --wait 120s
fi

# The GPU worker: the NVIDIA container toolkit inside the node, containerd's default runtime set to it,
# and the host's masked /proc/driver/nvidia unmounted (the steps nvkind performs).
gpu_nodes=$(kubectl get nodes -l nvidia.com/gpu.present=true -o jsonpath='{.items[*].metadata.name}')
[[ -n "$gpu_nodes" ]] || die "no node labelled nvidia.com/gpu.present=true (see kind-config.yaml)"
for node in $gpu_nodes; do
  log "configuring the NVIDIA runtime in node $node"
  docker exec "$node" bash -c '
    set -e
    if ! command -v nvidia-ctk >/dev/null; then
      apt-get update -qq && apt-get install -y -qq gpg curl >/dev/null
      curl -fsSL https://nvidia.github.io/libnvidia-container/gpgkey \
        | gpg --dearmor -o /usr/share/keyrings/nvidia-container-toolkit-keyring.gpg
      curl -fsSL https://nvidia.github.io/libnvidia-container/stable/deb/nvidia-container-toolkit.list \
        | sed "s#deb https://#deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] https://#g" \
        > /etc/apt/sources.list.d/nvidia-container-toolkit.list
      apt-get update -qq && apt-get install -y -qq nvidia-container-toolkit >/dev/null
    fi
    nvidia-ctk runtime configure --runtime=containerd --set-as-default
    systemctl restart containerd
    umount -R /proc/driver/nvidia 2>/dev/null || true
  '
done

log "installing the NVIDIA device plugin $DEVICE_PLUGIN_VERSION"
helm repo add nvdp https://nvidia.github.io/k8s-device-plugin --force-update >/dev/null
helm upgrade --install nvidia-device-plugin nvdp/nvidia-device-plugin --version "$DEVICE_PLUGIN_VERSION" \
  --namespace nvidia --create-namespace --wait --timeout 300s
log "waiting for nvidia.com/gpu allocatable (up to ${GPU_WAIT_S}s)"
deadline=$((SECONDS + GPU_WAIT_S))
while :; do
  gpus=$(kubectl get nodes -l nvidia.com/gpu.present=true \
    -o jsonpath='{range .items[*]}{.status.allocatable.nvidia\.com/gpu}{" "}{end}')
  [[ "$gpus" =~ [1-9] ]] && break
  ((SECONDS < deadline)) || break
  sleep 5
done
[[ "$gpus" =~ [1-9] ]] || die "no nvidia.com/gpu allocatable after ${GPU_WAIT_S}s: kubectl -n nvidia logs -l app.kubernetes.io/name=nvidia-device-plugin"
log "allocatable nvidia.com/gpu per GPU node: $gpus"

# ------------------------------------------------------------------------------------------ images
OPERATOR_IMAGE="modeldeploy/operator:$IMAGE_TAG"
SERVING_IMAGE="modeldeploy/modelserver:$IMAGE_TAG"
if ((!SKIP_BUILD)); then
  log "building $OPERATOR_IMAGE and $SERVING_IMAGE"
  docker build -f "$REPO/operator/Dockerfile" -t "$OPERATOR_IMAGE" "$REPO"
  build_args=()
  [[ -n "$SERVING_BASE_IMAGE" ]] && build_args+=(--build-arg "BASE_IMAGE=$SERVING_BASE_IMAGE")
  docker build -f "$REPO/serving_image/Dockerfile" "${build_args[@]}" -t "$SERVING_IMAGE" "$REPO"
fi
for image in "$OPERATOR_IMAGE" "$SERVING_IMAGE"; do
  log "kind load $image"
  kind load docker-image "$image" --name "$CLUSTER_NAME"
done

# ------------------------------------------------------------------------------------------ Prometheus
log "installing Prometheus (deploy/prometheus)"
kubectl apply -f "$REPO/deploy/prometheus/"
kubectl -n monitoring rollout status deployment/prometheus --timeout=300s

# ------------------------------------------------------------------------------------------ operator
log "installing the CRDs and the chart"
kubectl apply --server-side --force-conflicts -f "$REPO/charts/modeldeploy/crds/"
helm upgrade --install "$RELEASE" "$REPO/charts/modeldeploy" --namespace "$RELEASE_NAMESPACE" --create-namespace \
  --set image.tag="$IMAGE_TAG" --set operator.defaultServingImage="$SERVING_IMAGE" \
  --set operator.prometheusUrl=http://prometheus.monitoring.svc:9090 --set rbac.clusterWide=true \
  --wait --timeout 300s

# ------------------------------------------------------------------------------------------ e2e suite
kubectl -n monitoring port-forward svc/prometheus "$PROMETHEUS_LOCAL_PORT:9090" >"$STATE_DIR/port-forward.log" 2>&1 &
PF_PID=$!
log "running tests/e2e against kind-$CLUSTER_NAME"
export E2E_KUBECONFIG="$KUBECONFIG"
export E2E_KUBECTL
E2E_KUBECTL="$(command -v kubectl)"
export E2E_PROMETHEUS_URL="http://127.0.0.1:$PROMETHEUS_LOCAL_PORT"
export E2E_OPERATOR_RELEASE="$RELEASE" E2E_OPERATOR_NAMESPACE="$RELEASE_NAMESPACE"
export E2E_SERVING_IMAGE="$SERVING_IMAGE"
cd "$REPO"
"$PYTHON" -m pytest -p no:cacheprovider tests/e2e "${PYTEST_ARGS[@]}"
