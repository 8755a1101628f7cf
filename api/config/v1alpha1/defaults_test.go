// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"reflect"
	"strings"
	"testing"
)

// TestDefault: what defaulting writes into the file's rules, and what it
// leaves for Validate to name.
func TestDefault(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   NICRule
		want NICRule
	}{{
		name: "nothing given: shared, the built-in policy",
		in:   NICRule{},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "10G", Minimum: "1G", Step: "1G"}},
	}, {
		name: "step only: the minimum is the step, the default rounds up to a share",
		in:   NICRule{Bandwidth: &Bandwidth{Step: "4G"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "12G", Minimum: "4G", Step: "4G"}},
	}, {
		name: "minimum above the built-in default",
		in:   NICRule{Bandwidth: &Bandwidth{Minimum: "40G", Step: "10G"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Default: "40G", Minimum: "40G", Step: "10G"}},
	}, {
		name: "an invalid step is not copied to the minimum",
		in:   NICRule{Bandwidth: &Bandwidth{Step: "0"}},
		want: NICRule{Mode: ModeShared, Bandwidth: &Bandwidth{Step: "0"}},
	}, {
		name: "exclusive: no policy; valid selector values in canonical form, invalid ones as written",
		in: NICRule{Mode: ModeExclusive, Select: PFSelector{
			PCIAddresses: []string{"B1:00.1", "0000:17:00"}, VendorIDs: []string{"0x15B3"}, DeviceIDs: []string{"101B", "xyz"},
		}},
		want: NICRule{Mode: ModeExclusive, Select: PFSelector{
			PCIAddresses: []string{"0000:b1:00.1", "0000:17:00"}, VendorIDs: []string{"15b3"}, DeviceIDs: []string{"101b", "xyz"},
		}},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			c := &AgentConfig{NICs: []NICRule{tc.in}}
			c.Default()
			if got := c.NICs[0]; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v %+v\nwant %+v %+v", got, got.Bandwidth, tc.want, tc.want.Bandwidth)
			}
		})
	}
}

// TestValidateNamesEveryProblem: one report, every field with its path.
func TestValidateNamesEveryProblem(t *testing.T) {
	t.Parallel()
	c := &AgentConfig{
		NICs: []NICRule{
			{Mode: "dedicated", Bandwidth: &Bandwidth{Default: "1G"}},
			{Bandwidth: &Bandwidth{Step: "0"}, Select: PFSelector{Names: []string{"a/b"}, Drivers: []string{""}}},
		},
		Health: &HealthConfig{XIDs: XIDConfig{Ignore: []uint64{13}, Report: []uint64{13}}, FatalEffect: "Evict"},
		GPUs:   &GPUConfig{MIGProfiles: &ProfileFilter{Include: []string{"1G.*"}}, Settings: "leave"},
		DevicePlugin: &DevicePluginConfig{
			Resources: []string{"nvidia.com/gpu", "gpu", "kubernetes.io/gpu", "nvidia.com/*/x", "Nvidia.com/gpu", "nvidia.com/mig-1g.10gb+me", "nvidia.com/*"},
			OwnedGPUs: &GPUSelector{PCIAddresses: []string{"1b:00.0", "0000:1b:00"}, UUIDs: []string{"GPU-3AE1F2C4-0B6D-4E1A-9C2F-5D7E8F901234", "3ae1f2c4"}},
		},
	}
	c.Default()
	var got []string
	for _, e := range c.Validate() {
		got = append(got, e.Field)
	}
	want := []string{"nics[0].mode", "nics[0].bandwidth", "nics[1].select.names[0]", "nics[1].select.drivers[0]",
		"nics[1].bandwidth.step", "health.xids.report[0]", "health.fatalEffect",
		"gpus.migProfiles.include[0]", "gpus.settings",
		"devicePlugin.resources[1]", "devicePlugin.resources[2]", "devicePlugin.resources[3]", "devicePlugin.resources[4]",
		"devicePlugin.resources[5]", "devicePlugin.ownedGPUs.pciAddresses[1]", "devicePlugin.ownedGPUs.uuids[1]"}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fields %s\nwant   %s", strings.Join(got, " "), strings.Join(want, " "))
	}
}

// TestDefaultDevicePlugin: an empty devicePlugin section gets the device
// plugin's default resource names; owned GPUs are put in canonical form.
func TestDefaultDevicePlugin(t *testing.T) {
	t.Parallel()
	c := &AgentConfig{DevicePlugin: &DevicePluginConfig{OwnedGPUs: &GPUSelector{
		PCIAddresses: []string{"1B:00.0"}, UUIDs: []string{"GPU-3AE1F2C4-0B6D-4E1A-9C2F-5D7E8F901234"},
	}}}
	c.Default()
	want := &DevicePluginConfig{
		Resources: []string{"nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*"},
		OwnedGPUs: &GPUSelector{PCIAddresses: []string{"0000:1b:00.0"}, UUIDs: []string{"GPU-3ae1f2c4-0b6d-4e1a-9c2f-5d7e8f901234"}},
	}
	if !reflect.DeepEqual(c.DevicePlugin, want) {
		t.Errorf("got  %+v %+v\nwant %+v %+v", c.DevicePlugin, c.DevicePlugin.OwnedGPUs, want, want.OwnedGPUs)
	}
	if errs := c.Validate(); len(errs) > 0 {
		t.Errorf("defaulted section invalid: %v", errs)
	}
}

// TestDefaultGPUSettings: a gpus section without settings manages them
// and writes claim status; a file without gpus keeps no section (package
// config reads that as Manage and Write too). An unknown claimStatus is
// refused by name.
func TestDefaultGPUSettings(t *testing.T) {
	t.Parallel()
	c := &AgentConfig{GPUs: &GPUConfig{}}
	c.Default()
	if c.GPUs.Settings != GPUSettingsManage || c.GPUs.ClaimStatus != GPUClaimStatusWrite {
		t.Errorf("settings %q, claimStatus %q: want Manage, Write", c.GPUs.Settings, c.GPUs.ClaimStatus)
	}
	off := &AgentConfig{GPUs: &GPUConfig{ClaimStatus: GPUClaimStatusOff}}
	off.Default()
	if off.GPUs.ClaimStatus != GPUClaimStatusOff || len(off.Validate()) > 0 {
		t.Errorf("claimStatus Off defaulted to %q, %v", off.GPUs.ClaimStatus, off.Validate())
	}
	bad := &AgentConfig{GPUs: &GPUConfig{ClaimStatus: "off"}}
	bad.Default()
	if errs := bad.Validate(); len(errs) != 1 || errs[0].Field != "gpus.claimStatus" {
		t.Errorf("claimStatus off (lower case): %v", errs)
	}
	leave := &AgentConfig{GPUs: &GPUConfig{Settings: GPUSettingsLeave}}
	leave.Default()
	if leave.GPUs.Settings != GPUSettingsLeave || len(leave.Validate()) > 0 {
		t.Errorf("Leave defaulted to %q, %v", leave.GPUs.Settings, leave.Validate())
	}
	none := &AgentConfig{}
	none.Default()
	if none.GPUs != nil {
		t.Errorf("defaulting made a gpus section: %+v", none.GPUs)
	}
}
