#!/usr/bin/env bash
# Runs the fleet harness (test/e2e/fleet_test.go, TestFleet): simulated
# nodes publishing hwdra's ResourceSlices, or one device per GPU, against
# the real kube-apiserver, kube-scheduler and kube-controller-manager, and
# prints one "fleet ..." line per figure. Control planes only: no kubelet.
# It measures the scheduler's CPU: run one at a time, and not beside the
# real-node suite (flock /tmp/hwdra-e2e.lock hack/fleet.sh ...). It prints
# the machine's load average before and after. Sizes from the environment:
#
#   HWDRA_FLEET_NODES=100 HWDRA_FLEET_PODS=800 hack/fleet.sh
#   HWDRA_FLEET_BAD=none hack/fleet.sh        # skip the bad-claim runs
#   HWDRA_FLEET_SCHEDULER=upstream,patched    # also kube-scheduler with
#                                             # hack/upstream's patches
#   HWDRA_FLEET_SHARES=0,2000,5000            # runs with that many shares
#                                             # allocated first
#   HWDRA_FLEET_PROFILE=/tmp/prof             # the scheduler's CPU profiles
#                                             # per kind (go tool pprof)
#
# The patched scheduler is built once per patch series
# (hack/build-patched-scheduler.sh); where it cannot be built (a patch that
# does not apply), the run says so and measures the others.
#
# Extra arguments go to `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."
export HWDRA_FLEET=1 HWDRA_E2E_CONTROL_PLANE_ONLY=1
if [[ ",${HWDRA_FLEET_SCHEDULER:-upstream}," == *,patched,* ]]; then
  log=$(mktemp)
  if bin=$(hack/build-patched-scheduler.sh 2>"$log"); then
    export HWDRA_FLEET_PATCHED_SCHEDULER="$bin"
  else
    HWDRA_FLEET_PATCHED_UNAVAILABLE="hack/build-patched-scheduler.sh failed: $(tail -5 "$log" | tr '\n' ' ')"
    export HWDRA_FLEET_PATCHED_UNAVAILABLE
    echo "fleet: the patched scheduler is unavailable: $HWDRA_FLEET_PATCHED_UNAVAILABLE" >&2
  fi
  rm -f "$log"
fi
echo "fleet machine: $(nproc) cores; before: $(uptime)"
rc=0
hack/e2e-realnode.sh -run '^TestFleet$' -timeout 180m "$@" || rc=$?
echo "fleet machine: after: $(uptime)"
exit $rc
