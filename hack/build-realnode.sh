#!/usr/bin/env bash
# Builds the binaries of a real single-node Kubernetes (control plane, kubelet,
# containerd, CNI plugins) from their Go modules, once per pinned version, into
# a cache outside the repository. Prints the bin directory on stdout.
#
# Cold: about 35 minutes on 2 cores. Warm: a version check only.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.37.2}
# The staging modules (k8s.io/api, ...) of K8S_VERSION v1.X.Y are v0.X.Y.
K8S_STAGING_VERSION=${K8S_STAGING_VERSION:-v0.${K8S_VERSION#v1.}}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
CONTAINERD_VERSION=${CONTAINERD_VERSION:-v2.4.2}
CNI_VERSION=${CNI_VERSION:-v1.9.1}

cache=${HWDRA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hwdra}
key="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_containerd-${CONTAINERD_VERSION}_cni-${CNI_VERSION}_$(go env GOVERSION)"
bin="$cache/realnode/$key/bin"
mkdir -p "$bin"

# One build at a time per key: a second caller (another checkout, CI while a
# developer builds) waits and then finds the binaries.
exec 9>"$cache/realnode/$key.lock"
flock 9

log() { echo "build-realnode: $*" >&2; }

have() { [ -x "$bin/$1" ]; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

build_etcd() {
  have etcd && return
  log "building etcd $ETCD_VERSION"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init hwdra.local/etcdbuild >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_kube() {
  local missing=()
  for c in kube-apiserver kube-scheduler kube-controller-manager kubelet; do
    have "$c" || missing+=("$c")
  done
  [ ${#missing[@]} -eq 0 ] && return
  log "building ${missing[*]} $K8S_VERSION"
  mkdir -p "$work/kube" && cd "$work/kube"
  go mod init hwdra.local/kubebuild >/dev/null 2>&1
  # k8s.io/kubernetes points each staging module at ./staging; replace them
  # with their released twins.
  local gomod
  gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  {
    echo "require k8s.io/kubernetes $K8S_VERSION"
    grep -E '^\s*k8s.io/[a-z0-9-]+ => ./staging/' "$gomod" |
      awk -v v="$K8S_STAGING_VERSION" '{print "replace " $1 " => " $1 " " v}'
  } >>go.mod
  cat >tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
  go mod tidy >&2
  local ld="-s -w" major minor
  major=$(echo "${K8S_VERSION#v}" | cut -d. -f1)
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  # Without these the node and the apiserver report v0.0.0.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitTreeState=clean"
  done
  for c in "${missing[@]}"; do
    log "  $c"
    go build -trimpath -ldflags "$ld" -o "$bin/$c.tmp" "k8s.io/kubernetes/cmd/$c" >&2
    mv "$bin/$c.tmp" "$bin/$c"
  done
}

build_containerd() {
  have containerd && have ctr && have containerd-shim-runc-v2 && return
  log "building containerd $CONTAINERD_VERSION"
  GOBIN="$bin" CGO_ENABLED=0 go install -trimpath -tags "no_btrfs no_devmapper no_zfs" \
    "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION" \
    "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" >&2
}

build_cni() {
  have bridge && have host-local && have loopback && return
  log "building CNI plugins $CNI_VERSION"
  GOBIN="$bin" CGO_ENABLED=0 go install -trimpath \
    "github.com/containernetworking/plugins/plugins/main/bridge@$CNI_VERSION" \
    "github.com/containernetworking/plugins/plugins/ipam/host-local@$CNI_VERSION" \
    "github.com/containernetworking/plugins/plugins/main/loopback@$CNI_VERSION" >&2
}

build_cni
build_containerd
build_etcd
build_kube
echo "$bin"
