// Package backend opens the hardware a --hardware flag names: the host's
// real NVML and sysfs/netlink, or a mock node. Both give the same backends
// (nvml, sriov) so everything above runs unchanged on either.
package backend

import (
	"context"
	"errors"
	"fmt"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/vishvananda/netlink"
	"k8s.io/klog/v2"

	"github.com/hwdra/hwdra/hw"
	"github.com/hwdra/hwdra/hw/mock"
	"github.com/hwdra/hwdra/nvml"
	"github.com/hwdra/hwdra/sriov"
)

// Host is the --hardware value for the machine's real devices.
const Host = "host"

// MockPrefix starts a --hardware value naming a mock profile.
const MockPrefix = "mock:"

// Node is a node's hardware backends.
type Node struct {
	// GPU is nil when the node has no usable NVML.
	GPU *nvml.Backend
	// NIC is how to discover SR-IOV NICs.
	NIC sriov.Options
	// DevRoot, ProcRoot and SysfsRoot are where the host's device nodes,
	// procfs and sysfs are ("/dev", "/proc", "/sys"); the mock's trees on
	// mock hardware.
	DevRoot, ProcRoot, SysfsRoot string
	// Sysfs writes sysfs attributes (mediated devices); on mock hardware it
	// also plays the kernel's part.
	Sysfs nvml.SysfsWriter
	// VFs reads and applies VF settings.
	VFs hw.VFConfigurator
	// Mock is set for mock hardware.
	Mock *mock.Hardware
}

// Open opens "host" or "mock:<profile>" (a built-in name or a YAML file).
func Open(spec string) (*Node, error) {
	switch {
	case spec == Host:
		return openHost(), nil
	case strings.HasPrefix(spec, MockPrefix):
		m, err := mock.Open(strings.TrimPrefix(spec, MockPrefix))
		if err != nil {
			return nil, err
		}
		nics := m.NICs()
		n := &Node{
			Mock: m, DevRoot: m.DevRoot(), ProcRoot: m.ProcRoot(), SysfsRoot: m.Sysfs,
			Sysfs: m.SysfsWriter(), VFs: nics.VFConfigurator(),
			NIC: sriov.Options{SysfsRoot: m.Sysfs, Routes: nics, Eswitch: nics},
		}
		if len(m.Profile.GPUs) > 0 {
			n.GPU = nvml.New(m.NVML, nvml.WithSysfs(m.Sysfs))
			if err := n.GPU.Init(); err != nil {
				return nil, errors.Join(err, m.Close())
			}
		}
		return n, nil
	default:
		return nil, fmt.Errorf("--hardware %q: want %q or %q<profile> (built-in profiles: %s)",
			spec, Host, MockPrefix, strings.Join(mock.Builtins(), ", "))
	}
}

func openHost() *Node {
	n := &Node{
		NIC:     sriov.Options{SysfsRoot: sriov.DefaultSysfsRoot},
		DevRoot: "/dev", ProcRoot: "/proc", SysfsRoot: sriov.DefaultSysfsRoot,
		Sysfs: nvml.SysfsFiles(sriov.DefaultSysfsRoot), VFs: sriov.NetlinkVFConfigurator{},
	}
	gpu := nvml.New(gonvml.New())
	if err := gpu.Init(); err != nil {
		// A NIC-only node has no NVIDIA driver: not an error.
		klog.InfoS("No GPUs: NVML unavailable", "err", err)
		return n
	}
	n.GPU = gpu
	return n
}

// Inventory probes everything. A problem confined to some devices is
// returned with what could be read; the caller logs it.
func (n *Node) Inventory(ctx context.Context) (hw.Inventory, error) {
	var (
		inv  hw.Inventory
		errs []error
	)
	if n.GPU != nil {
		gpus, err := n.GPU.GPUs(ctx)
		if err != nil {
			errs = append(errs, fmt.Errorf("GPUs: %w", err))
		}
		inv.GPUs = gpus
		inv.UnreadableGPUs = nvml.Unreadable(err)
	}
	pfs, err := sriov.Discover(n.NIC)
	if err != nil {
		errs = append(errs, fmt.Errorf("NICs: %w", err))
	}
	inv.PFs = pfs
	return inv, errors.Join(errs...)
}

// Close releases NVML and removes mock hardware.
func (n *Node) Close() error {
	var errs []error
	if n.GPU != nil {
		errs = append(errs, n.GPU.Shutdown())
	}
	if n.Mock != nil {
		errs = append(errs, n.Mock.Close())
	}
	return errors.Join(errs...)
}

// Changes signals when the hardware may have changed in a way the slices
// show: a NIC link going up or down or changing speed. The publisher
// rescans on each signal besides its periodic scan. On mock hardware it
// never fires (tests poke the agent instead).
func (n *Node) Changes(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	if n.Mock != nil {
		return out
	}
	updates := make(chan netlink.LinkUpdate, 64)
	done := make(chan struct{})
	go func() {
		<-ctx.Done()
		close(done)
	}()
	err := netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) { klog.FromContext(ctx).Error(err, "Watching links") },
	})
	if err != nil {
		klog.FromContext(ctx).Error(err, "Cannot watch NIC links; relying on periodic rescans")
		return out
	}
	go func() {
		for range updates {
			select {
			case out <- struct{}{}:
			default: // a rescan is already due
			}
		}
	}()
	return out
}
