#!/usr/bin/env bash
# Builds the pinned local-cluster binaries (kube-apiserver, kube-controller-manager, kube-scheduler,
# kube-proxy, kubectl, etcd, kwok, helm, prometheus, traefik, versitygw, coredns, kstatus) from the Go modules under tools/ and caches them
# outside the repository. And the real node's: kubelet, containerd (+ containerd-shim-runc-v2, ctr), runc
# (cgo; needs Debian's libseccomp-dev to build), the CNI plugins (cni-bin/: bridge, host-local, loopback,
# portmap), pause (gcc -static, tools/pause/pause.c), modeldeploy-device-plugin (fake nvidia.com/gpu), crictl.
# Each of those alone, from empty Go module and build caches on 2 cores shared with other builds (load 6-11;
# 2026-12-07): kubelet 651 s (507 CPU-s, 2.0 GB peak RSS), containerd 312 s (157 CPU-s), ctr 88 s, shim 34 s,
# runc 51 s, CNI plugins 68 s, device plugin 55 s, crictl 190 s, pause < 1 s. Here, after the control plane
# (the kubelet shares most of its packages) and with each other: 3.2 min of builds added on a warm Go cache. Each binary is keyed by its version and a hash of its module's go.mod/go.sum and build
# flags, so fresh clones reuse them and a change rebuilds only what it touches.
# Prints the directory holding all of them (symlinks into the store) on stdout.
# Cold build on 2 cores, from empty Go and binary caches: 14 min on a quiet machine, 22 with other work
# running (make rehearsal, 2026-11-30), before Traefik; Traefik alone adds 5.4 min cold (325 s from empty
# module and build caches, 2.4 GB of modules, 3.1 GB peak RSS; 2026-11-30).
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0 GOFLAGS=-mod=mod
here="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION=v1.37.2
ETCD_VERSION=v3.6.16
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0
PROMETHEUS_VERSION=v0.316.0   # Prometheus 3.16.0
GATEWAY_API_VERSION=v1.6.3
TRAEFIK_VERSION=v3.6.12       # must match tools/traefik/go.mod
KEDA_VERSION=v2.21.0          # must match tools/keda/go.mod
VERSITYGW_VERSION=v1.8.0      # must match tools/versitygw/go.mod
COREDNS_VERSION=v1.15.0       # must match tools/coredns/go.mod
KSTATUS_VERSION=v0.37.2       # sigs.k8s.io/cli-utils; must match tools/kstatus/go.mod
CONTAINERD_VERSION=v2.4.2     # must match tools/containerd/go.mod
RUNC_VERSION=v1.5.3           # must match tools/runc/go.mod
CNI_PLUGINS_VERSION=v1.10.0   # must match tools/cni-plugins/go.mod
PAUSE_VERSION=v3.10.2         # kubernetes' build/pause/Makefile TAG, for tools/pause/pause.c
DEVICE_PLUGIN_API_VERSION=v0.37.2  # k8s.io/kubelet (deviceplugin/v1beta1); must match tools/deviceplugin/go.mod
CRICTL_VERSION=v1.37.0        # sigs.k8s.io/cri-tools; must match tools/crictl/go.mod
cache="${MODELDEPLOY_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modeldeploy}"
store="$cache/store"
mkdir -p "$store"
links=()

# build <module dir> <output name> <version> <package> [ldflags] [extra build tags]
# With CGO_ENABLED=1 in its environment (runc only) the key says so; the others' keys are unchanged.
build() {
  local dir=$1 out=$2 version=$3 pkg=$4 ldflags=${5:-} tags=selinux,notest${6:+,$6}
  local flags="-trimpath -tags $tags -ldflags=-s -w $ldflags"
  [[ $CGO_ENABLED == 1 ]] && flags+=" cgo"
  local key
  key="$( (cat "$here/$dir/go.mod" "$here/$dir/go.sum"; echo "$pkg $flags") | sha256sum | cut -c1-12)"
  local target="$store/$out-$version-$key"
  links+=("$out=$target")
  [[ -x "$target" ]] && return 0
  echo "building $out $version ($pkg) ..." >&2
  local start=$SECONDS
  (cd "$here/$dir" && go build -trimpath -tags "$tags" -ldflags "-s -w $ldflags" -o "$target.tmp" "$pkg")
  mv "$target.tmp" "$target"
  echo "built $out in $((SECONDS - start))s (at $(date +%T))" >&2
}

