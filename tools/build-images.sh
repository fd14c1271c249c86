#!/usr/bin/env bash
# Builds the three container images with buildah, without a Docker engine or a registry (docs/images.md):
#   modeldeploy/operator:dev     operator/Dockerfile         (PYTHON_IMAGE: a Debian bookworm base + python3 made here)
#   modeldeploy/modelserver:dev  serving_image/Dockerfile    (BASE_IMAGE: the plain bookworm base made here)
#   modeldeploy/pause:3.10       tools/pause/Containerfile   (the static pause binary from tools/build-binaries.sh)
# The bases come from `debootstrap --variant=minbase bookworm` on the host's Debian mirror. Each image is
# smoke-tested (its entrypoint with --help, its imports, as its configured non-root user), then written as an
# OCI archive into the cache, named by a hash of everything that goes into it:
#   ${MODELDEPLOY_IMAGE_CACHE:-~/.cache/modeldeploy/images}/<name>-<key>.tar
# An archive already there is not built again, so an unchanged second run takes seconds (the hashes).
# Prints an env-style manifest on stdout (IMAGE_<NAME>_REF / IMAGE_<NAME>_ARCHIVE per image), also written to
# <cache>/manifest.env; the archives load with `ctr -n k8s.io images import <archive>` (the ref is inside the
# archive). Progress goes to stderr.
# Needs root (buildah's overlay storage under /var/lib/containers, debootstrap); installs Debian's buildah and
# debootstrap when missing. Machine-specific parts stay here, never in the Dockerfiles: the mirror, and the
# host's CA bundle, bind-mounted (not copied) into the RUN steps so that pip trusts what the host trusts.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache="${MODELDEPLOY_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modeldeploy/images}"
SUITE=bookworm
PAUSE_VERSION=3.10 # the tag of modeldeploy/pause (tools/localcluster/realnode_config.py's PAUSE_IMAGE)
# the archives' layer compression: zstd (containerd >= 1.5 imports it) takes half the time of gzip
COMPRESSION="${MODELDEPLOY_IMAGE_COMPRESSION:-zstd}"
host_ca="${MODELDEPLOY_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}"
export BUILDAH_ISOLATION=chroot BUILDAH_LAYERS=true
log() { echo "build-images: $*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}
[[ $EUID -eq 0 ]] || die "needs root (buildah's storage under /var/lib/containers, debootstrap)"

if ! command -v buildah >/dev/null || ! command -v debootstrap >/dev/null; then
  log "installing Debian's buildah and debootstrap ..."
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah debootstrap >/dev/null
fi

# ---- the working containers this run creates are removed on exit, whatever happens ----------------------
containers=()
untested="" # an image built but not (yet) through its smoke test: its name is taken off on exit
tmp="$(mktemp -d)"
cleanup() {
  local c
  for c in "${containers[@]}"; do buildah rm "$c" >/dev/null 2>&1 || true; done
  [[ -z "$untested" ]] || buildah rmi "$untested" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT
new_container() { # new_container <image>: a working container of it, named in $c (removed on exit)
  c="$(buildah from --pull=never --quiet "$1")"
  containers+=("$c")
}

# ---- the host's Debian mirror (the URIs of its apt sources), for debootstrap and for apt inside builds ----
host_uri() { # host_uri <path suffix, e.g. /debian>: the first http(s) URI of the host's sources ending so
  local suffix=$1
  {
    grep -h -E '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{for (i = 2; i <= NF; i++) print $i}'
    grep -h -E '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}'
  } | sed 's:/*$::' | grep -E "^https?://.*${suffix}\$" | head -n 1 || true
}
mirror="${MODELDEPLOY_DEBIAN_MIRROR:-$(host_uri /debian)}"
security="${MODELDEPLOY_DEBIAN_SECURITY_MIRROR:-$(host_uri /debian-security)}"
[[ -n "$mirror" ]] || die "no Debian mirror in /etc/apt/sources.list{,.d/*}; set MODELDEPLOY_DEBIAN_MIRROR"
# the base's /etc/apt/sources.list.d/debian.sources: the host's mirror, so that apt works inside the builds
sources="Types: deb
URIs: $mirror
Suites: $SUITE $SUITE-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
[[ -n "$security" ]] && sources+="

Types: deb
URIs: $security
Suites: $SUITE-security
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"

have_image() { buildah inspect --type image "$1" >/dev/null 2>&1; }
hash_of() { sha256sum | cut -c1-16; }

# ---- the bases ----------------------------------------------------------------------------------------------
# bookworm: debootstrap minbase, the host's sources, the updates and security fixes of the day it was made.
# Its key is the hash of its inputs (suite, variant, debootstrap's version, the sources, this recipe's version);
# MODELDEPLOY_BASE_REFRESH=<anything> makes a new one (e.g. a date, for the newest security fixes).
BASE_RECIPE="minbase upgrade v1 ${MODELDEPLOY_BASE_REFRESH:-}"
base_key="$(printf '%s\n' "$SUITE" "$BASE_RECIPE" "$(debootstrap --version)" "$sources" | hash_of)"
BASE="localhost/modeldeploy/$SUITE:$base_key"
if ! have_image "$BASE"; then
  log "making $BASE with debootstrap from $mirror ..."
  start=$SECONDS
  debootstrap --variant=minbase "$SUITE" "$tmp/rootfs" "$mirror" >"$tmp/debootstrap.log" 2>&1 ||
    {
      tail -n 20 "$tmp/debootstrap.log" >&2
      die "debootstrap failed"
    }
  rm -f "$tmp/rootfs/etc/apt/sources.list"
  printf '%s\n' "$sources" >"$tmp/rootfs/etc/apt/sources.list.d/debian.sources"
  rm -rf "$tmp/rootfs/var/cache/apt/archives/"*.deb "$tmp/rootfs/var/lib/apt/lists/"* "$tmp/rootfs/debootstrap"
  tar -C "$tmp/rootfs" --numeric-owner -cf "$tmp/rootfs.tar" .
  rm -rf "$tmp/rootfs"
  new_container scratch
  buildah add --quiet "$c" "$tmp/rootfs.tar" / >/dev/null
  rm -f "$tmp/rootfs.tar"
  buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --cmd '["bash"]' \
    --label "org.opencontainers.image.title=modeldeploy-$SUITE-base" \
    --label "org.opencontainers.image.description=debootstrap --variant=minbase $SUITE ($mirror)" \
    --created-by "debootstrap --variant=minbase $SUITE $mirror; apt-get upgrade (tools/build-images.sh)" "$c"
  buildah run "$c" -- sh -c 'export DEBIAN_FRONTEND=noninteractive; apt-get update -qq && apt-get upgrade -y -qq \
    && apt-get clean && rm -rf /var/lib/apt/lists/*' >"$tmp/upgrade.log" 2>&1 ||
    {
      tail -n 20 "$tmp/upgrade.log" >&2
      die "apt-get upgrade in the base failed"
    }
  buildah commit --quiet --rm "$c" "$BASE" >/dev/null
  log "made $BASE in $((SECONDS - start)) s"
fi

# bookworm-python: the base + python3 (python3-venv, python-is-python3): the operator Dockerfile's PYTHON_IMAGE
PY_PACKAGES="python3 python3-venv python-is-python3 ca-certificates"
py_key="$(printf '%s\n' "$base_key" "$PY_PACKAGES" | hash_of)"
PYBASE="localhost/modeldeploy/$SUITE-python:$py_key"
if ! have_image "$PYBASE"; then
  log "making $PYBASE ($PY_PACKAGES) ..."
  start=$SECONDS
  new_container "$BASE"
  # shellcheck disable=SC2086 # the package list is split on purpose
  buildah run "$c" -- sh -c "export DEBIAN_FRONTEND=noninteractive; apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends $PY_PACKAGES && rm -rf /var/lib/apt/lists/*" \
    >"$tmp/python.log" 2>&1 || {
    tail -n 20 "$tmp/python.log" >&2
    die "installing python into the base failed"
  }
  buildah config --label "org.opencontainers.image.title=modeldeploy-$SUITE-python-base" \
    --label "org.opencontainers.image.description=$BASE + $PY_PACKAGES" \
    --created-by "apt-get install $PY_PACKAGES (tools/build-images.sh)" "$c"
  buildah commit --quiet --rm "$c" "$PYBASE" >/dev/null
  log "made $PYBASE in $((SECONDS - start)) s"
fi

# ---- the RUN steps' view of the host CA bundle (a bind mount; in no layer) ---------------------------------------
# pip in the builds must trust what the host trusts (a TLS-inspecting proxy's CA, say). A host directory is
# mounted over /root (HOME of the RUN steps, in every base, so that no mount point is left in a layer) with
# .config/pip/pip.conf (pip's user config) pointing at a copy of the host's bundle beside it. The images' own
# bundle stays Debian's (a build that installs ca-certificates rewrites it; mounting over it would fail there).
[[ -r "$host_ca" ]] || die "no CA bundle at $host_ca (set MODELDEPLOY_HOST_CA)"
build_home="$tmp/home"
mkdir -p "$build_home/.config/pip"
cp "$host_ca" "$build_home/.config/pip/host-ca.crt"
printf '[global]\ncert = /root/.config/pip/host-ca.crt\n' >"$build_home/.config/pip/pip.conf"
build_mounts=(-v "$build_home:/root")

# ---- the images ------------------------------------------------------------------------------------------------
files_hash() { # files_hash <path>...: the names and contents of the files a COPY takes from the context
  (cd "$root" && find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.py[co]' -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum)
}
manifest=()
smoke() { # smoke <image> <label> <command...>: runs a command in the image as its configured user
  local image=$1 label=$2 user
  shift 2
  user="$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$image")"
  [[ "${user%%:*}" == 10001 ]] || die "$image runs as '${user}', not uid 10001"
  new_container "$image"
  log "smoke test of $image: $label"
  buildah run --user "$user" "$c" -- "$@" >"$tmp/smoke.log" 2>&1 || {
    tail -n 30 "$tmp/smoke.log" >&2
    die "smoke test of $image failed: $label"
  }
  buildah rm "$c" >/dev/null
}
entrypoint() { # entrypoint <image>: the image's ENTRYPOINT, one word a line
  buildah inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{println .}}{{end}}' "$1"
}
image() { # image <var name> <ref> <key> <build: a function building $ref> <smoke: a function testing it>
  local var=$1 ref=$2 key=$3 build=$4 check=$5
  local archive="$cache/${ref//[\/:]/-}-$key-$COMPRESSION.tar"
  if [[ ! -s "$archive" ]]; then
    local start=$SECONDS
    log "building $ref (key $key) ..."
    untested="$ref"
    "$build" "$ref"
    local built=$SECONDS
    "$check" "$ref"
    untested=""
    mkdir -p "$cache"
    # docker.io/...: the name kubelet looks for (it normalises modeldeploy/operator:dev to it)
    buildah push --quiet --compression-format "$COMPRESSION" "$ref" "oci-archive:$archive.tmp:docker.io/$ref" >/dev/null
    mv "$archive.tmp" "$archive"
    log "$ref: built in $((built - start)) s, smoke-tested and archived in $((SECONDS - built)) s: $archive" \
      "($(du -h "$archive" | cut -f1))"
    # the archives of earlier keys of this image are no longer needed
    find "$cache" -maxdepth 1 -name "${ref//[\/:]/-}-*.tar" ! -name "${archive##*/}" -delete
  fi
  manifest+=("IMAGE_${var}_REF=docker.io/$ref" "IMAGE_${var}_ARCHIVE=$archive")
}

bud() { # bud <ref> <dockerfile> <build args...>
  local ref=$1 file=$2
  shift 2
  (cd "$root" && buildah bud --quiet --isolation chroot --layers --pull=never --force-rm "${build_mounts[@]}" \
    "$@" -f "$file" -t "$ref" . >"$tmp/bud.log" 2>&1) || {
    tail -n 40 "$tmp/bud.log" >&2
    die "building $ref from $file failed (log above)"
  }
}

OPERATOR_ARGS=(--build-arg "PYTHON_IMAGE=$PYBASE")
build_operator() { bud "$1" operator/Dockerfile "${OPERATOR_ARGS[@]}"; }
smoke_operator() {
  local ep
  mapfile -t ep < <(entrypoint "$1")
  smoke "$1" "entrypoint ${ep[*]} --help" "${ep[@]}" --help
  smoke "$1" "imports" python -c "import kopf, modeldeploy.operator, modeldeploy.api"
}
operator_key="$( (
  files_hash operator/Dockerfile pyproject.toml README.md operator crds
  printf '%s\n' "$py_key" "${OPERATOR_ARGS[@]}"
) | hash_of)"
image OPERATOR modeldeploy/operator:dev "$operator_key" build_operator smoke_operator

