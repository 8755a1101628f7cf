#!/usr/bin/env bash
# Runs the fleet harness (test/e2e/fleet_test.go, TestFleet): simulated
# nodes publishing hwdra's ResourceSlices, or one device per GPU, against
# the real kube-apiserver, kube-scheduler and kube-controller-manager, and
# prints one "fleet ..." line per figure. Control planes only: no kubelet,
# no machine lock, so it runs beside another real-node run (run one fleet
# at a time: it measures CPU). Sizes from the environment:
#
#   HWDRA_FLEET_NODES=100 HWDRA_FLEET_PODS=800 hack/fleet.sh
#   HWDRA_FLEET_BAD=none hack/fleet.sh      # skip the bad-claim runs
#
# Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export HWDRA_FLEET=1 HWDRA_E2E_CONTROL_PLANE_ONLY=1
exec hack/e2e-realnode.sh -run '^TestFleet$' -timeout 60m "$@"
