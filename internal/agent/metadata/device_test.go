// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"net/netip"
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
)

func s(v string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &v} }
func i(v int64) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{IntValue: &v} }
func p(v int) *int                           { return &v }

func TestGPUAttributes(t *testing.T) {
	published := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"gpu.hwdra.io/profile":            s("3g.40gb"),
		"gpu.hwdra.io/uuid":               s("GPU-parent"),
		"resource.kubernetes.io/pciBusID": s("0000:1b:00.0"),
	}
	for _, tc := range []struct {
		name string
		gpu  GPU
		want map[string]resourceapi.DeviceAttribute
	}{{
		name: "whole GPU: what is published",
		gpu:  GPU{Published: published},
		want: map[string]resourceapi.DeviceAttribute{
			"gpu.hwdra.io/profile": s("3g.40gb"), "gpu.hwdra.io/uuid": s("GPU-parent"), "resource.kubernetes.io/pciBusID": s("0000:1b:00.0"),
		},
	}, {
		name: "MIG device: its own UUID replaces the published one, with its instances",
		gpu:  GPU{Published: published, UUID: "MIG-1", GPUInstance: p(2), ComputeInstance: p(0)},
		want: map[string]resourceapi.DeviceAttribute{
			"gpu.hwdra.io/profile": s("3g.40gb"), "gpu.hwdra.io/uuid": s("MIG-1"), "resource.kubernetes.io/pciBusID": s("0000:1b:00.0"),
			"gpu.hwdra.io/gpuInstanceID": i(2), "gpu.hwdra.io/computeInstanceID": i(0),
		},
	}, {
		name: "GPU share: its limits as MPS takes them, under no capacity's name",
		gpu:  GPU{Published: published, Share: &ShareLimits{ThreadPercentage: 40, MemoryBytes: 10<<30 + 1<<19}},
		want: map[string]resourceapi.DeviceAttribute{
			"gpu.hwdra.io/profile": s("3g.40gb"), "gpu.hwdra.io/uuid": s("GPU-parent"), "resource.kubernetes.io/pciBusID": s("0000:1b:00.0"),
			"gpu.hwdra.io/mpsActiveThreadPercentage": i(40), "gpu.hwdra.io/mpsPinnedMemoryLimitMiB": i(10240),
		},
	}, {
		name: "MIG-backed vGPU: its mediated device (also under KubeVirt's key) and GPU instance",
		gpu:  GPU{MdevUUID: "8f2c", MdevParent: "0000:1b:00.4", GPUInstance: p(5)},
		want: map[string]resourceapi.DeviceAttribute{
			"gpu.hwdra.io/mdevUUID": s("8f2c"), "mdevUUID": s("8f2c"), "gpu.hwdra.io/mdevParent": s("0000:1b:00.4"), "gpu.hwdra.io/gpuInstanceID": i(5),
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.gpu.Attributes(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestNICAttributes(t *testing.T) {
	published := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"sriov.hwdra.io/mode": s("shared"), "sriov.hwdra.io/pfPciAddress": s("0000:17:00.0"), "sriov.hwdra.io/pfName": s("ens1f0"),
		"resource.kubernetes.io/numaNode": i(1), "resource.kubernetes.io/pcieRoot": s("pci0000:17"), "sriov.hwdra.io/linkType": s("ethernet"),
	}
	pf := NIC{Published: published, Mode: "shared", PFAddress: "0000:17:00.0", PFName: "ens1f0"}
	base := map[string]resourceapi.DeviceAttribute{}
	for k, v := range published {
		base[string(k)] = v
	}
	with := func(extra map[string]resourceapi.DeviceAttribute) map[string]resourceapi.DeviceAttribute {
		out := map[string]resourceapi.DeviceAttribute{}
		for _, m := range []map[string]resourceapi.DeviceAttribute{base, extra} {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	share, plain := pf, pf
	share.VF = &VF{PCIAddress: "0000:17:00.3", Index: 1, DeviceID: "101e", Driver: "mlx5_core", Rates: &TxRates{MinMbps: 10000, MaxMbps: 10000}, MAC: "02:00:00:00:00:01", VLAN: 100, VLANQoS: 3, RDMADevice: "mlx5_3"}
	plain.VF = &VF{PCIAddress: "0000:17:00.2", Index: 0}
	for _, tc := range []struct {
		name string
		nic  NIC
		want map[string]resourceapi.DeviceAttribute
	}{
		{"adminAccess: what the slice publishes", pf, base},
		{"a configured share", share, with(map[string]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pciBusID": s("0000:17:00.3"), "sriov.hwdra.io/vfIndex": i(1),
			"sriov.hwdra.io/maxTxRateMbps": i(10000), "sriov.hwdra.io/minTxRateMbps": i(10000),
			"sriov.hwdra.io/vfDeviceID": s("101e"), "sriov.hwdra.io/vfDriver": s("mlx5_core"),
			"sriov.hwdra.io/mac": s("02:00:00:00:00:01"), "sriov.hwdra.io/vlan": i(100), "sriov.hwdra.io/vlanQoS": i(3), "sriov.hwdra.io/rdmaDevice": s("mlx5_3"),
		})},
		{"a VF as it is: index 0, no VLAN, no MAC", plain, with(map[string]resourceapi.DeviceAttribute{
			"resource.kubernetes.io/pciBusID": s("0000:17:00.2"), "sriov.hwdra.io/vfIndex": i(0),
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.nic.Attributes(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %v\nwant %v", got, tc.want)
			}
		})
	}
}

func TestNetwork(t *testing.T) {
	got := Network("net1", []netip.Prefix{netip.MustParsePrefix("10.0.0.5/24"), netip.MustParsePrefix("fd00::5/64")}, "02:00:00:00:00:01")
	want := &resourceapi.NetworkDeviceData{InterfaceName: "net1", IPs: []string{"10.0.0.5/24", "fd00::5/64"}, HardwareAddress: "02:00:00:00:00:01"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
}
