// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nvml

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// switchWithoutReset: the architecture applies a MIG mode change at once.
//
// Hardware quirk: Hopper and later apply a MIG mode change at once. On
// Ampere it stays pending (GetMigMode: current != pending) until the GPU
// is reset, which needs the GPU idle or a reboot. Unknown architectures
// are assumed to need the reset.
func switchWithoutReset(arch nvml.DeviceArchitecture) bool {
	return arch == nvml.DEVICE_ARCH_HOPPER || arch == nvml.DEVICE_ARCH_BLACKWELL || arch == nvml.DEVICE_ARCH_RUBIN
}

// MIGEnabled reports the GPU's current MIG mode; false where the GPU has
// no MIG.
func (b *Backend) MIGEnabled(busID string) (bool, error) {
	var on bool
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		current, _, ret := dev.GetMigMode()
		if ok, err := ref.optional("GetMigMode", ret); err != nil || !ok {
			return err
		}
		on = current == nvml.DEVICE_MIG_ENABLE
		return nil
	})
	return on, err
}

// SetMIGMode turns MIG mode on or off; nothing happens when it already is.
// It refuses, with errors wrapping ErrResetRequired or ErrInUse, where the
// hardware would need a reset or would refuse:
//   - Ampere (and unknown architectures): the new mode stays pending until
//     a GPU reset, which would kill whatever else runs on the GPU; the
//     agent never resets a GPU, so it does not switch there at all;
//   - GPU instances exist (NVML: ERROR_IN_USE; they must be destroyed
//     first), or processes run on the GPU (the driver refuses while a
//     context is open).
//
// After a switch NVML may have re-bound the GPU: read its minor again.
func (b *Backend) SetMIGMode(busID string, enabled bool) error {
	return b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		want := nvml.DEVICE_MIG_DISABLE
		if enabled {
			want = nvml.DEVICE_MIG_ENABLE
		}
		current, pending, ret := dev.GetMigMode()
		if ret != nvml.SUCCESS {
			return ref.err("GetMigMode", ret)
		}
		if current == want && pending == want {
			return nil
		}
		arch, ret := dev.GetArchitecture()
		if ret != nvml.SUCCESS {
			return ref.err("GetArchitecture", ret)
		}
		if !switchWithoutReset(arch) {
			return fmt.Errorf("%s: switching MIG mode %s needs a GPU reset on %s GPUs, which the agent never does (set it with nvidia-smi -mig and reset the GPU): %w",
				ref, onOff(enabled), archName(arch), ErrResetRequired)
		}
		if current == nvml.DEVICE_MIG_ENABLE {
			if n, err := b.countInstances(dev, ref); err != nil {
				return err
			} else if n > 0 {
				return fmt.Errorf("%s: cannot switch MIG mode %s: %d GPU instances exist: %w", ref, onOff(enabled), n, ErrInUse)
			}
		}
		if n, err := runningProcesses(dev, ref); err != nil {
			return err
		} else if n > 0 {
			return fmt.Errorf("%s: cannot switch MIG mode %s: %d processes run on the GPU: %w", ref, onOff(enabled), n, ErrInUse)
		}
		activation, ret := dev.SetMigMode(want)
		if ret == nvml.ERROR_IN_USE {
			return fmt.Errorf("%s: SetMigMode(%s): %w (%w)", ref, onOff(enabled), ret, ErrInUse)
		}
		if ret != nvml.SUCCESS {
			return ref.err(fmt.Sprintf("SetMigMode(%s)", onOff(enabled)), ret)
		}
		if activation != nvml.SUCCESS {
			return fmt.Errorf("%s: SetMigMode(%s): activation: %w (%w)", ref, onOff(enabled), activation, ErrResetRequired)
		}
		if current, _, ret = dev.GetMigMode(); ret != nvml.SUCCESS {
			return ref.err("GetMigMode", ret)
		} else if current != want {
			return fmt.Errorf("%s: MIG mode still %s after switching it %s: %w", ref, onOff(!enabled), onOff(enabled), ErrResetRequired)
		}
		return nil
	})
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

// countInstances counts the GPU instances of every profile.
func (b *Backend) countInstances(dev nvml.Device, ref gpuRef) (int, error) {
	n := 0
	for index := 0; index < nvml.GPU_INSTANCE_PROFILE_COUNT; index++ {
		info, ret := dev.GetGpuInstanceProfileInfo(index)
		if ret != nvml.SUCCESS {
			continue
		}
		gis, ret := dev.GetGpuInstances(&info)
		if ok, err := ref.optional(fmt.Sprintf("GetGpuInstances(%d)", index), ret); err != nil {
			return 0, err
		} else if ok {
			n += len(gis)
		}
	}
	return n, nil
}

func runningProcesses(dev nvml.Device, ref gpuRef) (int, error) {
	n := 0
	for _, q := range []struct {
		call string
		do   func() ([]nvml.ProcessInfo, nvml.Return)
	}{
		{"GetComputeRunningProcesses", dev.GetComputeRunningProcesses},
		{"GetGraphicsRunningProcesses", dev.GetGraphicsRunningProcesses},
	} {
		procs, ret := q.do()
		if ok, err := ref.optional(q.call, ret); err != nil {
			return 0, err
		} else if ok {
			n += len(procs)
		}
	}
	return n, nil
}

// invalidGIID is NVML's INVALID_GPU_INSTANCE_ID: the GPU instance of a
// time-sliced vGPU.
const invalidGIID = 0xFFFFFFFF

// VGPUInstanceOf returns the GPU instance that hosts the vGPU whose
// mediated device has the given UUID, -1 for a time-sliced vGPU. The error
// wraps ErrNotFound when no active vGPU of the GPU has that mdev.
//
// Hardware quirk: for a MIG-backed vGPU type the vendor driver, not the
// caller, picks the GPU instance when the mdev is created (one of that
// profile without a vGPU), so this is how to learn which one it took.
func (b *Backend) VGPUInstanceOf(busID, mdevUUID string) (int, error) {
	gi := -1
	err := b.onGPU(busID, func(dev nvml.Device, ref gpuRef) error {
		vgpus, ret := dev.GetActiveVgpus()
		if ret != nvml.SUCCESS {
			return ref.err("GetActiveVgpus", ret)
		}
		for _, v := range vgpus {
			id, ret := v.GetMdevUUID()
			if ret != nvml.SUCCESS || id != mdevUUID {
				continue
			}
			if !b.has("nvmlVgpuInstanceGetGpuInstanceId") {
				return nil // a driver without MIG-backed vGPU
			}
			g, ret := v.GetGpuInstanceId()
			if ret != nvml.SUCCESS {
				return ref.err(fmt.Sprintf("vGPU %s: GetGpuInstanceId", mdevUUID), ret)
			}
			if uint32(g) != invalidGIID && g >= 0 {
				gi = g
			}
			return nil
		}
		return fmt.Errorf("%s: no active vGPU with mdev %s: %w", ref, mdevUUID, ErrNotFound)
	})
	return gi, err
}
