// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpusim

import (
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// giProfile returns the v1 profile info of a named profile.
func giProfile(t *testing.T, dev nvml.Device, name string) nvml.GpuInstanceProfileInfo {
	t.Helper()
	for i := 0; i < nvml.GPU_INSTANCE_PROFILE_COUNT; i++ {
		v3, ret := dev.(*gpu).GetGpuInstanceProfileInfoV3(i)
		if ret == nvml.SUCCESS && strings.TrimPrefix(cStr(v3.Name[:]), "MIG ") == name {
			info, ret := dev.GetGpuInstanceProfileInfo(i)
			if ret != nvml.SUCCESS || info.Id != v3.Id {
				t.Fatalf("%s: v1 %v %v disagrees with v3 %v", name, info, ret, v3)
			}
			return info
		}
	}
	t.Fatalf("no profile %s", name)
	return nvml.GpuInstanceProfileInfo{}
}

func cStr(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

func at(start, size uint32) *nvml.GpuInstancePlacement {
	return &nvml.GpuInstancePlacement{Start: start, Size: size}
}

func want(t *testing.T, what string, got, want nvml.Return) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}

func TestGPUInstanceRefusals(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 1}]")
	dev := device(t, h, 0)
	g3, g1, me := giProfile(t, dev, "3g.40gb"), giProfile(t, dev, "1g.10gb"), giProfile(t, dev, "1g.10gb+me")

	_, ret := dev.CreateGpuInstanceWithPlacement(&g3, at(0, 4))
	want(t, "create with MIG off", ret, nvml.ERROR_NOT_SUPPORTED)
	_, ret = dev.CreateGpuInstance(&g3)
	want(t, "create (no placement) with MIG off", ret, nvml.ERROR_NOT_SUPPORTED)

	act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	want(t, "enable MIG on Hopper", ret, nvml.SUCCESS)
	want(t, "activation on Hopper", act, nvml.SUCCESS)
	if cur, pend, _ := dev.GetMigMode(); cur != 1 || pend != 1 {
		t.Fatalf("Hopper MIG mode after enable: %d/%d, want 1/1 (no reset needed)", cur, pend)
	}

	gi3, ret := dev.CreateGpuInstanceWithPlacement(&g3, at(0, 4))
	want(t, "3g.40gb at 0", ret, nvml.SUCCESS)
	_, ret = dev.CreateGpuInstanceWithPlacement(&g3, at(0, 4))
	want(t, "3g.40gb at 0 again", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	_, ret = dev.CreateGpuInstanceWithPlacement(&g1, at(3, 1))
	want(t, "1g.10gb at 3 inside the 3g", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	_, ret = dev.CreateGpuInstanceWithPlacement(&g3, at(1, 4))
	want(t, "3g.40gb at 1 (not a placement)", ret, nvml.ERROR_INVALID_ARGUMENT)
	_, ret = dev.CreateGpuInstanceWithPlacement(&g3, at(4, 3))
	want(t, "3g.40gb in compute-slice units", ret, nvml.ERROR_INVALID_ARGUMENT)
	bogus := g3
	bogus.Id = 77
	_, ret = dev.CreateGpuInstance(&bogus)
	want(t, "unknown profile ID", ret, nvml.ERROR_INVALID_ARGUMENT)

	gme, ret := dev.CreateGpuInstanceWithPlacement(&me, at(4, 1))
	want(t, "1g.10gb+me at 4", ret, nvml.SUCCESS)
	_, ret = dev.CreateGpuInstanceWithPlacement(&me, at(5, 1))
	want(t, "second 1g.10gb+me (instance count 1)", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	if n, _ := dev.GetGpuInstanceRemainingCapacity(&g1); n != 2 {
		t.Errorf("1g.10gb remaining capacity: %d, want 2 (memory slices 5, 6 and 7 free, 7 is no 1g placement)", n)
	}
	gi, ret := dev.CreateGpuInstance(&g1)
	want(t, "1g.10gb, first free placement", ret, nvml.SUCCESS)
	if info, _ := gi.GetInfo(); info.Placement.Start != 5 || info.ProfileId != 19 {
		t.Errorf("1g.10gb got %+v, want placement 5 and driver profile ID 19", info)
	}
	_, ret = dev.CreateGpuInstance(&g3)
	want(t, "3g.40gb with no room", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)

	act, ret = dev.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	want(t, "disable MIG with instances", ret, nvml.ERROR_IN_USE)
	want(t, "activation with instances", act, nvml.ERROR_IN_USE)

	for _, g := range []nvml.GpuInstance{gi3, gme, gi} {
		want(t, "destroy", g.Destroy(), nvml.SUCCESS)
	}
	want(t, "destroy twice", gi.Destroy(), nvml.ERROR_INVALID_ARGUMENT)
	_, ret = dev.SetMigMode(nvml.DEVICE_MIG_DISABLE)
	want(t, "disable MIG without instances", ret, nvml.SUCCESS)
}

func TestComputeInstanceRefusals(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 1, mig: true}]")
	dev := device(t, h, 0)
	g3 := giProfile(t, dev, "3g.40gb")
	gi, ret := dev.CreateGpuInstance(&g3)
	want(t, "3g.40gb", ret, nvml.SUCCESS)
	c1, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	c2, _ := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	if _, ret := gi.GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED); ret == nvml.SUCCESS {
		t.Error("a 3g instance offers a 4c compute profile")
	}
	c4 := c1
	c4.Id, c4.SliceCount = nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE, 4
	_, ret = gi.CreateComputeInstance(&c4)
	want(t, "4c in a 3g", ret, nvml.ERROR_NOT_SUPPORTED)

	ci2, ret := gi.CreateComputeInstance(&c2)
	want(t, "2c", ret, nvml.SUCCESS)
	_, ret = gi.CreateComputeInstance(&c2)
	want(t, "second 2c (instance count 1)", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	_, ret = gi.CreateComputeInstanceWithPlacement(&c1, &nvml.ComputeInstancePlacement{Start: 1, Size: 1})
	want(t, "1c inside the 2c", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	_, ret = gi.CreateComputeInstanceWithPlacement(&c1, &nvml.ComputeInstancePlacement{Start: 5, Size: 1})
	want(t, "1c outside the GI", ret, nvml.ERROR_INVALID_ARGUMENT)
	ci1, ret := gi.CreateComputeInstance(&c1)
	want(t, "1c in the free slice", ret, nvml.SUCCESS)
	if info, _ := ci1.GetInfo(); info.Placement.Start != 2 {
		t.Errorf("1c placed at %d, want 2", info.Placement.Start)
	}
	_, ret = gi.CreateComputeInstance(&c1)
	want(t, "1c with the GI full", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)

	want(t, "destroy GI with compute instances", gi.Destroy(), nvml.ERROR_IN_USE)

	md, ret := dev.GetMigDeviceHandleByIndex(1)
	want(t, "MIG device 1", ret, nvml.SUCCESS)
	uuid, _ := md.GetUUID()
	ciID, _ := md.GetComputeInstanceId()
	if info, _ := ci1.GetInfo(); !strings.HasPrefix(uuid, "MIG-") || ciID != int(info.Id) {
		t.Errorf("MIG device 1: %s, CI %d; want the second compute instance %d", uuid, ciID, info.Id)
	}
	_, ret = dev.GetMigDeviceHandleByIndex(2)
	want(t, "MIG device 2", ret, nvml.ERROR_NOT_FOUND)

	want(t, "destroy 2c", ci2.Destroy(), nvml.SUCCESS)
	want(t, "destroy 1c", ci1.Destroy(), nvml.SUCCESS)
	want(t, "destroy empty GI", gi.Destroy(), nvml.SUCCESS)
	_, ret = gi.CreateComputeInstance(&c1)
	want(t, "compute instance in a destroyed GI", ret, nvml.ERROR_INVALID_ARGUMENT)
}

func TestAmpereMIGModePendsUntilReset(t *testing.T) {
	h := build(t, "gpus: [{model: a100-40gb, count: 1}]")
	dev := device(t, h, 0)
	act, ret := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE)
	want(t, "SetMigMode", ret, nvml.SUCCESS)
	want(t, "activation", act, nvml.ERROR_RESET_REQUIRED)
	if cur, pend, _ := dev.GetMigMode(); cur != 0 || pend != 1 {
		t.Fatalf("Ampere after enable: current %d pending %d, want 0/1", cur, pend)
	}
	g7 := giProfile(t, dev, "7g.40gb")
	_, ret = dev.CreateGpuInstance(&g7)
	want(t, "create while pending", ret, nvml.ERROR_NOT_SUPPORTED)
	if err := h.Reset("00000000:1B:00.0"); err != nil {
		t.Fatal(err)
	}
	if cur, pend, _ := dev.GetMigMode(); cur != 1 || pend != 1 {
		t.Fatalf("after reset: %d/%d, want 1/1", cur, pend)
	}
	gi, ret := dev.CreateGpuInstance(&g7)
	want(t, "7g.40gb after reset", ret, nvml.SUCCESS)
	if info, _ := gi.GetInfo(); info.Placement != *at(0, 8) {
		t.Errorf("7g.40gb placement %+v, want 0+8 memory slices", info.Placement)
	}
}

