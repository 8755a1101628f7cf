// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package convert

import (
	"fmt"
	"strings"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// NVIDIA's names: the driver of NVIDIA's GPU DRA driver
// (github.com/NVIDIA/k8s-dra-driver-gpu), its ComputeDomain driver, and
// the group of its opaque configuration types.
const (
	nvidiaDriver       = "gpu.nvidia.com"
	nvidiaCDDriver     = "compute-domain.nvidia.com"
	nvidiaConfigGroup  = "resource.nvidia.com"
	nvidiaConfigAPI    = nvidiaConfigGroup + "/v1beta1"
	standardDomain     = "resource.kubernetes.io"
	computeDomainWhy   = "ComputeDomains (IMEX channels for multi-node NVLink) have no equivalent in hwdra: it does not run IMEX daemons or hand out IMEX channels"
	stockClassNoteWhy  = "left out: hwdra's chart installs %s, its equivalent"
	nvidiaDomainSuffix = ".nvidia.com"
)

// classes maps the DeviceClasses NVIDIA's chart installs to hwdra's
// chart's.
var classes = map[string]string{
	"gpu.nvidia.com":      "gpu.hwdra.io",
	"mig.nvidia.com":      "mig.gpu.hwdra.io",
	"vfio.gpu.nvidia.com": "passthrough.gpu.hwdra.io",
}

// computeDomainClasses are NVIDIA's classes of ComputeDomain devices
// (imex.nvidia.com is their name before ComputeDomains).
var computeDomainClasses = map[string]bool{
	"compute-domain-daemon.nvidia.com":          true,
	"compute-domain-default-channel.nvidia.com": true,
	"imex.nvidia.com":                           true,
}

// name is an attribute or capacity as CEL and constraints name it: a
// domain and an identifier.
type name struct{ domain, id string }

func (n name) String() string { return n.domain + "/" + n.id }

// attributes maps NVIDIA's GPU attributes (domain gpu.nvidia.com) to
// hwdra's; an empty domain means there is none and why says why.
var attributes = map[string]struct {
	to  name
	why string
}{
	"type":                  {to: hwdra(device.AttrType)},
	"uuid":                  {to: hwdra(device.AttrUUID)},
	"parentUUID":            {to: hwdra(device.AttrParentUUID)},
	"profile":               {to: hwdra(device.AttrProfile)},
	"productName":           {to: hwdra(device.AttrProductName)},
	"architecture":          {to: hwdra(device.AttrArchitecture)},
	"cudaComputeCapability": {to: hwdra(device.AttrCUDAComputeCapability)},
	"driverVersion":         {to: hwdra(device.AttrDriverVersion)},
	"cudaDriverVersion":     {to: hwdra(device.AttrCUDADriverVersion)},
	"deviceID":              {to: hwdra(device.AttrPCIDeviceID)},
	"numa":                  {to: name{standardDomain, "numaNode"}},
	"brand":                 {why: "hwdra publishes no brand: select on productName or architecture"},
	"index":                 {why: "an enumeration index is not stable across reboots: hwdra names GPUs by PCI address (resource.kubernetes.io/pciBusID)"},
	"minor":                 {why: "a device minor is not stable across reboots: hwdra names GPUs by PCI address (resource.kubernetes.io/pciBusID)"},
	"addressingMode":        {why: "hwdra publishes no addressing mode"},
	"vendorID":              {why: "hwdra publishes only NVIDIA GPUs (vendor 10de) under gpu.hwdra.io: drop the test"},
	"iommuFDEnabled":        {why: "hwdra hands a passthrough GPU over as a legacy VFIO group only, never through iommufd"},
}

// capacities maps NVIDIA's GPU capacities to hwdra's.
var capacities = map[string]struct {
	to  name
	why string
}{
	"memory":          {to: name{device.GPUDriver, "memory"}},
	"multiprocessors": {to: name{device.GPUDriver, "multiprocessors"}},
	"copyEngines":     {why: noEngineCapacity},
	"decoders":        {why: noEngineCapacity},
	"encoders":        {why: noEngineCapacity},
	"jpegEngines":     {why: noEngineCapacity},
	"ofaEngines":      {why: noEngineCapacity},
}

const noEngineCapacity = "hwdra publishes a GPU's or MIG partition's memory and multiprocessors, not its engines: select the MIG profile by name (gpu.hwdra.io/profile)"

func hwdra(qualified string) name {
	d, id, _ := strings.Cut(qualified, "/")
	return name{d, id}
}

// attribute maps an NVIDIA GPU attribute; memorySlice<N> capacities and
// unknown names have no equivalent.
func attribute(id string) (name, error) {
	a, ok := attributes[id]
	switch {
	case !ok:
		return name{}, fmt.Errorf("attribute %s/%s: not one NVIDIA's driver publishes, and hwdra has no equivalent", nvidiaDriver, id)
	case a.why != "":
		return name{}, fmt.Errorf("attribute %s/%s has no equivalent: %s", nvidiaDriver, id, a.why)
	}
	return a.to, nil
}

func capacity(id string) (name, error) {
	c, ok := capacities[id]
	switch {
	case strings.HasPrefix(id, "memorySlice"):
		return name{}, fmt.Errorf("capacity %s/%s has no equivalent: hwdra counts memory slices in counter sets, which a selector cannot read", nvidiaDriver, id)
	case !ok:
		return name{}, fmt.Errorf("capacity %s/%s: not one NVIDIA's driver publishes, and hwdra has no equivalent", nvidiaDriver, id)
	case c.why != "":
		return name{}, fmt.Errorf("capacity %s/%s has no equivalent: %s", nvidiaDriver, id, c.why)
	}
	return c.to, nil
}

// attributeValue maps a string an attribute is compared with, where the
// two drivers spell values differently: NVIDIA's type "vfio" is hwdra's
// "passthrough"; NVIDIA's architectures are capitalised ("Hopper"), its
// PCI device IDs hexadecimal with 0x.
func attributeValue(id, v string) string {
	switch id {
	case "type":
		if v == "vfio" {
			return device.KindPassthrough
		}
	case "architecture":
		return strings.ToLower(v)
	case "deviceID": // "0x2330" there, "2330" here
		return strings.TrimPrefix(strings.ToLower(v), "0x")
	}
	return v
}

// qualifiedAttribute maps a constraint's "gpu.nvidia.com/<attribute>".
func qualifiedAttribute(q string) (string, bool, error) {
	id, ok := strings.CutPrefix(q, nvidiaDriver+"/")
	if !ok {
		return q, false, nil
	}
	to, err := attribute(id)
	if err != nil {
		return q, false, err
	}
	return to.String(), true, nil
}
