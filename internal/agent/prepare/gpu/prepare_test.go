// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package gpu

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	oci "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/gpusim"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// wantNumbers is the major:minor a container must get for a device node
// of the mock node, as its kernel (the mock's /proc/devices and driver
// files) defines them.
func wantNumbers(t *testing.T, path string) (int64, int64) {
	t.Helper()
	name := strings.TrimPrefix(path, "/dev/")
	num := func(s string) int64 {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("device node %s", path)
		}
		return n
	}
	switch {
	case name == "nvidiactl":
		return gpusim.NVIDIAMajor, 255
	case name == "nvidia-modeset":
		return gpusim.NVIDIAMajor, 254
	case name == "nvidia-uvm":
		return gpusim.NVIDIAUVMMajor, 0
	case name == "nvidia-uvm-tools":
		return gpusim.NVIDIAUVMMajor, 1
	case name == "vfio/vfio":
		return 10, 196
	case strings.HasPrefix(name, "vfio/"):
		return nodefs.VFIOMajor, num(strings.TrimPrefix(name, "vfio/")) - 128
	case strings.HasPrefix(name, "nvidia-caps/nvidia-cap"):
		return gpusim.NVIDIACapsMajor, num(strings.TrimPrefix(name, "nvidia-caps/nvidia-cap"))
	case strings.HasPrefix(name, "nvidia"):
		return gpusim.NVIDIAMajor, num(strings.TrimPrefix(name, "nvidia"))
	}
	t.Fatalf("unexpected device node %s", path)
	return 0, 0
}

