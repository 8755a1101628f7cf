// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// nicPF is a ConnectX-7 PF as discovery reports it.
func nicPF(addr, netdev string, numa, speedMbps, vfs int) hw.PF {
	pf := hw.PF{
		PCIAddress: addr, Netdev: netdev, VendorID: "15b3", DeviceID: "1021", Driver: "mlx5_core",
		NUMANode: numa, PCIeRoot: "pci0000:" + addr[5:7], LinkType: hw.LinkEthernet, RDMADevice: "mlx5_0",
		LinkUp: true, SpeedMbps: speedMbps, EswitchMode: "legacy", TotalVFs: 127, NumVFs: vfs,
	}
	var a, bus int
	fmt.Sscanf(addr, "%04x:%02x", &a, &bus)
	for i := range vfs {
		rid := bus<<8 + 8 + i
		pf.VFs = append(pf.VFs, hw.VF{Index: i, PCIAddress: fmt.Sprintf("%04x:%02x:%02x.%x", a, rid>>8, rid>>3&0x1f, rid&7),
			Netdev: fmt.Sprintf("%sv%d", netdev, i), Driver: "mlx5_core", DeviceID: "101e"})
	}
	return pf
}

func offer(mode config.Mode, pfs ...hw.PF) []config.NICOffer {
	var out []config.NICOffer
	for _, pf := range pfs {
		out = append(out, config.NICOffer{PF: pf, Mode: mode, Bandwidth: config.DefaultBandwidth, Rule: -1})
	}
	return out
}

func nicDevices(res resourceslice.DriverResources) []resourceapi.Device {
	var out []resourceapi.Device
	for _, s := range res.Pools[testNode].Slices {
		out = append(out, s.Devices...)
	}
	return out
}

func q(s string) *resource.Quantity { v := resource.MustParse(s); return &v }

func TestNICSharedDevice(t *testing.T) {
	res, skips := NIC(testNode, offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 1, 400000, 16)), device.AllFeatures)
	if len(skips) != 0 {
		t.Fatalf("skips: %v", skips)
	}
	devs := nicDevices(res)
	if len(devs) != 1 {
		t.Fatalf("%d devices, want 1", len(devs))
	}
	d := devs[0]
	if d.Name != "nic-0000-17-00-0" || d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
		t.Errorf("device %s, allowMultipleAllocations %v", d.Name, d.AllowMultipleAllocations)
	}
	want := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"sriov.hwdra.io/mode": str("shared"), "sriov.hwdra.io/pfName": str("ens1f0"), "sriov.hwdra.io/pfPciAddress": str("0000:17:00.0"),
		"sriov.hwdra.io/vendorID": str("15b3"), "sriov.hwdra.io/deviceID": str("1021"), "sriov.hwdra.io/driver": str("mlx5_core"),
		"sriov.hwdra.io/linkType": str("ethernet"), "sriov.hwdra.io/rdma": boolean(true), "sriov.hwdra.io/eswitchMode": str("legacy"),
		"resource.kubernetes.io/numaNode": integer(1), "resource.kubernetes.io/pcieRoot": str("pci0000:17"),
	}
	if !reflect.DeepEqual(d.Attributes, want) {
		t.Errorf("attributes:\n got %v\nwant %v", d.Attributes, want)
	}
	bw, vfs := d.Capacity[device.NICCapBandwidth], d.Capacity[device.NICCapVFs]
	checkQ := func(what string, got *resource.Quantity, want string) {
		t.Helper()
		if got == nil || got.Cmp(*q(want)) != 0 || got.String() != want {
			t.Errorf("%s = %v, want %s", what, got, want)
		}
	}
	checkQ("bandwidth", &bw.Value, "400G")
	checkQ("bandwidth default", bw.RequestPolicy.Default, "10G")
	checkQ("bandwidth min", bw.RequestPolicy.ValidRange.Min, "1G")
	checkQ("bandwidth max", bw.RequestPolicy.ValidRange.Max, "400G")
	checkQ("bandwidth step", bw.RequestPolicy.ValidRange.Step, "1G")
	checkQ("vfs", &vfs.Value, "16")
	checkQ("vfs default", vfs.RequestPolicy.Default, "1")
	if len(vfs.RequestPolicy.ValidValues) != 1 || vfs.RequestPolicy.ValidValues[0].String() != "1" || vfs.RequestPolicy.ValidRange != nil {
		t.Errorf("vfs policy %+v", vfs.RequestPolicy)
	}
}

