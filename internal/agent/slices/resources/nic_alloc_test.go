// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// nicAllocator is the scheduler's allocator over the NIC slices of offers.
func nicAllocator(t *testing.T, offers []config.NICOffer) *allocate.Allocator {
	t.Helper()
	res, skips := NIC(testNode, offers, device.AllFeatures)
	if len(skips) > 0 {
		t.Fatalf("skips: %v", skips)
	}
	return newAllocator(t, allocate.ClusterFeatures, map[string]resourceslice.DriverResources{device.NICDriver: res})
}

// share asks for one NIC device of the driver, with a bandwidth request
// unless bw is "", and further capacity requests in pairs ("vfs", "2").
func share(name, bw string, more ...string) resourceapi.DeviceRequest {
	r := request(name, device.NICDriver, 1, "")
	reqs := map[resourceapi.QualifiedName]resource.Quantity{}
	if bw != "" {
		reqs[device.NICCapBandwidth] = resource.MustParse(bw)
	}
	for i := 0; i+1 < len(more); i += 2 {
		reqs[resourceapi.QualifiedName(more[i])] = resource.MustParse(more[i+1])
	}
	if len(reqs) > 0 {
		r.Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: reqs}
	}
	return r
}

// consumed is what a claim's only result takes of a capacity.
func consumed(t *testing.T, c *resourceapi.ResourceClaim, name resourceapi.QualifiedName) string {
	t.Helper()
	res := c.Status.Allocation.Devices.Results
	if len(res) != 1 || res[0].ShareID == nil {
		t.Fatalf("results %+v: want one share", res)
	}
	q, ok := res[0].ConsumedCapacity[name]
	if !ok {
		return ""
	}
	return q.String()
}

func TestNICShares400G(t *testing.T) {
	a := nicAllocator(t, offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 0, 400000, 16)))
	for i := range 2 {
		c := claim(share("nic", "150G"))
		if !fits(t, a, c) {
			t.Fatalf("150G share %d refused", i+1)
		}
		if got := consumed(t, c, device.NICCapBandwidth); got != "150G" {
			t.Errorf("share %d consumed %s", i+1, got)
		}
		if got := consumed(t, c, device.NICCapVFs); got != "1" {
			t.Errorf("share %d consumed %s VFs", i+1, got)
		}
	}
	if fits(t, a, claim(share("nic", "150G"))) {
		t.Fatal("third 150G share on a 400G link allocated")
	}
	if !fits(t, a, claim(share("nic", "100G"))) {
		t.Fatal("the remaining 100G refused")
	}
}

func TestNICSeventeenthVFRefused(t *testing.T) {
	a := nicAllocator(t, offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 0, 400000, 16)))
	var claims []*resourceapi.ResourceClaim
	for i := range 16 {
		c := claim(share("nic", "1G"))
		if !fits(t, a, c) {
			t.Fatalf("1G share %d refused", i+1)
		}
		claims = append(claims, c)
	}
	if fits(t, a, claim(share("nic", "1G"))) {
		t.Fatal("seventeenth share allocated with 16 VFs")
	}
	a.Release(claims[7])
	if !fits(t, a, claim(share("nic", "1G"))) {
		t.Fatal("share refused after one was released")
	}
}

func TestNICShareDefault(t *testing.T) {
	a := nicAllocator(t, offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 0, 400000, 16)))
	c := claim(share("nic", ""))
	if !fits(t, a, c) {
		t.Fatal("share without a bandwidth request refused")
	}
	if got := consumed(t, c, device.NICCapBandwidth); got != "10G" {
		t.Errorf("consumed %s, want the policy default 10G", got)
	}
	if got := consumed(t, c, device.NICCapVFs); got != "1" {
		t.Errorf("consumed %s VFs, want 1", got)
	}
}

// TestNICShareRounding: the allocator rounds a request below the minimum
// up to it and one off the step up to the next step (counted from the
// minimum); a request above the range's max, or one that rounds up past
// it, and a VF count other than 1 make the device unsuitable.
func TestNICShareRounding(t *testing.T) {
	pf := nicPF("0000:17:00.0", "ens1f0", 0, 400000, 16)
	o := offer(config.ModeShared, pf)
	o[0].Bandwidth = config.BandwidthPolicy{DefaultMbps: 11000, MinimumMbps: 1000, StepMbps: 10000} // 1G, 11G, ..., 391G
	for _, tc := range []struct {
		name string
		req  resourceapi.DeviceRequest
		want string // consumed bandwidth, "" for refused
	}{
		{"below the minimum", share("nic", "100M"), "1G"},
		{"on the grid", share("nic", "21G"), "21G"},
		{"off the step", share("nic", "12G"), "21G"},
		{"fraction of a step", share("nic", "1001M"), "11G"},
		{"the largest share", share("nic", "391G"), "391G"},
		{"rounds past the max", share("nic", "392G"), ""},
		{"above the link", share("nic", "401G"), ""},
		{"two VFs", share("nic", "10G", string(device.NICCapVFs), "2"), ""},
		{"zero VFs rounds up to one", share("nic", "10G", string(device.NICCapVFs), "0"), "11G"},
		{"unknown capacity", share("nic", "10G", "sriov.hwdra.io/iops", "1"), ""},
		// Capacity requests name the capacity exactly: the unqualified
		// name of the capacity before it was qualified matches nothing.
		{"unqualified bandwidth", share("nic", "", "bandwidth", "10G"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := nicAllocator(t, o)
			c := claim(tc.req)
			ok := fits(t, a, c)
			switch {
			case tc.want == "" && ok:
				t.Fatalf("allocated, consuming %s", consumed(t, c, device.NICCapBandwidth))
			case tc.want != "" && !ok:
				t.Fatal("refused")
			case ok:
				if got := consumed(t, c, device.NICCapBandwidth); got != tc.want {
					t.Errorf("consumed %s, want %s", got, tc.want)
				}
			}
		})
	}
}

