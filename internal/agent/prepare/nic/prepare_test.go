// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"reflect"
	"strconv"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

const exclusiveConfig = agentHeader + openPolicy + "nics:\n- mode: exclusive\n"

// TestPrepareUnprepare: a share and an exclusive VF are configured as the
// claim asks (a share's rate is its consumed bandwidth in Mb/s: its cap,
// and its guaranteed minimum where the PF's driver takes one; an exclusive
// VF keeps its own), their metadata says so, and unprepare restores every
// VF exactly. A driver that refuses a minimum on its PF (mlx5 firmware
// without eswitch bandwidth share, ice with DCB on) gets the cap alone,
// and the metadata says the minimum is 0.
func TestPrepareUnprepare(t *testing.T) {
	const vfConfig = `, "mac": "02:00:00:00:aa:01", "vlan": 100, "vlanQoS": 5, "trust": true, "spoofCheck": false, "mtu": 9000,
		"interfaceName": "fast0", "addresses": ["10.0.0.5/24"], "routes": [{"destination": "10.1.0.0/16", "gateway": "10.0.0.1"}]`
	up := false
	for _, tc := range []struct {
		name, profile, agentConfig string
		req                        resourceapi.DeviceRequest
		vf                         string // "<pf>/<index>" configured
		want                       hw.VFConfig
		wantAttrs                  map[string]string
	}{
		{
			name: "share of a CX7", profile: cx7Node, req: share("nic", "25G"), vf: "pfa/0",
			want: hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, MinTxRateMbps: 25000, MaxTxRateMbps: 25000, Trust: true, MTU: 9000, NetdevUp: &up},
			wantAttrs: map[string]string{"resource.kubernetes.io/pciBusID": "0000:17:01.0", "sriov.hwdra.io/mode": "shared",
				"sriov.hwdra.io/pfName": "pfa", "sriov.hwdra.io/rdmaDevice": "mlx5_1", "sriov.hwdra.io/mac": "02:00:00:00:aa:01",
				"sriov.hwdra.io/maxTxRateMbps": "25000", "sriov.hwdra.io/minTxRateMbps": "25000"},
		},
		{
			name: "share at the policy default", profile: cx7Node, req: share("nic", ""), vf: "pfa/0",
			want:      hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, MinTxRateMbps: 10000, MaxTxRateMbps: 10000, Trust: true, MTU: 9000, NetdevUp: &up},
			wantAttrs: map[string]string{"sriov.hwdra.io/maxTxRateMbps": "10000"},
		},
		{
			name: "share of a CX7 without eswitch bandwidth share", req: share("nic", "25G"), vf: "pfa/0",
			profile:   `nics: [{model: cx7, count: 1, vfs: 4, pciAddresses: ["0000:17:00.0"], netdevs: [pfa], vfMinTxRate: false}]`,
			want:      hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, MaxTxRateMbps: 25000, Trust: true, MTU: 9000, NetdevUp: &up},
			wantAttrs: map[string]string{"sriov.hwdra.io/maxTxRateMbps": "25000", "sriov.hwdra.io/minTxRateMbps": "0"},
		},
		{
			name: "share of an E810", req: share("nic", "25G"), vf: "pfb/0",
			profile: `nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfb]}]`,
			want:    hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, MinTxRateMbps: 25000, MaxTxRateMbps: 25000, Trust: true, MTU: 9000, NetdevUp: &up},
		},
		{
			name: "share of an E810 with DCB on", req: share("nic", "25G"), vf: "pfb/0",
			profile:   `nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfb], vfMinTxRate: false}]`,
			want:      hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, MaxTxRateMbps: 25000, Trust: true, MTU: 9000, NetdevUp: &up},
			wantAttrs: map[string]string{"sriov.hwdra.io/minTxRateMbps": "0"},
		},
		{
			name: "exclusive E810 VF", agentConfig: exclusiveConfig, req: vfRequest("nic"), vf: "pfb/0",
			profile: `nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfb]}]`,
			// ice VFs start with spoof checking on; the rate stays the VF's.
			want:      hw.VFConfig{MAC: "02:00:00:00:aa:01", VLAN: 100, QoS: 5, Trust: true, MTU: 9000, NetdevUp: &up},
			wantAttrs: map[string]string{"sriov.hwdra.io/mode": "exclusive", "sriov.hwdra.io/vfIndex": "0", "resource.kubernetes.io/pciBusID": "0000:31:01.0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, tc.agentConfig)
			if tc.agentConfig != "" { // a rate set by the administrator is kept
				if err := e.vfs.SetVF(hw.VFRef{PF: "pfb", Index: 0}, hw.VFConfig{MaxTxRateMbps: 5000, SpoofChk: true}); err != nil {
					t.Fatal(err)
				}
				tc.want.MaxTxRateMbps = 5000
				e.initial = e.vfs.Snapshot()
			}
			c := e.allocate(newClaim(vfConfig, tc.req))
			res := e.mustPrepare(c)
			if got := e.vfs.Snapshot()[tc.vf]; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("VF %s: %+v\nwant %+v", tc.vf, got, tc.want)
			}
			if len(res.Devices) != 1 || res.Devices[0].Metadata == nil {
				t.Fatalf("devices %+v", res.Devices)
			}
			d := res.Devices[0]
			if d.DeviceName != c.Status.Allocation.Devices.Results[0].Device || !reflect.DeepEqual(d.ShareID, c.Status.Allocation.Devices.Results[0].ShareID) {
				t.Errorf("device %s share %v", d.DeviceName, d.ShareID)
			}
			for k, want := range tc.wantAttrs {
				if got := attrString(d.Metadata.Attributes[k]); got != want {
					t.Errorf("attribute %s = %q, want %q", k, got, want)
				}
			}
			// The NRI step finds the pod-side settings in the record.
			rec := e.record(c)
			if len(rec.VFs) != 1 || rec.VFs[0].Network.InterfaceName != "fast0" || rec.VFs[0].Network.Addresses[0] != "10.0.0.5/24" ||
				rec.VFs[0].Network.Routes[0].Gateway != "10.0.0.1" || rec.VFs[0].Netdev == "" {
				t.Errorf("record %+v", rec)
			}
			if err := e.unprepare(c); err != nil {
				t.Fatal(err)
			}
			e.checkPristine()
			// Prepared again (a new pod with the same claim): same VF.
			e.mustPrepare(c)
			if got := e.vfs.Snapshot()[tc.vf]; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("second prepare: VF %s: %+v", tc.vf, got)
			}
		})
	}
}