func TestDeviceQueries(t *testing.T) {
	h := build(t, `gpus: [{model: h100-80gb, count: 1, pciBusIDs: ["0000:9d:00.0"], numaNodes: [1]}]`)
	dev := device(t, h, 0)
	pci, ret := dev.GetPciInfo()
	want(t, "GetPciInfo", ret, nvml.SUCCESS)
	if cStr(pci.BusId[:]) != "00000000:9D:00.0" || cStr(pci.BusIdLegacy[:]) != "0000:9D:00.0" ||
		pci.Domain != 0 || pci.Bus != 0x9d || pci.Device != 0 || pci.PciDeviceId != 0x233010DE {
		t.Errorf("GetPciInfo: %+v", pci)
	}
	if n, ret := dev.GetNumaNodeId(); n != 1 || ret != nvml.SUCCESS {
		t.Errorf("GetNumaNodeId: %d %v", n, ret)
	}
	if d, ret := h.NVML.DeviceGetHandleByPciBusId("0000:9d:00.0"); ret != nvml.SUCCESS || d != nvml.Device(dev) {
		t.Errorf("DeviceGetHandleByPciBusId: %v", ret)
	}
	id, _ := dev.GetUUID()
	if d, ret := h.NVML.DeviceGetHandleByUUID(id); ret != nvml.SUCCESS || d != nvml.Device(dev) {
		t.Errorf("DeviceGetHandleByUUID: %v", ret)
	}
	if m, _ := dev.GetVirtualizationMode(); m != nvml.GPU_VIRTUALIZATION_MODE_NONE {
		t.Errorf("virtualization %v", m)
	}
	if _, ret := dev.GetSupportedVgpus(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("GetSupportedVgpus without vGPU: %v", ret)
	}
	v3, ret := dev.GetGpuInstanceProfileInfoV3(nvml.GPU_INSTANCE_PROFILE_1_SLICE_REV1)
	if ret != nvml.SUCCESS || cStr(v3.Name[:]) != "MIG 1g.10gb+me" || v3.Id != 20 || v3.OfaCount != 1 {
		t.Errorf("profile info v3 REV1: %v %s %+v", ret, cStr(v3.Name[:]), v3)
	}
	if _, ret := dev.GetGpuInstanceProfileInfoV3(nvml.GPU_INSTANCE_PROFILE_6_SLICE); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("6-slice profile on H100: %v", ret)
	}
	pl, _ := dev.GetGpuInstancePossiblePlacements(&[]nvml.GpuInstanceProfileInfo{giProfile(t, dev, "1g.20gb")}[0])
	if len(pl) != 4 || pl[3] != *at(6, 2) {
		t.Errorf("1g.20gb placements %v, want 0,2,4,6 size 2", pl)
	}
}

