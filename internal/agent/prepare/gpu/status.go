// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"slices"

	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
)

// Statuses are a prepared claim's status.devices entries, one per device
// (metadata.GPUStatus: Ready, the UUIDs, MIG IDs, a share's limits, the
// MPS pipe directory in the container), from what the checkpoint keeps:
// the devices' metadata and the record, so that an agent restarted since
// the prepare says the same.
func Statuses(c prepare.Claim[Record]) []metadata.DeviceStatus {
	out := make([]metadata.DeviceStatus, 0, len(c.Devices))
	for _, d := range c.Devices {
		var (
			share *metadata.GPUShareData
			pipe  string
		)
		if r := c.Record.deviceOf(d); r != nil && r.Sharing != nil {
			if r.Sharing.MPS != "" {
				pipe = mps.ContainerPipeDir
			}
			if sh := r.Sharing.Share; sh != nil {
				isolation := gpuv1alpha1.Policed
				if sh.Dedicated {
					isolation = gpuv1alpha1.Dedicated
				}
				share = &metadata.GPUShareData{ActiveThreadPercentage: int64(sh.Compute),
					PinnedMemoryLimitMiB: int64(metadata.ShareLimits{MemoryBytes: sh.Memory}.MemoryMiB()), Isolation: string(isolation)}
			}
		}
		out = append(out, metadata.GPUStatus(d.Pool, d.Device, d.ShareID, d.Attributes, share, pipe))
	}
	return out
}

// deviceOf is the record of a prepared device.
func (r Record) deviceOf(d prepare.Device) *DeviceRecord {
	for i := range r.Devices {
		if r.Devices[i].Device == d.Device && slices.Contains(d.Requests, r.Devices[i].Request) {
			return &r.Devices[i]
		}
	}
	return nil
}
