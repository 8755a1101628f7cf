#!/usr/bin/env bash
# The real-node suite's core scenarios on the previous Kubernetes minor
# (v1.36.3 by default, K8S_VERSION to change it), on demand: its binaries
# are built like the pinned version's (hack/build-realnode.sh, cached per
# version; another 10-35 minutes cold on 2 cores, too long for CI beside
# the pinned suite). The chart says which minors it installs on
# (kubeVersion); this is the proof for the oldest. The scenarios: the node,
# the chart installed from the registry under Pod Security, its objects
# accepted, whole GPUs, MIG partitions made on demand, GPU shares, a VF
# bandwidth share, an nvidia.com/gpu pod, an XID fault in the pod's status,
# the rolling update, slices accepted and allocated, and what the cluster
# lacks (1.36 has no compatibility groups or partition types: the two
# gate-off scenarios are how it runs). Extra arguments go to go test.
set -euo pipefail
cd "$(dirname "$0")/.."
export K8S_VERSION=${K8S_VERSION:-v1.36.3}
core='TestNodeReady|TestPlainPod|TestDeployManifests|TestDeployPodSecurity|TestAgentGPUPods|TestPodsMIGProfiles|TestPodsGPUShares|TestPodVFShare|TestPodExtendedResourceGPU|TestHealthXIDInPodStatus|TestAgentPodRollingUpdate|TestSlicesAcceptedAndAllocated|TestCompatibilityGroupsGateOff|TestPartitionTypeGateOff'
exec hack/e2e-realnode.sh -run "^($core)\$" "$@"
