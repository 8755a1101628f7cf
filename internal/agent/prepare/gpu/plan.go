// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"errors"
	"fmt"
	"reflect"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hwdra/hwdra/api"
	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/hw"
)

// devicePlan is what one allocated device needs: which hardware it stands
// for, the MIG mode its GPU must be in, and its configuration. Whether a
// GPU instance already exists or must be created, and whether MIG mode
// must actually change, apply decides on the live hardware under the
// GPU's lock: the inventory the plan is made from may be a little old.
type devicePlan struct {
	request, pool, device string
	// shareID is set where the device is one that claims share (a block
	// of time-sliced vGPUs: each share is a vGPU of its own; a GPU's
	// shares: each an MPS client held to what it consumed).
	shareID *types.UID
	dev     resources.GPUDevice
	// wantMIG is the MIG mode the device needs on its GPU.
	wantMIG bool
	// computeSlices is the MIG device's compute instance size, 0 for the
	// whole GPU instance.
	computeSlices int
	// admin: an adminAccess request, given the device as it is.
	admin bool
	// sharing is how the claim's processes share the device (nil: as
	// the driver leaves it).
	sharing *gpuv1alpha1.Sharing
	// share is what a GPU share consumed.
	share *shareLimits
}

// plan is pure: the claim's allocation, its configuration, the catalog
// of published devices, the node (every result's pool must be its) and
// whether the agent leaves GPU settings alone (gpus.settings Leave) give
// the devices to prepare, or an error before any hardware is touched. Whether a device's GPU is in the MIG mode it
// needs under Leave only the live hardware tells (apply's
// modesAsNeeded): the catalog shows a mode the agent switched as it was.
func plan(claim *resourceapi.ResourceClaim, catalog map[string]resources.GPUDevice, node string, leave bool) ([]devicePlan, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	type config struct {
		*gpuv1alpha1.GpuConfig
		from string // which of the claim's configs it is, for errors
	}
	configs := map[string]config{}
	var out []devicePlan
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if err := prepare.OwnPool(r, node); err != nil {
			return nil, err
		}
		dev, ok := catalog[r.Device]
		if !ok {
			return nil, fmt.Errorf("request %q: device %q (pool %q) is not one of this node's GPU devices now", r.Request, r.Device, r.Pool)
		}
		cfg, ok := configs[r.Request]
		if !ok {
			var err error
			if cfg.GpuConfig, cfg.from, err = api.ForRequestFrom(claim, DriverName, r.Request, &gpuv1alpha1.GpuConfig{}); err != nil {
				return nil, err
			}
			configs[r.Request] = cfg
		}
		p := devicePlan{request: r.Request, pool: r.Pool, device: r.Device, shareID: r.ShareID, dev: dev}
		if r.AdminAccess != nil && *r.AdminAccess {
			// Monitoring and debugging: no partition, mode or config.
			p.admin = true
			out = append(out, p)
			continue
		}
		if cfg.Share != nil && dev.Kind != device.KindShare {
			err := field.Forbidden(field.NewPath("share"), fmt.Sprintf("only a GPU share (device type share) takes share settings; device %s is of type %s", r.Device, dev.Kind))
			return nil, fmt.Errorf("request %q, device %s: %s: %w", r.Request, r.Device, cfg.from, err)
		}
		switch dev.Kind {
		case device.KindGPU, device.KindPassthrough:
		case device.KindMIG:
			p.wantMIG = true
			if cfg.MIG != nil && cfg.MIG.ComputeInstanceSlices != nil {
				n := *cfg.MIG.ComputeInstanceSlices
				if sizes := nvml.ComputeSizes(dev.Profile); !slices.Contains(sizes, n) {
					err := field.Invalid(field.NewPath("mig", "computeInstanceSlices"), n,
						fmt.Sprintf("MIG profile %s offers compute instances of %v slices", dev.Profile.Name, sizes))
					return nil, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err)
				}
				if n != dev.Profile.Slices {
					p.computeSlices = n
				}
			}
		case device.KindVGPU:
			// A MIG-backed vGPU's compute instances belong to its VM.
			p.wantMIG = dev.VGPUType.GPUInstanceProfileID != nil
		case device.KindShare:
			if err := sharePlan(&p, r, cfg.Share); err != nil {
				return nil, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err)
			}
		default:
			return nil, fmt.Errorf("request %q: device %q is of unknown kind %q", r.Request, r.Device, dev.Kind)
		}
		if err := sharingPlan(&p, cfg.Sharing, leave); err != nil {
			return nil, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err)
		}
		if g := dev.GPU.MIG; g.Enabled != p.wantMIG && !g.SwitchWithoutReset {
			return nil, fmt.Errorf("request %q: device %q needs MIG mode %s on GPU %s, which cannot switch without a GPU reset",
				r.Request, r.Device, onOff(p.wantMIG), dev.GPU.PCIBusID)
		}
		out = append(out, p)
	}
	if err := checkClaimMPS(out); err != nil {
		return nil, err
	}
	return out, nil
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// gpusOf lists the plans' GPUs, sorted and unique: the locks to take.
func gpusOf(plans []devicePlan) []string {
	var out []string
	for _, p := range plans {
		out = append(out, p.dev.PCIBusID())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// sharingPlan checks a device's sharing configuration against what the
// device can take and the agent may do (pure): time-slicing sets the
// GPU's compute mode and time slice, which an agent that leaves GPU
// settings alone does not.
func sharingPlan(p *devicePlan, s *gpuv1alpha1.Sharing, leave bool) error {
	if s == nil {
		return nil
	}
	strategy := field.NewPath("sharing", "strategy")
	switch p.dev.Kind {
	case device.KindVGPU:
		return field.Invalid(strategy, s.Strategy, "a vGPU takes no sharing strategy: the VM that runs it owns it")
	case device.KindPassthrough:
		return field.Invalid(strategy, s.Strategy, "a passthrough GPU takes no sharing strategy: the VM it is passed to owns it")
	case device.KindShare:
		return field.Invalid(strategy, s.Strategy, "a GPU share takes no sharing strategy: it runs under MPS, held to the memory and compute the scheduler counted (share.isolation says under which daemon)")
	case device.KindMIG:
		if s.Strategy == gpuv1alpha1.TimeSlicing {
			return field.Invalid(strategy, s.Strategy, "the time slice is a setting of the whole GPU: a MIG partition takes MPS")
		}
	}
	if leave && s.Strategy == gpuv1alpha1.TimeSlicing {
		return field.Invalid(strategy, s.Strategy, "refused: the agent's configuration says gpus.settings: Leave, so it sets no GPU's compute mode or time slice; "+
			"leave sharing out to share the GPU in the compute mode and at the time slice it has, use MPS, or have the node's agent configured with gpus.settings: Manage")
	}
	if m := s.MPS; m != nil && m.DefaultPinnedDeviceMemoryLimit != nil {
		if have := p.memory(); uint64(m.DefaultPinnedDeviceMemoryLimit.Value()) > have {
			return field.Invalid(field.NewPath("sharing", "mps", "defaultPinnedDeviceMemoryLimit"), m.DefaultPinnedDeviceMemoryLimit.String(),
				fmt.Sprintf("more than the device's %d bytes of memory", have))
		}
	}
	p.sharing = s
	return nil
}

// shareLimits are what a GPU share consumed: its MPS client is held to
// them.
type shareLimits struct {
	memory  uint64 // bytes
	compute int    // percent of the GPU's multiprocessors
	// dedicated: the share runs under an MPS daemon of its own whose
	// defaults are these limits (GpuConfig share.isolation Dedicated);
	// otherwise under the GPU's daemon of its policed shares.
	dedicated bool
}

// sharePlan takes a GPU share's consumed capacity from its allocation
// and checks it against the GPU (the request policy keeps the scheduler
// within it; a share larger than the GPU is refused all the same), and
// its isolation from the share configuration (nil: Policed).
func sharePlan(p *devicePlan, r resourceapi.DeviceRequestAllocationResult, cfg *gpuv1alpha1.ShareConfig) error {
	if r.ShareID == nil {
		return errors.New("a GPU share allocated without a share ID (is DRAConsumableCapacity on in the scheduler?)")
	}
	path := field.NewPath("consumedCapacity")
	memory, compute := r.ConsumedCapacity[device.GPUCapMemory], r.ConsumedCapacity[device.GPUCapCompute]
	var errs field.ErrorList
	if v := compute.Value(); v < 1 || v > 100 {
		errs = append(errs, field.Invalid(path.Key(string(device.GPUCapCompute)), compute.String(), "must be 1 to 100 (percent of the GPU's multiprocessors)"))
	}
	if v := memory.Value(); v < 1 || uint64(v) > p.dev.GPU.MemoryBytes {
		errs = append(errs, field.Invalid(path.Key(string(device.GPUCapMemory)), memory.String(), fmt.Sprintf("must be at least 1 byte and at most the GPU's %d", p.dev.GPU.MemoryBytes)))
	}
	if len(errs) > 0 {
		return errs.ToAggregate()
	}
	p.share = &shareLimits{memory: uint64(memory.Value()), compute: int(compute.Value()),
		dedicated: cfg != nil && cfg.Isolation == gpuv1alpha1.Dedicated}
	p.sharing = &gpuv1alpha1.Sharing{Strategy: gpuv1alpha1.MPS}
	return nil
}

// memory is the device's memory in bytes.
func (p *devicePlan) memory() uint64 {
	if p.dev.Kind == device.KindMIG {
		return p.dev.Profile.MemoryBytes
	}
	return p.dev.GPU.MemoryBytes
}

// usesMPS: the device runs under an MPS daemon.
func (p *devicePlan) usesMPS() bool {
	return p.sharing != nil && p.sharing.Strategy == gpuv1alpha1.MPS
}

// checkClaimMPS checks that a claim's devices that run under MPS run
// under one daemon (a container reaches one daemon, through one pipe
// directory), with one configuration, and that the claim has no other
// GPU devices beside them (their processes would go through the daemon,
// which does not serve them).
func checkClaimMPS(plans []devicePlan) error {
	for _, p := range plans {
		if p.share != nil && len(plans) > 1 {
			return fmt.Errorf("request %q: a claim with a GPU share has no other device (its containers reach one MPS daemon, held to the share's limits)", p.request)
		}
	}
	var first *devicePlan
	for i := range plans {
		p := &plans[i]
		if p.admin || !p.usesMPS() {
			continue
		}
		if first == nil {
			first = p
			continue
		}
		if !reflect.DeepEqual(first.sharing.MPS, p.sharing.MPS) {
			return fmt.Errorf("requests %q and %q: their MPS settings differ, and a claim's devices run under one MPS daemon", first.request, p.request)
		}
	}
	if first == nil {
		return nil
	}
	for _, p := range plans {
		if !p.admin && !p.usesMPS() {
			return fmt.Errorf("request %q: device %s does not run under MPS beside request %q's, which do: the claim's containers would reach it through the MPS daemon, which does not serve it",
				p.request, p.device, first.request)
		}
	}
	return nil
}

// claimDaemon is the MPS daemon of a claim's MPS devices, their UUIDs
// given (the MIG devices' are known once applied).
func claimDaemon(claim types.UID, plans []devicePlan, uuids []string) (mps.Spec, []int) {
	if len(plans) == 1 && plans[0].share != nil {
		// A GPU's policed shares run under the GPU's daemon, which gives
		// no defaults: each client is held to its own share by its
		// environment (and the agent's policing).
		p := plans[0]
		s := mps.Spec{Owner: mps.OwnerShares, Devices: []string{uuids[0]}, Serves: []hw.PartitionRef{p.serves()}}
		if sh := p.share; sh.dedicated {
			// A dedicated share's daemon is its own, its defaults the
			// share's limits: ceilings a client's environment can lower
			// but not raise.
			compute, memory := sh.compute, sh.memory
			s.Owner, s.Share = string(claim), true
			s.ActiveThreadPercentage, s.PinnedMemoryLimit = &compute, &memory
		}
		s.ID = mps.ID(s.Owner, s.Devices)
		return s, []int{0}
	}
	var s mps.Spec
	var idx []int
	for i, p := range plans {
		if p.admin || !p.usesMPS() {
			continue
		}
		idx = append(idx, i)
		s.Devices = append(s.Devices, uuids[i])
		s.Serves = append(s.Serves, p.serves())
		if m := p.sharing.MPS; m != nil {
			s.ActiveThreadPercentage = m.DefaultActiveThreadPercentage
			if q := m.DefaultPinnedDeviceMemoryLimit; q != nil {
				v := uint64(q.Value())
				s.PinnedMemoryLimit = &v
			}
		}
	}
	s.Owner = string(claim)
	s.ID = mps.ID(s.Owner, s.Devices)
	return s, idx
}

// serves is the hardware the device is.
func (p *devicePlan) serves() hw.PartitionRef {
	ref := hw.PartitionRef{GPU: p.dev.GPU.PCIBusID}
	if at := p.dev.At(); at != nil {
		ref.Placement = *at
	}
	return ref
}
