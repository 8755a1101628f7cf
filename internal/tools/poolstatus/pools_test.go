// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"
)

const drv = "example.com"

// slice is a slice of pool p at generation gen, one of count, on node.
func slice(p string, gen, count int64, node string, devices ...resourceapi.Device) resourceapi.ResourceSlice {
	s := resourceapi.ResourceSlice{Spec: resourceapi.ResourceSliceSpec{
		Driver: drv, Pool: resourceapi.ResourcePool{Name: p, Generation: gen, ResourceSliceCount: count}, Devices: devices,
	}}
	if node != "" {
		s.Spec.NodeName = ptr.To(node)
	}
	return s
}

func dev(name string, taints ...resourceapi.DeviceTaintEffect) resourceapi.Device {
	d := resourceapi.Device{Name: name}
	for _, e := range taints {
		d.Taints = append(d.Taints, resourceapi.DeviceTaint{Key: "k", Effect: e})
	}
	return d
}

func shared(name string, bandwidth string) resourceapi.Device {
	return resourceapi.Device{Name: name, AllowMultipleAllocations: ptr.To(true), Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		"bw": {Value: resource.MustParse(bandwidth)}, "vfs": {Value: resource.MustParse("8")},
	}}
}

type result struct {
	driver, pool, device string
	admin                bool
	bw                   string
}

func allocated(results ...result) resourceapi.ResourceClaim {
	var c resourceapi.ResourceClaim
	c.Status.Allocation = &resourceapi.AllocationResult{}
	for _, r := range results {
		d := resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: r.driver, Pool: r.pool, Device: r.device}
		if r.admin {
			d.AdminAccess = ptr.To(true)
		}
		if r.bw != "" {
			d.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"bw": resource.MustParse(r.bw), "vfs": resource.MustParse("1")}
		}
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results, d)
	}
	return c
}

func rule(effect resourceapi.DeviceTaintEffect, sel *resourceapi.DeviceTaintSelector) resourceapi.DeviceTaintRule {
	return resourceapi.DeviceTaintRule{Spec: resourceapi.DeviceTaintRuleSpec{DeviceSelector: sel, Taint: resourceapi.DeviceTaint{Key: "r", Effect: effect}}}
}

// counts is what the controller reports as numbers (nil: left out).
type counts struct {
	slices, total, allocated, available, unavailable *int32
}

func n(v int32) *int32 { return &v }

// TestControllerDefinitions: the pool counts follow the pool-status
// controller's definitions (see pools.go), case by case.
func TestControllerDefinitions(t *testing.T) {
	cases := []struct {
		name   string
		c      Cluster
		pool   string
		want   counts
		node   *string
		errHas string
	}{
		{
			name: "devices counted once, allocations by distinct device",
			c: Cluster{
				Slices: []resourceapi.ResourceSlice{slice("p", 1, 2, "n1", dev("a"), dev("b")), slice("p", 1, 2, "n1", dev("c"))},
				Claims: []resourceapi.ResourceClaim{
					allocated(result{drv, "p", "a", false, ""}),
					allocated(result{drv, "p", "a", false, ""}, result{drv, "p", "b", false, ""}),
				},
			},
			pool: "p", want: counts{n(2), n(3), n(2), n(1), n(0)}, node: ptr.To("n1"),
		},
		{
			name: "only the newest generation counts",
			c: Cluster{Slices: []resourceapi.ResourceSlice{
				slice("p", 1, 1, "n1", dev("old1"), dev("old2")), slice("p", 2, 1, "n1", dev("new")),
			}},
			pool: "p", want: counts{n(1), n(1), n(0), n(1), n(0)}, node: ptr.To("n1"),
		},
		{
			name: "incomplete pool: no counts, PoolIncomplete",
			c:    Cluster{Slices: []resourceapi.ResourceSlice{slice("p", 3, 2, "n1", dev("a"))}},
			pool: "p", node: ptr.To("n1"), errHas: Incomplete + " pool example.com/p has 1 of its 2 slices at generation 3",
		},
		{
			name: "NoSchedule and NoExecute taints make devices unavailable, None does not",
			c: Cluster{Slices: []resourceapi.ResourceSlice{slice("p", 1, 1, "n1",
				dev("a", resourceapi.DeviceTaintEffectNoSchedule), dev("b", resourceapi.DeviceTaintEffectNoExecute),
				dev("c", resourceapi.DeviceTaintEffectNone), dev("d"))}},
			pool: "p", want: counts{n(1), n(4), n(0), n(2), n(2)}, node: ptr.To("n1"),
		},
		{
			name: "DeviceTaintRules: by driver, pool and device; no selector selects nothing",
			c: Cluster{
				Slices: []resourceapi.ResourceSlice{slice("p", 1, 1, "n1", dev("a"), dev("b"), dev("c"), dev("d"))},
				TaintRules: []resourceapi.DeviceTaintRule{
					rule(resourceapi.DeviceTaintEffectNoSchedule, &resourceapi.DeviceTaintSelector{Driver: ptr.To(drv), Pool: ptr.To("p"), Device: ptr.To("a")}),
					rule(resourceapi.DeviceTaintEffectNoExecute, &resourceapi.DeviceTaintSelector{Device: ptr.To("b")}),
					rule(resourceapi.DeviceTaintEffectNoSchedule, &resourceapi.DeviceTaintSelector{Driver: ptr.To("other"), Device: ptr.To("c")}),
					rule(resourceapi.DeviceTaintEffectNone, &resourceapi.DeviceTaintSelector{Device: ptr.To("d")}),
					rule(resourceapi.DeviceTaintEffectNoSchedule, nil),
				},
			},
			pool: "p", want: counts{n(1), n(4), n(0), n(2), n(2)}, node: ptr.To("n1"),
		},
		{
			name: "admin access and other drivers' results are no allocations; a tainted allocated device counts twice",
			c: Cluster{
				Slices: []resourceapi.ResourceSlice{slice("p", 1, 1, "n1", dev("a", resourceapi.DeviceTaintEffectNoSchedule), dev("b"))},
				Claims: []resourceapi.ResourceClaim{
					allocated(result{drv, "p", "a", false, ""}, result{drv, "p", "b", true, ""}, result{"other", "p", "b", false, ""}),
					{}, // not allocated
				},
			},
			pool: "p", want: counts{n(1), n(2), n(1), n(0), n(1)}, node: ptr.To("n1"),
		},
		{
			name: "slices on different nodes: no node name",
			c:    Cluster{Slices: []resourceapi.ResourceSlice{slice("p", 1, 2, "n1", dev("a")), slice("p", 1, 2, "n2", dev("b"))}},
			pool: "p", want: counts{n(2), n(2), n(0), n(2), n(0)},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var got *Pool
			for _, p := range Compute(tc.c, drv) {
				if p.PoolName == tc.pool {
					got = &p
				}
			}
			if got == nil {
				t.Fatalf("pool %s missing", tc.pool)
			}
			have := counts{got.ResourceSliceCount, got.TotalDevices, got.AllocatedDevices, got.AvailableDevices, got.UnavailableDevices}
			for _, f := range []struct {
				name       string
				have, want *int32
			}{
				{"resourceSliceCount", have.slices, tc.want.slices}, {"totalDevices", have.total, tc.want.total},
				{"allocatedDevices", have.allocated, tc.want.allocated}, {"availableDevices", have.available, tc.want.available},
				{"unavailableDevices", have.unavailable, tc.want.unavailable},
			} {
				if (f.have == nil) != (f.want == nil) || f.have != nil && *f.have != *f.want {
					t.Errorf("%s = %s, want %s", f.name, num(f.have), num(f.want))
				}
			}
			if ptr.Deref(got.NodeName, "-") != ptr.Deref(tc.node, "-") {
				t.Errorf("nodeName %s, want %s", str(got.NodeName), str(tc.node))
			}
			if e := ptr.Deref(got.ValidationError, ""); tc.errHas == "" && e != "" || !strings.Contains(e, tc.errHas) {
				t.Errorf("validationError %q, want %q", e, tc.errHas)
			}
		})
	}
}

