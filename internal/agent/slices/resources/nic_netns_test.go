// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"reflect"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// TestNICSlicesIgnoreWhereVFNetdevsAre: what the agent does for claims
// never changes the published slices. A VF whose netdev is in a pod's
// network namespace has none in the host (discovery reports it without),
// and one back from a destroyed namespace may carry the kernel's name for
// it; neither changes a device, a capacity (the PF's vfs) or an attribute,
// in shared or exclusive mode.
func TestNICSlicesIgnoreWhereVFNetdevsAre(t *testing.T) {
	pf := nicPF("0000:17:00.0", "enp23s0f0", 0, 400000, 4)
	inPods, renamed := pf, pf
	inPods.VFs = append([]hw.VF(nil), pf.VFs...)
	renamed.VFs = append([]hw.VF(nil), pf.VFs...)
	inPods.VFs[0].Netdev, inPods.VFs[2].Netdev = "", ""
	renamed.VFs[1].Netdev = "dev57"
	for _, mode := range []config.Mode{config.ModeShared, config.ModeExclusive} {
		want, _ := NIC(testNode, offer(mode, pf), device.AllFeatures)
		for name, changed := range map[string]hw.PF{"in pods": inPods, "renamed": renamed} {
			got, _ := NIC(testNode, offer(mode, changed), device.AllFeatures)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%s, VF netdevs %s: the slices changed:\n%+v\nwant\n%+v", mode, name, nicDevices(got), nicDevices(want))
			}
		}
	}
}
