// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"fmt"
	"iter"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/mps"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/publish"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/backend"
	"github.com/hwdra/hwdra/internal/backend/driverlibs"
	"github.com/hwdra/hwdra/internal/hw"
)

// Driver is one driver's kubelet-side implementation: the plugin that
// prepares its claims (R: its record of what a prepare applied) and, once
// the agent serves it, the kubelet plugin library's helper that serves it
// to the kubelet.
type Driver[R any] struct {
	Name   string
	Plugin *prepare.Plugin[R]
	helper *kubeletplugin.Helper
}

// GPU is the GPU driver.
type GPU struct {
	Driver[gpuprep.Record]
	// Unclaimed is the node as it would be without the partitions the
	// driver made for claims: what is published.
	Unclaimed publish.Unclaimed
	// MPS are the driver's MPS control daemons, which the health monitor
	// supervises.
	MPS *mps.Manager
}

// NIC is the SR-IOV NIC driver.
type NIC struct {
	Driver[nicprep.Record]
}

// Drivers are a node's drivers; nil where it has no such hardware.
type Drivers struct {
	GPU *GPU
	NIC *NIC
}

// All yields each driver's name and kubelet plugin, the GPU's first.
func (d Drivers) All() iter.Seq2[string, kubeletplugin.DRAPlugin] {
	return func(yield func(string, kubeletplugin.DRAPlugin) bool) {
		if d.GPU != nil && !yield(d.GPU.Name, d.GPU.Plugin) {
			return
		}
		if d.NIC != nil {
			yield(d.NIC.Name, d.NIC.Plugin)
		}
	}
}

// PluginOptions say where drivers keep state and write CDI specs.
type PluginOptions struct {
	StateDir, CDIDir string
	// Published is what the node publishes now: prepare looks allocated
	// devices up in it.
	Published prepare.Published
	// Config decides which PFs are offered and how, and whether the GPU
	// driver changes GPU settings (gpus.settings).
	Config *config.AgentConfig
	// NodeName is the pool name.
	NodeName string
	// Errors gets background errors of the kubelet plugin helpers; nil:
	// logged.
	Errors prepare.ErrorHandler
	// Cluster says which claims are allocated to this node: hardware
	// state one of them may use is never reclaimed. Nil: no API server
	// (the lab).
	Cluster prepare.Cluster
	// Network moves prepared VFs into pods (NRI); nil: they stay in the
	// host namespace.
	Network nicprep.PodNetwork
	// CDIHook is nvidia-cdi-hook on the node, for the driver files'
	// hooks; empty: none.
	CDIHook string
	// MPSCgroup is where MPS control daemons run.
	MPSCgroup mps.Cgroup
	// GPUStatus writes the GPU claims' status.devices after prepare; nil:
	// none (gpus.claimStatus Off, the lab).
	GPUStatus *metadata.StatusWriter
}

// NewDrivers builds a plugin for each driver that has hardware in inv. Each
// plugin reconciles its checkpoint with the hardware on creation.
func NewDrivers(ctx context.Context, node *backend.Node, inv hw.Inventory, opts PluginOptions) (Drivers, error) {
	var drivers Drivers
	// GPUs bound to vfio-pci need no NVML; while NVML is pending (a
	// driver container starting) the GPU driver waits for it all the same,
	// to start once with both kinds (startLateGPU).
	gpu := node.GPU()
	if len(inv.GPUs) > 0 && gpu != nil || len(inv.PassthroughGPUs) > 0 && !node.NVMLPending() {
		d, err := gpuprep.New(gpuprep.Options{
			NVML:      gpu, // nil where only GPUs bound to vfio-pci are there
			NodeName:  opts.NodeName,
			Published: opts.Published,
			StateDir:  opts.StateDir,
			DevRoot:   node.GPUDevRoot, DevNodeRoot: node.GPUDevNodeRoot, ProcRoot: node.ProcRoot, SysfsRoot: node.SysfsRoot,
			Sysfs: node.Sysfs, DriverFiles: driverlibs.New(node.DriverFiles(opts.CDIDir, opts.CDIHook)),
			Programs: node.Programs, MPSCgroup: opts.MPSCgroup,
			MPSShmSize: opts.gpuPolicy().MPSShmSize(), MPSMemoryLimit: opts.gpuPolicy().MPSDaemonMemoryLimit(),
			Settings:           opts.gpuSettings(),
			AllowUnsafeNoIOMMU: opts.Config != nil && opts.Config.AllowsUnsafeNoIOMMU(),
		})
		if err != nil {
			return Drivers{}, err
		}
		p, err := prepare.New(ctx, d, prepare.Options{
			DriverName: device.GPUDriver, StateDir: opts.StateDir, CDIDir: opts.CDIDir, Errors: opts.Errors, Cluster: opts.Cluster,
		})
		if err != nil {
			return Drivers{}, fmt.Errorf("%s: %w", device.GPUDriver, err)
		}
		if opts.GPUStatus != nil {
			p.ReportTo(gpuStatusReporter{opts.GPUStatus})
		}
		drivers.GPU = &GPU{Driver: Driver[gpuprep.Record]{Name: device.GPUDriver, Plugin: p}, Unclaimed: d, MPS: d.MPS()}
	}
	if len(inv.PFs) > 0 {
		d, err := nicprep.New(nicprep.Options{
			VFs: node.VFs, Published: opts.Published, Config: opts.Config,
			SysfsRoot: node.SysfsRoot, DevRoot: node.DevRoot,
			StateDir: opts.StateDir, NodeName: opts.NodeName, Network: opts.Network,
		})
		if err != nil {
			return Drivers{}, err
		}
		p, err := prepare.New(ctx, d, prepare.Options{
			DriverName: device.NICDriver, StateDir: opts.StateDir, CDIDir: opts.CDIDir, Errors: opts.Errors, Cluster: opts.Cluster,
		})
		if err != nil {
			return Drivers{}, fmt.Errorf("%s: %w", device.NICDriver, err)
		}
		drivers.NIC = &NIC{Driver[nicprep.Record]{Name: device.NICDriver, Plugin: p}}
	}
	return drivers, nil
}

// gpuSettings is the configuration's gpus.settings; without a
// configuration the default, Manage.
func (o PluginOptions) gpuSettings() config.GPUSettings { return o.gpuPolicy().Settings() }

// gpuPolicy is the configuration's gpus section; without a configuration
// the defaults.
func (o PluginOptions) gpuPolicy() config.GPUPolicy {
	if o.Config == nil {
		return config.GPUPolicy{}
	}
	return o.Config.GPUPolicy()
}

// nodeClaims is the API server's word on the claims allocated to a node
// (prepare.Cluster).
type nodeClaims struct {
	client kubernetes.Interface
	node   string
}

// AllocatedClaims lists the claims with a device allocated from a pool of
// the node (the pools of a node agent are named after its node), a page
// at a time. Asked at start and while hardware state no prepared claim
// holds waits to be reclaimed; not on any prepare's path.
func (n nodeClaims) AllocatedClaims(ctx context.Context) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := n.client.ResourceV1().ResourceClaims("").List(ctx, opts)
		if err != nil {
			return nil, err
		}
		for i := range list.Items {
			c := &list.Items[i]
			if c.Status.Allocation != nil && slices.ContainsFunc(c.Status.Allocation.Devices.Results,
				func(r resourceapi.DeviceRequestAllocationResult) bool { return r.Pool == n.node }) {
				out = append(out, c)
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return out, nil
		}
	}
}