// TestShareableSummary: capacities of shared devices summed over the pool,
// consumption summed over results, available never below zero; per device
// its own share.
func TestShareableSummary(t *testing.T) {
	c := Cluster{
		Slices: []resourceapi.ResourceSlice{slice("p", 1, 1, "n1", shared("pf0", "400G"), shared("pf1", "100G"), dev("plain"))},
		Claims: []resourceapi.ResourceClaim{
			allocated(result{drv, "p", "pf0", false, "150G"}),
			allocated(result{drv, "p", "pf0", false, "150G"}, result{drv, "p", "pf1", false, "100G"}),
			allocated(result{drv, "p", "pf1", true, "50G"}), // admin access: not counted
		},
	}
	p := Compute(c, drv)[0]
	s := p.ShareableSummary
	if s == nil || *s.FullyAvailableDevices != 0 || *s.PartiallyAvailableDevices != 2 {
		t.Fatalf("summary %+v", s)
	}
	want := map[string][3]string{"bw": {"500G", "400G", "100G"}, "vfs": {"16", "3", "13"}}
	for _, cs := range s.Capacity {
		if w := want[cs.Name]; [3]string{cs.Total.String(), cs.Consumed.String(), cs.Available.String()} != w {
			t.Errorf("pool %s: %s/%s/%s, want %v", cs.Name, cs.Total, cs.Consumed, cs.Available, w)
		}
	}
	perDevice := map[string]map[string]string{"pf0": {"bw": "100G", "vfs": "6"}, "pf1": {"bw": "0", "vfs": "7"}}
	if len(p.SharedDevices) != 2 {
		t.Fatalf("shared devices %+v", p.SharedDevices)
	}
	for _, d := range p.SharedDevices {
		for _, cs := range d.Capacity {
			if got := cs.Available.String(); got != perDevice[d.Device][cs.Name] {
				t.Errorf("%s %s available %s, want %s", d.Device, cs.Name, got, perDevice[d.Device][cs.Name])
			}
		}
	}
	if p.SharedDevices[0].Allocations != 2 || p.SharedDevices[1].Allocations != 1 {
		t.Errorf("allocations %d, %d", p.SharedDevices[0].Allocations, p.SharedDevices[1].Allocations)
	}
	// Over-consumed (the capacity shrank under existing shares): zero left.
	c.Slices[0].Spec.Devices[1] = shared("pf1", "50G")
	for _, d := range Compute(c, drv)[0].SharedDevices {
		for _, cs := range d.Capacity {
			if d.Device == "pf1" && cs.Name == "bw" && cs.Available.String() != "0" {
				t.Errorf("over-consumed device shows %s available", cs.Available)
			}
		}
	}
}
