// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// ibNode: one InfiniBand PF with 2 VFs.
const ibNode = `nics: [{model: cx7, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [ib0], linkType: infiniband}]`

// TestTenantVfConfigBeyondThePolicy is the attack of issue 34, row 2: a
// claim's VfConfig joins a VLAN, turns spoof checking off, trusts its VF,
// sets a router's MAC, forges InfiniBand GUIDs. Under the default policy
// (no vfPolicy) each is refused at prepare, naming the claim, the field,
// the PF and the setting that forbids it, and nothing is reserved,
// configured or written.
func TestTenantVfConfigBeyondThePolicy(t *testing.T) {
	eth := newEnv(t, cx7Node, agentHeader)
	ib := newEnv(t, ibNode, agentHeader)
	for _, tc := range []struct {
		name, config string
		env          *env
		want         []string
	}{
		{"join a VLAN", `, "vlan": 42`, eth, []string{"vlan: 42", "vfPolicy.allowedVLANs", "the DeviceClass's VLAN is none"}},
		{"VLAN with a priority", `, "vlan": 42, "vlanQoS": 7`, eth, []string{"vlan: 42", "vfPolicy.allowedVLANs"}},
		{"spoof checking off", `, "spoofCheck": false`, eth, []string{"spoofCheck: false", "vfPolicy.allowSpoofCheckOff"}},
		{"trusted VF", `, "trust": true`, eth, []string{"trust: true", "vfPolicy.allowTrust"}},
		{"a router's MAC", `, "mac": "02:00:5e:00:01:01"`, eth, []string{"mac: 02:00:5e:00:01:01", "vfPolicy.allowMAC"}},
		{"all at once", `, "vlan": 42, "spoofCheck": false, "trust": true, "mac": "02:00:5e:00:01:01"`, eth,
			[]string{"vlan: 42", "spoofCheck: false", "trust: true", "mac: 02:00:5e:00:01:01"}},
		{"forged node GUID", `, "nodeGUID": "00:11:22:33:44:55:66:77"`, ib, []string{"nodeGUID: 00:11:22:33:44:55:66:77", "vfPolicy.allowGUIDs", "PF ib0 (0000:31:00.0)"}},
		{"forged port GUID", `, "portGUID": "00:11:22:33:44:55:66:78"`, ib, []string{"portGUID: 00:11:22:33:44:55:66:78", "vfPolicy.allowGUIDs"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env
			calls := len(e.vfs.Records())
			c := e.allocate(newClaim(tc.config, share("nic", "1G")))
			defer e.alloc.Release(c)
			_, err := e.prepare(c)
			if err == nil {
				t.Fatal("prepared")
			}
			t.Logf("refused: %v", err)
			pf := "PF pfa (0000:17:00.0)"
			if e == ib {
				pf = "PF ib0 (0000:31:00.0)"
			}
			for _, want := range append([]string{"claim ns/" + c.Name, `request "nic"`, "config[0] from the claim", pf, "is not allowed"}, tc.want...) {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("the refusal does not say %q: %v", want, err)
				}
			}
			if got := len(e.vfs.Records()); got != calls {
				t.Errorf("%d VF settings were applied", got-calls)
			}
			e.checkPristine()
			if specs, _ := os.ReadDir(e.cdiDir()); len(specs) > 0 {
				t.Errorf("CDI specs left: %v", specs)
			}
		})
	}
}

// TestTenantCannotUndoItsClassSettings: what the DeviceClass's VfConfig
// sets is the administrator's: a claim whose own VfConfig leaves the VLAN
// out (before: it replaced the class's whole, VLAN and all) keeps its
// class's VLAN and spoof checking, may repeat them or ask for less, and is
// refused another VLAN or untagged.
func TestTenantCannotUndoItsClassSettings(t *testing.T) {
	e := newEnv(t, cx7Node, agentHeader)
	const class = `, "vlan": 100, "vlanQoS": 3, "spoofCheck": true, "mtu": 9000`
	for _, tc := range []struct {
		name, config string
		want         string // the VF's "vlan/qos trust spoof" after prepare, or the refusal
	}{
		{"no VfConfig of its own", "", "100/3 trust=false spoof=true"},
		{"only pod-side settings", `, "interfaceName": "data0", "mtu": 1500`, "100/3 trust=false spoof=true"},
		{"the class's VLAN repeated", `, "vlan": 100, "vlanQoS": 3`, "100/3 trust=false spoof=true"},
		{"less than allowed", `, "trust": false, "spoofCheck": true`, "100/3 trust=false spoof=true"},
		{"another VLAN", `, "vlan": 200`, "vlan: 200 (config[1] from the claim) is not allowed on PF pfa (0000:17:00.0)"},
		{"untagged", `, "vlan": 0`, "vlan: 0 (config[1] from the claim) is not allowed"},
		{"the class's VLAN at another priority", `, "vlan": 100, "vlanQoS": 7`, "vlanQoS: 7 (config[1] from the claim) is not allowed"},
		{"spoof checking off", `, "spoofCheck": false`, "spoofCheck: false (config[1] from the claim) is not allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.allocate(newClaim(tc.config, share("nic", "1G")))
			defer e.alloc.Release(c)
			withClassConfig(c, class)
			res, err := e.prepare(c)
			if strings.Contains(tc.want, "not allowed") {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
				}
				e.checkPristine()
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := e.unprepare(c); err != nil {
					t.Error(err)
				}
			}()
			got := e.record(c).VFs[0].Applied
			if s := vfState(got.VLAN, got.QoS, got.Trust, got.SpoofChk); s != tc.want {
				t.Errorf("VF %s of %s applied %s, want %s", res.Devices[0].DeviceName, c.Name, s, tc.want)
			}
			snap := e.vfs.Snapshot()[fmt.Sprintf("pfa/%d", e.record(c).VFs[0].Index)]
			if s := vfState(snap.VLAN, snap.QoS, snap.Trust, snap.SpoofChk); s != tc.want {
				t.Errorf("the PF reads the VF as %s, want %s", s, tc.want)
			}
		})
	}
}

