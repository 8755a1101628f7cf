// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package prepare

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
)

// OwnPool refuses an allocation result from a pool other than this
// node's. The agent names its pools after its node
// (internal/agent/slices/resources), and device names repeat from node to
// node (they derive from PCI addresses): a result naming a device of
// another pool, even one with the name of a device here, is another
// node's device. A compromised node can publish under another node's pool
// name where the chart's admission policy is not in force; the scheduler
// then allocates its devices to pods bound to the victim's node, and
// prepare must not take them for its own. The plugin names the claim.
func OwnPool(r resourceapi.DeviceRequestAllocationResult, node string) error {
	if r.Pool == node {
		return nil
	}
	return fmt.Errorf("request %q, device %s: allocated from pool %q, not from this node's %s pool %q: the agent prepares only devices of its own node's pool",
		r.Request, r.Device, r.Pool, r.Driver, node)
}
