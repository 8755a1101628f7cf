// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package config

import (
	"time"

	configv1alpha1 "github.com/hwdra/hwdra/api/config/v1alpha1"
)

// GPUPolicy is the validated gpus section: what the GPU driver publishes
// and which GPU settings it may change. The zero policy publishes
// everything the hardware delivers and manages the settings.
type GPUPolicy struct {
	migProfiles *configv1alpha1.ProfileFilter
	// leave: gpus.settings is Leave. The zero value is Manage, so that a
	// policy built without a file (tests, the prepare catalog) manages.
	leave bool
	// report: gpus.shares.overuse is Report (zero: Stop).
	report bool
	// checkInterval is gpus.shares.checkIntervalMilliseconds (zero: the
	// default).
	checkInterval time.Duration
	// mpsShm and mpsMemory are gpus.mps's sizes in bytes (zero: the
	// defaults).
	mpsShm, mpsMemory int64
	// noClaimStatus: gpus.claimStatus is Off (zero: Write).
	noClaimStatus bool
}

// MPSShmSize is the size of each MPS daemon's shared memory, in bytes
// (gpus.mps.shmSize).
func (p GPUPolicy) MPSShmSize() int64 {
	return orDefault(p.mpsShm, configv1alpha1.DefaultMPSShmSize)
}

// MPSDaemonMemoryLimit is the memory limit of each MPS daemon's cgroup,
// in bytes (gpus.mps.daemonMemoryLimit).
func (p GPUPolicy) MPSDaemonMemoryLimit() int64 {
	return orDefault(p.mpsMemory, configv1alpha1.DefaultMPSDaemonMemoryLimit)
}

func orDefault(v int64, def configv1alpha1.Quantity) int64 {
	if v != 0 {
		return v
	}
	b, err := configv1alpha1.Bytes(def, 0, 1<<62)
	if err != nil {
		panic(err) // the built-in defaults are valid quantities
	}
	return b
}

// WritesClaimStatus reports whether prepared GPU devices get entries in
// their claims' status.devices (gpus.claimStatus Write).
func (p GPUPolicy) WritesClaimStatus() bool { return !p.noClaimStatus }

// StopsShareOveruse reports whether a process that overruns a GPU share is
// stopped (gpus.shares.overuse Stop) rather than only reported.
func (p GPUPolicy) StopsShareOveruse() bool { return !p.report }

// ShareCheckInterval is how often GPU shares are policed.
func (p GPUPolicy) ShareCheckInterval() time.Duration {
	if p.checkInterval == 0 {
		return configv1alpha1.DefaultShareCheckIntervalMilliseconds * time.Millisecond
	}
	return p.checkInterval
}

// GPUSettings is who owns a GPU's MIG mode, compute mode and time slice,
// as the file names it.
type GPUSettings = configv1alpha1.GPUSettings

// The values of gpus.settings.
const (
	SettingsManage = configv1alpha1.GPUSettingsManage
	SettingsLeave  = configv1alpha1.GPUSettingsLeave
)

// GPUPolicy returns the validated GPU policy.
func (c *AgentConfig) GPUPolicy() GPUPolicy { return c.gpu }

// OffersMIGProfile reports whether the MIG profile of that name
// ("1g.10gb+me") is published.
func (p GPUPolicy) OffersMIGProfile(name string) bool { return p.migProfiles.Offers(name) }

// Settings is gpus.settings: SettingsManage or SettingsLeave, never empty.
func (p GPUPolicy) Settings() GPUSettings {
	if p.leave {
		return SettingsLeave
	}
	return SettingsManage
}

// ManagesSettings reports whether the agent may change GPU settings (MIG
// mode, compute mode, time slice) for claims: gpus.settings is Manage.
func (p GPUPolicy) ManagesSettings() bool { return !p.leave }

func gpuPolicy(g *configv1alpha1.GPUConfig) GPUPolicy {
	if g == nil {
		return GPUPolicy{}
	}
	p := GPUPolicy{migProfiles: g.MIGProfiles.DeepCopy(), leave: g.Settings == configv1alpha1.GPUSettingsLeave,
		noClaimStatus: g.ClaimStatus == configv1alpha1.GPUClaimStatusOff}
	if s := g.Shares; s != nil {
		p.report = s.Overuse == configv1alpha1.ShareOveruseReport
		if s.CheckIntervalMilliseconds != nil {
			p.checkInterval = time.Duration(*s.CheckIntervalMilliseconds) * time.Millisecond
		}
	}
	if m := g.MPS; m != nil {
		// Validated: the errors are nil.
		p.mpsShm, _ = configv1alpha1.Bytes(m.ShmSize, 0, 1<<62)
		p.mpsMemory, _ = configv1alpha1.Bytes(m.DaemonMemoryLimit, 0, 1<<62)
	}
	return p
}
