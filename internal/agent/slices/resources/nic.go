// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package resources

import (
	"fmt"
	"sort"

	"github.com/hwdra/hwdra/internal/agent/slices/device"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/hw"
)

// NIC builds the sriov.hwdra.io devices of the offered PFs: in
// shared mode one device per PF that many claims share (bandwidth and VF
// capacities), in exclusive mode one device per VF. It returns the PFs it
// left out and why: a link speed too slow for the policy, no VFs. The pool
// is named after the node.
//
// A PF whose link is down or whose speed is unknown stays published,
// tainted (see NICDevice.Fault), so claims already allocated on it still
// prepare and unprepare: its bandwidth capacity is the last speed the agent
// saw (hw.PF.LastSpeedMbps), or the policy's minimum share if it never saw
// one.
//
// Without ConsumableCapacity the API server would drop the shared devices'
// capacities and every claim would take a whole PF, so shared PFs fall back
// to exclusive mode (one device per VF); the caller says so in its log.
//
// Device names derive from the PF's PCI address, stable across reboots:
// "nic-0000-17-00-0" for a shared PF, "nic-0000-17-00-0-vf-3" for its VF 3.
func NIC(nodeName string, offers []config.NICOffer, f device.Features) (resourceslice.DriverResources, []config.Skip) {
	return TaintedNIC(nodeName, offers, f, Health{})
}

// TaintedNIC is NIC with the devices that h finds at
// fault tainted (with DeviceTaints).
func TaintedNIC(nodeName string, offers []config.NICOffer, f device.Features, h Health) (resourceslice.DriverResources, []config.Skip) {
	res, skips, _ := buildNICs(nodeName, offers, f, h, false)
	return res, skips
}

// NICDevice is what a published NIC device stands for on the hardware:
// prepare looks devices up here by name.
type NICDevice struct {
	// Mode is the device's mode as published: a shared PF falls back to
	// exclusive VFs without ConsumableCapacity.
	Mode config.Mode
	PF   hw.PF
	// VF is the exclusive device's VF; nil for a shared PF.
	VF *hw.VF
	// Bandwidth is the PF's policy (shared devices).
	Bandwidth config.BandwidthPolicy
	// Attributes are the device's published attributes: its metadata
	// carries them.
	Attributes map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
}

// NICDevices maps every device NIC publishes for these offers and
// features to what it stands for; both come from one builder.
func NICDevices(offers []config.NICOffer, f device.Features) map[string]NICDevice {
	_, _, catalog := buildNICs("", offers, f, Health{}, true)
	return catalog
}

func buildNICs(nodeName string, offers []config.NICOffer, f device.Features, h Health, withCatalog bool) (resourceslice.DriverResources, []config.Skip, map[string]NICDevice) {
	offers = append([]config.NICOffer(nil), offers...)
	sort.SliceStable(offers, func(i, j int) bool { return offers[i].PF.PCIAddress < offers[j].PF.PCIAddress })
	var (
		devices []resourceapi.Device
		skips   []config.Skip
		catalog map[string]NICDevice
	)
	if withCatalog {
		catalog = map[string]NICDevice{}
	}
	add := func(d resourceapi.Device, what NICDevice) {
		if fault, ok := what.Fault(h.Faults); ok && f.DeviceTaints {
			d.Taints = []resourceapi.DeviceTaint{h.taint(device.NICTaintKey, fault)}
		}
		devices = append(devices, d)
		if catalog != nil {
			what.Attributes = d.Attributes
			catalog[d.Name] = what
		}
	}
	for _, o := range offers {
		pf := o.PF
		mode := o.Mode
		if mode == config.ModeShared && !f.ConsumableCapacity {
			mode = config.ModeExclusive
		}
		switch mode {
		case config.ModeShared:
			d, reason := sharedDevice(pf, o.Bandwidth)
			if reason != "" {
				skips = append(skips, config.SkipPF(pf, reason))
				continue
			}
			add(d, NICDevice{Mode: mode, PF: pf, Bandwidth: o.Bandwidth})
		case config.ModeExclusive:
			for _, vf := range pf.VFs {
				add(vfDevice(pf, vf), NICDevice{Mode: mode, PF: pf, VF: &vf, Bandwidth: o.Bandwidth})
			}
		default:
			skips = append(skips, config.SkipPF(pf, fmt.Sprintf("mode %q is not published", o.Mode)))
		}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: pool(nil, devices)},
	}, skips, catalog
}