func attrString(a resourceapi.DeviceAttribute) string {
	switch {
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	case a.BoolValue != nil && *a.BoolValue:
		return "true"
	case a.BoolValue != nil:
		return "false"
	}
	return ""
}

// TestSharesGetTheirOwnVFs: two shares of one PF in one claim, and two
// claims, each get a VF of their own, lowest index first; a VF freed by
// unprepare is reused.
func TestSharesGetTheirOwnVFs(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	a := e.allocate(newClaim("", share("x", "10G"), share("y", "20G")))
	b := e.allocate(newClaim("", share("z", "30G")))
	for _, c := range []*resourceapi.ResourceClaim{a, b} {
		e.mustPrepare(c)
	}
	snap := e.vfs.Snapshot()
	for vf, rate := range map[string]int{"pfa/0": 10000, "pfa/1": 20000, "pfa/2": 30000, "pfa/3": 0} {
		if got := snap[vf].MaxTxRateMbps; got != rate {
			t.Errorf("%s rate %d, want %d", vf, got, rate)
		}
	}
	if got := e.driver.Held(); !reflect.DeepEqual(got, []string{"0000:17:01.0", "0000:17:01.1", "0000:17:01.2"}) {
		t.Errorf("held %v", got)
	}
	if err := e.unprepare(a); err != nil {
		t.Fatal(err)
	}
	c := e.allocate(newClaim("", share("w", "40G")))
	e.mustPrepare(c)
	if got := e.vfs.Snapshot()["pfa/0"].MaxTxRateMbps; got != 40000 {
		t.Errorf("freed VF 0 not reused: rate %d", got)
	}
	for _, c := range []*resourceapi.ResourceClaim{b, c} {
		if err := e.unprepare(c); err != nil {
			t.Fatal(err)
		}
	}
	e.checkPristine()
}

