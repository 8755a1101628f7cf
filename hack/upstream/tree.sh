#!/usr/bin/env bash
# Prints the directory of the Kubernetes sources of K8S_VERSION with this
# directory's patch series (series) applied, laid out as upstream lays them
# out (k8s.io/kubernetes, with k8s.io/dynamic-resource-allocation under
# staging/src), made from the Go module cache once per (version, series
# hash) into a cache outside the repository. A patch that does not apply
# exits 3, naming the patch and the sources; nothing is cached then.
#
# HWDRA_UPSTREAM_PATCHES, when set (also to the empty string), replaces the
# series with the patches it names (file names in this directory, separated
# by blanks, in order; empty: the released sources): bench.sh scheduler-perf
# builds the released allocator with only the scheduler_perf test case.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
K8S_VERSION=${K8S_VERSION:-v1.37.2}
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.${K8S_VERSION#v1.}}

log() { echo "upstream/tree: $*" >&2; }

cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}/realnode/patched
if [ -n "${HWDRA_UPSTREAM_PATCHES+set}" ]; then
  read -r -a patches <<<"$HWDRA_UPSTREAM_PATCHES"
  for p in "${patches[@]}"; do
    [ -f "$here/$p" ] || { log "HWDRA_UPSTREAM_PATCHES names $p, which is not in $here"; exit 1; }
  done
  # Not the series' hash: a subset never shares a directory with it.
  hash=$(cd "$here" && { printf '%s\n' "subset:" "${patches[@]}"; cat "${patches[@]}" </dev/null; } | sha256sum | cut -c1-12)
  tree="$cache/src-${K8S_VERSION}_subset-$hash"
else
  mapfile -t patches < <(sed -e 's/#.*//' -e '/^[[:space:]]*$/d' "$here/series")
  [ ${#patches[@]} -gt 0 ] || { log "$here/series lists no patch"; exit 1; }
  hash=$(cd "$here" && cat series "${patches[@]}" | sha256sum | cut -c1-12)
  tree="$cache/src-${K8S_VERSION}_patched-$hash"
fi
mkdir -p "$cache"
exec 9>"$tree.lock"
flock 9
if [ -f "$tree/.hwdra-patched" ]; then
  echo "$tree"
  exit 0
fi

moddir() { go mod download -json "$1@$2" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p'; }
kdir=$(moddir k8s.io/kubernetes "$K8S_VERSION")
ddir=$(moddir k8s.io/dynamic-resource-allocation "$K8S_STAGING_VERSION")
[ -n "$kdir" ] && [ -n "$ddir" ] || { log "cannot download k8s.io/kubernetes@$K8S_VERSION or k8s.io/dynamic-resource-allocation@$K8S_STAGING_VERSION"; exit 1; }
rm -rf "$tree"
cp -r "$kdir" "$tree"
mkdir -p "$tree/staging/src/k8s.io"
cp -r "$ddir" "$tree/staging/src/k8s.io/dynamic-resource-allocation"
chmod -R u+w "$tree"
for p in "${patches[@]+"${patches[@]}"}"; do
  if ! out=$(cd "$tree" && patch -p1 --forward --batch <"$here/$p" 2>&1); then
    log "patch hack/upstream/$p does not apply to k8s.io/kubernetes@$K8S_VERSION (k8s.io/dynamic-resource-allocation@$K8S_STAGING_VERSION):"
    printf '%s\n' "$out" | sed 's/^/  /' >&2
    rm -rf "$tree"
    exit 3
  fi
  log "applied $p"
done
printf '%s\n' "${patches[@]+"${patches[@]}"}" >"$tree/.hwdra-patched"
echo "$tree"