SERVER_ARGS=(--build-arg "BASE_IMAGE=$BASE")
build_server() { bud "$1" serving_image/Dockerfile "${SERVER_ARGS[@]}"; }
smoke_server() {
  local ep
  mapfile -t ep < <(entrypoint "$1")
  smoke "$1" "entrypoint ${ep[*]} --help" "${ep[@]}" --help
  smoke "$1" "fetch --help" python -m modelserver.fetch --help
  smoke "$1" "imports" python -c "import modelserver.app, modelserver.fetch, torch, transformers, boto3"
}
server_key="$( (
  files_hash serving_image/Dockerfile pyproject.toml serving_image/modelserver
  printf '%s\n' "$base_key" "${SERVER_ARGS[@]}"
) | hash_of)"
image MODELSERVER modeldeploy/modelserver:dev "$server_key" build_server smoke_server

# pause: FROM scratch + tools/build-binaries.sh's static pause binary (MODELDEPLOY_PAUSE_BIN: another one)
pause_bin="${MODELDEPLOY_PAUSE_BIN:-}"
if [[ -z "$pause_bin" ]]; then
  bin_dir="$("$here/build-binaries.sh")" || die "tools/build-binaries.sh failed"
  pause_bin="$bin_dir/pause"
fi
[[ -x "$pause_bin" ]] || die "no pause binary at $pause_bin (tools/build-binaries.sh builds it)"
build_pause() {
  mkdir -p "$tmp/pause"
  cp "$(readlink -f "$pause_bin")" "$tmp/pause/pause"
  cp "$here/pause/Containerfile" "$tmp/pause/Containerfile"
  (cd "$tmp/pause" && buildah bud --quiet --isolation chroot --layers --force-rm -f Containerfile -t "$1" . \
    >"$tmp/bud.log" 2>&1) || {
    tail -n 20 "$tmp/bud.log" >&2
    die "building $1 failed"
  }
}
smoke_pause() { # no shell in it: /pause must start, keep running, and exit 0 on SIGTERM
  [[ "$(entrypoint "$1")" == /pause ]] || die "$1's entrypoint is not /pause"
  new_container "$1"
  log "smoke test of $1: /pause runs and exits 0 on SIGTERM"
  buildah run "$c" -- /pause >"$tmp/smoke.log" 2>&1 &
  local runner=$! pid="" p rc=0
  sleep 1
  # the process named pause among buildah run's descendants (buildah itself does not pass SIGTERM on)
  local todo=("$runner")
  while [[ ${#todo[@]} -gt 0 ]]; do
    p=${todo[0]}
    todo=("${todo[@]:1}")
    [[ "$(cat "/proc/$p/comm" 2>/dev/null)" == pause ]] && pid=$p && break
    mapfile -t -O "${#todo[@]}" todo < <(ps -o pid= --ppid "$p" | tr -d ' ')
  done
  [[ -n "$pid" ]] || {
    cat "$tmp/smoke.log" >&2
    kill "$runner" 2>/dev/null || true
    die "smoke test of $1 failed: /pause is not running"
  }
  kill -TERM "$pid"
  wait "$runner" || rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q 'Terminated' "$tmp/smoke.log"; then
    cat "$tmp/smoke.log" >&2
    die "smoke test of $1 failed: /pause did not exit 0 on SIGTERM (exit $rc)"
  fi
}
pause_key="$( (
  cat "$here/pause/Containerfile"
  sha256sum <"$(readlink -f "$pause_bin")"
) | hash_of)"
image PAUSE "modeldeploy/pause:$PAUSE_VERSION" "$pause_key" build_pause smoke_pause

# the manifest: on stdout, and in the cache for tooling that did not run this (tools/localcluster/nodeimages.py)
printf '%s\n' "${manifest[@]}" >"$cache/manifest.env.tmp"
mv "$cache/manifest.env.tmp" "$cache/manifest.env"
printf '%s\n' "${manifest[@]}"
