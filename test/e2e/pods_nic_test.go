// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/test/e2e/framework"
)

const (
	capBandwidth resourceapi.QualifiedName = nicDriver + "/bandwidth"
	attrNUMANode resourceapi.QualifiedName = "resource.kubernetes.io/numaNode"
)

// shareClaim is deploy/examples/vf-share-10g.yaml asking for bandwidth.
func shareClaim(t *testing.T, bandwidth string) *resourceapi.ResourceClaim {
	t.Helper()
	c := exampleClaim(t, "vf-share-10g.yaml")
	c.Name = "vf-share-" + strings.ToLower(bandwidth)
	caps := c.Spec.Devices.Requests[0].Exactly.Capacity
	if caps == nil || len(caps.Requests) != 1 {
		t.Fatalf("vf-share-10g.yaml: want one capacity request, have %+v", caps)
	}
	caps.Requests[capBandwidth] = resource.MustParse(bandwidth)
	return c
}

// checkShare checks a running VF share: the allocation consumed want of
// its PF's bandwidth; the KEP-5304 metadata in the container gives the
// share's bandwidth as its VF's transmit cap (no capacity's name), its VF's index and PCI address and the PF as
// published; where the VF has an RDMA device, the container has its
// uverbs node and variable from our CDI spec; the container has the VF as
// net1, up, and the metadata and the claim's status say so
// (checkInterface). It returns the VF index.
func checkShare(t *testing.T, s *scenario, r ran, request, want string) int {
	t.Helper()
	res := result(t, r.claim, request)
	if res.Driver != nicDriver || res.ShareID == nil {
		t.Fatalf("pod %s: request %s allocated %s/%s (shareID %v), want a share of a %s device", r.pod.Name, request, res.Driver, res.Device, res.ShareID, nicDriver)
	}
	if got, ok := res.ConsumedCapacity[capBandwidth]; !ok || got.Cmp(resource.MustParse(want)) != 0 {
		t.Errorf("pod %s: the allocation consumed %s of %s (%v), want %s", r.pod.Name, got.String(), capBandwidth, res.ConsumedCapacity, want)
	}
	published, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
	if err != nil {
		t.Fatal(err)
	}
	attrs := metadataDevice(t, r, res)
	str := func(name string) string {
		v, _ := attrValue(attrs, nicDriver, name).(string)
		return v
	}
	// The share's bandwidth as the wire holds it (no capacity's name in
	// the metadata): the VF's transmit cap in Mb/s.
	wantQ := resource.MustParse(want)
	if got, _ := attrValue(attrs, nicDriver, nicDriver+"/maxTxRateMbps").(float64); int64(got) != wantQ.Value()/1e6 {
		t.Errorf("pod %s: metadata maxTxRateMbps %v, want %s in Mb/s", r.pod.Name, got, want)
	}
	if v := attrValue(attrs, nicDriver, nicDriver+"/bandwidth"); v != nil {
		t.Errorf("pod %s: metadata carries the capacity sriov.hwdra.io/bandwidth (%v)", r.pod.Name, v)
	}
	for _, a := range []resourceapi.QualifiedName{nicDriver + "/pfName", nicDriver + "/pfPciAddress"} {
		if got, pub := str(string(a)), sliceAttr(published, a); got == "" || got != pub {
			t.Errorf("pod %s: metadata %s %q, the slice publishes %q", r.pod.Name, a, got, pub)
		}
	}
	vfs := published.Capacity[nicDriver+"/vfs"]
	vfCount := vfs.Value.Value()
	index, ok := attrValue(attrs, nicDriver, nicDriver+"/vfIndex").(float64)
	if !ok || index < 0 || int64(index) >= vfCount {
		t.Errorf("pod %s: metadata vfIndex %v, want 0-%d", r.pod.Name, attrValue(attrs, nicDriver, nicDriver+"/vfIndex"), vfCount-1)
	}
	vfAddr := str("resource.kubernetes.io/pciBusID")
	if vfAddr == "" || vfAddr == str(nicDriver+"/pfPciAddress") {
		t.Errorf("pod %s: metadata pciBusID %q is not a VF's address", r.pod.Name, vfAddr)
	}

	// A netdev share has CDI edits only for its RDMA device.
	spec := checkCDI(t, s.n, nicDriver, r)
	prefix := "HWDRA_SRIOV_" + strings.ToUpper(request) + "_"
	if rdma := str(nicDriver + "/rdmaDevice"); rdma != "" {
		if spec == nil {
			t.Errorf("pod %s: VF has RDMA device %s but the claim has no CDI spec", r.pod.Name, rdma)
		}
		if got := r.out.Env[prefix+"RDMA_DEVICE"]; got != rdma {
			t.Errorf("pod %s: env %sRDMA_DEVICE=%q, metadata rdmaDevice %q", r.pod.Name, prefix, got, rdma)
		}
		var uverbs bool
		for p := range r.out.Devices {
			uverbs = uverbs || strings.HasPrefix(p, "/dev/infiniband/uverbs")
		}
		if !uverbs {
			t.Errorf("pod %s: VF has RDMA device %s but no /dev/infiniband/uverbs* in the container: %v", r.pod.Name, rdma, r.out.Devices)
		}
	}
	if spec != nil {
		if got := r.out.Env[prefix+"PCI_ADDRESS"]; got != vfAddr {
			t.Errorf("pod %s: env %sPCI_ADDRESS=%q, metadata pciBusID %q", r.pod.Name, prefix, got, vfAddr)
		}
	}
	mac := checkInterface(t, s.n, s.ctx, r.pod.Name, r.out, r.claim, res, framework.MetadataPath("devices", request, nicDriver), defaultVF)
	t.Logf("pod %s: %s share of %s (%s), VF %v %s, rdma %q, in the pod as %s %s", r.pod.Name, want, res.Device, str(nicDriver+"/pfName"), index, vfAddr, str(nicDriver+"/rdmaDevice"), defaultVF.name, mac)
	return int(index)
}