// sharedDevice: the bandwidth capacity's request policy is the configured
// one, fitted to the link: the largest valid share (the range's max, which
// the API wants on the step grid) is the largest on-grid value not above
// the link speed, and the default is clamped to it.
func sharedDevice(pf hw.PF, p config.BandwidthPolicy) (resourceapi.Device, string) {
	speed := knownSpeed(pf)
	if speed <= 0 {
		// Never seen: the smallest share is all the device promises
		// until its link tells (it is tainted meanwhile).
		speed = p.MinimumMbps
	}
	switch {
	case speed < p.MinimumMbps:
		return resourceapi.Device{}, fmt.Sprintf("link speed %s is below the bandwidth minimum %s", bps(speed), bps(p.MinimumMbps))
	case len(pf.VFs) == 0:
		return resourceapi.Device{}, "no VFs"
	case shareableVFs(pf) == 0:
		return resourceapi.Device{}, fmt.Sprintf("none of its %d VFs is bound to a network driver (shares need a VF netdev; bound to vfio-pci, offer the PF in exclusive mode)", len(pf.VFs))
	}
	maxShare := p.MinimumMbps + (speed-p.MinimumMbps)/p.StepMbps*p.StepMbps
	rng := &resourceapi.CapacityRequestPolicyRange{Min: quantityBps(p.MinimumMbps), Max: quantityBps(maxShare)}
	if maxShare > p.MinimumMbps { // the API wants min+step within the capacity
		rng.Step = quantityBps(p.StepMbps)
	}
	d := resourceapi.Device{
		Name:                     device.NICDeviceName(pf.PCIAddress),
		Attributes:               pfAttributes(pf, config.ModeShared),
		AllowMultipleAllocations: new(true),
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			device.NICCapBandwidth: {
				Value: *quantityBps(speed),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:    quantityBps(min(p.DefaultMbps, maxShare)),
					ValidRange: rng,
				},
			},
			device.NICCapVFs: {
				Value: *resource.NewQuantity(int64(shareableVFs(pf)), resource.DecimalSI),
				RequestPolicy: &resourceapi.CapacityRequestPolicy{
					Default:     resource.NewQuantity(1, resource.DecimalSI),
					ValidValues: []resource.Quantity{*resource.NewQuantity(1, resource.DecimalSI)},
				},
			},
		},
	}
	return d, ""
}

// shareableVFs is how many shares a PF takes: its VFs bound to a network
// driver, what prepare hands out (wherever their netdevs are: a share's
// netdev is in its pod). Counted from what the hardware can deliver, so
// claims never change it.
func shareableVFs(pf hw.PF) int {
	n := 0
	for _, vf := range pf.VFs {
		if vf.NetdevDriver() {
			n++
		}
	}
	return n
}

// vfDevice is one VF claimed whole. Its bandwidth capacity (the link
// speed, when known) is informational: selectors can compare it.
func vfDevice(pf hw.PF, vf hw.VF) resourceapi.Device {
	attrs := pfAttributes(pf, config.ModeExclusive)
	attrs[deviceattribute.StandardDeviceAttributePCIBusID] = str(vf.PCIAddress)
	attrs[device.NICAttrVFIndex] = integer(vf.Index)
	if vf.DeviceID != "" {
		attrs[device.NICAttrVFDeviceID] = str(vf.DeviceID)
	}
	if vf.Driver != "" {
		attrs[device.NICAttrVFDriver] = str(vf.Driver)
	}
	d := resourceapi.Device{Name: device.NICVFDeviceName(pf.PCIAddress, vf.Index), Attributes: attrs}
	if speed := knownSpeed(pf); speed > 0 {
		d.Capacity = map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{device.NICCapBandwidth: {Value: *quantityBps(speed)}}
	}
	return d
}

// knownSpeed is the PF's link speed, or while that is unknown (link down)
// the last one seen; 0 if none.
func knownSpeed(pf hw.PF) int {
	if pf.SpeedMbps > 0 {
		return pf.SpeedMbps
	}
	return pf.LastSpeedMbps
}

// pfAttributes are the attributes every device of a PF carries. Unknown
// values are left out rather than published empty, so a matchAttribute
// constraint never pairs two unknowns.
func pfAttributes(pf hw.PF, mode config.Mode) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	// Sized for the VF attributes too: no rehash while they are added.
	a := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 16)
	a[device.NICAttrMode] = str(string(mode))
	a[device.NICAttrPFPCIAddress] = str(pf.PCIAddress)
	a[device.NICAttrVendorID] = str(pf.VendorID)
	a[device.NICAttrDeviceID] = str(pf.DeviceID)
	a[device.NICAttrRDMA] = boolean(pf.RDMADevice != "")
	for _, o := range [...]struct {
		name  resourceapi.QualifiedName
		value string
	}{
		{device.NICAttrPFName, pf.Netdev},
		{device.NICAttrDriver, pf.Driver},
		{device.NICAttrLinkType, string(pf.LinkType)},
		{device.NICAttrEswitchMode, pf.EswitchMode},
		{deviceattribute.StandardDeviceAttributePCIeRoot, pf.PCIeRoot},
	} {
		if o.value != "" {
			a[o.name] = str(o.value)
		}
	}
	if pf.NUMANode >= 0 {
		a[deviceattribute.StandardDeviceAttributeNUMANode] = integer(pf.NUMANode)
	}
	return a
}

// quantityBps is a bit rate given in Mb/s ("400G" for 400000).
func quantityBps(mbps int) *resource.Quantity {
	return resource.NewScaledQuantity(int64(mbps), resource.Mega)
}

func bps(mbps int) string { return quantityBps(mbps).String() }
