// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
)

// Mock nodes of the two paths to a VM: an H100 whose vGPUs are made
// through the vendor-specific VFIO framework, and GPUs bound to vfio-pci
// beside one for the NVIDIA driver.
const (
	vfioHost        = "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio}]"
	passthroughNode = "gpus: [{model: h100-80gb, count: 1}, {model: h100-80gb, count: 2, virtualization: passthrough}]"
)

// TestEveryPublishedDevicePrepares: what the slices publish is what
// prepare can deliver. Each device of a node is prepared alone (as the
// scheduler would hand it to a claim) and unprepared, leaving the node as
// it was; on a vGPU host of either framework and beside passthrough
// GPUs. A GPU whose vGPU framework is not set up publishes no vGPU.
func TestEveryPublishedDevicePrepares(t *testing.T) {
	for _, profile := range []string{vfioHost, "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu}]", passthroughNode} {
		t.Run(profile, func(t *testing.T) {
			e := newEnv(t, profile, false)
			before := e.hwState()
			catalog := resources.GPUDevices(e.gpus, e.passthrough, device.AllFeatures)
			var names []string
			for name := range catalog {
				names = append(names, name)
			}
			slices.Sort(names)
			for i, name := range names {
				c := allocatedTo(i, name)
				if catalog[name].Kind == device.KindShare {
					// As the allocator gives a share: its ID and what it consumed.
					r := &c.Status.Allocation.Devices.Results[0]
					r.ShareID = new(types.UID("share-" + c.Name))
					r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
						device.GPUCapMemory: resource.MustParse("1Gi"), device.GPUCapCompute: resource.MustParse("10"),
					}
				}
				if _, err := e.prepare(c); err != nil {
					t.Errorf("published device %s (%s): %v", name, catalog[name].Kind, err)
					continue
				}
				e.unprepare(c)
				if got := e.hwState(); got != before {
					t.Fatalf("after %s:\n%s\nwant\n%s", name, got, before)
				}
			}
			t.Logf("%d devices prepared", len(names))
		})
	}
	t.Run("no framework set up", func(t *testing.T) {
		e := newEnv(t, vfioHost, false)
		g := e.gpus[0]
		// sriov-manage never ran: no VFs, so no way to create a vGPU.
		links, _ := filepath.Glob(filepath.Join(e.hw.Sysfs, "bus/pci/devices", g.PCIBusID, "virtfn*"))
		for _, l := range links {
			os.Remove(l)
		}
		e.rescan()
		if fw := e.gpus[0].VGPU.Framework; fw != "" {
			t.Fatalf("framework %q without VFs", fw)
		}
		for name, d := range resources.GPUDevices(e.gpus, nil, device.AllFeatures) {
			if d.Kind == device.KindVGPU {
				t.Fatalf("vGPU %s published without a framework", name)
			}
		}
	})
}

// allocatedTo is a claim allocated exactly the device named.
func allocatedTo(i int, name string) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{
		Namespace: "default", Name: fmt.Sprintf("every-%d", i), UID: types.UID(fmt.Sprintf("every-%d", i)),
	}}
	c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
		Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: DriverName, Pool: testNode, Device: name}},
	}}
	return c
}

// TestVFVGPURefusals: no free VF, a type no longer creatable, a VF that
// refuses the write: the prepare fails naming the claim, the GPU and the
// cause, and leaves nothing written.
func TestVFVGPURefusals(t *testing.T) {
	e := newEnv(t, "gpus: [{model: h100-80gb, count: 1, virtualization: host-vgpu, vgpuFramework: vfio, vgpuTypes: [{name: NVIDIA H100-40C, framebufferMB: 40960, maxInstances: 2}, {name: NVIDIA H100-20C, framebufferMB: 20480, maxInstances: 4}]}]", false)
	before := e.hwState()
	bus := e.gpus[0].PCIBusID
	catalog := resources.GPUDevices(e.gpus, nil, device.AllFeatures)
	name := func(profile string) string {
		for n, d := range catalog {
			if d.Kind == device.KindVGPU && device.ShortVGPUName(d.VGPUType.Name) == profile {
				return n
			}
		}
		t.Fatalf("no %s published", profile)
		return ""
	}
	// Another agent (or an administrator) made a VF a 40C: without
	// heterogeneous mode no 20C can run beside it.
	vfs, _ := filepath.Glob(filepath.Join(e.hw.Sysfs, "bus/pci/devices", bus, "virtfn*"))
	slices.Sort(vfs)
	first, _ := filepath.EvalSymlinks(vfs[0])
	other := filepath.Base(first)
	if err := e.hw.SysfsWriter().WriteFile(filepath.Join("bus/pci/devices", other, "nvidia/current_vgpu_type"), []byte(fmt.Sprint(catalog[name("H100-40C")].VGPUType.ID))); err != nil {
		t.Fatal(err)
	}
	taken := e.hwState()
	c := allocatedTo(1, name("H100-20C"))
	_, err := e.prepare(c)
	for _, want := range []string{c.Name, bus, "none of its", "not creatable"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("prepare of a type no longer creatable: %v, want it to name %q", err, want)
		}
	}
	if got := e.hwState(); got != taken || len(e.ledgerKeys()) != 0 {
		t.Errorf("left behind:\n%s\nledger %v", got, e.ledgerKeys())
	}
	// The driver refuses the write itself (a VF made a vGPU between the
	// look and the write): the error says so.
	if err := e.hw.SysfsWriter().WriteFile(filepath.Join("bus/pci/devices", other, "nvidia/current_vgpu_type"), []byte("0")); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.vfs.Assign(other, catalog[name("H100-20C")].VGPUType.ID); err != nil {
		t.Fatal(err)
	}
	if err := e.driver.vfs.Assign(other, catalog[name("H100-20C")].VGPUType.ID); err == nil || !strings.Contains(err.Error(), "device or resource busy") {
		t.Errorf("second write to a vGPU VF: %v", err)
	}
	e.driver.vfs.Clear(other)
	// Every VF a vGPU: no free VF.
	all, _ := filepath.Glob(filepath.Join(e.hw.Sysfs, "bus/pci/devices", bus, "virtfn*"))
	for i := 0; i < 4; i++ {
		c := allocatedTo(10+i, name("H100-20C"))
		e.mustPrepare(c)
	}
	c = allocatedTo(20, name("H100-20C"))
	_, err = e.prepare(c)
	if err == nil || !strings.Contains(err.Error(), c.Name) || !strings.Contains(err.Error(), bus) {
		t.Errorf("a fifth 20C: %v", err)
	}
	for i := 0; i < 4; i++ {
		e.unprepare(allocatedTo(10+i, name("H100-20C")))
	}
	if got := e.hwState(); got != before || len(e.ledgerKeys()) != 0 {
		t.Errorf("after:\n%s\nwant\n%s\nledger %v (%d VFs)", got, before, e.ledgerKeys(), len(all))
	}
	_ = context.Background
}
