#!/usr/bin/env bash
# Builds kube-scheduler with the allocator patch series of hack/upstream
# (hack/upstream/README.md) applied to the Kubernetes sources of
# K8S_VERSION, once per (version, Go version, series hash), into a cache
# outside the repository, as hack/build-realnode.sh does for the unpatched
# binaries. Prints the binary's path on stdout.
#
# For measurements only (hack/fleet.sh, HWDRA_FLEET_SCHEDULER=patched): a
# patched scheduler never goes into the chart or the image.
#
# The sources come from hack/upstream/tree.sh: a patch that does not apply
# fails the build, naming the patch and the sources (exit 3); other
# failures exit 1.
#
# Cold: one kube-scheduler build (about 15 minutes on 2 shared cores).
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=${K8S_VERSION:-v1.37.2}
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
export K8S_VERSION K8S_STAGING_VERSION

log() { echo "build-patched-scheduler: $*" >&2; }

# The patched sources (exit 3 where a patch does not apply).
rc=0
tree=$(hack/upstream/tree.sh) || rc=$?
[ $rc -eq 0 ] || exit $rc
hash=${tree##*_patched-}
cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}
key="kube-scheduler-${K8S_VERSION}_patched-${hash}_$(go env GOVERSION)"
out="$cache/realnode/patched/$key"

exec 9>"$out.lock"
flock 9
if [ -x "$out/kube-scheduler" ]; then
  echo "$out/kube-scheduler"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
hack/upstream/module.sh "$work/build" "$tree" k8s.io/kubernetes/cmd/kube-scheduler
cd "$work/build"
major=$(echo "${K8S_VERSION#v}" | cut -d. -f1)
minor=$(echo "$K8S_VERSION" | cut -d. -f2)
ld="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $pkg.gitVersion=$K8S_VERSION-hwdra-patched-$hash -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=dirty"
done
log "building kube-scheduler"
mkdir -p "$out"
go build -trimpath -ldflags "$ld" -o "$out/kube-scheduler.tmp" k8s.io/kubernetes/cmd/kube-scheduler >&2
mv "$out/kube-scheduler.tmp" "$out/kube-scheduler"
echo "$out/kube-scheduler"
