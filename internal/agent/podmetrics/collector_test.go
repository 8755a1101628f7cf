// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package podmetrics

import (
	"errors"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/utils/ptr"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// TestInfoJoinsDCGMLabels: each prepared device gets one info series per
// pod that uses its claim, labelled as dcgm-exporter labels the same
// hardware: a whole GPU and a share by the GPU's UUID with no GPU_I_ID, a
// MIG partition by its GPU's UUID, its GPU instance ID and profile (and
// its own UUID apart). A claim used by two pods has two; one no pod uses
// has none (its pod label would be the scraped agent's under honorLabels).
func TestInfoJoinsDCGMLabels(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{wholeGPU("ml", "train"), migDevice("ml", "small", 7), shareDevice("web", "infer", 10<<30, 30), wholeGPU("ml", "orphan")}
	n.pod("ml", "trainer", "train")
	n.pod("ml", "tiny", "small")
	n.pod("web", "server-a", "infer")
	n.pod("web", "server-b", "infer")
	status, samples := scrape(t, n.collector(Options{}))
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	want := map[string]float64{
		`hwdra_claim_device_info{Hostname="worker-1",UUID="` + uuid0 + `",claim="train",device="gpu-0000-1b-00-0",driver="gpu.hwdra.io",namespace="ml",pci_address="0000:1b:00.0",pod="trainer",pool="worker-1",request="gpu",type="gpu"}`:                                                                                                 1,
		`hwdra_claim_device_info{GPU_I_ID="7",GPU_I_PROFILE="1g.10gb",Hostname="worker-1",UUID="` + uuid1 + `",claim="small",compute_instance="0",device="gpu-0000-43-00-0-mig-1g-10gb-6",driver="gpu.hwdra.io",mig_uuid="` + migUUID + `",namespace="ml",pci_address="0000:43:00.0",pod="tiny",pool="worker-1",request="mig",type="mig"}`: 1,
		`hwdra_claim_device_info{Hostname="worker-1",UUID="` + uuid0 + `",claim="infer",device="gpu-0000-1b-00-0-share",driver="gpu.hwdra.io",namespace="web",pci_address="0000:1b:00.0",pod="server-a",pool="worker-1",request="share",sharing="share",type="share"}`:                                                                     1,
		`hwdra_claim_device_info{Hostname="worker-1",UUID="` + uuid0 + `",claim="infer",device="gpu-0000-1b-00-0-share",driver="gpu.hwdra.io",namespace="web",pci_address="0000:1b:00.0",pod="server-b",pool="worker-1",request="share",sharing="share",type="share"}`:                                                                     1,
	}
	if got := named(samples, "hwdra_claim_device_info"); !maps.Equal(got, want) {
		t.Errorf("info series:\n%s\nwant:\n%s", keys(got), keys(want))
	}
	limits := map[string]float64{
		`hwdra_claim_gpu_share_memory_bytes{Hostname="worker-1",UUID="` + uuid0 + `",claim="infer",device="gpu-0000-1b-00-0-share",namespace="web",pool="worker-1",request="share"}`:    10 << 30,
		`hwdra_claim_gpu_share_compute_percent{Hostname="worker-1",UUID="` + uuid0 + `",claim="infer",device="gpu-0000-1b-00-0-share",namespace="web",pool="worker-1",request="share"}`: 30,
	}
	for k, v := range limits {
		if samples[k] != v {
			t.Errorf("%s = %v, want %v", k, samples[k], v)
		}
	}
}

// TestUnpreparedClaimGoneAtNextScrape: the series follow the checkpoint:
// a claim unprepared between two scrapes has none in the second, nor
// does a pod that no longer exists.
func TestUnpreparedClaimGoneAtNextScrape(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{wholeGPU("ml", "train"), shareDevice("web", "infer", 4<<30, 10)}
	p := n.pod("ml", "trainer", "train")
	n.pod("web", "server", "infer")
	n.run(gpu0, p, 100, 1<<30, nil)
	c := n.collector(Options{MaxAge: time.Nanosecond})
	_, before := scrape(t, c)
	if len(named(before, "hwdra_claim_device_info")) != 2 || len(named(before, "hwdra_pod_gpu_memory_used_bytes")) != 1 {
		t.Fatalf("before: %s", keys(before))
	}
	n.mu.Lock()
	n.devices = n.devices[1:] // "train" unprepared
	delete(n.pods, p.UID)
	n.mu.Unlock()
	_, after := scrape(t, c)
	for k := range after {
		if strings.Contains(k, `claim="train"`) || strings.Contains(k, `pod="trainer"`) {
			t.Errorf("after unprepare: %s", k)
		}
	}
	if len(named(after, "hwdra_claim_device_info")) != 1 {
		t.Errorf("after: %s", keys(after))
	}
}

// TestTenantLabelValuesEscaped: names from the checkpoint and the pods
// reach the exposition through the client library: quotes, backslashes
// and newlines come back as they were; a value that is not UTF-8 drops
// its series, not the scrape. Two devices that would make the same series
// make one (the registry fails a scrape with duplicates).
func TestTenantLabelValuesEscaped(t *testing.T) {
	n := newNode(t)
	hostile := "a\"b\\c\nd} 1\nhwdra_claim_device_info{pod=\"x\"} 1"
	n.devices = []Device{wholeGPU("ml", hostile), wholeGPU("ml", hostile), wholeGPU("ml", "bad\xff")}
	n.pod("ml", "p1", hostile)
	n.pod("ml", "p2", "bad\xff")
	status, samples := scrape(t, n.collector(Options{}))
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	info := named(samples, "hwdra_claim_device_info")
	if len(info) != 1 {
		t.Fatalf("info series %s, want the one with the hostile claim name alone", keys(info))
	}
	for k := range info {
		if !strings.Contains(k, `claim=`+quote(hostile)) || !strings.Contains(k, `pod="p1"`) {
			t.Errorf("series %s lost the claim's name %q", k, hostile)
		}
	}
}

func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)
	return `"` + r.Replace(s) + `"`
}

