#!/usr/bin/env bash
# Runs the real-node end-to-end suite (test/e2e): installs runc/iproute2 if
# missing, builds the node binaries once per version (cached outside the
# repository; cold ~35 min on 2 cores, warm seconds), then runs the tests as
# root. Extra arguments go to `go test` (e.g. -run TestPlainPod), and the
# tests run in one process, one after another.
#
# Without arguments, the whole suite runs as two processes side by side:
# the scenarios on a cluster of their own (framework.NewCluster: workers
# in network, mount and cgroup namespaces of their own) in a run of
# clusters only (HWDRA_E2E_CLUSTERS_ONLY=1, which takes no machine lock),
# and every other scenario in the run with the suite's node. Each mostly
# waits on kubelets and control planes, so together they take about the
# longer one's time. The clusters' run's output follows the other's.
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
if [ $# -gt 0 ]; then
  exec go test ./test/e2e/ -count=1 -timeout 45m -v "$@"
fi

# The scenarios that start a cluster (framework.NewCluster).
clusters='^(TestMultiNode)$'
clusters_log=$(mktemp /tmp/hwdra-e2e-clusters.XXXXXX)
# The images and hwdra, built once for both (framework's prebuild).
HWDRA_E2E_SHARED_BUILD=$(mktemp -d /tmp/hwdra-e2e-build.XXXXXX)
export HWDRA_E2E_SHARED_BUILD
trap 'rm -rf "$HWDRA_E2E_SHARED_BUILD" "$clusters_log"' EXIT
began=$SECONDS
HWDRA_E2E_CLUSTERS_ONLY=1 go test ./test/e2e/ -count=1 -timeout 45m -v -run "$clusters" >"$clusters_log" 2>&1 &
clusters_pid=$!
rc=0
go test ./test/e2e/ -count=1 -timeout 45m -v -skip "$clusters" || rc=$?
echo "e2e-realnode: the run with the node took $((SECONDS - began)) s (exit $rc)"
clusters_rc=0
wait "$clusters_pid" || clusters_rc=$?
echo "e2e-realnode: ---- the clusters' run (HWDRA_E2E_CLUSTERS_ONLY=1 -run '$clusters'), exit $clusters_rc ----"
cat "$clusters_log"
echo "e2e-realnode: the whole suite took $((SECONDS - began)) s"
if [ "$rc" != 0 ]; then exit "$rc"; fi
exit "$clusters_rc"