// TestNICPolicyFitsTheLink: the API wants max on the step grid and within
// the capacity, and the default within the range.
func TestNICPolicyFitsTheLink(t *testing.T) {
	for _, tc := range []struct {
		name             string
		speed            int
		policy           config.BandwidthPolicy
		wantDef, wantMax string
		wantStep         string // "" for none
	}{
		{"400G, 10G steps from 1G", 400000, config.BandwidthPolicy{DefaultMbps: 11000, MinimumMbps: 1000, StepMbps: 10000}, "11G", "391G", "10G"},
		{"25G link, default 40G clamped", 25000, config.BandwidthPolicy{DefaultMbps: 40000, MinimumMbps: 1000, StepMbps: 1000}, "25G", "25G", "1G"},
		{"1.5G link, 1G shares: one size only", 1500, config.DefaultBandwidth, "1G", "1G", ""},
		{"100G E810, 500M shares", 100000, config.BandwidthPolicy{DefaultMbps: 10000, MinimumMbps: 500, StepMbps: 500}, "10G", "100G", "500M"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 0, tc.speed, 4))
			o[0].Bandwidth = tc.policy
			res, skips := NIC(testNode, o, device.AllFeatures)
			if len(skips) > 0 {
				t.Fatal(skips)
			}
			p := nicDevices(res)[0].Capacity[device.NICCapBandwidth].RequestPolicy
			if p.Default.String() != tc.wantDef || p.ValidRange.Max.String() != tc.wantMax {
				t.Errorf("default %s max %s, want %s %s", p.Default, p.ValidRange.Max, tc.wantDef, tc.wantMax)
			}
			if (p.ValidRange.Step == nil) != (tc.wantStep == "") || (p.ValidRange.Step != nil && p.ValidRange.Step.String() != tc.wantStep) {
				t.Errorf("step %v, want %q", p.ValidRange.Step, tc.wantStep)
			}
			checkNICInvariants(t, res)
		})
	}
}

func TestNICExclusiveDevices(t *testing.T) {
	var pfs []hw.PF
	for i, bus := range []string{"17", "31", "b1", "ca"} {
		pfs = append(pfs, nicPF("0000:"+bus+":00.0", fmt.Sprintf("ens%df0", i), i/2, 400000, 64))
	}
	pfs[3].NUMANode = hw.UnknownNUMANode
	pfs[3].VFs[5].Driver = "vfio-pci"
	pfs[3].VFs[5].Netdev = ""
	res, skips := NIC(testNode, offer(config.ModeExclusive, pfs...), device.AllFeatures)
	if len(skips) != 0 {
		t.Fatal(skips)
	}
	sl := res.Pools[testNode].Slices
	if len(sl) != 2 || len(sl[0].Devices) != 128 || len(sl[1].Devices) != 128 {
		t.Fatalf("slices: %d", len(sl))
	}
	d := sl[1].Devices[128-64+5] // PF 3, VF 5
	if d.Name != "nic-0000-ca-00-0-vf-5" || d.AllowMultipleAllocations != nil {
		t.Errorf("device %s", d.Name)
	}
	for name, want := range map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"resource.kubernetes.io/pciBusID": str("0000:ca:01.5"), "sriov.hwdra.io/vfIndex": integer(5), "sriov.hwdra.io/vfDriver": str("vfio-pci"),
		"sriov.hwdra.io/vfDeviceID": str("101e"), "sriov.hwdra.io/mode": str("exclusive"), "sriov.hwdra.io/pfName": str("ens3f0"),
		"sriov.hwdra.io/pfPciAddress": str("0000:ca:00.0"),
	} {
		if got := d.Attributes[name]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if _, ok := d.Attributes["resource.kubernetes.io/numaNode"]; ok {
		t.Error("numaNode published for an unknown NUMA node")
	}
	if bw := d.Capacity[device.NICCapBandwidth]; bw.Value.String() != "400G" || bw.RequestPolicy != nil {
		t.Errorf("bandwidth %+v", bw)
	}
	checkNICInvariants(t, res)
}