// TestGPUMemoryByPod: each listed process's memory goes to the device of
// its container's claims on its GPU (on a MIG GPU, of its GPU instance);
// two share pods on one GPU get theirs apart; what no claim of the
// process's pod covers (a process of no pod, of a pod without a claim of
// the GPU, in another GPU instance) is the GPU's unclaimed memory; a
// process that exited is left out.
func TestGPUMemoryByPod(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{shareDevice("web", "a", 10<<30, 30), shareDevice("web", "b", 10<<30, 30), migDevice("ml", "small", 7)}
	pa, pb := n.pod("web", "server-a", "a"), n.pod("web", "server-b", "b")
	tiny, stranger := n.pod("ml", "tiny", "small"), n.pod("ml", "stranger")
	n.run(gpu0, pa, 101, 3<<30, nil)
	n.run(gpu0, pa, 102, 1<<30, nil)
	n.run(gpu0, pb, 103, 2<<30, nil)
	n.run(gpu0, nil, 104, 512<<20, nil)      // the MPS server, say
	n.run(gpu0, stranger, 105, 256<<20, nil) // a pod without a claim of the GPU
	n.run(gpu1, tiny, 106, 5<<30, ptr.To(7))
	n.run(gpu1, tiny, 107, 1<<30, ptr.To(9)) // another GPU instance than its claim's
	n.mu.Lock()
	n.procs[gpu0] = append(n.procs[gpu0], n.procs[gpu0][0])
	n.procs[gpu0][len(n.procs[gpu0])-1].PID = 999 // listed, but gone from /proc
	n.mu.Unlock()
	_, samples := scrape(t, n.collector(Options{}))
	want := map[string]float64{
		`hwdra_pod_gpu_memory_used_bytes{Hostname="worker-1",UUID="` + uuid0 + `",claim="a",device="gpu-0000-1b-00-0-share",namespace="web",pod="server-a"}`:                     4 << 30,
		`hwdra_pod_gpu_memory_used_bytes{Hostname="worker-1",UUID="` + uuid0 + `",claim="b",device="gpu-0000-1b-00-0-share",namespace="web",pod="server-b"}`:                     2 << 30,
		`hwdra_pod_gpu_memory_used_bytes{GPU_I_ID="7",Hostname="worker-1",UUID="` + uuid1 + `",claim="small",device="gpu-0000-43-00-0-mig-1g-10gb-6",namespace="ml",pod="tiny"}`: 5 << 30,
	}
	if got := named(samples, "hwdra_pod_gpu_memory_used_bytes"); !maps.Equal(got, want) {
		t.Errorf("memory by pod:\n%s\nwant:\n%s", keys(got), keys(want))
	}
	unclaimed := map[string]float64{
		`hwdra_gpu_unclaimed_memory_used_bytes{Hostname="worker-1",UUID="` + uuid0 + `"}`:              768 << 20,
		`hwdra_gpu_unclaimed_memory_used_bytes{GPU_I_ID="9",Hostname="worker-1",UUID="` + uuid1 + `"}`: 1 << 30,
	}
	if got := named(samples, "hwdra_gpu_unclaimed_memory_used_bytes"); !maps.Equal(got, unclaimed) {
		t.Errorf("unclaimed:\n%s\nwant:\n%s", keys(got), keys(unclaimed))
	}
}

