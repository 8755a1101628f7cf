#!/usr/bin/env bash
# Runs every test: the unit and mock-hardware tests, then (as root) the
# real-node suite against a real control plane, kubelet and containerd
# (hack/e2e-realnode.sh: its binaries are built once per pinned version into
# a cache outside the repository, ~35 minutes cold on 2 cores).
# HWDRA_SKIP_REALNODE=1 skips the real-node suite.
set -euo pipefail
cd "$(dirname "$0")/.."
export CGO_ENABLED=1
# go-nvml's cgo preamble uses deprecated NVML symbols; the warnings are noise.
export CGO_CFLAGS="${CGO_CFLAGS:--Wno-deprecated-declarations}"

# HWDRA_TEST_SKIP_PACKAGES: import paths (space-separated) another stage
# runs with the same tests (CI's race stage, .ci/run); go test leaves them
# out here.
pkgs=(./...)
if [ -n "${HWDRA_TEST_SKIP_PACKAGES:-}" ]; then
  mapfile -t pkgs < <(go list ./... | grep -vxF -f <(tr ' ' '\n' <<<"$HWDRA_TEST_SKIP_PACKAGES" | grep .))
  echo "test.sh: ${#pkgs[@]} packages; left to another stage: $HWDRA_TEST_SKIP_PACKAGES"
fi
# Without HWDRA_REALNODE_BIN the real-node tests skip here and run below.
began=$SECONDS
env -u HWDRA_REALNODE_BIN go test -count=1 -timeout 20m "${pkgs[@]}"
echo "test.sh: go test (${#pkgs[@]} patterns) took $((SECONDS - began)) s"

if [ "${HWDRA_SKIP_REALNODE:-}" = 1 ]; then
  echo "test.sh: real-node suite skipped (HWDRA_SKIP_REALNODE=1)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "test.sh: real-node suite skipped: it needs root (network namespaces, containerd, kubelet)"
  exit 0
fi
echo "test.sh: now the real-node suite, as root: it installs runc and iproute2 with apt-get where missing and, on first use, builds etcd, Kubernetes, containerd and helm from source into ~/.cache/hwdra (about 35 minutes on 2 cores; seconds once cached). HWDRA_SKIP_REALNODE=1 skips it." >&2
exec hack/e2e-realnode.sh
