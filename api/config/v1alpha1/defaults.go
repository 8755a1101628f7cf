// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"slices"
	"strings"
)

// The built-in bandwidth policy, in Mb/s: a claim that names no bandwidth
// gets 10 Gb/s; shares go in whole Gb/s from 1 Gb/s.
const (
	DefaultShareMbps   = 10000
	DefaultMinimumMbps = 1000
	DefaultStepMbps    = 1000
)

// Default fills in what the file leaves out: mode shared; a shared rule's
// bandwidth policy (given only one of minimum and step, the other takes
// its value; neither: 1G each; default: 10G rounded up to a valid share);
// fatalEffect NoSchedule; the device plugin's default resources; gpus
// settings Manage; gpus.mps's sizes.
// Selector values that are valid are put in canonical form (PCI
// addresses and IDs in lower case, a PCI address with its domain, IDs
// without 0x, GPU UUIDs' hex digits in lower case), so that they compare
// with what the hardware reports; invalid ones stay as written, for
// Validate to name.
func (c *AgentConfig) Default() {
	for i := range c.NICs {
		c.NICs[i].defaults()
	}
	if c.VFPolicy != nil {
		for i := range c.VFPolicy.PFs {
			c.VFPolicy.PFs[i].Select.defaults()
		}
	}
	if c.Health != nil && c.Health.FatalEffect == "" {
		c.Health.FatalEffect = EffectNoSchedule
	}
	if c.GPUs != nil && c.GPUs.Settings == "" {
		c.GPUs.Settings = GPUSettingsManage
	}
	if c.GPUs != nil && c.GPUs.ClaimStatus == "" {
		c.GPUs.ClaimStatus = GPUClaimStatusWrite
	}
	if c.GPUs != nil && c.GPUs.Shares != nil {
		if c.GPUs.Shares.Overuse == "" {
			c.GPUs.Shares.Overuse = ShareOveruseStop
		}
		if c.GPUs.Shares.CheckIntervalMilliseconds == nil {
			ms := DefaultShareCheckIntervalMilliseconds
			c.GPUs.Shares.CheckIntervalMilliseconds = &ms
		}
	}
	if c.GPUs != nil && c.GPUs.MPS != nil {
		if c.GPUs.MPS.ShmSize == "" {
			c.GPUs.MPS.ShmSize = DefaultMPSShmSize
		}
		if c.GPUs.MPS.DaemonMemoryLimit == "" {
			c.GPUs.MPS.DaemonMemoryLimit = DefaultMPSDaemonMemoryLimit
		}
	}
	if dp := c.DevicePlugin; dp != nil {
		if len(dp.Resources) == 0 {
			dp.Resources = slices.Clone(DefaultDevicePluginResources)
		}
		if dp.OwnedGPUs != nil {
			canonical(dp.OwnedGPUs.PCIAddresses, canonicalPCIAddress)
			canonical(dp.OwnedGPUs.UUIDs, canonicalGPUUUID)
		}
	}
}

func (r *NICRule) defaults() {
	if r.Mode == "" {
		r.Mode = ModeShared
	}
	r.Select.defaults()
	if r.Mode != ModeShared {
		return
	}
	if r.Bandwidth == nil {
		r.Bandwidth = &Bandwidth{}
	}
	r.Bandwidth.defaults()
}

// defaults puts the selector's valid values in canonical form.
func (s *PFSelector) defaults() {
	canonical(s.PCIAddresses, canonicalPCIAddress)
	canonical(s.VendorIDs, canonicalID)
	canonical(s.DeviceIDs, canonicalID)
}

// defaults completes the policy from its valid values; an invalid one
// leaves what depends on it empty (Validate names the invalid one).
func (b *Bandwidth) defaults() {
	valid := func(q Quantity) bool { _, err := Mbps(q); return err == nil }
	switch {
	case b.Minimum == "" && b.Step == "":
		b.Minimum, b.Step = FormatMbps(DefaultMinimumMbps), FormatMbps(DefaultStepMbps)
	case b.Minimum == "" && valid(b.Step):
		b.Minimum = b.Step
	case b.Step == "" && valid(b.Minimum):
		b.Step = b.Minimum
	}
	if b.Default != "" {
		return
	}
	minimum, err1 := Mbps(b.Minimum)
	step, err2 := Mbps(b.Step)
	if err1 != nil || err2 != nil {
		return
	}
	k := max(0, (DefaultShareMbps-minimum+step-1)/step)
	b.Default = FormatMbps(minimum + k*step)
}

// canonical rewrites the valid values of list in place.
func canonical(list []string, canon func(string) (string, bool)) {
	for i, s := range list {
		if c, ok := canon(s); ok {
			list[i] = c
		}
	}
}

func canonicalPCIAddress(s string) (string, bool) {
	s = strings.ToLower(s)
	if !pciAddressRE.MatchString(s) {
		return s, false
	}
	if len(s) == len("17:00.0") {
		s = "0000:" + s
	}
	return s, true
}

func canonicalID(s string) (string, bool) {
	s = strings.TrimPrefix(strings.ToLower(s), "0x")
	return s, hexIDRE.MatchString(s)
}

func canonicalGPUUUID(s string) (string, bool) {
	if rest, ok := strings.CutPrefix(s, "GPU-"); ok {
		s = "GPU-" + strings.ToLower(rest)
	}
	return s, gpuUUIDRE.MatchString(s)
}

// DefaultShareCheckIntervalMilliseconds is gpus.shares' default interval:
// one round costs microseconds per GPU (docs/design.md, "Policed
// shares"), so a second is cheap and short beside a job's life.
const DefaultShareCheckIntervalMilliseconds = 1000

// gpus.mps's defaults: MPS keeps little in its shared memory, but the
// containers on a daemon share it for their own POSIX shared memory
// (data loaders, NCCL); the daemon's cgroup holds its MPS servers, each
// with the host side of its clients' contexts.
const (
	DefaultMPSShmSize           Quantity = "1Gi"
	DefaultMPSDaemonMemoryLimit Quantity = "4Gi"
)
