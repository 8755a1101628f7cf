// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

// Package backend opens the hardware a --hardware flag names: the host's
// real NVML and sysfs/netlink, or a mock node. Both give the same backends
// (nvml, sriov) so everything above runs unchanged on either.
package backend

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/backend/nvml"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/backend/vfiopci"
	"github.com/hwdra/hwdra/internal/hw"
)

// Host is the --hardware value for the machine's real devices.
const Host = "host"

// MockPrefix starts a --hardware value naming a mock profile.
const MockPrefix = "mock:"

// Node is a node's hardware backends.
type Node struct {
	mu  sync.Mutex
	gpu *nvml.Backend // initialised NVML; nil without
	// nvmlPending is an NVML whose Init failed on a node whose PCI bus
	// shows NVIDIA GPUs: a driver (container) not ready yet.
	nvmlPending *nvml.Backend
	// NIC is how to discover SR-IOV NICs.
	NIC sriov.Options
	// Passthrough finds the GPUs bound to vfio-pci.
	Passthrough *vfiopci.Scanner
	// DevRoot, ProcRoot and SysfsRoot are where the host's device nodes,
	// procfs and sysfs are ("/dev", "/proc", "/sys"); the mock's trees on
	// mock hardware.
	DevRoot, ProcRoot, SysfsRoot string
	// Sysfs writes sysfs attributes (mediated devices); on mock hardware it
	// also plays the kernel's part.
	Sysfs nvml.SysfsWriter
	// VFs reads and applies VF settings.
	VFs hw.VFConfigurator
	// RDMA moves VFs' RDMA devices between network namespaces.
	RDMA hw.RDMANetns
	// VFLinks finds VF netdevs by identity where the kernel cannot (the
	// mock's veth stand-ins); nil on a host, where a netdev's parent
	// device names its PCI function.
	VFLinks hw.VFLinks
	// HostNetns is where the node's netdevs are when in no pod: "" for
	// the agent's own namespace, or the mock's stand-in for it.
	HostNetns string
	// NoLinks: the NICs' netdevs are not links netlink can watch (mock
	// NICs without veth stand-ins): link health comes from sysfs alone.
	NoLinks bool
	// GPUDevRoot is where the GPUs' device nodes are, GPUDevNodeRoot the
	// same directory as the node names it (they differ in a container);
	// DriverSpecDirs are searched for the NVIDIA Container Toolkit's CDI
	// spec (nil: the defaults). Set once NVML is up.
	GPUDevRoot, GPUDevNodeRoot string
	DriverSpecDirs             []string
	// NoDevNodes: DevRoot holds no device nodes to look at, only their
	// names' absence (mock hardware not run as root creates none).
	NoDevNodes bool
	// Programs are the NVIDIA driver's programs (nvidia-smi, the MPS
	// control daemon): the driver root's, the mock's stand-ins on mock
	// hardware. Set once NVML is up.
	Programs nvml.Programs

	// driverRoot is where the NVIDIA driver is looked for (nil on mock
	// hardware): a pending NVML is made anew at each retry, found again,
	// as the library may have appeared since.
	driverRoot *DriverRoot
	// driver is the driver installation as last found.
	driver Driver
	// sim is the simulated hardware behind a mock node (mock.go), nil on
	// a host; Close removes it.
	sim io.Closer
	// settle makes the simulated sysfs follow netdevs that moved (nil on
	// a host).
	settle func()
}

// Settle makes sysfs current after netdevs moved: the kernel's is at once;
// the simulator's follows link events.
func (n *Node) Settle() {
	if n.settle != nil {
		n.settle()
	}
}

// Options say how to open the hardware.
type Options struct {
	// DriverRoot is the NVIDIA driver's root ("host" hardware only).
	DriverRoot DriverRoot
	// Logger says what opening found (NVML missing); default klog's.
	Logger klog.Logger
}