// checkInjected checks an OCI spec's devices and environment after CDI
// injection: character devices with the kernel's numbers, each allowed in
// the device cgroup, the device's own environment winning over the
// image's and the driver spec's.
func checkInjected(t *testing.T, e *env, spec *oci.Spec, wantNodes []string, wantEnv map[string]string) {
	t.Helper()
	var paths []string
	for _, d := range spec.Linux.Devices {
		paths = append(paths, d.Path)
		major, minor := wantNumbers(t, d.Path)
		if d.Type != "c" || d.Major != major || d.Minor != minor {
			t.Errorf("%s: %s %d:%d, want c %d:%d", d.Path, d.Type, d.Major, d.Minor, major, minor)
		}
		allowed := slices.ContainsFunc(spec.Linux.Resources.Devices, func(r oci.LinuxDeviceCgroup) bool {
			return r.Allow && r.Type == "c" && r.Major != nil && *r.Major == major && r.Minor != nil && *r.Minor == minor
		})
		if !allowed {
			t.Errorf("%s: not allowed in the device cgroup", d.Path)
		}
		// The host's node, where the mock made one, has the same numbers.
		var st unix.Stat_t
		if err := unix.Stat(filepath.Join(e.hw.DevRoot(), strings.TrimPrefix(d.Path, "/dev/")), &st); err == nil {
			if int64(unix.Major(st.Rdev)) != major || int64(unix.Minor(st.Rdev)) != minor {
				t.Errorf("%s: host node is %d:%d", d.Path, unix.Major(st.Rdev), unix.Minor(st.Rdev))
			}
		}
	}
	slices.Sort(paths)
	slices.Sort(wantNodes)
	if !slices.Equal(paths, wantNodes) {
		t.Errorf("device nodes %v, want %v", paths, wantNodes)
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	for k, v := range wantEnv {
		if env[k] != v {
			t.Errorf("env %s=%q, want %q (all: %v)", k, env[k], v, spec.Process.Env)
		}
	}
}

func attr(d kubeletplugin.Device, name string) string {
	if d.Metadata == nil {
		return "<no metadata>"
	}
	a, ok := d.Metadata.Attributes[name]
	if !ok {
		a, ok = d.Metadata.Attributes[DriverName+"/"+name]
	}
	switch {
	case !ok:
		return "<unset>"
	case a.StringValue != nil:
		return *a.StringValue
	case a.IntValue != nil:
		return strconv.FormatInt(*a.IntValue, 10)
	}
	return "<other>"
}

func TestPrepareUnprepare(t *testing.T) {
	libs := []string{"/dev/nvidia-modeset"} // the driver spec's control node
	for _, tc := range []struct {
		name, profile string
		req           request
		// during is the hardware while prepared (after: as before).
		during func(gpu string) string
		check  func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec)
	}{{
		name: "full GPU", profile: "gpus: [{model: h100-80gb, count: 2}]",
		req:    request{name: "gpu", cel: `profile == "full"`},
		during: func(string) string { return "" },
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			g := e.gpuOf(d.DeviceName)
			checkInjected(t, e, spec, append([]string{fmt.Sprintf("/dev/nvidia%d", g.Minor), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"}, libs...),
				map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", envName(d.DeviceName, "UUID"): g.UUID, "NVIDIA_CTK_LIBCUDA_DIR": "/usr/lib/x86_64-linux-gnu"})
			if attr(d, "uuid") != g.UUID || attr(d, "productName") != "NVIDIA H100 80GB HBM3" || attr(d, "resource.kubernetes.io/pciBusID") != g.PCIBusID {
				t.Errorf("metadata %v", d.Metadata)
			}
			if len(spec.Mounts) != 1 || len(spec.Hooks.CreateContainer) != 1 {
				t.Errorf("driver libraries not injected: mounts %v, hooks %v", spec.Mounts, spec.Hooks)
			}
		},
	}, {
		name: "full GPU, MIG switched off and back", profile: "gpus: [{model: h100-80gb, count: 1, mig: true}]",
		req:    request{name: "gpu", cel: `profile == "full"`},
		during: func(gpu string) string { return gpu + " mig=false\n" },
	}, {
		name: "dynamic MIG", profile: "gpus: [{model: h100-80gb, count: 1}]",
		req:    request{name: "mig", cel: `profile == "1g.10gb" && device.attributes["gpu.hwdra.io"].placementStart == 6`},
		during: func(gpu string) string { return gpu + " mig=true gi(profile 0 at 6, 1 CIs)\n" },
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			g := e.gpuOf(d.DeviceName)
			list, _ := e.nvml.GPUInstances(g.PCIBusID)
			gi, ci := list[0].ID, list[0].ComputeInstances[0]
			base := 3 + g.Minor*135 + gi*9 // the mock's mig-minors numbering
			checkInjected(t, e, spec, append([]string{fmt.Sprintf("/dev/nvidia%d", g.Minor), "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
				fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", base), fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", base+1+ci.ID)}, libs...),
				map[string]string{"NVIDIA_VISIBLE_DEVICES": "void", envName(d.DeviceName, "UUID"): ci.UUID})
			for name, want := range map[string]string{"uuid": ci.UUID, "parentUUID": g.UUID, "profile": "1g.10gb",
				"placementStart": "6", "gpuInstanceID": strconv.Itoa(gi), "type": "mig"} {
				if got := attr(d, name); got != want {
					t.Errorf("metadata %s = %q, want %q", name, got, want)
				}
			}
		},
	}, {
		name: "dynamic MIG, 2 of 4 compute slices", profile: "gpus: [{model: h100-80gb, count: 1, mig: true}]",
		req: request{name: "mig", cel: `profile == "4g.40gb"`,
			config: `{"apiVersion": "gpu.hwdra.io/v1alpha1", "kind": "GpuConfig", "mig": {"computeInstanceSlices": 2}}`},
		during: func(gpu string) string { return gpu + " mig=true gi(profile 3 at 0, 1 CIs)\n" },
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			list, _ := e.nvml.GPUInstances(e.gpuOf(d.DeviceName).PCIBusID)
			if ci := list[0].ComputeInstances[0]; ci.ProfileID != nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE {
				t.Errorf("compute instance profile %d, want the 2-slice one", ci.ProfileID)
			}
		},
	}, {
		name: "static MIG partition", profile: "h100-mig",
		req: request{name: "mig", cel: `profile == "3g.40gb" && device.attributes["gpu.hwdra.io"].placementStart == 0`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			g := e.gpuOf(d.DeviceName)
			if want := g.MIG.Instances[0].ComputeInstances[0].UUID; attr(d, "uuid") != want {
				t.Errorf("uuid %s, want the static instance's %s", attr(d, "uuid"), want)
			}
		},
	}, {
		name: "vGPU", profile: "h100-vgpu",
		req: request{name: "vgpu", cel: `profile == "H100-10C"`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			mdevs := e.hw.MdevUUIDs()
			if len(mdevs) != 1 || attr(d, "mdevUUID") != mdevs[0] || attr(d, "vgpuType") != "NVIDIA H100-10C" {
				t.Fatalf("mdevs %v, metadata %v", mdevs, d.Metadata)
			}
			group, _ := e.driver.mdevs.IOMMUGroup(mdevs[0])
			checkInjected(t, e, spec, []string{"/dev/vfio/vfio", fmt.Sprintf("/dev/vfio/%d", group)},
				map[string]string{envName(d.DeviceName, "MDEV"): mdevs[0], "NVIDIA_VISIBLE_DEVICES": "void"})
		},
	}, {
		name: "MIG-backed vGPU", profile: "h100-vgpu",
		req: request{name: "vgpu", cel: `profile == "H100-3-40C"`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			g := e.gpuOf(d.DeviceName)
			list, _ := e.nvml.GPUInstances(g.PCIBusID)
			if len(list) != 1 || len(e.hw.MdevUUIDs()) != 1 || attr(d, "gpuInstanceID") != strconv.Itoa(list[0].ID) ||
				attr(d, "migProfile") != "3g.40gb" || attr(d, "placementStart") != strconv.Itoa(list[0].Placement.Start) {
				t.Errorf("instances %+v, mdevs %v, metadata %v", list, e.hw.MdevUUIDs(), d.Metadata)
			}
			if on, _ := e.nvml.MIGEnabled(g.PCIBusID); !on {
				t.Error("MIG mode off under a MIG-backed vGPU")
			}
		},
	}, {
		// vGPUs through the vendor-specific VFIO framework and GPUs bound
		// to vfio-pci: a VF made a vGPU (its group node, its address in
		// the environment and metadata), undone at unprepare; a
		// passthrough GPU's group node.
		name: "time-sliced vGPU", profile: vfioHost, req: request{name: "vgpu", cel: `profile == "H100-10C"`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			vfs := e.hw.VGPUVFs()
			if len(vfs) != 1 {
				t.Fatalf("vGPU VFs %v", vfs)
			}
			vf, _, _ := strings.Cut(vfs[0], "=")
			group, err := e.driver.vfs.IOMMUGroup(vf)
			if err != nil {
				t.Fatal(err)
			}
			checkInjected(t, e, spec, []string{"/dev/vfio/vfio", fmt.Sprintf("/dev/vfio/%d", group)},
				map[string]string{envName(d.DeviceName, "PCI"): vf, "NVIDIA_VISIBLE_DEVICES": "void"})
			if attr(d, "resource.kubernetes.io/pciBusID") != vf || attr(d, "parentPciBusID") != e.gpuOf(d.DeviceName).PCIBusID ||
				attr(d, "vgpuFramework") != "vfio" || attr(d, "mdevUUID") != "<unset>" {
				t.Errorf("metadata %v", d.Metadata.Attributes)
			}
			if len(e.hw.MdevUUIDs()) != 0 {
				t.Errorf("mediated devices %v on a VFIO framework host", e.hw.MdevUUIDs())
			}
		},
	}, {
		name: "MIG-backed vGPU", profile: vfioHost, req: request{name: "vgpu", cel: `profile == "H100-3-40C"`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			g := e.gpuOf(d.DeviceName)
			list, _ := e.nvml.GPUInstances(g.PCIBusID)
			if len(list) != 1 || len(e.hw.VGPUVFs()) != 1 || attr(d, "gpuInstanceID") != fmt.Sprint(list[0].ID) ||
				attr(d, "placementStart") != fmt.Sprint(list[0].Placement.Start) {
				t.Errorf("instances %+v, VFs %v, metadata %v", list, e.hw.VGPUVFs(), d.Metadata.Attributes)
			}
		},
	}, {
		name: "passthrough GPU", profile: passthroughNode, req: request{name: "gpu", cel: `type == "passthrough"`},
		check: func(t *testing.T, e *env, d kubeletplugin.Device, spec *oci.Spec) {
			var g = e.passthrough[0]
			if d.DeviceName != device.PassthroughName(g.PCIBusID) {
				g = e.passthrough[1]
			}
			checkInjected(t, e, spec, []string{"/dev/vfio/vfio", fmt.Sprintf("/dev/vfio/%d", g.IOMMUGroup)},
				map[string]string{envName(d.DeviceName, "PCI"): g.PCIBusID, "NVIDIA_VISIBLE_DEVICES": "void"})
			if attr(d, "resource.kubernetes.io/pciBusID") != g.PCIBusID || attr(d, "productName") != g.ProductName || attr(d, "type") != "passthrough" {
				t.Errorf("metadata %v", d.Metadata.Attributes)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, true)
			before := e.hwState()
			c := e.claim(tc.req)
			devs := e.mustPrepare(c)
			if len(devs) != 1 {
				t.Fatalf("devices %+v", devs)
			}
			during := e.hwState()
			if tc.during != nil {
				g := e.gpuOf(devs[0].DeviceName).PCIBusID
				if want := tc.during(g); want != "" && !strings.Contains(during, want) {
					t.Errorf("hardware while prepared:\n%s\nwant a line %q", during, want)
				} else if want == "" && during != before {
					t.Errorf("hardware changed:\n%s\nwas\n%s", during, before)
				}
			}
			spec := e.inject(devs)
			if tc.check != nil {
				tc.check(t, e, devs[0], spec)
			}
			again := e.mustPrepare(c) // the kubelet retries: same answer, hardware untouched
			if !slices.Equal(again[0].CDIDeviceIDs, devs[0].CDIDeviceIDs) || e.hwState() != during {
				t.Errorf("second prepare: %v, hardware\n%s", again[0].CDIDeviceIDs, e.hwState())
			}
			e.unprepare(c)
			e.wantAsBefore(t, before, "after unprepare")
			if entries, _ := os.ReadDir(filepath.Join(e.dir, "cdi")); len(entries) != 0 {
				t.Errorf("CDI specs left: %v", entries)
			}
			e.mustPrepare(c) // and once more, from scratch
			e.unprepare(c)
		})
	}
}

