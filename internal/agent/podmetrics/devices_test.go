// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"reflect"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/hw"
)

func attrs(kv ...any) map[string]resourceapi.DeviceAttribute {
	out := map[string]resourceapi.DeviceAttribute{}
	for i := 0; i < len(kv); i += 2 {
		switch v := kv[i+1].(type) {
		case string:
			out[kv[i].(string)] = resourceapi.DeviceAttribute{StringValue: ptr.To(v)}
		case int:
			out[kv[i].(string)] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(v))}
		}
	}
	return out
}

// TestDevicesFromTheCheckpoint: what the checkpoint keeps of a MIG
// device (its metadata: its own UUID, its GPU's as parentUUID, the GPU
// and compute instance IDs), a share (its record's limits), an MPS claim,
// an adminAccess device (no record) and a VF becomes what the series say.
func TestDevicesFromTheCheckpoint(t *testing.T) {
	gpus := map[types.UID]prepare.Claim[gpuprep.Record]{
		"u1": {Namespace: "ml", Name: "small", State: prepare.StatePrepared,
			Devices: []prepare.Device{{Requests: []string{"mig"}, Pool: "n1", Device: "gpu-0000-43-00-0-mig-1g-10gb-6",
				Attributes: attrs("gpu.hwdra.io/type", "mig", "gpu.hwdra.io/profile", "1g.10gb", "gpu.hwdra.io/uuid", migUUID,
					"gpu.hwdra.io/parentUUID", uuid1, "gpu.hwdra.io/gpuInstanceID", 7, "gpu.hwdra.io/computeInstanceID", 0,
					"resource.kubernetes.io/pciBusID", gpu1)}},
			Record: gpuprep.Record{Devices: []gpuprep.DeviceRecord{{Request: "mig", Device: "gpu-0000-43-00-0-mig-1g-10gb-6", GPU: gpu1,
				GPUInstance: &gpuprep.GPUInstanceRecord{Profile: 19, Created: true, ID: ptr.To(7)}}}}},
		"u2": {Namespace: "web", Name: "infer", State: prepare.StatePrepared,
			Devices: []prepare.Device{
				{Requests: []string{"share"}, Pool: "n1", Device: "gpu-0000-1b-00-0-share",
					Attributes: attrs("gpu.hwdra.io/type", "share", "gpu.hwdra.io/profile", "share", "gpu.hwdra.io/uuid", uuid0, "resource.kubernetes.io/pciBusID", gpu0)},
				{Requests: []string{"watch"}, Pool: "n1", Device: "gpu-0000-43-00-0",
					Attributes: attrs("gpu.hwdra.io/type", "gpu", "gpu.hwdra.io/profile", "full", "gpu.hwdra.io/uuid", uuid1, "resource.kubernetes.io/pciBusID", gpu1)},
			},
			Record: gpuprep.Record{Devices: []gpuprep.DeviceRecord{{Request: "share", Device: "gpu-0000-1b-00-0-share", GPU: gpu0,
				Sharing: &gpuprep.SharingRecord{MPS: "d1", Share: &gpuprep.ShareRecord{Memory: 10 << 30, Compute: 30}}}}}},
		"u3": {Namespace: "ml", Name: "mps", State: prepare.StatePrepared,
			Devices: []prepare.Device{{Requests: []string{"gpu"}, Pool: "n1", Device: "gpu-0000-1b-00-0",
				Attributes: attrs("gpu.hwdra.io/type", "gpu", "gpu.hwdra.io/profile", "full", "gpu.hwdra.io/uuid", uuid0, "resource.kubernetes.io/pciBusID", gpu0)}},
			Record: gpuprep.Record{Devices: []gpuprep.DeviceRecord{{Request: "gpu", Device: "gpu-0000-1b-00-0", GPU: gpu0, Sharing: &gpuprep.SharingRecord{MPS: "d2"}}}}},
	}
	got := GPUDevices(gpus)
	want := []Device{
		{Namespace: "ml", Claim: "small", ClaimUID: "u1", Request: "mig", Driver: "gpu.hwdra.io", Pool: "n1", Name: "gpu-0000-43-00-0-mig-1g-10gb-6", Type: "mig",
			GPU: gpu1, UUID: uuid1, GPUInstance: ptr.To(7), ComputeInstance: ptr.To(0), Profile: "1g.10gb", MIGUUID: migUUID},
		{Namespace: "web", Claim: "infer", ClaimUID: "u2", Request: "share", Driver: "gpu.hwdra.io", Pool: "n1", Name: "gpu-0000-1b-00-0-share", Type: "share",
			GPU: gpu0, UUID: uuid0, Sharing: SharingShare, Share: &gpuprep.ShareRecord{Memory: 10 << 30, Compute: 30}},
		{Namespace: "web", Claim: "infer", ClaimUID: "u2", Request: "watch", Driver: "gpu.hwdra.io", Pool: "n1", Name: "gpu-0000-43-00-0", Type: "gpu", GPU: gpu1, UUID: uuid1},
		{Namespace: "ml", Claim: "mps", ClaimUID: "u3", Request: "gpu", Driver: "gpu.hwdra.io", Pool: "n1", Name: "gpu-0000-1b-00-0", Type: "gpu", GPU: gpu0, UUID: uuid0, Sharing: SharingMPS},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("GPU devices:\n%+v\nwant\n%+v", got, want)
	}

	nics := map[types.UID]prepare.Claim[nicprep.Record]{"u4": {Namespace: "net", Name: "v", State: prepare.StatePrepared,
		Record: nicprep.Record{VFs: []nicprep.VF{{Request: "nic", Pool: "n1", Device: "pf-0000-17-00-0", PF: "pfa", Index: 2, PCIAddress: "0000:17:00.4",
			Applied: hw.VFConfig{MaxTxRateMbps: 10000, MinTxRateMbps: 2000}}}}}}
	wantNIC := []Device{{Namespace: "net", Claim: "v", ClaimUID: "u4", Request: "nic", Driver: "sriov.hwdra.io", Pool: "n1", Name: "pf-0000-17-00-0", Type: "vf",
		VF: "0000:17:00.4", PF: "pfa", VFIndex: 2, MaxTxRate: 10000, MinTxRate: 2000}}
	if got := NICDevices(nics); !reflect.DeepEqual(got, wantNIC) {
		t.Errorf("NIC devices:\n%+v\nwant\n%+v", got, wantNIC)
	}
}