// TestNICDistinctPF: without a constraint the first-fit allocator puts two
// shares on one PF; distinctAttribute on the PF name spreads them.
func TestNICDistinctPF(t *testing.T) {
	pfs := offer(config.ModeShared,
		nicPF("0000:17:00.0", "ens1f0", 0, 400000, 16), nicPF("0000:b1:00.0", "ens2f0", 1, 400000, 16))
	for _, tc := range []struct {
		name       string
		constraint *resourceapi.DeviceConstraint
		distinct   bool
	}{
		{"no constraint", nil, false},
		{"distinct pfName", &resourceapi.DeviceConstraint{DistinctAttribute: new(resourceapi.FullyQualifiedName(device.NICAttrPFName))}, true},
		{"distinct pfPciAddress", &resourceapi.DeviceConstraint{DistinctAttribute: new(resourceapi.FullyQualifiedName(device.NICAttrPFPCIAddress))}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := nicAllocator(t, pfs)
			c := claim(share("a", "100G"), share("b", "100G"))
			if tc.constraint != nil {
				c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{*tc.constraint}
			}
			if !fits(t, a, c) {
				t.Fatal("refused")
			}
			got := allocatedDevices(c)
			if len(got) != 2 || (got[0] != got[1]) != tc.distinct {
				t.Errorf("devices %v, distinct want %v", got, tc.distinct)
			}
		})
	}
	// Two 300G shares cannot share one 400G PF, with or without the
	// constraint; a third finds no room anywhere.
	a := nicAllocator(t, pfs)
	if c := claim(share("a", "300G"), share("b", "300G")); !fits(t, a, c) || allocatedDevices(c)[0] == allocatedDevices(c)[1] {
		t.Fatalf("two 300G shares: %v", c.Status.Allocation)
	}
	if fits(t, a, claim(share("a", "300G"))) {
		t.Fatal("third 300G share allocated")
	}
}

// TestNICMatchNUMA: two shares constrained to one NUMA node land on one,
// here the second node's PFs because the request selects a node-1 PF.
func TestNICMatchNUMA(t *testing.T) {
	a := nicAllocator(t, offer(config.ModeShared,
		nicPF("0000:17:00.0", "ens1f0", 0, 400000, 4), nicPF("0000:31:00.0", "ens2f0", 0, 400000, 4),
		nicPF("0000:b1:00.0", "ens3f0", 1, 400000, 4), nicPF("0000:ca:00.0", "ens4f0", 1, 400000, 4)))
	first := share("a", "10G")
	first.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
		Expression: `device.attributes["sriov.hwdra.io"].pfName == "ens4f0"`}}}
	c := claim(first, share("b", "10G"))
	c.Spec.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: new(resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode"))}}
	if !fits(t, a, c) {
		t.Fatal("refused")
	}
	if got := allocatedDevices(c); got[0] != "nic-0000-ca-00-0" || got[1] != "nic-0000-b1-00-0" {
		t.Errorf("devices %v, want both on NUMA node 1", got)
	}
}

func TestNICExclusiveVFs(t *testing.T) {
	a := nicAllocator(t, offer(config.ModeExclusive, nicPF("0000:17:00.0", "ens1f0", 0, 400000, 4)))
	seen := map[string]bool{}
	for i := range 4 {
		c := claim(request("vf", device.NICDriver, 1, `device.attributes["sriov.hwdra.io"].mode == "exclusive"`))
		if !fits(t, a, c) {
			t.Fatalf("VF %d refused", i)
		}
		d := allocatedDevices(c)[0]
		if seen[d] || c.Status.Allocation.Devices.Results[0].ShareID != nil {
			t.Errorf("VF device %s handed out twice or as a share", d)
		}
		seen[d] = true
	}
	if fits(t, a, claim(request("vf", device.NICDriver, 1, ""))) {
		t.Fatal("fifth VF of four allocated")
	}
	// A selector on the informational bandwidth capacity works too.
	b := nicAllocator(t, offer(config.ModeExclusive, nicPF("0000:17:00.0", "ens1f0", 0, 100000, 1)))
	if fits(t, b, claim(request("vf", device.NICDriver, 1, `device.capacity["sriov.hwdra.io"].bandwidth.compareTo(quantity("200G")) >= 0`))) {
		t.Fatal("a 100G VF matched bandwidth >= 200G")
	}
}
