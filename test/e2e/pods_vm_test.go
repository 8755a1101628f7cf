// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

// vfioVGPUHost is one H100 whose R550+ vGPU manager makes vGPUs through
// the vendor-specific VFIO framework.
const vfioVGPUHost = `
gpus:
- model: h100-80gb
  count: 1
  virtualization: host-vgpu
  vgpuFramework: vfio
  vgpuHeterogeneous: true
`

// TestPodGPUsForVMs: on a node of a current vGPU driver with a GPU bound
// to vfio-pci (mock:h100-vm), a vGPU pod (deploy/examples/vgpu.yaml) gets
// a VF of the VFIO framework: its container sees /dev/vfio/vfio and the
// VF's group node, HWDRA_<device>_PCI names the VF, and the KEP-5304
// metadata's resource.kubernetes.io/pciBusID is that VF (the GPU's is
// parentPciBusID). A passthrough pod (deploy/examples/passthrough.yaml)
// gets the vfio-pci GPU's group node and its address. Deleting the pods
// removes the claims' CDI specs.
func TestPodGPUsForVMs(t *testing.T) {
	s := startScenario(t, "pod-vm-gpus", "mock:h100-vm", gpuDriver)
	check := func(name, file, request, kind string) {
		tmpl := s.template(exampleClaim(t, file))
		r := s.runPod(name, tmpl, name, "/dev", framework.MetadataPath("devices", request, gpuDriver))
		res := result(t, r.claim, request)
		attrs := metadataDevice(t, r, res)
		if typ := attrValue(attrs, gpuDriver, "type"); typ != kind {
			t.Errorf("%s: metadata type %v, want %s", name, typ, kind)
		}
		addr, _ := attrValue(attrs, "resource.kubernetes.io", "pciBusID").(string)
		if env := gpuEnvName(res.Device, "PCI"); addr == "" || r.out.Env[env] != addr {
			t.Errorf("%s: container env %s=%q, metadata pciBusID %q", name, env, r.out.Env[env], addr)
		}
		if kind == "vgpu" {
			parent, _ := attrValue(attrs, gpuDriver, "parentPciBusID").(string)
			if parent == "" || parent == addr || attrValue(attrs, gpuDriver, "vgpuFramework") != "vfio" {
				t.Errorf("vGPU: the VF %q, its GPU %q, metadata %v", addr, parent, attrs)
			}
		}
		if got := r.out.Devices["/dev/vfio/vfio"]; got != "char 10:196" {
			t.Errorf("%s: /dev/vfio/vfio in the container: %q (devices %v)", name, got, r.out.Devices)
		}
		var groups []string
		for p := range r.out.Devices {
			if g, ok := strings.CutPrefix(p, "/dev/vfio/"); ok && g != "vfio" {
				groups = append(groups, p)
			}
		}
		if len(groups) != 1 {
			t.Errorf("%s: %d VFIO group nodes, want 1: %v", name, len(groups), groups)
		}
		if spec := checkCDI(t, s.n, gpuDriver, r); spec == nil {
			t.Fatalf("%s: no CDI spec for claim %s", name, r.claim.Name)
		}
		t.Logf("%s: %s at %s", name, res.Device, addr)
		s.deletePod(name)
		waitCDISpecGone(t, s.n, gpuDriver, r.claim)
	}
	check("vgpu", "vgpu.yaml", "vgpu", "vgpu")
	check("passthrough", "passthrough.yaml", "gpu", "passthrough")
}

// TestPodsCompeteCompatibilityGroupsVFIO is TestPodsCompeteCompatibilityGroups
// on a GPU whose vGPUs are VFs of the VFIO framework: a MIG pod runs, a
// vGPU pod waits until it is gone, then gets a VF.
func TestPodsCompeteCompatibilityGroupsVFIO(t *testing.T) {
	competeGroups(t, "compat-groups-vfio", framework.MockProfile(t, "one-vfio-vgpu-host", vfioVGPUHost), func(res resourceapi.DeviceRequestAllocationResult, attrs map[string]map[string]any) {
		vf, _ := attrValue(attrs, "resource.kubernetes.io", "pciBusID").(string)
		if parent, _ := attrValue(attrs, gpuDriver, "parentPciBusID").(string); vf == "" || parent == "" || vf == parent {
			t.Errorf("the vGPU pod's metadata names no VF: %v", attrs)
		}
		t.Logf("the vGPU pod got %s, VF %s", res.Device, vf)
	})
}