// TestNoFreeVF: the scheduler refuses a 17th share of 16 VFs; and when it
// hands out a VF's worth of capacity that an unprepare has not returned
// yet (a deleted claim's pod still stopping), prepare refuses, naming the
// PF, and changes nothing.
func TestNoFreeVF(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	var claims []*resourceapi.ResourceClaim
	for range 16 {
		c := e.allocate(newClaim("", share("nic", "1G")))
		e.mustPrepare(c)
		claims = append(claims, c)
	}
	if err := e.alloc.Allocate(t.Context(), newClaim("", share("nic", "1G"))); err == nil {
		t.Fatal("the allocator handed out a 17th share of 16 VFs")
	}
	e.alloc.Release(claims[3]) // deleted, not yet unprepared
	before := e.vfs.Snapshot()
	late := e.allocate(newClaim("", share("nic", "1G")))
	_, err := e.prepare(late)
	if err == nil || !strings.Contains(err.Error(), "no free VF on PF pfa (0000:17:00.0)") || !strings.Contains(err.Error(), late.Name) {
		t.Fatalf("prepare with every VF held: %v", err)
	}
	if !reflect.DeepEqual(e.vfs.Snapshot(), before) || len(e.driver.Held()) != 16 {
		t.Error("a refused prepare changed VFs or reservations")
	}
	if err := e.unprepare(claims[3]); err != nil {
		t.Fatal(err)
	}
	if _, err := e.prepare(late); err != nil {
		t.Fatalf("after the unprepare: %v", err)
	}
}

// TestUnknownDevice: a device the node no longer publishes (its PF was
// reconfigured since allocation) fails with an error naming it.
func TestUnknownDevice(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	c := e.allocate(newClaim("", share("nic", "1G")))
	e.pfs = nil
	_, err := e.prepare(c)
	if err == nil || !strings.Contains(err.Error(), "device nic-0000-17-00-0 is not among this node's sriov.hwdra.io devices") {
		t.Fatalf("got %v", err)
	}
	e.checkPristine()
}

// TestSharesNeedNetdevVFs: a share is a VF netdev, so a PF whose VFs are
// all bound to vfio-pci offers no shares (they serve exclusive devices);
// the vfs capacity counts what prepare can hand out (slices tests count a
// mixed PF's).
func TestSharesNeedNetdevVFs(t *testing.T) {
	_, pfs := openNode(t, `nics: [{model: e810, count: 1, vfs: 2, netdevs: [pfv], vfDriver: vfio-pci}]`)
	offers, _ := config.Default().Resolve(pfs)
	_, skips := resources.NIC(testNode, offers, device.AllFeatures)
	if len(skips) != 1 || !strings.Contains(skips[0].Reason, "none of its 2 VFs is bound to a network driver") {
		t.Fatalf("skips %v", skips)
	}
}

