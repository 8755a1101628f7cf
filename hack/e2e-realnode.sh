#!/usr/bin/env bash
# Runs the real-node end-to-end suite (test/e2e): installs runc/iproute2 if
# missing, builds the node binaries once per version (cached outside the
# repository; cold ~35 min on 2 cores, warm seconds), then runs the tests as
# root. Extra arguments go to `go test` (e.g. -run TestPlainPod).
#
# Component logs of every node are copied to $HWDRA_E2E_ARTIFACTS when set.
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-realnode-deps.sh
bin=$(hack/build-realnode.sh)
export HWDRA_REALNODE_BIN="$bin"
# Prometheus for TestPrometheus* (built once per version, cached like the
# node's binaries).
HWDRA_PROMETHEUS_BIN=$(hack/build-prometheus.sh)
export HWDRA_PROMETHEUS_BIN
# The whole suite took 20 min on a shared 2-core machine (2026-12-06).
exec go test ./test/e2e/ -count=1 -timeout 45m -v "$@"