// TestVfPolicyAllows: what the policy allows, per PF, a claim gets; the
// first vfPolicy.pfs entry that selects the PF decides, wholly.
func TestVfPolicyAllows(t *testing.T) {
	const cfg = agentHeader + `vfPolicy:
  allowedVLANs: [5]
  pfs:
  - select: {names: [pfa]}
    allowedVLANs: ["200-299", 0]
    allowTrust: true
    allowSpoofCheckOff: true
    allowMAC: true
`
	e := newEnv(t, cx7Node, cfg)
	for _, tc := range []struct{ name, config, want string }{
		{"a VLAN of the range, trusted, no spoof checking, own MAC", `, "vlan": 250, "vlanQoS": 6, "trust": true, "spoofCheck": false, "mac": "02:00:00:00:aa:02"`,
			"250/6 trust=true spoof=false"},
		{"untagged", `, "vlan": 0`, "0/0 trust=false spoof=true"},
		{"a VLAN outside it", `, "vlan": 300`, "vlan: 300 (config[0] from the claim) is not allowed on PF pfa (0000:17:00.0): vfPolicy.pfs[0].allowedVLANs does not list it (it lists 200-299, 0)"},
		// pfs[0] decides for pfa wholly: vfPolicy's own VLAN 5 is not added.
		{"the top-level VLAN", `, "vlan": 5`, "vfPolicy.pfs[0].allowedVLANs does not list it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := e.allocate(newClaim(tc.config, share("nic", "1G")))
			defer e.alloc.Release(c)
			_, err := e.prepare(c)
			if strings.Contains(tc.want, "does not list") {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want a refusal saying %q", err, tc.want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := e.unprepare(c); err != nil {
					t.Error(err)
				}
			}()
			got := e.record(c).VFs[0].Applied
			if s := vfState(got.VLAN, got.QoS, got.Trust, got.SpoofChk); s != tc.want {
				t.Errorf("applied %s, want %s", s, tc.want)
			}
		})
	}
}

// withClassConfig puts a DeviceClass's VfConfig before the claim's, as the
// allocator copies a class's config into the allocation.
func withClassConfig(c *resourceapi.ResourceClaim, vfConfig string) {
	raw := `{"apiVersion": "sriov.hwdra.io/v1alpha1", "kind": "VfConfig"` + vfConfig + `}`
	class := resourceapi.DeviceAllocationConfiguration{Source: resourceapi.AllocationConfigSourceClass, DeviceConfiguration: resourceapi.DeviceConfiguration{
		Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: device.NICDriver, Parameters: runtime.RawExtension{Raw: []byte(raw)}}}}
	a := &c.Status.Allocation.Devices
	a.Config = append([]resourceapi.DeviceAllocationConfiguration{class}, a.Config...)
}

func vfState(vlan, qos int, trust, spoof bool) string {
	return fmt.Sprintf("%d/%d trust=%t spoof=%t", vlan, qos, trust, spoof)
}

// TestTenantNoIOMMUVFRefused is the attack of issue 34, row 10, on the NIC
// side: a claim for an exclusive VF bound to vfio-pci on a node whose
// kernel runs VFIO without an IOMMU would get /dev/vfio/noiommu-<N>, and
// with it DMA into all of the node's memory. Refused at prepare before
// the VF is reserved or touched, naming the claim, the VF and the
// setting; with vfio.allowUnsafeNoIOMMU the claim gets the noiommu node.
func TestTenantNoIOMMUVFRefused(t *testing.T) {
	const node = `noIOMMU: true
nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfv], vfDriver: vfio-pci}]`
	e := newEnv(t, node, exclusiveConfig)
	c := e.allocate(newClaim("", vfRequest("dpdk")))
	_, err := e.prepare(c)
	if err == nil {
		t.Fatal("prepared")
	}
	t.Logf("refused: %v", err)
	for _, want := range []string{"claim ns/" + c.Name, `request "dpdk"`, "VF 0000:31:01.0 (VF 0 of PF 0000:31:00.0) is in VFIO group noiommu-512", "vfio.allowUnsafeNoIOMMU"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q: %v", want, err)
		}
	}
	e.checkPristine()
	if specs, _ := os.ReadDir(e.cdiDir()); len(specs) > 0 {
		t.Errorf("CDI specs left: %v", specs)
	}

	allowed := newEnv(t, node, exclusiveConfig+"vfio: {allowUnsafeNoIOMMU: true}\n")
	c = allowed.allocate(newClaim("", vfRequest("dpdk")))
	res := allowed.mustPrepare(c)
	spec := allowed.inject(res.Devices)
	var nodes []string
	for _, d := range spec.Linux.Devices {
		nodes = append(nodes, d.Path)
	}
	if !slices.Contains(nodes, "/dev/vfio/noiommu-512") {
		t.Errorf("allowed: device nodes %v, want /dev/vfio/noiommu-512", nodes)
	}
	if err := allowed.unprepare(c); err != nil {
		t.Fatal(err)
	}
}