// gpuOf is the GPU a published device name belongs to.
func (e *env) gpuOf(device string) hw.GPU {
	for _, g := range e.gpus {
		if strings.HasPrefix(device, "gpu-"+strings.NewReplacer(":", "-", ".", "-").Replace(g.PCIBusID)) {
			return g
		}
	}
	e.t.Fatalf("no GPU for device %s", device)
	return hw.GPU{}
}

// TestAdminAccessTakesTheDeviceAsItIs: an adminAccess request (monitoring,
// debugging) gets the device as it is: no GPU instance made or destroyed,
// no MIG mode switched, the capability nodes of a partition that exists,
// and its unprepare leaves everything as it was. (The scheduler's
// allocator still charges an admin request's counters, so it never lands
// on a partition a claim holds.)
func TestAdminAccessTakesTheDeviceAsItIs(t *testing.T) {
	e := newEnv(t, `gpus: [{model: h100-80gb, count: 1, mig: true, migInstances: [{profile: 3g.40gb, start: 4}]},
		{model: h100-80gb, count: 1, mig: true}]`, true)
	before := e.hwState()
	for _, tc := range []struct {
		name string
		cel  string
		// the partition's MIG capability nodes, besides the GPU's own
		caps int
	}{
		{"a static partition", `profile == "3g.40gb" && device.attributes["gpu.hwdra.io"].placementStart == 4`, 2},
		{"a MIG partition that does not exist", `profile == "1g.10gb"`, 0},
		{"the whole GPU, in MIG mode", `profile == "full"`, 0}, // the second GPU: the first cannot switch
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := e.claim(request{name: "a", cel: tc.cel, admin: true})
			defer e.alloc.Release(admin)
			devs := e.mustPrepare(admin)
			if got := e.hwState(); got != before {
				t.Errorf("hardware after the admin prepare:\n%s\nwant\n%s", got, before)
			}
			spec := e.inject(devs)
			caps := 0
			for _, d := range spec.Linux.Devices {
				if strings.HasPrefix(d.Path, "/dev/nvidia-caps/") {
					caps++
				}
			}
			if caps != tc.caps {
				t.Errorf("%d MIG capability nodes, want %d", caps, tc.caps)
			}
			if want := e.gpus[0].MIG.Instances[0].ComputeInstances[0].UUID; tc.caps > 0 && attr(devs[0], "uuid") != want {
				t.Errorf("admin metadata uuid %q, the partition's is %q", attr(devs[0], "uuid"), want)
			}
			e.unprepare(admin)
			if got := e.hwState(); got != before {
				t.Errorf("hardware after the admin unprepare:\n%s\nwant\n%s", got, before)
			}
		})
	}
}

