#!/usr/bin/env bash
# The fresh-machine rehearsal: clones the committed `main` into a temporary directory and runs `.ci/run`
# there as CI does (CI=true, no standard input), with the Go module cache, the Go build cache and the
# binary cache pointed at empty temporary directories, so every set-up step runs from nothing.
# The pip cache stays as it is (warm or not: the output says which) unless --cold-pip is given.
#
#   tools/fresh-rehearsal.sh [--cold-pip] [--keep] [--seed-cache] [--ref REF]
#
#   --cold-pip     an empty pip cache too (downloads torch and its CUDA wheels again)
#   --keep         keep the temporary directory (clone, caches, log) instead of deleting it
#   --seed-cache   after a green run, copy the binaries it built into this machine's binary cache
#   --ref REF      the commit to rehearse (default: main)
#
# Prints the wall time of the whole run and of its phases; exits with .ci/run's status.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cold_pip=0 keep=0 seed=0 ref=main
while (($#)); do
  case $1 in
    --cold-pip) cold_pip=1 ;;
    --keep) keep=1 ;;
    --seed-cache) seed=1 ;;
    --ref) ref=$2; shift ;;
    *) echo "usage: $0 [--cold-pip] [--keep] [--seed-cache] [--ref REF]" >&2; exit 2 ;;
  esac
  shift
done

root="$(mktemp -d "${TMPDIR:-/tmp}/modeldeploy-rehearsal.XXXXXX")"
# this machine's binary cache, where --seed-cache copies to (the run itself uses an empty one)
own_bin_cache="${MODELDEPLOY_BIN_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modeldeploy}"
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  if ((keep)); then
    echo "rehearsal: kept $root" >&2
  else
    chmod -R u+w "$root" 2>/dev/null || true   # the Go module cache is read-only
    rm -rf "$root"
  fi
}
trap cleanup EXIT

git clone --quiet --no-local --branch "$ref" "$repo" "$root/main" 2>/dev/null \
  || { git clone --quiet --no-local "$repo" "$root/main" && git -C "$root/main" checkout --quiet "$ref"; }
# CI lays a copy of shared/ beside the clone.
[[ -d "$repo/../shared" ]] && cp -r "$repo/../shared" "$root/shared"
mkdir -p "$root/gomodcache" "$root/gocache" "$root/bincache"

pip_cache="$(python3 -m pip cache dir 2>/dev/null || echo "$HOME/.cache/pip")"
if ((cold_pip)); then
  mkdir -p "$root/pipcache"
  export PIP_CACHE_DIR="$root/pipcache"
  echo "rehearsal: pip cache EMPTY ($PIP_CACHE_DIR)"
else
  echo "rehearsal: pip cache as this machine has it, not emptied ($pip_cache: $(du -sh "$pip_cache" 2>/dev/null | cut -f1 || echo 0))"
fi
echo "rehearsal: commit $(git -C "$root/main" rev-parse --short HEAD); Go module, Go build and binary caches empty under $root"

log="$root/ci.log"
start=$(date +%s)
set +e
(
  cd "$root/main"
  export CI=true GOMODCACHE="$root/gomodcache" GOCACHE="$root/gocache"
  unset VIRTUAL_ENV
  MODELDEPLOY_BIN_CACHE="$root/bincache" bash .ci/run </dev/null 2>&1 | while IFS= read -r line; do
    printf '[%4ds] %s\n' "$(($(date +%s) - start))" "$line"
  done
  exit "${PIPESTATUS[0]}"
) | tee "$log"
rc=${PIPESTATUS[0]}
set -e
wall=$(($(date +%s) - start))

echo "rehearsal: .ci/run exited $rc after ${wall}s ($((wall / 60)) min $((wall % 60)) s)"
grep -E '^\[ *[0-9]+s\] (built |=+ .*(passed|failed|error))' "$log" || true
if ((rc == 0 && seed)); then
  dest="$own_bin_cache/store"
  mkdir -p "$dest" && cp -a "$root/bincache/store/." "$dest/"
  echo "rehearsal: copied the built binaries into $dest"
fi
exit "$rc"