// TestUnreadableGPUGivesUpZero: a GPU whose processes NVML cannot list
// gives hwdra_gpu_processes_up 0 and no memory series; the scrape
// succeeds and the other GPU's series are there.
func TestUnreadableGPUGivesUpZero(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{wholeGPU("ml", "train"), migDevice("ml", "small", 7)}
	p := n.pod("ml", "trainer", "train")
	n.pod("ml", "tiny", "small")
	n.run(gpu0, p, 100, 1<<30, nil)
	n.failing[gpu1] = errors.New("GPU 0000:43:00.0: GetComputeRunningProcesses: GPU is lost")
	status, samples := scrape(t, n.collector(Options{}))
	if status != 200 {
		t.Fatalf("status %d", status)
	}
	want := map[string]float64{
		`hwdra_gpu_processes_up{Hostname="worker-1",UUID="` + uuid0 + `",pci_address="` + gpu0 + `"}`: 1,
		`hwdra_gpu_processes_up{Hostname="worker-1",UUID="` + uuid1 + `",pci_address="` + gpu1 + `"}`: 0,
	}
	if got := named(samples, "hwdra_gpu_processes_up"); !maps.Equal(got, want) {
		t.Errorf("up:\n%s\nwant:\n%s", keys(got), keys(want))
	}
	if got := named(samples, "hwdra_pod_gpu_memory_used_bytes"); len(got) != 1 {
		t.Errorf("memory series %s, want the readable GPU's alone", keys(got))
	}
}

// TestHungGPUStallsNoScrape: a listing that does not answer makes the
// scrape give up on that GPU after Wait (up 0), with no lock held: the
// drivers' checkpoints are read and set meanwhile. Once it answers, the
// next scrape has its processes, and it is read once however many
// scrapes waited.
func TestHungGPUStallsNoScrape(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{wholeGPU("ml", "train")}
	p := n.pod("ml", "trainer", "train")
	n.run(gpu0, p, 100, 1<<30, nil)
	b := &blocking{node: n, release: make(chan struct{})}
	c := New(Options{NodeName: "worker-1", Pods: n, ProcRoot: n.procRoot, Wait: 50 * time.Millisecond, MaxAge: time.Hour})
	c.SetGPU(gpuOnly{n}, b)
	for range 3 {
		began := time.Now()
		status, samples := scrape(t, c)
		if took := time.Since(began); status != 200 || took > 5*time.Second {
			t.Fatalf("scrape: status %d after %v", status, took)
		}
		if got := samples[`hwdra_gpu_processes_up{Hostname="worker-1",UUID="`+uuid0+`",pci_address="`+gpu0+`"}`]; got != 0 {
			t.Fatalf("up %v while the listing hangs, want 0", got)
		}
		c.SetGPU(gpuOnly{n}, b) // takes no lock a read holds
	}
	close(b.release)
	waitfor.True(t, "the listing once released", 10*time.Second, func() bool {
		_, samples := scrape(t, c)
		return len(named(samples, "hwdra_pod_gpu_memory_used_bytes")) == 1
	})

	if got := b.reads(); got != 1 {
		t.Errorf("%d listings for four scrapes within MaxAge, want 1", got)
	}
}

// blocking is a GPU whose listing does not answer until released; it
// counts the listings asked for.
type blocking struct {
	*node
	release chan struct{}
	asked   atomic.Int32
}

func (b *blocking) GPUProcesses(gpu string) ([]hw.GPUProcess, error) {
	b.asked.Add(1)
	<-b.release
	return b.node.GPUProcesses(gpu)
}

func (b *blocking) reads() int { return int(b.asked.Load()) }