// TestConcurrentPrepares: claims prepared at once on one PF (the kubelet
// prepares different pods' claims in parallel) get distinct VFs, and
// unprepared at once restore every VF.
func TestConcurrentPrepares(t *testing.T) {
	e := newEnv(t, cx7Node, "")
	claims := make([]*resourceapi.ResourceClaim, 12)
	for i := range claims {
		claims[i] = e.allocate(newClaim(`, "vlan": `+strconv.Itoa(100+i), share("nic", strconv.Itoa(i+1)+"G")))
	}
	parallel := func(f func(c *resourceapi.ResourceClaim) error) {
		errs := make(chan error, len(claims))
		for _, c := range claims {
			go func() { errs <- f(c) }()
		}
		for range claims {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	}
	parallel(func(c *resourceapi.ResourceClaim) error { _, err := e.prepare(c); return err })
	if held := e.driver.Held(); len(held) != len(claims) {
		t.Fatalf("%d VFs held for %d claims", len(held), len(claims))
	}
	rates, vlans := map[int]bool{}, map[int]bool{}
	for _, c := range e.vfs.Snapshot() {
		if c.MaxTxRateMbps != 0 {
			rates[c.MaxTxRateMbps], vlans[c.VLAN] = true, true
		}
	}
	if len(rates) != len(claims) || len(vlans) != len(claims) {
		t.Errorf("%d distinct rates and %d VLANs on the VFs, want %d each", len(rates), len(vlans), len(claims))
	}
	parallel(e.unprepare)
	e.checkPristine()
}

// TestInfiniBandShare: an InfiniBand VF gets the GUIDs its VfConfig names
// and none of the Ethernet settings (the mock refuses those as the driver
// does), no rate limit (accounted, not enforced on InfiniBand), and gets
// its GUIDs back at unprepare.
func TestInfiniBandShare(t *testing.T) {
	e := newEnv(t, `nics: [{model: cx7, count: 1, vfs: 2, linkType: infiniband, pciAddresses: ["0000:17:00.0"], netdevs: [ib0]}]`, "")
	c := e.allocate(newClaim(`, "nodeGUID": "00:11:22:33:44:55:66:77", "portGUID": "00:11:22:33:44:55:66:78", "mtu": 2044`, share("ib", "100G")))
	e.mustPrepare(c)
	var configured []hw.VFConfig
	for _, v := range e.vfs.Snapshot() {
		if v.NodeGUID != "00:00:00:00:00:00:00:00" {
			configured = append(configured, v)
		}
	}
	if len(configured) != 1 {
		t.Fatalf("VFs with GUIDs set: %+v", configured)
	}
	got := configured[0]
	if got.NodeGUID != "00:11:22:33:44:55:66:77" || got.PortGUID != "00:11:22:33:44:55:66:78" || got.MTU != 2044 || got.MaxTxRateMbps != 0 || got.MAC != "" {
		t.Errorf("the VF: %+v", got)
	}
	if err := e.unprepare(c); err != nil {
		t.Fatal(err)
	}
	e.checkPristine()
}

// TestMetadataIsWhatTheSlicePublishes: a container's metadata about its
// VF holds every attribute the ResourceSlice publishes for the device
// (the PF's NUMA node, PCIe root, link type, driver, IDs, RDMA, eswitch
// mode), same names, same values, plus what exists only once prepared:
// as the GPU's (prepare/gpu's test of the same name).
func TestMetadataIsWhatTheSlicePublishes(t *testing.T) {
	for _, tc := range []struct {
		name, agentConfig string
		req               resourceapi.DeviceRequest
		runtime           []string
	}{
		{"share", "", share("nic", "25G"), []string{"resource.kubernetes.io/pciBusID", "sriov.hwdra.io/vfIndex", "sriov.hwdra.io/vfDeviceID", "sriov.hwdra.io/vfDriver",
			"sriov.hwdra.io/maxTxRateMbps", "sriov.hwdra.io/minTxRateMbps", "sriov.hwdra.io/rdmaDevice"}},
		{"exclusive VF", exclusiveConfig, vfRequest("nic"), []string{"sriov.hwdra.io/rdmaDevice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, cx7Node, tc.agentConfig)
			c := e.allocate(newClaim("", tc.req))
			dev := e.mustPrepare(c).Devices[0]
			offers, _ := e.cfg.Resolve(e.pfs)
			published := resources.NICDevices(offers, device.AllFeatures)[dev.DeviceName].Attributes
			if len(published) == 0 {
				t.Fatalf("device %s is not published", dev.DeviceName)
			}
			for _, name := range []resourceapi.QualifiedName{"resource.kubernetes.io/numaNode", "resource.kubernetes.io/pcieRoot", device.NICAttrLinkType,
				device.NICAttrDriver, device.NICAttrVendorID, device.NICAttrDeviceID, device.NICAttrRDMA, device.NICAttrEswitchMode} {
				if _, ok := published[name]; !ok {
					t.Errorf("the slice publishes no %s: the test shows nothing about it", name)
				}
			}
			got := dev.Metadata.Attributes
			for name, want := range published {
				if v, ok := got[string(name)]; !ok || !equality.Semantic.DeepEqual(v, want) {
					t.Errorf("metadata %s = %v, the slice publishes %v", name, v, want)
				}
			}
			extra := 0
			for _, name := range tc.runtime {
				if _, ok := got[name]; !ok {
					t.Errorf("no %s in the metadata", name)
				}
				if _, ok := published[resourceapi.QualifiedName(name)]; !ok {
					extra++
				}
			}
			if len(got) != len(published)+extra {
				t.Errorf("metadata has %d attributes, want the %d published and %v:\n%v", len(got), len(published), tc.runtime, got)
			}
			if err := e.unprepare(c); err != nil {
				t.Fatal(err)
			}
		})
	}
}
