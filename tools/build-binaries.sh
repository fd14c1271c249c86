#!/usr/bin/env bash
# Builds the pinned local-cluster binaries (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl, etcd, kwok, helm) from the Go modules under tools/ and caches
# them outside the repository, keyed by version and go.sum, so fresh clones reuse them.
# Prints the cache directory on stdout. Cold build on 2 cores: tens of minutes.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
here="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
key="$(cat "$here"/{k8s,etcd,kwok,helm}/go.sum "$0" | sha256sum | cut -c1-12)"
bin="${MODELDEPLOY_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modeldeploy/bin}/k8s-${K8S_VERSION}-etcd-${ETCD_VERSION}-kwok-${KWOK_VERSION}-helm-${HELM_VERSION}-${key}"
mkdir -p "$bin"

build() {  # build <module dir> <output name> <package> [ldflags]
  local dir=$1 out=$2 pkg=$3 ldflags=${4:-}
  [[ -x "$bin/$out" ]] && return 0
  echo "building $out ($pkg) ..." >&2
  local start=$SECONDS
  (cd "$here/$dir" && go build -trimpath -tags selinux,notest -ldflags "-s -w $ldflags" -o "$bin/$out.tmp" "$pkg")
  mv "$bin/$out.tmp" "$bin/$out"
  echo "built $out in $((SECONDS - start))s" >&2
}

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
kv=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
build etcd etcd go.etcd.io/etcd/server/v3
build k8s kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$kv"
build k8s kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$kv"
build k8s kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$kv"
build k8s kubectl k8s.io/kubernetes/cmd/kubectl "$kv"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
build helm helm helm.sh/helm/v3/cmd/helm "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"

# kwok needs Stage documents; copy the ones its module ships.
stages="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage"
if [[ ! -d "$bin/kwok-stages" ]]; then
  mkdir -p "$bin/kwok-stages.tmp" && cp -r "$stages"/. "$bin/kwok-stages.tmp/" && chmod -R u+w "$bin/kwok-stages.tmp"
  mv "$bin/kwok-stages.tmp" "$bin/kwok-stages"
fi
echo "$bin"
