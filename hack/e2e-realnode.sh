#!/usr/bin/env bash
# Runs the real-node end-to-end suite (test/e2e): installs runc/iproute2 if
# missing, builds the node binaries once per version (cached outside the
# repository; cold ~35 min on 2 cores, warm seconds), then runs the tests as
# root. Extra arguments go to `go test` (e.g. -run TestPlainPod), and the
# tests run in one process, one after another.
#
# Without arguments, the whole suite runs as two processes side by side:
# the scenarios named in $isolated in a run of isolated nodes
# (HWDRA_E2E_ISOLATED=1, which takes no machine lock: a cluster's workers
# in network, mount and cgroup namespaces of their own, its other nodes
# in a mount namespace and a cgroup root of their own), and every other
# scenario in the run with the machine's node. Each mostly waits on
# kubelets and control planes, so together they take about the longer
# one's time. The isolated run's output follows the other's.
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

# The isolated run's scenarios: the clusters (framework.NewCluster), the
# dedicated nodes (framework.New: the feature-gate variants), which in
# the other run would each stop and restart its shared node, and
# scenarios of the shared node that mostly wait (Prometheus' alert rule,
# the scheduler's refusals, the NRI gate, claims beside extended
# resources), to even the two runs out. Not the MPS scenarios: an
# isolated node's pod once found its MPS pipe directory empty
# (TestPodsSharingWithSettingsLeft, CI run of 2026-12-06 09:01; not
# understood yet). The other run
# skips exactly these, so every scenario runs once.
isolated='^(TestMultiNode|TestVFPodWaitsForTheAgent|TestPodsCompeteExtendedResourceAndClaims|TestUnfittableClaimRefusedAtOnce|TestPrometheusGPUsByPod|TestCompatibilityGroupsGateOff|TestGateTurnedOffAfterSlicesStored|TestPartitionTypeGateOff|TestGateOffPartitionableDevices|TestGateOffConsumableCapacity)$'
isolated_log=$(mktemp /tmp/hwdra-e2e-isolated.XXXXXX)
# The images and hwdra, built once for both (framework's prebuild).
HWDRA_E2E_SHARED_BUILD=$(mktemp -d /tmp/hwdra-e2e-build.XXXXXX)
export HWDRA_E2E_SHARED_BUILD
trap 'rm -rf "$HWDRA_E2E_SHARED_BUILD" "$isolated_log"' EXIT
began=$SECONDS
(rc=0; HWDRA_E2E_ISOLATED=1 go test ./test/e2e/ -count=1 -timeout 45m -v -run "$isolated" >"$isolated_log" 2>&1 || rc=$?
  echo "e2e-realnode: the isolated run took $((SECONDS - began)) s (exit $rc)" >>"$isolated_log"; exit $rc) &
isolated_pid=$!
rc=0
go test ./test/e2e/ -count=1 -timeout 45m -v -skip "$isolated" || rc=$?
echo "e2e-realnode: the run with the node took $((SECONDS - began)) s (exit $rc)"
isolated_rc=0
wait "$isolated_pid" || isolated_rc=$?
echo "e2e-realnode: ---- the isolated run (HWDRA_E2E_ISOLATED=1 -run '$isolated'), exit $isolated_rc ----"
cat "$isolated_log"
echo "e2e-realnode: the whole suite took $((SECONDS - began)) s"
if [ "$rc" != 0 ]; then exit "$rc"; fi
exit "$isolated_rc"
