// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

//go:build !nomock

package backend

import (
	"errors"
	"path/filepath"
	"strings"

	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
	"github.com/hwdra/hwdra/internal/mock"
	"github.com/hwdra/hwdra/internal/mock/nodefs"
	"github.com/hwdra/hwdra/internal/mock/profile"
)

// openMock builds the simulator's node of a profile (a built-in name or a
// YAML file). The real backends run on it unchanged: only the hardware
// under them is simulated. Builds with -tags nomock (the agent's image)
// leave the simulator out (nomock.go).
func openMock(spec string, logger klog.Logger) (*Node, error) {
	m, err := mock.Open(spec)
	if err != nil {
		return nil, err
	}
	nics := m.NICs()
	n := &Node{
		sim: m, DevRoot: m.DevRoot(), ProcRoot: m.ProcRoot(), SysfsRoot: m.Sysfs,
		GPUDevRoot: m.DevRoot(), GPUDevNodeRoot: m.DevRoot(),
		Sysfs: m.SysfsWriter(), VFs: nics.VFConfigurator(), RDMA: nics.RDMA(),
		HostNetns: nics.Netns(), settle: nics.Settle, NoLinks: !nics.HasVeths(),
		NIC:        sriov.Options{SysfsRoot: m.Sysfs, Routes: nics, Eswitch: nics},
		NoDevNodes: !nodefs.CanMknod(),
	}
	if nics.HasVeths() {
		n.VFLinks = nics
	}
	// The driver's installation is found as on a host, in the mock's
	// node tree: the same search, the same layouts.
	n.driver = DriverRoot{Host: m.HostRoot()}.Find()
	n.Programs = n.driver.programs()
	// The toolkit's spec is looked for in the mock node's own /etc/cdi and
	// /var/run/cdi, never this machine's.
	n.DriverSpecDirs = []string{filepath.Join(m.HostRoot(), "etc", "cdi"), filepath.Join(m.HostRoot(), "var", "run", "cdi")}
	if n.Passthrough, err = vfiopci.New(m.Sysfs); err != nil {
		return nil, errors.Join(err, m.Close())
	}
	if len(m.Profile.GPUs) > 0 {
		n.openNVML(nvml.New(m.NVML, nvml.WithSysfs(m.Sysfs)), logger)
	}
	return n, nil
}

// Mock is the simulated hardware of a node opened from "mock:<profile>"
// (nil on a host): tests and the lab change it as the world would.
func (n *Node) Mock() *mock.Hardware {
	m, _ := n.sim.(*mock.Hardware)
	return m
}

// mockProfiles names the built-in profiles for an error message.
func mockProfiles() string {
	return " (built-in profiles: " + strings.Join(profile.Builtins(), ", ") + ")"
}