// TestPools: each pool's GPUs and VFs, and those a prepared claim holds
// (a GPU with a MIG partition and a share prepared counts once).
func TestPools(t *testing.T) {
	n := newNode(t)
	n.units = []Unit{{device.GPUDriver, "worker-1", UnitGPU, gpu0}, {device.GPUDriver, "worker-1", UnitGPU, gpu1},
		{device.NICDriver, "worker-1", UnitVF, "0000:17:00.2"}, {device.NICDriver, "worker-1", UnitVF, "0000:17:00.3"}}
	n.devices = []Device{migDevice("ml", "a", 7), migDevice("ml", "b", 8),
		{Namespace: "net", Claim: "v", Driver: device.NICDriver, Pool: "worker-1", Name: "pf-0000-17-00-0", Type: "vf", VF: "0000:17:00.2", PF: "pfa", MaxTxRate: 10000}}
	_, samples := scrape(t, n.collector(Options{Published: n}))
	want := map[string]float64{
		`hwdra_pool_units{driver="gpu.hwdra.io",pool="worker-1",unit="gpu"}`:         2,
		`hwdra_pool_units_in_use{driver="gpu.hwdra.io",pool="worker-1",unit="gpu"}`:  1,
		`hwdra_pool_units{driver="sriov.hwdra.io",pool="worker-1",unit="vf"}`:        2,
		`hwdra_pool_units_in_use{driver="sriov.hwdra.io",pool="worker-1",unit="vf"}`: 1,
	}
	for k, v := range want {
		if got, ok := samples[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if got := samples[`hwdra_claim_vf_tx_rate_bits_per_second{bound="max",claim="v",device="pf-0000-17-00-0",namespace="net",pool="worker-1",vf="0000:17:00.2"}`]; got != 10e9 {
		t.Errorf("VF rate %v, want 10e9", got)
	}
}

// vfCounters are a PF's fake VF counters.
type vfCounters map[string]map[int]VFCounters

func (v vfCounters) VFStats(pf string) (map[int]VFCounters, error) {
	s, ok := v[pf]
	if !ok {
		return nil, errors.New("sriov: PF " + pf + ": Link not found")
	}
	return s, nil
}

// TestVFCounters: a prepared VF's counters as its PF's driver reports
// them, by direction; a PF netlink cannot read gives its up series 0.
func TestVFCounters(t *testing.T) {
	n := newNode(t)
	n.devices = []Device{
		{Namespace: "net", Claim: "v", Request: "nic", Driver: device.NICDriver, Pool: "worker-1", Name: "pf-a", Type: "vf", VF: "0000:17:00.3", PF: "pfa", VFIndex: 1},
		{Namespace: "net", Claim: "w", Request: "nic", Driver: device.NICDriver, Pool: "worker-1", Name: "pf-b", Type: "vf", VF: "0000:18:00.2", PF: "pfb", VFIndex: 0},
	}
	stats := vfCounters{"pfa": {0: {RxBytes: 1}, 1: {RxBytes: 1000, TxBytes: 2000, RxPackets: 10, TxPackets: 20, RxDropped: 1, TxDropped: 2}}}
	_, samples := scrape(t, n.collector(Options{VFStats: stats}))
	l := `claim="v",device="pf-a",direction="%s",namespace="net",pool="worker-1",request="nic",vf="0000:17:00.3"`
	for k, v := range map[string]float64{
		"hwdra_claim_vf_bytes_total{" + strings.Replace(l, "%s", "receive", 1) + "}":           1000,
		"hwdra_claim_vf_bytes_total{" + strings.Replace(l, "%s", "transmit", 1) + "}":          2000,
		"hwdra_claim_vf_packets_total{" + strings.Replace(l, "%s", "transmit", 1) + "}":        20,
		"hwdra_claim_vf_dropped_packets_total{" + strings.Replace(l, "%s", "receive", 1) + "}": 1,
		`hwdra_pf_vf_stats_up{pf="pfa"}`:                                                       1,
		`hwdra_pf_vf_stats_up{pf="pfb"}`:                                                       0,
	} {
		if got, ok := samples[k]; !ok || got != v {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, v)
		}
	}
	if got := named(samples, "hwdra_claim_vf_bytes_total"); len(got) != 2 {
		t.Errorf("VF byte counters %s, want the one VF's two directions", keys(got))
	}
}

func keys(m map[string]float64) string {
	return strings.Join(slices.Sorted(maps.Keys(m)), "\n")
}
