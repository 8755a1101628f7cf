// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// planPF is a 100G PF with n netdev VFs at 0000:<bus>:01.<i>.
func planPF(bus string, n int) hw.PF {
	pf := hw.PF{PCIAddress: "0000:" + bus + ":00.0", Netdev: "p" + bus, VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core",
		LinkType: hw.LinkEthernet, LinkUp: true, SpeedMbps: 100000, MTU: 1500, NumVFs: n}
	for i := range n {
		pf.VFs = append(pf.VFs, hw.VF{Index: i, PCIAddress: fmt.Sprintf("0000:%s:01.%d", bus, i), Netdev: fmt.Sprintf("p%sv%d", bus, i), Driver: "mlx5_core"})
	}
	return pf
}

func result(request, dev string, share bool, bw string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: device.NICDriver, Pool: testNode, Device: dev}
	if share {
		id := types.UID("share-" + request)
		r.ShareID = &id
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{device.NICCapBandwidth: resource.MustParse(bw)}
	}
	return r
}

// TestPlan: the pure planning step, on a hand-made catalog.
func TestPlan(t *testing.T) {
	shared := planPF("17", 4)
	shared.VFs[0].Driver, shared.VFs[0].Netdev = "vfio-pci", "" // not shareable
	shared.VFs[2].Netdev = ""                                   // netdev moved away
	ib := planPF("31", 2)
	ib.LinkType, ib.MTU = hw.LinkInfiniBand, 4092
	excl := planPF("4b", 2)
	offers := []config.NICOffer{
		{PF: shared, Mode: config.ModeShared, Bandwidth: config.DefaultBandwidth},
		{PF: ib, Mode: config.ModeShared, Bandwidth: config.DefaultBandwidth},
		{PF: excl, Mode: config.ModeExclusive},
	}
	catalog := resources.NICDevices(offers, device.AllFeatures)
	admin := result("mon", "nic-0000-17-00-0", false, "")
	admin.AdminAccess = new(true)
	for _, tc := range []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		config  string // VfConfig fields, JSON after the kind
		held    map[string]types.UID
		want    []string // "<vf pci address> rate=<Mb/s> mtu=<mtu>", InfiniBand: + " guids=<node>/<port>"; or "admin"
		wantErr string
	}{
		{name: "lowest usable VF", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "1500M")},
			want: []string{"0000:17:01.1 rate=1500 mtu=1500"}},
		{name: "held VFs skipped", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "1G")},
			held: map[string]types.UID{"0000:17:01.1": "other"}, want: []string{"0000:17:01.3 rate=1000 mtu=1500"}},
		{name: "two shares", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "1G"), result("b", "nic-0000-17-00-0", true, "2G")},
			want: []string{"0000:17:01.1 rate=1000 mtu=1500", "0000:17:01.3 rate=2000 mtu=1500"}},
		{name: "none left", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "1G"), result("b", "nic-0000-17-00-0", true, "2G"), result("c", "nic-0000-17-00-0", true, "2G")},
			wantErr: `request "c": no free VF on PF p17 (0000:17:00.0): all 2 of its 4 VFs usable for a share`},
		// No VF rate limit on InfiniBand: the share is accounted, not enforced.
		{name: "InfiniBand share: PF MTU, no rate", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			want: []string{"0000:31:01.0 rate=0 mtu=4092 guids=/"}},
		{name: "InfiniBand share with GUIDs", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			config: `, "nodeGUID": "00:11:22:33:44:55:66:77", "portGUID": "00:11:22:33:44:55:66:78"`,
			want:   []string{"0000:31:01.0 rate=0 mtu=4092 guids=00:11:22:33:44:55:66:77/00:11:22:33:44:55:66:78"}},
		{name: "MAC on InfiniBand", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			config: `, "mac": "02:00:00:00:00:01"`, wantErr: `mac: PF p31 (0000:31:00.0) is an InfiniBand port, whose VFs have GUIDs`},
		{name: "VLAN on InfiniBand", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			config: `, "vlan": 5`, wantErr: "vlan: PF p31 (0000:31:00.0) is an InfiniBand port"},
		{name: "trust on InfiniBand", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			config: `, "trust": true`, wantErr: "trust: PF p31 (0000:31:00.0) is an InfiniBand port"},
		{name: "spoof checking off on InfiniBand", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			config: `, "spoofCheck": false`, wantErr: "spoofCheck: PF p31 (0000:31:00.0) is an InfiniBand port"},
		{name: "GUID on Ethernet", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "1G")},
			config: `, "nodeGUID": "00:11:22:33:44:55:66:77"`, wantErr: "nodeGUID: PF p17 (0000:17:00.0) is an Ethernet port"},
		{name: "exclusive keeps its rate", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-4b-00-0-vf-1", false, "")},
			want: []string{"0000:4b:01.1 rate=0 mtu=1500"}},
		{name: "exclusive VF still held", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-4b-00-0-vf-1", false, "")},
			held: map[string]types.UID{"0000:4b:01.1": "old"}, wantErr: "still held by claim old"},
		{name: "admin access touches nothing", results: []resourceapi.DeviceRequestAllocationResult{admin}, want: []string{"admin"}},
		{name: "other drivers ignored", results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: device.GPUDriver, Pool: testNode, Device: "gpu-0"}}},
		{name: "unknown device", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-99-00-0", true, "1G")},
			wantErr: "device nic-0000-99-00-0 is not among this node's"},
		{name: "other pool", results: []resourceapi.DeviceRequestAllocationResult{func() resourceapi.DeviceRequestAllocationResult {
			r := result("a", "nic-0000-17-00-0", true, "1G")
			r.Pool = "worker-2"
			return r
		}()}, wantErr: `allocated from pool "worker-2", not from this node's sriov.hwdra.io pool "worker-1"`},
		{name: "share without bandwidth", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "0")},
			wantErr: "below 1 Mb/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClaim(tc.config)
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: tc.results}}
			for _, cfg := range c.Spec.Devices.Config { // as the allocator copies them
				c.Status.Allocation.Devices.Config = append(c.Status.Allocation.Devices.Config, resourceapi.DeviceAllocationConfiguration{
					Source: resourceapi.AllocationConfigSourceClaim, Requests: cfg.Requests, DeviceConfiguration: cfg.DeviceConfiguration})
			}
			plan, err := Plan(c, catalog, tc.held, testNode, permissive(t))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range plan {
				if a.Admin {
					got = append(got, "admin")
					continue
				}
				line := fmt.Sprintf("%s rate=%d mtu=%d", a.VF.PCIAddress, a.Config.MaxTxRateMbps, a.Config.MTU)
				if a.PF.LinkType == hw.LinkInfiniBand {
					line += fmt.Sprintf(" guids=%s/%s", a.Config.NodeGUID, a.Config.PortGUID)
				}
				got = append(got, line)
			}
			if strings.Join(got, ";") != strings.Join(tc.want, ";") {
				t.Errorf("plan %v, want %v", got, tc.want)
			}
		})
	}
}