// Open opens "host" or "mock:<profile>" (a built-in name or a YAML file).
func Open(spec string) (*Node, error) { return OpenWith(spec, Options{}) }

// OpenWith is Open with options.
func OpenWith(spec string, opts Options) (*Node, error) {
	logger := opts.Logger
	if logger.GetSink() == nil {
		logger = klog.Background()
	}
	switch {
	case spec == Host:
		return openHost(opts.DriverRoot, logger), nil
	case strings.HasPrefix(spec, MockPrefix):
		return openMock(strings.TrimPrefix(spec, MockPrefix), logger)
	default:
		return nil, fmt.Errorf("--hardware %q: want %q or %q<profile>%s", spec, Host, MockPrefix, mockProfiles())
	}
}

func openHost(root DriverRoot, logger klog.Logger) *Node {
	passthrough, _ := vfiopci.New(sriov.DefaultSysfsRoot) // "/sys": always valid
	n := &Node{
		Passthrough: passthrough,
		NIC:         sriov.Options{SysfsRoot: sriov.DefaultSysfsRoot},
		DevRoot:     "/dev", ProcRoot: "/proc", SysfsRoot: sriov.DefaultSysfsRoot,
		Sysfs: nvml.SysfsFiles(sriov.DefaultSysfsRoot), VFs: sriov.NetlinkVFConfigurator{}, RDMA: sriov.NetlinkRDMA{},
		driverRoot: &root,
	}
	n.findDriver(logger)
	n.openNVML(n.driver.newNVML(sriov.DefaultSysfsRoot), logger)
	return n
}

// findDriver finds the driver installation (again) and says where it is
// when that changed.
func (n *Node) findDriver(logger klog.Logger) {
	d := n.driverRoot.Find()
	if d.String() != n.driver.String() {
		logger.Info("NVIDIA driver: "+d.String(), "root", d.Root.Path, "layout", d.Layout, "given", n.driverRoot.Path != "")
	}
	n.driver = d
	n.DriverSpecDirs = d.specDirs()
}

// DriverFiles are the options of the driver's files for GPU containers
// on this node (driverlibs): the toolkit's spec folders with the
// runtime's cdiDir, and, once NVML is up, the driver root as this
// process sees it and as the container runtime does (they differ where
// the agent runs in a container with the node's / or the driver root
// mounted elsewhere; on mock hardware the runtime sees the mock's files
// where this process does), the GPUs' device root and NVML. hook is
// nvidia-cdi-hook on the node ("" for none).
func (n *Node) DriverFiles(cdiDir, hook string) driverlibs.Options {
	o := driverlibs.Options{SpecDirs: driverlibs.SpecDirs(n.DriverSpecDirs, cdiDir), HookPath: hook}
	gpu := n.GPU()
	if gpu == nil {
		return o // GPUs bound to vfio-pci only, or NVML not up: nothing to generate from
	}
	d := n.Driver()
	o.NVML = gpu.Library()
	o.Root, o.NodeRoot = d.Root.Mount, d.Root.Path
	if n.sim != nil {
		o.NodeRoot = d.Root.Mount
	}
	o.DevRoot = filepath.Dir(n.GPUDevRoot)
	return o
}

// Driver is the NVIDIA driver installation as last found: where its root,
// NVML and programs are.
func (n *Node) Driver() Driver {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.driver
}

// openNVML initialises NVML. Where that fails but the PCI bus shows NVIDIA
// GPUs, the driver is not ready yet: NVML stays pending (InitNVML).
func (n *Node) openNVML(b *nvml.Backend, logger klog.Logger) {
	err := b.Init()
	switch {
	case err == nil:
		n.gpu = b
		n.nvmlUp()
	case nvidiaGPUsOnBus(n.SysfsRoot):
		n.nvmlPending = b
		logger.Info("NVML unavailable, but the PCI bus shows NVIDIA GPUs: waiting for the driver", "err", err, "driver", n.driver.String())
	default:
		// A NIC-only node has no NVIDIA driver: not an error.
		logger.Info("No GPUs: NVML unavailable", "err", err, "driver", n.driver.String())
	}
}

