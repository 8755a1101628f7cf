package nic

import (
	"fmt"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/config"
	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/slices"
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

func result(request, device string, share bool, bw string) resourceapi.DeviceRequestAllocationResult {
	r := resourceapi.DeviceRequestAllocationResult{Request: request, Driver: slices.NICDriver, Pool: testNode, Device: device}
	if share {
		id := types.UID("share-" + request)
		r.ShareID = &id
		r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{slices.NICCapBandwidth: resource.MustParse(bw)}
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
	catalog := slices.NICDevices(offers, slices.AllFeatures)
	admin := result("mon", "nic-0000-17-00-0", false, "")
	admin.AdminAccess = new(true)
	for _, tc := range []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		held    map[string]types.UID
		want    []string // "<vf pci address> rate=<Mb/s> mtu=<mtu>", or "admin"
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
		{name: "InfiniBand share: PF MTU", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-31-00-0", true, "1G")},
			want: []string{"0000:31:01.0 rate=1000 mtu=4092"}},
		{name: "exclusive keeps its rate", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-4b-00-0-vf-1", false, "")},
			want: []string{"0000:4b:01.1 rate=0 mtu=1500"}},
		{name: "exclusive VF still held", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-4b-00-0-vf-1", false, "")},
			held: map[string]types.UID{"0000:4b:01.1": "old"}, wantErr: "still held by claim old"},
		{name: "admin access touches nothing", results: []resourceapi.DeviceRequestAllocationResult{admin}, want: []string{"admin"}},
		{name: "other drivers ignored", results: []resourceapi.DeviceRequestAllocationResult{{Request: "gpu", Driver: slices.GPUDriver, Pool: testNode, Device: "gpu-0"}}},
		{name: "unknown device", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-99-00-0", true, "1G")},
			wantErr: "device nic-0000-99-00-0 is not among this node's"},
		{name: "other pool", results: []resourceapi.DeviceRequestAllocationResult{func() resourceapi.DeviceRequestAllocationResult {
			r := result("a", "nic-0000-17-00-0", true, "1G")
			r.Pool = "worker-2"
			return r
		}()}, wantErr: `in pool "worker-2"`},
		{name: "share without bandwidth", results: []resourceapi.DeviceRequestAllocationResult{result("a", "nic-0000-17-00-0", true, "0")},
			wantErr: "below 1 Mb/s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClaim("")
			c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: tc.results}}
			plan, err := Plan(c, catalog, tc.held, testNode)
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
				got = append(got, fmt.Sprintf("%s rate=%d mtu=%d", a.VF.PCIAddress, a.Config.MaxTxRateMbps, a.Config.MTU))
			}
			if strings.Join(got, ";") != strings.Join(tc.want, ";") {
				t.Errorf("plan %v, want %v", got, tc.want)
			}
		})
	}
}