// TestPodVFShare: on a NIC-only node (mock:cx7: two ConnectX-7 PFs at 400
// Gb/s, 16 VFs each) a pod asking for a 10 Gb/s VF share from a
// ResourceClaimTemplate (deploy/examples/vf-share-10g.yaml) runs; the
// allocation consumed 10G of the PF's bandwidth, the container has the VF
// as net1 and its metadata file (under resourceclaimtemplates/, generation
// 2) names the share's bandwidth, VF index and PF and the interface, as
// the claim's status does; deleting the pod returns the VF to the node
// under its original name (the node's links are as before).
func TestPodVFShare(t *testing.T) {
	s := startScenario(t, "pod-vf-share", "mock:cx7", nicDriver)
	before := nodeLinks(t)
	tmpl := s.template(exampleClaim(t, "vf-share-10g.yaml"))
	r := s.runPod("share", tmpl, "vf-share-10g", "/dev", framework.MetadataPath("devices", "nic", nicDriver))
	checkShare(t, s, r, "nic", "10G")
	checkStatusWrites(t, 1, 1)
	s.deletePod("share")
	waitCDISpecGone(t, s.n, nicDriver, r.claim)
	waitNodeLinks(t, before)
}

// oneE810 is one Intel E810 PF at 100 Gb/s without RDMA: its VFs (iavf)
// are plain netdevs.
const oneE810 = `
nics:
- model: e810
  count: 1
  vfs: 4
`

// TestPodVFSharePlainNetdev: a 10 Gb/s share of a PF whose VFs have no RDMA
// device (mock E810) runs too. The share needs no device node: the claim's
// CDI spec (which also keeps the claim's record for the agent) gives the
// container only HWDRA_SRIOV_NIC_PCI_ADDRESS, the VF's address, as the
// metadata does (moving the VF's netdev into the pod's network namespace
// is the NRI plugin's part).
func TestPodVFSharePlainNetdev(t *testing.T) {
	s := startScenario(t, "pod-vf-plain", framework.MockProfile(t, "one-e810", oneE810), nicDriver)
	tmpl := s.template(exampleClaim(t, "vf-share-10g.yaml"))
	r := s.runPod("share", tmpl, "vf-share-10g-plain-netdev", "/dev", framework.MetadataPath("devices", "nic", nicDriver))
	checkShare(t, s, r, "nic", "10G")
	spec, err := s.n.ClaimCDISpec(nicDriver, r.claim.UID)
	if err != nil || spec == nil || len(spec.Devices) != 1 || len(spec.Devices[0].ContainerEdits.DeviceNodes) != 0 {
		t.Errorf("a plain netdev share's CDI spec (err %v): %+v; want one device without device nodes", err, spec)
	}
	var sriovEnv []string
	for k, v := range r.out.Env {
		if strings.HasPrefix(k, "HWDRA_SRIOV_") {
			sriovEnv = append(sriovEnv, k+"="+v)
		}
	}
	vf := r.claim.Status.Allocation.Devices.Results[0]
	if len(sriovEnv) != 1 || !strings.HasPrefix(sriovEnv[0], "HWDRA_SRIOV_NIC_PCI_ADDRESS=0000:") {
		t.Errorf("a plain netdev share's container has %v (device %s), want HWDRA_SRIOV_NIC_PCI_ADDRESS only", sriovEnv, vf.Device)
	}
}

