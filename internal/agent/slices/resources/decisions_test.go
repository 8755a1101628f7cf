// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"testing"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	mockprofile "github.com/hwdra/hwdra/internal/mock/profile"
)

// TestNoSkipNodeOperations: no slice lets the kubelet skip prepare or
// unprepare (docs/design.md, Left out on purpose): every device needs them on the
// node (a CDI spec for each GPU device, a MIG instance or mdev made, a VF
// reserved, configured and moved into its pod).
func TestNoSkipNodeOperations(t *testing.T) {
	for _, name := range mockprofile.Builtins() {
		res, _ := ForNode(testNode, probe(t, "mock:"+name), config.Default(), device.AllFeatures, hw.Health{})
		for driver, r := range res {
			for _, pool := range r.Pools {
				for i, s := range pool.Slices {
					if len(s.SkipNodeOperations) > 0 {
						t.Errorf("%s: %s slice %d skips %v", name, driver, i, s.SkipNodeOperations)
					}
				}
			}
		}
	}
}
