// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// waitDeployEffective waits until the chart's RBAC and admission policy are in
// force: the apiserver picks both up from informers, a moment after they are
// created. Probes are dry-run slice creations with the agent's credentials:
// one for its own node must pass, one for another node must be denied.
func (n *Node) waitDeployEffective(ctx context.Context, timeout time.Duration) error {
	creds, err := n.AgentCredentials(ctx, "")
	if err != nil {
		return err
	}
	probe := func(node string) error {
		s := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-"},
			Spec: resourceapi.ResourceSliceSpec{
				Driver: "gpu.hwdra.io", NodeName: &node,
				Pool: resourceapi.ResourcePool{Name: node, ResourceSliceCount: 1},
			},
		}
		_, err := creds.Client.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	return waitfor.Check(ctx, "the chart's RBAC and admission policy in force", timeout, func() error {
		own, other := probe(n.Name), probe("probe-other-node")
		if own == nil && other != nil {
			return nil // the other node's write must be refused: that is the check
		}
		return fmt.Errorf("own node: %v; other node: %v", own, other)
	})
}