// gpuFarFromFirstNIC: one GPU on NUMA node 1 and two ConnectX-7 PFs, the
// first (by PCI address, the order the allocator tries them in) on NUMA
// node 0, the second on node 1: a GPU-plus-NIC claim lands on one NUMA
// node only if the allocator honours the claim's matchAttribute constraint.
const gpuFarFromFirstNIC = `
gpus:
- model: h100-80gb
  count: 1
  numaNodes: [1]
nics:
- model: cx7
  count: 2
  vfs: 4
  numaNodes: [0, 1]
  pciAddresses: ["0000:17:00.0", "0000:b1:00.0"]
  pcieRoots: [pci0000:16, pci0000:b0]
`

// TestPodGPUAndVFSameNUMA: a pod asking for a GPU and a 10 Gb/s VF share
// on the same NUMA node (deploy/examples/gpu-and-vf-same-numa.yaml) runs
// with both, on a node whose only GPU is on the NUMA node of its second
// NIC (gpuFarFromFirstNIC): the slices give both allocated devices the
// same numaNode, and the container has the GPU from our CDI spec and both
// drivers' metadata.
func TestPodGPUAndVFSameNUMA(t *testing.T) {
	s := startScenario(t, "pod-gpu-vf", framework.MockProfile(t, "gpu-numa1-nics", gpuFarFromFirstNIC), gpuDriver, nicDriver)
	tmpl := s.template(exampleClaim(t, "gpu-and-vf-same-numa.yaml"))
	r := s.runPod("gpu-vf", tmpl, "gpu-and-vf-same-numa", "/dev",
		framework.MetadataPath("devices", "gpu", gpuDriver), framework.MetadataPath("devices", "nic", nicDriver))

	gpu, nic := result(t, r.claim, "gpu"), result(t, r.claim, "nic")
	var numa []string
	for _, res := range []resourceapi.DeviceRequestAllocationResult{gpu, nic} {
		d, err := s.n.PublishedDevice(s.ctx, res.Driver, res.Pool, res.Device)
		if err != nil {
			t.Fatal(err)
		}
		numa = append(numa, sliceAttr(d, attrNUMANode))
	}
	if numa[0] != "1" || numa[0] != numa[1] {
		t.Errorf("%s: GPU %s on %q, NIC %s on %q; want both on the GPU's node 1", attrNUMANode, gpu.Device, numa[0], nic.Device, numa[1])
	}
	t.Logf("GPU %s and %s share of %s on NUMA node %s", gpu.Device, "10G", nic.Device, numa[0])

	gattrs := metadataDevice(t, r, gpu)
	uuid, _ := attrValue(gattrs, gpuDriver, "uuid").(string)
	if env := gpuEnvName(gpu.Device, "UUID"); uuid == "" || r.out.Env[env] != uuid {
		t.Errorf("container env %s=%q, GPU metadata uuid %q", env, r.out.Env[env], uuid)
	}
	if spec := checkCDI(t, s.n, gpuDriver, r); spec == nil {
		t.Errorf("no %s CDI spec for claim %s", gpuDriver, r.claim.Name)
	}
	if !anyNvidiaGPU(r.out.Devices) {
		t.Errorf("no GPU device node in the container: %v", r.out.Devices)
	}
	checkShare(t, s, r, "nic", "10G")
}
