// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/hwdra/hwdra/internal/agent/podmetrics"
	"github.com/hwdra/hwdra/internal/agent/prepare"
	gpuprep "github.com/hwdra/hwdra/internal/agent/prepare/gpu"
	nicprep "github.com/hwdra/hwdra/internal/agent/prepare/nic"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/agent/slices/resources"
	"github.com/hwdra/hwdra/internal/backend/sriov"
	"github.com/hwdra/hwdra/internal/hw"
)

// readiness is hwdra_agent_ready: what /readyz answers, as a series, for
// the alert on an agent that answers but does not serve.
func readiness(pr *probes) prometheus.Collector {
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "hwdra_agent_ready",
		Help: "1 while the agent is ready (what /readyz answers 200 to: it serves the node, its kubelet plugins are registered, its slices verified, NRI connected, the API server reachable), 0 otherwise.",
	}, func() float64 {
		if pr.ready() != nil {
			return 0
		}
		return 1
	})
}

// startPodMetrics serves the per-pod series (package podmetrics) of the
// drivers' prepared claims on the agent's registry, from the node's pod
// informer, the checkpoints and NVML's process listings.
func (s *server) startPodMetrics(ctx context.Context) {
	s.nodePods.start(ctx)
	c := podmetrics.New(podmetrics.Options{
		NodeName: s.opts.NodeName, Pods: s.nodePods, Published: publishedUnits{s.health},
		VFStats: vfStats{s.node.HostNetns}, ProcRoot: s.opts.procRoot,
	})
	if d := s.drivers.NIC; d != nil {
		c.SetNIC(nicClaims{d.Plugin})
	}
	s.podMetrics = c
	s.setPodMetricsGPU(s.drivers.GPU)
	s.m.registry.MustRegister(c)
	s.onStop(func() { s.m.registry.Unregister(c) })
}

// setPodMetricsGPU gives the per-pod series the GPU driver, also one that
// started late (NVML came up after the agent).
func (s *server) setPodMetricsGPU(d *GPU) {
	if d == nil || s.podMetrics == nil {
		return
	}
	var procs podmetrics.Processes
	if gpu := s.node.GPU(); gpu != nil {
		procs = gpu
	}
	s.podMetrics.SetGPU(gpuClaimDevices{d.Plugin}, procs)
}

// gpuClaimDevices and nicClaims are the drivers' checkpoints as the
// per-pod series read them (podmetrics.Claims): without a lock.
type gpuClaimDevices struct {
	plugin *prepare.Plugin[gpuprep.Record]
}

func (g gpuClaimDevices) Devices() []podmetrics.Device {
	return podmetrics.GPUDevices(g.plugin.Claims())
}

type nicClaims struct {
	plugin *prepare.Plugin[nicprep.Record]
}

func (n nicClaims) Devices() []podmetrics.Device { return podmetrics.NICDevices(n.plugin.Claims()) }

// List is every pod of the node the informer has (podmetrics.Pods).
func (p *nodePods) List() []*corev1.Pod {
	pods, err := p.inf.Lister().List(labels.Everything())
	if err != nil {
		return nil
	}
	return pods
}

// publishedUnits are the GPUs and VFs of what the drivers last published
// (podmetrics.Published).
type publishedUnits struct{ h *nodeHealth }

func (p publishedUnits) Units() []podmetrics.Unit {
	p.h.mu.Lock()
	defer p.h.mu.Unlock()
	var out []podmetrics.Unit
	for driver, devices := range p.h.devices {
		for _, d := range devices {
			switch of := d.Of.(type) {
			case resources.GPUDevice:
				out = append(out, podmetrics.Unit{Driver: driver, Pool: d.Pool, Kind: podmetrics.UnitGPU, ID: of.PCIBusID()})
			case resources.NICDevice:
				vfs := of.PF.VFs
				if of.VF != nil {
					vfs = []hw.VF{*of.VF}
				}
				for _, vf := range vfs {
					out = append(out, podmetrics.Unit{Driver: device.NICDriver, Pool: d.Pool, Kind: podmetrics.UnitVF, ID: vf.PCIAddress})
				}
			}
		}
	}
	return out
}

// vfStats reads VF counters through the PFs' netdevs in the node's
// network namespace (the mock's stand-in for it on mock hardware), a
// netlink socket per scrape (podmetrics.VFStats).
type vfStats struct{ netns string }

func (v vfStats) VFStats(pf string) (map[int]podmetrics.VFCounters, error) {
	ns, err := sriov.OpenNetns(v.netns)
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	stats, err := ns.VFStats(pf)
	if err != nil {
		return nil, err
	}
	out := make(map[int]podmetrics.VFCounters, len(stats))
	for i, s := range stats {
		out[i] = podmetrics.VFCounters(s)
	}
	return out, nil
}
