// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// A GPU's shares: one device per GPU that is not in MIG mode (nor a vGPU
// host), with allowMultipleAllocations, that independent claims each take
// a share of: its memory (bytes) and compute (percent of the GPU's
// multiprocessors), each with a request policy. It consumes what the
// whole GPU consumes (gpuCounters.wholeGPU); the scheduler's allocator
// charges a shareable device's counters once, at its first share, so the
// first share keeps the whole GPU, MIG partitions and vGPUs off the GPU,
// and any of those keeps shares off it. Prepare runs each share under the
// GPU's MPS server, held to what it consumed.
//
// Without consumable capacity the API server drops the capacities'
// policies and allowMultipleAllocations (every claim would take the GPU
// whole under another name), and without partitionable devices nothing
// keeps a share and the whole GPU apart: no shares then.

// Request policies of a share.
const (
	// shareMemoryStep is the granularity of a share's memory, also its
	// least; shareMemoryDefault what a claim that does not say gets.
	shareMemoryStep    = 1 << 30
	shareMemoryDefault = 4 << 30
	// A share's compute is a percentage, from 1 to 100 in steps of 1; a
	// claim that does not say gets shareComputeDefault.
	shareComputeDefault = 10
)

// shareable: the GPU offers shares where the features allow.
func (b *gpuDevices) shareable() bool {
	return b.f.ConsumableCapacity && b.gpu.MemoryBytes >= shareMemoryStep
}

func (b *gpuDevices) share() resourceapi.Device {
	g := b.gpu
	d := b.base(device.ShareName(g.PCIBusID), device.KindShare, device.ProfileShare)
	d.Attributes[device.AttrUUID] = str(g.UUID)
	d.AllowMultipleAllocations = new(true)
	maxMemory := int64(g.MemoryBytes) / shareMemoryStep * shareMemoryStep // on the step grid
	d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
		device.GPUCapMemory: {
			Value:         *resource.NewQuantity(int64(g.MemoryBytes), resource.BinarySI),
			RequestPolicy: stepPolicy(min(shareMemoryDefault, maxMemory), shareMemoryStep, maxMemory, shareMemoryStep, resource.BinarySI),
		},
		device.GPUCapCompute: {
			Value:         *resource.NewQuantity(100, resource.DecimalSI),
			RequestPolicy: stepPolicy(shareComputeDefault, 1, 100, 1, resource.DecimalSI),
		},
	}
	d.ConsumesCounters = b.consume(b.counters.wholeGPU(), "")
	return d
}

// stepPolicy is a request policy: a default, and a range from least to
// most in steps (on the grid: most - least is a multiple of step).
func stepPolicy(def, least, most, step int64, format resource.Format) *resourceapi.CapacityRequestPolicy {
	q := func(v int64) *resource.Quantity { return resource.NewQuantity(v, format) }
	r := &resourceapi.CapacityRequestPolicyRange{Min: q(least), Max: q(most)}
	if most > least {
		r.Step = q(step)
	}
	return &resourceapi.CapacityRequestPolicy{Default: q(def), ValidRange: r}
}