// TestVGPUSharesEachGetAVGPU: a time-sliced vGPU type is published as
// blocks that claims share; prepare makes one vGPU for each share, in one
// claim (two requests) as across claims, and unprepare removes only the
// claim's own.
func TestVGPUSharesEachGetAVGPU(t *testing.T) {
	e := newEnv(t, "h100-vgpu", true)
	before := e.hwState()
	two := e.claim(request{name: "a", cel: `profile == "H100-10C"`}, request{name: "b", cel: `profile == "H100-10C"`})
	one := e.claim(request{name: "a", cel: `profile == "H100-10C"`})
	results := append(slices.Clone(two.Status.Allocation.Devices.Results), one.Status.Allocation.Devices.Results...)
	for _, r := range results {
		if r.ShareID == nil || r.Device != results[0].Device {
			t.Fatalf("results %+v: want three shares of one block", results)
		}
	}
	devs := append(e.mustPrepare(two), e.mustPrepare(one)...)
	seen := map[string]bool{}
	for _, d := range devs {
		mdev := attr(d, "mdevUUID")
		if d.ShareID == nil || seen[mdev] || len(d.CDIDeviceIDs) != 1 || seen[d.CDIDeviceIDs[0]] {
			t.Fatalf("devices %+v: want a share ID, a vGPU and a CDI device each", devs)
		}
		seen[mdev], seen[d.CDIDeviceIDs[0]] = true, true
	}
	if got := len(e.hw.MdevUUIDs()); got != 3 {
		t.Fatalf("%d vGPUs for three shares", got)
	}
	e.unprepare(two)
	if mdevs := e.hw.MdevUUIDs(); len(mdevs) != 1 || mdevs[0] != attr(devs[2], "mdevUUID") {
		t.Fatalf("vGPUs after unpreparing the two-share claim: %v, want %s", mdevs, attr(devs[2], "mdevUUID"))
	}
	e.unprepare(one)
	if after := e.hwState(); after != before {
		t.Errorf("after unprepare:\n%s\nwant\n%s", after, before)
	}
}
