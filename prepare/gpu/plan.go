package gpu

import (
	"fmt"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/hwdra/hwdra/api"
	gpuv1alpha1 "github.com/hwdra/hwdra/api/gpu/v1alpha1"
	"github.com/hwdra/hwdra/nvml"

	"github.com/hwdra/hwdra/slices/device"
	"github.com/hwdra/hwdra/slices/resources"
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

// plan is pure: the claim's allocation, its configuration and the catalog
// of published devices give the devices to prepare, or an error before
// any hardware is touched.
func plan(claim *resourceapi.ResourceClaim, catalog map[string]resources.GPUDevice) ([]devicePlan, error) {
	if claim.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", claim.Namespace, claim.Name)
	}
	configs := map[string]*gpuv1alpha1.GpuConfig{}
	var out []devicePlan
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		dev, ok := catalog[r.Device]
		if !ok {
			return nil, fmt.Errorf("request %q: device %q (pool %q) is not one of this node's GPU devices now", r.Request, r.Device, r.Pool)
		}
		cfg, ok := configs[r.Request]
		if !ok {
			var err error
			if cfg, err = api.ForRequest(claim, DriverName, r.Request, &gpuv1alpha1.GpuConfig{}); err != nil {
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
			if err := sharePlan(&p, r); err != nil {
				return nil, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err)
			}
		default:
			return nil, fmt.Errorf("request %q: device %q is of unknown kind %q", r.Request, r.Device, dev.Kind)
		}
		if err := sharingPlan(&p, cfg.Sharing); err != nil {
			return nil, fmt.Errorf("request %q, device %s: %w", r.Request, r.Device, err)
		}
		if g := dev.GPU.MIG; g.Enabled != p.wantMIG && !g.SwitchWithoutReset {
			return nil, fmt.Errorf("request %q: device %q needs MIG mode %s on GPU %s, which cannot switch without a GPU reset",
				r.Request, r.Device, onOff(p.wantMIG), dev.GPU.PCIBusID)
		}
		out = append(out, p)
	}
	if err := claimMPS(out); err != nil {
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