# module_dir <module dir> <module path>: the module's directory in the module cache, downloading it
# first. (`go list -m -f {{.Dir}}` prints nothing for a module that was never downloaded.)
module_dir() {
  local dir=$1 mod=$2 out
  (cd "$here/$dir" && go mod download "$mod") || {
    echo "build-binaries: 'go mod download $mod' failed in tools/$dir" >&2; return 1; }
  out="$(cd "$here/$dir" && go list -m -f '{{.Dir}}' "$mod")"
  if [[ -z "$out" || ! -d "$out" ]]; then
    echo "build-binaries: module $mod (tools/$dir) has no directory in the module cache after download" >&2
    return 1
  fi
  echo "$out"
}

# copy_files <destination> <source dir> <glob>: copies the matching files, failing when none match.
copy_files() {
  local dest=$1 src=$2 glob=$3 files
  shopt -s nullglob
  # shellcheck disable=SC2206  # the glob must expand here
  files=("$src"/$glob)
  shopt -u nullglob
  if ((${#files[@]} == 0)); then
    echo "build-binaries: no files match $src/$glob" >&2
    return 1
  fi
  cp -r "${files[@]}" "$dest/"
}

# build_traefik: Traefik's go.mod has replace directives, which `go install mod@version` refuses, so it
# is built with `go build ./cmd/traefik` inside a writable copy of its module directory, with its own
# go.mod and go.sum (-mod=readonly: nothing is re-resolved). The module itself is pinned by
# tools/traefik/go.sum (its h1: hash), which is part of the key like every other binary's.
build_traefik() {
  local ldflags="-X github.com/traefik/traefik/v3/pkg/version.Version=${TRAEFIK_VERSION#v}"
  local key target src start
  key="$( (cat "$here/traefik/go.mod" "$here/traefik/go.sum"; echo "./cmd/traefik -trimpath -ldflags=-s -w $ldflags") \
    | sha256sum | cut -c1-12)"
  target="$store/traefik-$TRAEFIK_VERSION-$key"
  links+=("traefik=$target")
  [[ -x "$target" ]] && return 0
  echo "building traefik $TRAEFIK_VERSION (copy of github.com/traefik/traefik/v3, ./cmd/traefik) ..." >&2
  start=$SECONDS
  src="$(module_dir traefik github.com/traefik/traefik/v3)"
  rm -rf "$target.src" && mkdir -p "$target.src"
  cp -r "$src/." "$target.src/" && chmod -R u+w "$target.src"
  (cd "$target.src" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $ldflags" -o "$target.tmp" ./cmd/traefik)
  rm -rf "$target.src"
  mv "$target.tmp" "$target"
  echo "built traefik in $((SECONDS - start))s (at $(date +%T))" >&2
}

# build_keda: KEDA's go.mod has a replace directive (to a remote pseudo-version), so like Traefik it is
# built inside a writable copy of its module directory with its own go.mod and go.sum (-mod=readonly;
# `go build` downloads what the two commands import). One `go build` makes both (keda-operator, and
# keda-adapter: its external-metrics server), so their shared dependencies compile once. The parts of
# its config/ the local cluster installs (CRDs and their patches, RBAC, the APIService) are kept next to
# them. The module is pinned by tools/keda/go.sum, part of the key. Cold, from empty module and build
# caches on 2 cores: 969 s with the machine loaded (load ~9; 742 CPU-seconds), 301 MB of module zips
# (1.4 GB unpacked), 2.9 GB peak RSS, binaries of 177 and 127 MB (2026-12-01).
build_keda() {
  local pkg=github.com/kedacore/keda/v2
  local ldflags="-X $pkg/version.Version=${KEDA_VERSION#v} -X $pkg/version.GitCommit=module"
  local key target src start d tmp
  key="$( (cat "$here/keda/go.mod" "$here/keda/go.sum"; echo "./cmd/operator ./cmd/adapter -trimpath -ldflags=-s -w $ldflags") \
    | sha256sum | cut -c1-12)"
  target="$store/keda-$KEDA_VERSION-$key"
  links+=("keda-operator=$target/keda-operator" "keda-adapter=$target/keda-adapter" "keda-config=$target/config")
  [[ -d "$target" ]] && return 0
  echo "building keda $KEDA_VERSION (copy of $pkg, ./cmd/operator ./cmd/adapter) ..." >&2
  start=$SECONDS
  src="$(module_dir keda "$pkg")"
  tmp="$target.tmp.$$"   # this run's own: a concurrent run must not build in (or delete) it
  rm -rf "$tmp" && mkdir -p "$tmp/src" "$tmp/out/config"
  cp -r "$src/." "$tmp/src/" && chmod -R u+w "$tmp/src"
  (cd "$tmp/src" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp/out/" \
    ./cmd/operator ./cmd/adapter)
  mv "$tmp/out/operator" "$tmp/out/keda-operator" && mv "$tmp/out/adapter" "$tmp/out/keda-adapter"
  for d in crd rbac metrics-server; do cp -r "$tmp/src/config/$d" "$tmp/out/config/"; done
  # a directory: mv would move it into one a concurrent run finished first
  [[ -d "$target" ]] || mv "$tmp/out" "$target"
  rm -rf "$tmp"
  echo "built keda in $((SECONDS - start))s (at $(date +%T))" >&2
}

# build_cni: the CNI plugins the real node's containerd runs (bridge, host-local, loopback, portmap), made by
# one `go build` into one directory, linked as cni-bin (containerd's bin_dir for CNI). The module is pinned
# by tools/cni-plugins/go.sum, part of the key.
build_cni() {
  local m=github.com/containernetworking/plugins
  local pkgs="$m/plugins/main/bridge $m/plugins/ipam/host-local $m/plugins/main/loopback $m/plugins/meta/portmap"
  local ldflags="-X $m/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION"
  local key target start tmp
  key="$( (cat "$here/cni-plugins/go.mod" "$here/cni-plugins/go.sum"; echo "$pkgs -trimpath -ldflags=-s -w $ldflags") \
    | sha256sum | cut -c1-12)"
  target="$store/cni-plugins-$CNI_PLUGINS_VERSION-$key"
  links+=("cni-bin=$target")
  [[ -d "$target" ]] && return 0
  echo "building cni plugins $CNI_PLUGINS_VERSION (bridge host-local loopback portmap) ..." >&2
  start=$SECONDS
  tmp="$target.tmp.$$"
  rm -rf "$tmp" && mkdir -p "$tmp"
  # shellcheck disable=SC2086  # $pkgs is a list of packages
  (cd "$here/cni-plugins" && go build -trimpath -ldflags "-s -w $ldflags" -o "$tmp/" $pkgs)
  [[ -d "$target" ]] || mv "$tmp" "$target"
  rm -rf "$tmp"
  echo "built cni plugins in $((SECONDS - start))s (at $(date +%T))" >&2
}

# build_pause: the pod sandbox's pause process, from tools/pause/pause.c (kubernetes v1.37.2's
# build/pause/linux/pause.c, unchanged), static like kubernetes' own; keyed by the source and flags.
build_pause() {
  local cflags="-Os -Wall -Werror -static -DVERSION=$PAUSE_VERSION"
  local key target
  key="$( (cat "$here/pause/pause.c"; echo "gcc $cflags") | sha256sum | cut -c1-12)"
  target="$store/pause-$PAUSE_VERSION-$key"
  links+=("pause=$target")
  [[ -x "$target" ]] && return 0
  echo "building pause $PAUSE_VERSION (tools/pause/pause.c) ..." >&2
  # shellcheck disable=SC2086  # $cflags is a list of flags
  gcc $cflags -o "$target.tmp.$$" "$here/pause/pause.c"
  strip "$target.tmp.$$"
  mv "$target.tmp.$$" "$target"
  echo "built pause" >&2
}

minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
kv=""
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kv+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done
pm="${PROMETHEUS_VERSION#v0.}"; pm="${pm%%.*}"; pv="${pm:0:1}.${pm:1}.${PROMETHEUS_VERSION##*.}"
# Two lanes build side by side: one `go build` leaves a core idle while it links (single-threaded for
# the big binaries) or downloads modules, and the other lane fills it. Lane 1 starts with helm (make
# lint needs it first); lane 2 holds the three biggest builds that share nothing with Kubernetes' tree.
lane1() {
  build helm helm "$HELM_VERSION" helm.sh/helm/v3/cmd/helm \
    "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  # kstatus (tools/kstatus/main.go over cli-utils' status.Compute): the chart tests hold our status to it.
  # Its main.go is ours, so its hash is a build flag, hence part of the key. Cold: 52 s on 2 busy cores,
  # 17 small modules (apimachinery v0.30.1 and its dependencies).
  build kstatus kstatus "$KSTATUS_VERSION" . "-X main.sourceHash=$(sha256sum "$here/kstatus/main.go" | cut -c1-12)"
  build etcd etcd "$ETCD_VERSION" go.etcd.io/etcd/server/v3
  build k8s kube-apiserver "$K8S_VERSION" k8s.io/kubernetes/cmd/kube-apiserver "$kv"
  build k8s kube-controller-manager "$K8S_VERSION" k8s.io/kubernetes/cmd/kube-controller-manager "$kv"
  build k8s kube-scheduler "$K8S_VERSION" k8s.io/kubernetes/cmd/kube-scheduler "$kv"
  build k8s kube-proxy "$K8S_VERSION" k8s.io/kubernetes/cmd/kube-proxy "$kv"
  build k8s kubectl "$K8S_VERSION" k8s.io/kubernetes/cmd/kubectl "$kv"
  # The real node: the kubelet, containerd (no btrfs snapshotter: it needs cgo; the shim without grpc,
  # as containerd's Makefile builds it), and below in lane 2 runc, the CNI plugins, pause, the device plugin.
  build k8s kubelet "$K8S_VERSION" k8s.io/kubernetes/cmd/kubelet "$kv"
  local cv="-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION"
  cv+=" -X github.com/containerd/containerd/v2/version.Revision=module"
  build containerd containerd "$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/containerd "$cv" \
    no_btrfs,urfave_cli_no_docs
  build containerd containerd-shim-runc-v2 "$CONTAINERD_VERSION" \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 "$cv" no_btrfs,urfave_cli_no_docs,no_grpc
  build containerd ctr "$CONTAINERD_VERSION" github.com/containerd/containerd/v2/cmd/ctr "$cv" \
    no_btrfs,urfave_cli_no_docs
  build kwok kwok "$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
  # versitygw's go.mod has no replace directives: built like the others from its wrapper module.
  build versitygw versitygw "$VERSITYGW_VERSION" github.com/versity/versitygw/cmd/versitygw \
    "-X main.Version=$VERSITYGW_VERSION -X main.Build=module -X main.BuildTime=none"
}
lane2() {
  # Prometheus with the service discoveries the local cluster uses only (kubernetes; file and http are
  # always in): its documented build tags (plugins/plugin_*.go) leave out the 20 cloud SDKs of the others.
  build prometheus prometheus "$PROMETHEUS_VERSION" github.com/prometheus/prometheus/cmd/prometheus \
    "-X github.com/prometheus/common/version.Version=$pv -X github.com/prometheus/common/version.Branch=HEAD" \
    remove_all_sd,enable_kubernetes_sd
  build_keda
  build_traefik
  # CoreDNS with the plugins of tools/coredns/main.go only (the local cluster's cluster DNS).
  build coredns coredns "$COREDNS_VERSION" .
  # runc needs cgo (libcontainer/nsenter is C) and, with the seccomp tag, libseccomp-dev to build
  # (libseccomp2 to run: dynamically linked). Its version comes from its embedded VERSION file. Not
  # the libpathrs tag of its Makefile (a Rust library); runc then uses its pure-Go pathrs-lite.
  CGO_ENABLED=1 build runc runc "$RUNC_VERSION" github.com/opencontainers/runc "" seccomp,urfave_cli_no_docs
  build_cni
  build_pause
  # The fake GPU device plugin (tools/deviceplugin/main.go): its source hash is part of the key, as kstatus'.
  build deviceplugin modeldeploy-device-plugin "$DEVICE_PLUGIN_API_VERSION" . \
    "-X main.sourceHash=$(sha256sum "$here/deviceplugin/main.go" | cut -c1-12)"
  # crictl, to look into the real node's containerd (its CRI) when debugging.
  build crictl crictl "$CRICTL_VERSION" sigs.k8s.io/cri-tools/cmd/crictl \
    "-X sigs.k8s.io/cri-tools/pkg/version.Version=${CRICTL_VERSION#v}"
}

# One build at a time per binary cache: a second caller (a test asking for the binaries while
# `make test` still builds them) waits here for the first, then finds everything built.
exec 9>"$cache/.build.lock"
flock 9
lane_start=$SECONDS
lane1 & lane1_pid=$!
lane2 & lane2_pid=$!
lane_failed=0
wait "$lane1_pid" || lane_failed=1
wait "$lane2_pid" || lane_failed=1
if ((lane_failed)); then
  echo "build-binaries: a build failed (its output is above)" >&2
  exit 1
fi
((SECONDS - lane_start < 2)) || echo "built every binary in $((SECONDS - lane_start))s" >&2
# Everything is built now: this pass only records each binary's link (every build returns at once).
links=()
lane1
lane2

# kwok needs Stage documents; copy the ones its module ships.
kwok_stages="$store/kwok-stages-$KWOK_VERSION"
if [[ ! -d "$kwok_stages" ]]; then
  src="$(module_dir kwok sigs.k8s.io/kwok)/kustomize/stage"
  rm -rf "$kwok_stages.tmp" && mkdir -p "$kwok_stages.tmp"
  copy_files "$kwok_stages.tmp" "$src" "*"
  chmod -R u+w "$kwok_stages.tmp" && mv "$kwok_stages.tmp" "$kwok_stages"
fi
links+=("kwok-stages=$kwok_stages")

# The Gateway API's standard-channel CRDs, installed into the local cluster.
gateway_crds="$store/gateway-api-crds-$GATEWAY_API_VERSION"
if [[ ! -d "$gateway_crds" ]]; then
  src="$(module_dir gateway-api sigs.k8s.io/gateway-api)/config/crd/standard"
  rm -rf "$gateway_crds.tmp" && mkdir -p "$gateway_crds.tmp"
  copy_files "$gateway_crds.tmp" "$src" "gateway.networking.k8s.io_*.yaml"
  rm -f "$gateway_crds.tmp"/*_vap_*.yaml   # a ValidatingAdmissionPolicy, not a CRD
  chmod -R u+w "$gateway_crds.tmp" && mv "$gateway_crds.tmp" "$gateway_crds"
fi
links+=("gateway-api-crds=$gateway_crds")

# One directory per combination of binaries, holding symlinks.
combo="$(printf '%s\n' "${links[@]}" | sha256sum | cut -c1-12)"
bin="$cache/bin/$combo"
if [[ ! -d "$bin" ]]; then
  mkdir -p "$bin.tmp"
  for l in "${links[@]}"; do ln -sfn "${l#*=}" "$bin.tmp/${l%%=*}"; done
  rm -rf "$bin" && mv "$bin.tmp" "$bin"
fi
echo "$bin"
