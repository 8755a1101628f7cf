// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
)

// The chart's claim-limits policy refuses, when they are created, claims
// for more whole GPUs than claimLimits.gpusPerNode (and more partitions
// than that many GPUs hold), because no node could satisfy them and the
// scheduler's allocator would search for its filter timeout at every
// retry. Set below the GPUs of a node, it refuses claims that node could
// satisfy: the node's agent says so (a warning in /readyz, a log line and
// a Warning Event on the Node), since the policy itself cannot know the
// nodes.

// reasonClaimLimit is the reason of the Node's Event.
const reasonClaimLimit = "ClaimLimitBelowNodeGPUs"

// claimLimitWarning is the warning for a node with gpus GPUs under a
// policy that lets a claim ask for at most limit (0: no policy), nil when
// the limit fits the node.
func claimLimitWarning(limit, gpus int) error {
	if limit <= 0 || gpus <= limit {
		return nil
	}
	return fmt.Errorf("this node has %d GPUs, but the chart's claim-limits policy refuses claims for more than %d GPUs "+
		"(or more MIG partitions or vGPUs than %d GPUs hold) when they are created: set claimLimits.gpusPerNode to the most GPUs a node of the cluster has",
		gpus, limit, limit)
}

// claimLimit checks the node's GPUs against the policy's limit: the
// readiness warning, told once in the log and as an Event when it first
// holds.
func (s *server) claimLimit(ctx context.Context) error {
	inv, _ := s.pub.Current()
	err := claimLimitWarning(s.opts.ClaimLimitGPUs, len(inv.GPUs))
	if err == nil {
		return nil
	}
	s.claimLimitOnce.Do(func() {
		klog.FromContext(ctx).Info("Warning: claims this node could satisfy are refused", "reason", err)
		s.events(ctx).Eventf(nodeRef(s.opts.NodeName), nil, corev1.EventTypeWarning, reasonClaimLimit, "CheckClaimLimits", "%s", err.Error())
	})
	return err
}
