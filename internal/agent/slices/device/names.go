// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package device

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// maxLabel is the length limit of a DNS label (device and counter names).
const maxLabel = 63

// label turns free text ("0000:3b:00.0", "1g.10gb+me", "NVIDIA H100-10C")
// into a DNS label fragment: lower case, runs of other characters become one
// dash, no dash at either end. A "+" becomes the word "plus": NVIDIA names
// MIG profile variants by it, and Blackwell lists "1g.23gb+me" (with the
// media engines) beside "1g.23gb-me" (without), which would both read
// "1g-23gb-me" otherwise.
func label(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(strings.ReplaceAll(s, "+", "-plus-")) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
			continue
		}
		dash = true
	}
	return b.String()
}

// join builds a DNS label from fragments. Names longer than a label keep
// their start and end a short hash of the whole, so they stay unique and
// stable.
func join(parts ...string) string {
	name := strings.Join(parts, "-")
	if len(name) <= maxLabel {
		return name
	}
	sum := sha256.Sum256([]byte(name))
	suffix := hex.EncodeToString(sum[:])[:10]
	return strings.TrimRight(name[:maxLabel-len(suffix)-1], "-") + "-" + suffix
}

// GPUName is the device (and counter set) name of a whole GPU, derived from
// its PCI address so it survives reboots and driver reloads.
func GPUName(pciBusID string) string { return join("gpu", label(pciBusID)) }

// PassthroughName is the device name of a GPU bound to vfio-pci: not its
// GPUName, so that a claim allocated while the GPU was bound to the
// NVIDIA driver never finds it under the same name after a rebind.
func PassthroughName(pciBusID string) string { return join("gpu", label(pciBusID), "passthrough") }

// MIGName is the device name of MIG profile at a placement.
func MIGName(pciBusID, profile string, start int) string {
	return join("gpu", label(pciBusID), "mig", label(profile), strconv.Itoa(start))
}

// ShareName is the shareable device of a GPU, whose shares independent
// claims take.
func ShareName(pciBusID string) string { return join("gpu", label(pciBusID), "share") }

// VGPUName is the device name of a vGPU of a type; index is the instance
// number for time-sliced types and the placement start for MIG-backed ones.
func VGPUName(pciBusID, vgpuType string, index int) string {
	return join("gpu", label(pciBusID), "vgpu", label(ShortVGPUName(vgpuType)), strconv.Itoa(index))
}

// ShortVGPUName is a vGPU type's name without NVIDIA's prefix ("H100-10C"),
// as its devices' profile attribute and names carry it.
func ShortVGPUName(name string) string { return strings.TrimPrefix(name, "NVIDIA ") }

// Name builds a DNS label (a device, counter or group name) from free-text
// parts, each made a label fragment as device names are.
func Name(parts ...string) string {
	for i, p := range parts {
		parts[i] = label(p)
	}
	return join(parts...)
}

// NICDeviceName is the shared device of a PF.
func NICDeviceName(pfAddress string) string { return join("nic", label(pfAddress)) }

// NICVFDeviceName is the exclusive device of VF index of a PF.
func NICVFDeviceName(pfAddress string, index int) string {
	return join("nic", label(pfAddress), "vf", strconv.Itoa(index))
}