// GPU is the node's NVML once usable, nil before (or without GPUs).
func (n *Node) GPU() *nvml.Backend {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gpu
}

// NVMLPending reports whether NVML failed to start on a node with NVIDIA
// GPUs: InitNVML may succeed later.
func (n *Node) NVMLPending() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.nvmlPending != nil
}

// InitNVML tries a pending NVML again; nil once NVML is usable.
func (n *Node) InitNVML() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.gpu != nil {
		return nil
	}
	if n.nvmlPending == nil {
		return nvml.ErrNoNVML
	}
	if n.driverRoot != nil {
		n.findDriver(klog.Background())
		n.nvmlPending = n.driver.newNVML(n.SysfsRoot)
	}
	if err := n.nvmlPending.Init(); err != nil {
		return err
	}
	n.gpu, n.nvmlPending = n.nvmlPending, nil
	n.nvmlUp()
	return nil
}

// nvmlUp finds the GPUs' device nodes once the driver is there.
func (n *Node) nvmlUp() {
	if n.driverRoot != nil {
		n.GPUDevRoot, n.GPUDevNodeRoot = n.driver.devRoot()
		n.Programs = n.driver.programs()
	}
}

// nvidiaGPUsOnBus reports whether sysfs lists an NVIDIA display or 3D
// controller (vendor 0x10de, class 0x03xxxx) for the NVIDIA driver: one
// bound to vfio-pci needs none.
func nvidiaGPUsOnBus(sysfs string) bool {
	dir := filepath.Join(sysfs, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, e := range entries {
		vendor, _ := os.ReadFile(filepath.Join(dir, e.Name(), "vendor"))
		class, _ := os.ReadFile(filepath.Join(dir, e.Name(), "class"))
		driver, _ := os.Readlink(filepath.Join(dir, e.Name(), "driver"))
		if strings.TrimSpace(string(vendor)) == "0x10de" && strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") &&
			filepath.Base(driver) != vfiopci.Driver {
			return true
		}
	}
	return false
}

// Inventory probes everything. A problem confined to some devices is
// returned with what could be read; the caller logs it.
func (n *Node) Inventory(ctx context.Context) (hw.Inventory, error) {
	var (
		inv  hw.Inventory
		errs []error
	)
	if gpu := n.GPU(); gpu != nil {
		gpus, err := gpu.GPUs(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("GPUs: %w", err))
		}
		inv.GPUs = gpus
		inv.UnreadableGPUs = nvml.Unreadable(err)
	}
	if n.Passthrough != nil {
		gpus, err := n.Passthrough.GPUs()
		if err != nil {
			errs = append(errs, fmt.Errorf("passthrough GPUs: %w", err))
		}
		inv.PassthroughGPUs = gpus
	}
	pfs, err := sriov.Discover(n.NIC)
	if err != nil {
		errs = append(errs, fmt.Errorf("NICs: %w", err))
	}
	inv.PFs = pfs
	return inv, errors.Join(errs...)
}

// Probe opens spec, takes its inventory and closes it: what a node has,
// for tests and tools that read a profile once. Unlike Inventory it
// fails on any device it cannot read.
func Probe(ctx context.Context, spec string) (hw.Inventory, error) {
	n, err := Open(spec)
	if err != nil {
		return hw.Inventory{}, err
	}
	inv, err := n.Inventory(ctx)
	return inv, errors.Join(err, n.Close())
}

// Close releases NVML and removes mock hardware.
func (n *Node) Close() error {
	var errs []error
	if gpu := n.GPU(); gpu != nil {
		errs = append(errs, gpu.Shutdown())
	}
	if n.sim != nil {
		errs = append(errs, n.sim.Close())
	}
	return errors.Join(errs...)
}