func TestVGPUQueries(t *testing.T) {
	h := build(t, "h100-vgpu")
	dev := device(t, h, 0)
	if m, _ := dev.GetVirtualizationMode(); m != nvml.GPU_VIRTUALIZATION_MODE_HOST_VGPU {
		t.Fatalf("virtualization %v", m)
	}
	if m, ret := dev.GetVgpuHeterogeneousMode(); ret != nvml.SUCCESS || m.Mode != 1 {
		t.Errorf("heterogeneous mode: %+v %v", m, ret)
	}
	types, ret := dev.GetSupportedVgpus()
	want(t, "GetSupportedVgpus", ret, nvml.SUCCESS)
	byName := map[string]nvml.VgpuTypeId{}
	for _, vt := range types {
		n, _ := vt.GetName()
		byName[n] = vt
	}
	for name, w := range map[string]struct {
		fbMB    uint64
		max     int
		profile uint32
	}{
		"NVIDIA H100-80C":   {81920, 1, invalidGIProfileID},
		"NVIDIA H100-10C":   {10240, 8, invalidGIProfileID},
		"NVIDIA H100-1-10C": {9984, 7, 19},
		"NVIDIA H100-1-20C": {20096, 4, 15},
		"NVIDIA H100-2-20C": {20096, 3, 14},
		"NVIDIA H100-3-40C": {40448, 2, 9},
		"NVIDIA H100-4-40C": {40448, 1, 5},
		"NVIDIA H100-7-80C": {81152, 1, 0},
	} {
		vt, ok := byName[name]
		if !ok {
			t.Errorf("no vGPU type %s", name)
			continue
		}
		fb, _ := vt.GetFramebufferSize()
		max, _ := vt.GetMaxInstances(dev)
		gi, _ := vt.GetGpuInstanceProfileId()
		class, _ := vt.GetClass()
		if fb != w.fbMB<<20 || max != w.max || gi != w.profile || class != "Compute" {
			t.Errorf("%s: fb %d max %d GI profile %d class %s; want %+v", name, fb>>20, max, gi, class, w)
		}
	}
	creatable, _ := dev.GetCreatableVgpus()
	if len(creatable) != 8 {
		t.Errorf("creatable with MIG off: %d types, want the 8 time-sliced ones", len(creatable))
	}
	h2 := build(t, "gpus: [{model: a100-40gb, count: 1, virtualization: host-vgpu}]")
	if _, ret := device(t, h2, 0).GetVgpuHeterogeneousMode(); ret != nvml.ERROR_NOT_SUPPORTED {
		t.Errorf("heterogeneous mode on Ampere: %v", ret)
	}
}

