// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package nic

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/hwdra/hwdra/internal/mock/nodefs"
)

// TestCDI: the specs prepare writes load into the CDI cache and inject
// into an OCI spec as a runtime does: an RDMA share gets its VF's uverbs
// node and rdma_cm, a vfio-pci VF the VFIO container and its group, each
// fully numbered; all get the env var naming the VF, a VF needing no
// device node only that (its claim's spec keeps the claim's record).
func TestCDI(t *testing.T) {
	for _, tc := range []struct {
		name, profile, agentConfig string
		reqs                       []resourceapi.DeviceRequest
		wantNodes                  []string // path major:minor
		wantEnv                    []string
	}{
		{
			name: "RDMA share", profile: cx7Node, reqs: []resourceapi.DeviceRequest{share("rdma-nic", "10G")},
			// mlx5_0 and uverbs0 are the PF's; VF 0 has mlx5_1, uverbs1.
			wantNodes: []string{"/dev/infiniband/rdma_cm 10:58", "/dev/infiniband/uverbs1 231:193"},
			wantEnv:   []string{"HWDRA_SRIOV_RDMA_NIC_PCI_ADDRESS=0000:17:01.0", "HWDRA_SRIOV_RDMA_NIC_RDMA_DEVICE=mlx5_1"},
		},
		{
			// A request's devices are distinct: one share on each PF. The
			// PFs have mlx5_0 and mlx5_1, their VFs mlx5_2.. in order.
			name: "two RDMA shares of one request", reqs: []resourceapi.DeviceRequest{withCount(share("nic", "10G"), 2)},
			profile:   `nics: [{model: cx7, count: 2, vfs: 2, pciAddresses: ["0000:17:00.0", "0000:b1:00.0"], netdevs: [pfa, pfb]}]`,
			wantNodes: []string{"/dev/infiniband/rdma_cm 10:58", "/dev/infiniband/uverbs2 231:194", "/dev/infiniband/uverbs4 231:196"},
			wantEnv: []string{"HWDRA_SRIOV_NIC_0_PCI_ADDRESS=0000:17:01.0", "HWDRA_SRIOV_NIC_0_RDMA_DEVICE=mlx5_2",
				"HWDRA_SRIOV_NIC_1_PCI_ADDRESS=0000:b1:01.0", "HWDRA_SRIOV_NIC_1_RDMA_DEVICE=mlx5_4"},
		},
		{
			name: "vfio-pci VF", agentConfig: exclusiveConfig, reqs: []resourceapi.DeviceRequest{vfRequest("dpdk")},
			profile:   `nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfv], vfDriver: vfio-pci}]`,
			wantNodes: []string{"/dev/vfio/512 509:0", "/dev/vfio/vfio 10:196"},
			wantEnv:   []string{"HWDRA_SRIOV_DPDK_PCI_ADDRESS=0000:31:01.0"},
		},
		{
			name: "iavf share: the variable only", reqs: []resourceapi.DeviceRequest{share("nic", "10G")},
			profile: `nics: [{model: e810, count: 1, vfs: 2, pciAddresses: ["0000:31:00.0"], netdevs: [pfe]}]`,
			wantEnv: []string{"HWDRA_SRIOV_NIC_PCI_ADDRESS=0000:31:01.0"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.profile, tc.agentConfig)
			c := e.allocate(newClaim("", tc.reqs...))
			res := e.mustPrepare(c)
			spec := e.inject(res.Devices)
			var nodes []string
			for _, d := range spec.Linux.Devices {
				nodes = append(nodes, fmt.Sprintf("%s %d:%d", d.Path, d.Major, d.Minor))
				if d.Type != "c" {
					t.Errorf("%s: type %q", d.Path, d.Type)
				}
			}
			sort.Strings(nodes)
			if !reflect.DeepEqual(nodes, tc.wantNodes) {
				t.Errorf("device nodes %v, want %v", nodes, tc.wantNodes)
			}
			var env []string
			for _, kv := range spec.Process.Env {
				if strings.HasPrefix(kv, "HWDRA_") {
					env = append(env, kv)
				}
			}
			sort.Strings(env)
			if !reflect.DeepEqual(env, tc.wantEnv) {
				t.Errorf("env %v, want %v", env, tc.wantEnv)
			}
			// As root the mock made the host nodes the spec points at.
			for _, d := range spec.Linux.Devices {
				if _, err := os.Stat(filepath.Join(e.hw.DevRoot(), strings.TrimPrefix(d.Path, "/dev/"))); nodefs.CanMknod() && err != nil {
					t.Errorf("host node of %s: %v", d.Path, err)
				}
			}
			if err := e.unprepare(c); err != nil {
				t.Fatal(err)
			}
			if specs, _ := filepath.Glob(filepath.Join(e.cdiDir(), "*.json")); len(specs) != 0 {
				t.Errorf("specs left after unprepare: %v", specs)
			}
			e.checkPristine()
		})
	}
}

func withCount(r resourceapi.DeviceRequest, n int64) resourceapi.DeviceRequest {
	r.Exactly.Count = n
	return r
}

// inject loads the CDI directory into a fresh cache and injects the
// devices into an OCI spec, as a container runtime does.
func (e *env) inject(devs []kubeletplugin.Device) *oci.Spec {
	e.t.Helper()
	cache, err := cdi.NewCache(cdi.WithSpecDirs(e.cdiDir()), cdi.WithAutoRefresh(false))
	if err != nil {
		e.t.Fatal(err)
	}
	for path, errs := range cache.GetErrors() {
		if len(errs) > 0 {
			e.t.Fatalf("CDI spec %s: %v", path, errs)
		}
	}
	var ids []string
	for _, d := range devs {
		ids = append(ids, d.CDIDeviceIDs...)
	}
	spec := &oci.Spec{Process: &oci.Process{Env: []string{"PATH=/usr/bin"}}, Linux: &oci.Linux{}}
	if len(ids) == 0 {
		return spec
	}
	if unresolved, err := cache.InjectDevices(spec, ids...); err != nil {
		e.t.Fatalf("inject %v: %v (unresolved %v)", ids, err, unresolved)
	}
	return spec
}