func TestNICSkips(t *testing.T) {
	down := nicPF("0000:17:00.0", "ens1f0", 0, 0, 4)
	down.LinkUp = false
	unknown := nicPF("0000:18:00.0", "ens2f0", 0, 0, 4)
	slow := nicPF("0000:19:00.0", "ens3f0", 0, 100, 4)
	noVFs := nicPF("0000:1a:00.0", "ens4f0", 0, 100000, 0)
	exclDown := nicPF("0000:1b:00.0", "ens5f0", 0, 0, 4)
	exclDown.LinkUp = false
	exclUnknownSpeed := nicPF("0000:1c:00.0", "ens6f0", 0, 0, 2)
	heldDown := nicPF("0000:1d:00.0", "ens7f0", 0, 0, 4)
	heldDown.LinkUp, heldDown.LastSpeedMbps = false, 200000
	offers := append(offer(config.ModeShared, down, unknown, slow, noVFs, heldDown), offer(config.ModeExclusive, exclDown, exclUnknownSpeed)...)
	res, skips := NIC(testNode, offers, device.AllFeatures)
	var got []string
	for _, s := range skips {
		got = append(got, s.String())
	}
	want := []string{
		"0000:19:00.0 (ens3f0): link speed 100M is below the bandwidth minimum 1G",
		"0000:1a:00.0 (ens4f0): no VFs",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("skips:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A link that is down or of unknown speed is published, tainted, so
	// claims on it still prepare: bandwidth is the last speed seen, else
	// one minimum share. Exclusive VFs carry no bandwidth without a speed.
	byName := devicesByName(res)
	for _, tc := range []struct {
		device, taint, bandwidth string
	}{
		{"nic-0000-17-00-0", "LinkDown", "1G"},
		{"nic-0000-18-00-0", "SpeedUnknown", "1G"},
		{"nic-0000-1d-00-0", "LinkDown", "200G"},
		{"nic-0000-1b-00-0-vf-3", "LinkDown", ""},
		{"nic-0000-1c-00-0-vf-0", "SpeedUnknown", ""},
	} {
		d, ok := byName[tc.device]
		if !ok {
			t.Errorf("%s not published", tc.device)
			continue
		}
		wantTaints := []resourceapi.DeviceTaint{{Key: device.NICTaintKey, Value: tc.taint, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		if !reflect.DeepEqual(d.Taints, wantTaints) {
			t.Errorf("%s: taints %v, want %v", tc.device, d.Taints, wantTaints)
		}
		bw, has := d.Capacity[device.NICCapBandwidth]
		if got := bw.Value.String(); has != (tc.bandwidth != "") || has && got != tc.bandwidth {
			t.Errorf("%s: bandwidth %v (present %v), want %q", tc.device, got, has, tc.bandwidth)
		}
	}
	checkNICInvariants(t, res)
}

// TestNICTaintsFromFaults: a monitor's fault on a PF taints its shared
// device and all its VFs, a VF's fault that VF alone; a fatal fault taints
// NoExecute only where configured; without DeviceTaints nothing is tainted.
func TestNICTaintsFromFaults(t *testing.T) {
	shared := nicPF("0000:17:00.0", "ens1f0", 0, 400000, 4)
	excl := nicPF("0000:31:00.0", "ens2f0", 1, 100000, 3)
	offers := append(offer(config.ModeShared, shared), offer(config.ModeExclusive, excl)...)
	faults := hw.Health{
		PFs: map[string]hw.Fault{"0000:17:00.0": {Reason: "LinkRemoved", Fatal: true}},
		VFs: map[string]hw.Fault{excl.VFs[1].PCIAddress: {Reason: "VFGone"}},
	}
	noTaints := device.AllFeatures
	noTaints.DeviceTaints = false
	for _, tc := range []struct {
		name string
		f    device.Features
		h    Health
		want map[string]string // device -> value:effect
	}{
		{"NoSchedule", device.AllFeatures, Health{Faults: faults}, map[string]string{
			"nic-0000-17-00-0": "LinkRemoved:NoSchedule", "nic-0000-31-00-0-vf-1": "VFGone:NoSchedule"}},
		{"fatal NoExecute", device.AllFeatures, Health{Faults: faults, FatalNoExecute: true}, map[string]string{
			"nic-0000-17-00-0": "LinkRemoved:NoExecute", "nic-0000-31-00-0-vf-1": "VFGone:NoSchedule"}},
		{"DeviceTaints off", noTaints, Health{Faults: faults}, map[string]string{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := TaintedNIC(testNode, offers, tc.f, tc.h)
			got := map[string]string{}
			for name, d := range devicesByName(res) {
				for _, taint := range d.Taints {
					if taint.Key != device.NICTaintKey {
						t.Errorf("%s: taint key %s", name, taint.Key)
					}
					got[name] = taint.Value + ":" + string(taint.Effect)
				}
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("taints %v, want %v", got, tc.want)
			}
		})
	}
}

func TestNICWithoutConsumableCapacity(t *testing.T) {
	f := device.AllFeatures
	f.ConsumableCapacity = false
	res, _ := NIC(testNode, offer(config.ModeShared, nicPF("0000:17:00.0", "ens1f0", 0, 400000, 3)), f)
	devs := nicDevices(res)
	if len(devs) != 3 || devs[2].Name != "nic-0000-17-00-0-vf-2" || devs[2].AllowMultipleAllocations != nil {
		t.Fatalf("want 3 exclusive VF devices, got %d", len(devs))
	}
	checkNICInvariants(t, res)
}

func TestNICDeterministic(t *testing.T) {
	var pfs []hw.PF
	for i := range 6 {
		pfs = append(pfs, nicPF(fmt.Sprintf("0000:%02x:00.0", 0x20+i), fmt.Sprintf("ens%d", i), i%2, 200000, 8))
	}
	a, _ := NIC(testNode, offer(config.ModeShared, pfs...), device.AllFeatures)
	rand.Shuffle(len(pfs), func(i, j int) { pfs[i], pfs[j] = pfs[j], pfs[i] })
	b, _ := NIC(testNode, offer(config.ModeShared, pfs...), device.AllFeatures)
	if !reflect.DeepEqual(a, b) {
		t.Error("output depends on input order")
	}
	if n := nicDevices(a); n[0].Name != "nic-0000-20-00-0" || n[5].Name != "nic-0000-25-00-0" {
		t.Errorf("order %s..%s", n[0].Name, n[5].Name)
	}
}

// checkNICInvariants adds to checkLimits what the API server validates of
// consumable capacity (resource/v1) and would refuse at publish time.
func checkNICInvariants(t *testing.T, res resourceslice.DriverResources) {
	t.Helper()
	checkLimits(t, res)
	for _, d := range nicDevices(res) {
		for name, c := range d.Capacity {
			p := c.RequestPolicy
			if p == nil {
				continue
			}
			if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
				t.Errorf("%s/%s: requestPolicy on a device that is not multi-allocatable", d.Name, name)
			}
			if p.Default == nil {
				t.Errorf("%s/%s: no default", d.Name, name)
				continue
			}
			if r := p.ValidRange; r != nil {
				v, lo, hi, def := c.Value.Value(), r.Min.Value(), r.Max.Value(), p.Default.Value()
				if lo > v || hi > v || lo > hi || def < lo || def > hi {
					t.Errorf("%s/%s: min %d default %d max %d capacity %d", d.Name, name, lo, def, hi, v)
				}
				if r.Step != nil {
					st := r.Step.Value()
					if lo+st > v || (def-lo)%st != 0 || (hi-lo)%st != 0 {
						t.Errorf("%s/%s: step %d off for min %d default %d max %d capacity %d", d.Name, name, st, lo, def, hi, v)
					}
				}
			}
			if vv := p.ValidValues; len(vv) > 0 {
				found := false
				for _, x := range vv {
					found = found || x.Cmp(*p.Default) == 0
					if x.Cmp(c.Value) > 0 {
						t.Errorf("%s/%s: valid value %s above capacity %s", d.Name, name, x.String(), c.Value.String())
					}
				}
				if !found {
					t.Errorf("%s/%s: default not among valid values", d.Name, name)
				}
			}
		}
	}
}

func TestNICDevicesMatchPublishedDevices(t *testing.T) {
	shared := nicPF("0000:17:00.0", "ens1f0", 0, 400000, 4)
	excl := nicPF("0000:31:00.0", "ens2f0", 1, 100000, 3)
	down := nicPF("0000:4b:00.0", "ens3f0", 0, 0, 2)
	down.LinkUp = false
	offers := append(offer(config.ModeShared, shared, down), offer(config.ModeExclusive, excl)...)
	noCC := device.AllFeatures
	noCC.ConsumableCapacity = false
	for _, tc := range []struct {
		name string
		f    device.Features
		want int
	}{{"all features", device.AllFeatures, 2 + 3}, {"no consumable capacity", noCC, 6 + 3}} {
		t.Run(tc.name, func(t *testing.T) {
			res, _ := NIC(testNode, offers, tc.f)
			catalog := NICDevices(offers, tc.f)
			devs := nicDevices(res)
			if len(catalog) != len(devs) || len(devs) != tc.want {
				t.Fatalf("catalog has %d devices, slices %d, want %d", len(catalog), len(devs), tc.want)
			}
			for _, d := range devs {
				what, ok := catalog[d.Name]
				if !ok {
					t.Fatalf("%s published but not in the catalog", d.Name)
				}
				if mode := *d.Attributes[device.NICAttrMode].StringValue; mode != string(what.Mode) {
					t.Errorf("%s: mode %s in slices, %s in catalog", d.Name, mode, what.Mode)
				}
				if pf := *d.Attributes[device.NICAttrPFPCIAddress].StringValue; pf != what.PF.PCIAddress {
					t.Errorf("%s: PF %s in slices, %s in catalog", d.Name, pf, what.PF.PCIAddress)
				}
				switch {
				case what.Mode == config.ModeShared && what.VF != nil:
					t.Errorf("%s: shared device with VF %d", d.Name, what.VF.Index)
				case what.Mode == config.ModeExclusive && (what.VF == nil || device.NICVFDeviceName(what.PF.PCIAddress, what.VF.Index) != d.Name ||
					*d.Attributes[device.NICAttrVFIndex].IntValue != int64(what.VF.Index)):
					t.Errorf("%s: catalog VF %+v", d.Name, what.VF)
				}
			}
		})
	}
}

// TestNICVFsCapacityCountsUsableVFs: a share takes a VF netdev, so the
// vfs capacity counts the VFs bound to a network driver, wherever their
// netdevs are (a share's is in its pod), and not those bound to vfio-pci.
func TestNICVFsCapacityCountsUsableVFs(t *testing.T) {
	pf := nicPF("0000:17:00.0", "ens1f0", 0, 400000, 4)
	pf.VFs[0].Driver, pf.VFs[0].Netdev = "vfio-pci", ""
	pf.VFs[1].Netdev = "" // in a pod
	res, _ := NIC(testNode, []config.NICOffer{{PF: pf, Mode: config.ModeShared, Bandwidth: config.DefaultBandwidth}}, device.AllFeatures)
	d := res.Pools[testNode].Slices[0].Devices[0]
	q := d.Capacity[device.NICCapVFs].Value
	if got := q.Value(); got != 3 {
		t.Fatalf("vfs capacity %d, want 3 (4 VFs, one bound to vfio-pci)", got)
	}
}