func TestPreexistingInstances(t *testing.T) {
	h := build(t, "h100-mig")
	dev := device(t, h, 7)
	g3 := giProfile(t, dev, "3g.40gb")
	gis, ret := dev.GetGpuInstances(&g3)
	if ret != nvml.SUCCESS || len(gis) != 1 {
		t.Fatalf("GetGpuInstances(3g.40gb): %d %v", len(gis), ret)
	}
	info, _ := gis[0].GetInfo()
	c3, _ := gis[0].GetComputeInstanceProfileInfo(nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
	cis, _ := gis[0].GetComputeInstances(&c3)
	if info.Placement != *at(0, 4) || len(cis) != 1 {
		t.Errorf("pre-existing 3g.40gb: %+v with %d full compute instances", info, len(cis))
	}
	_, ret = dev.CreateGpuInstanceWithPlacement(&g3, at(0, 4))
	want(t, "second 3g.40gb on the taken half", ret, nvml.ERROR_INSUFFICIENT_RESOURCES)
	_, ret = dev.CreateGpuInstanceWithPlacement(&g3, at(4, 4))
	want(t, "3g.40gb on the free half", ret, nvml.SUCCESS)
}

func TestLibraryFunctionForms(t *testing.T) {
	h := build(t, "gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 7g.80gb}]}]")
	dev := device(t, h, 0)
	lib := h.NVML
	if a, _ := lib.DeviceGetUUID(dev); a != dev.UUID {
		t.Errorf("DeviceGetUUID: %s, want %s", a, dev.UUID)
	}
	if cur, _, ret := lib.DeviceGetMigMode(dev); cur != 1 || ret != nvml.SUCCESS {
		t.Errorf("DeviceGetMigMode: %d %v", cur, ret)
	}
	g7 := giProfile(t, dev, "7g.80gb")
	gis, ret := lib.DeviceGetGpuInstances(dev, &g7)
	if ret != nvml.SUCCESS || len(gis) != 1 {
		t.Fatalf("DeviceGetGpuInstances: %d %v", len(gis), ret)
	}
	if info, ret := lib.GpuInstanceGetInfo(gis[0]); ret != nvml.SUCCESS || info.Placement != *at(0, 8) {
		t.Errorf("GpuInstanceGetInfo: %+v %v", info, ret)
	}
	want(t, "GpuInstanceDestroy with a compute instance", lib.GpuInstanceDestroy(gis[0]), nvml.ERROR_IN_USE)
}
