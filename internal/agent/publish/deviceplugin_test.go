// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package publish

import (
	"fmt"
	"reflect"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

const twoGPUsOneNIC = twoGPUs + "nics:\n- model: cx7\n  count: 1\n  vfs: 4\n"

func deviceNames(ss []*resourceapi.ResourceSlice) []string {
	var out []string
	for _, s := range ss {
		for _, d := range s.Spec.Devices {
			out = append(out, d.Name)
		}
	}
	sort.Strings(out)
	return out
}

// stored counts the driver's stored slices.
func (r *rig) stored(driver string) int {
	r.t.Helper()
	list, err := r.client.ResourceV1().ResourceSlices().List(r.ctx, metav1.ListOptions{FieldSelector: resourceapi.ResourceSliceSelectorDriver + "=" + driver})
	if err != nil {
		r.t.Fatal(err)
	}
	return len(list.Items)
}

// TestLeavesGPUsToTheDevicePlugin: while NVIDIA's device plugin is seen,
// the GPU pool is withdrawn through the normal publication (every slice
// deleted, and that verified), the reason kept for readiness and the GPUs
// counted; once it is gone the same devices are published again. The
// NIC's pool is not touched.
func TestLeavesGPUsToTheDevicePlugin(t *testing.T) {
	var signals atomic.Pointer[[]string]
	r := newRig(t, twoGPUsOneNIC, Options{DevicePlugin: devicePluginFunc(func() []string {
		if p := signals.Load(); p != nil {
			return *p
		}
		return nil
	})})
	r.serve(device.GPUDriver, device.NICDriver)
	gpus := deviceNames(r.pool(device.GPUDriver, nil))
	r.pool(device.NICDriver, nil)
	r.verified()
	nicWrites := func() float64 {
		v, _ := r.metric("hwdra_resourceslice_writes_total", map[string]string{"driver": device.NICDriver, "operation": "create"})
		u, _ := r.metric("hwdra_resourceslice_writes_total", map[string]string{"driver": device.NICDriver, "operation": "update"})
		return v + u
	}
	nic := nicWrites()
	if r.pub.Withheld() != "" {
		t.Fatalf("withheld before any device plugin: %q", r.pub.Withheld())
	}
	r.wantMetric("hwdra_device_plugin_gpus", nil, 0)

	signals.Store(&[]string{"its socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock"})
	r.pub.Poke()
	waitfor.True(t, "no GPU slices stored while the device plugin serves", 30*time.Second, func() bool { return r.stored(device.GPUDriver) == 0 })
	r.verified()
	want := "2 of 2 GPUs not published: NVIDIA's device plugin serves GPUs on this node: its socket /var/lib/kubelet/device-plugins/nvidia-gpu.sock"
	if got := r.pub.Withheld(); got != want {
		t.Errorf("withheld %q\nwant     %q", got, want)
	}
	r.wantMetric("hwdra_device_plugin_gpus", nil, 2)
	if _, ok := r.metric("hwdra_published_devices", map[string]string{"driver": device.GPUDriver, "kind": "gpu"}); ok {
		t.Error("published GPU devices still counted")
	}

	signals.Store(nil)
	r.pub.Poke()
	again := deviceNames(r.pool(device.GPUDriver, func(ss []*resourceapi.ResourceSlice) bool { return len(deviceNames(ss)) == len(gpus) }))
	if !reflect.DeepEqual(again, gpus) {
		t.Errorf("published again %v\nfirst published  %v", again, gpus)
	}
	r.verified()
	if got := r.pub.Withheld(); got != "" {
		t.Errorf("still withheld: %q", got)
	}
	r.wantMetric("hwdra_device_plugin_gpus", nil, 0)
	if got := nicWrites(); got != nic {
		t.Errorf("NIC slice writes went from %v to %v", nic, got)
	}
}

// TestPublishesOwnedGPUsOnly: with devicePlugin.ownedGPUs the agent
// publishes exactly its GPUs, whether or not it sees the device plugin.
func TestPublishesOwnedGPUsOnly(t *testing.T) {
	var serves atomic.Bool
	r := newRig(t, twoGPUs, Options{DevicePlugin: devicePluginFunc(func() []string {
		if serves.Load() {
			return []string{"the node advertises nvidia.com/gpu=1"}
		}
		return nil
	})})
	r.pub.Refresh(r.ctx)
	inv, _ := r.pub.Current()
	if len(inv.GPUs) != 2 {
		t.Fatalf("%d GPUs on the mock", len(inv.GPUs))
	}
	mine := inv.GPUs[1]
	cfg, err := config.Parse([]byte(fmt.Sprintf("apiVersion: config.hwdra.io/v1alpha1\nkind: AgentConfig\ndevicePlugin:\n  ownedGPUs: {uuids: [%s]}\n", mine.UUID)))
	if err != nil {
		t.Fatal(err)
	}
	r.pub.opts.Config = cfg
	r.serve(device.GPUDriver)
	onlyMine := func(ss []*resourceapi.ResourceSlice) bool {
		for _, s := range ss {
			for _, d := range s.Spec.Devices {
				if a := d.Attributes["resource.kubernetes.io/pciBusID"]; a.StringValue == nil || *a.StringValue != mine.PCIBusID {
					return false
				}
			}
		}
		return len(deviceNames(ss)) > 0
	}
	r.pool(device.GPUDriver, onlyMine)
	if got := r.pub.Withheld(); !strings.HasPrefix(got, "1 of 2 GPUs not published: devicePlugin.ownedGPUs leaves them to NVIDIA's device plugin") {
		t.Errorf("withheld %q", got)
	}
	publications, _ := r.metric("hwdra_resource_publications_total", map[string]string{"driver": device.GPUDriver})
	serves.Store(true)
	r.pub.Poke()
	r.rescans(2) // the poked one and another, both seeing the device plugin
	r.pool(device.GPUDriver, onlyMine)
	r.wantMetric("hwdra_device_plugin_gpus", nil, 1)
	r.wantMetric("hwdra_resource_publications_total", map[string]string{"driver": device.GPUDriver}, publications)
}
