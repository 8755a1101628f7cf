// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"testing"
	"time"

	"github.com/hwdra/hwdra/test/e2e/framework"
	resourceapi "k8s.io/api/resource/v1"
)

// Pods competing for one device: the winner runs, the loser stays Pending
// with the scheduler's reason (it cannot allocate the claim) and runs once
// the winner is deleted.

// oneVGPUHost is a vGPU host with a single H100 (h100-vgpu's GPU): its
// MIG devices and vGPU devices carry different compatibility groups.
const oneVGPUHost = `
gpus:
- model: h100-80gb
  count: 1
  virtualization: host-vgpu
  vgpuHeterogeneous: true
`

// compete creates a pod from each of the winners' templates at once (the
// agent prepares them concurrently) and waits until they run, then creates
// a pod from the loser's template, which must stay Pending; deletes the
// first winner and waits until the loser runs. Each pod's app shows paths;
// check looks at each pod as soon as it runs.
func (s *scenario) compete(name string, winners []string, loser string, check func(ran), paths ...string) {
	s.t.Helper()
	created := make([]time.Time, len(winners))
	for i, tmpl := range winners {
		created[i] = s.createPod(winnerName(i), tmpl, paths...)
	}
	for i := range winners {
		check(s.waitRunning(winnerName(i), name+"/"+winnerName(i), created[i]))
	}
	loserCreated := s.createPod("loser", loser, paths...)
	s.t.Logf("loser pending: %s", s.waitPending("loser"))
	deleted := time.Now()
	s.deletePod(winnerName(0))
	r := s.waitRunning("loser", name+"/loser-after-winner-deleted", deleted)
	framework.Timing(s.t, name+"/loser-created-to-running", time.Since(loserCreated))
	check(r)
}

func winnerName(i int) string { return "winner-" + string(rune('a'+i)) }

// TestPodsCompeteCompatibilityGroups: on one GPU in host-vGPU mode, a MIG
// pod (1g.10gb) runs; a vGPU pod (deploy/examples/vgpu.yaml, any type)
// then cannot be placed and stays Pending; once the MIG pod is deleted the
// vGPU pod runs with its mediated device. Only the compatibility groups
// keep it off: a block of time-sliced vGPUs consumes framebuffer from the
// GPU's memory counter and no memory slice, which would fit next to a
// 1g.10gb, but MIG and vGPU devices are in different groups and the
// scheduler never mixes the two modes on one GPU.
func TestPodsCompeteCompatibilityGroups(t *testing.T) {
	competeGroups(t, "compat-groups", framework.MockProfile(t, "one-vgpu-host", oneVGPUHost), func(res resourceapi.DeviceRequestAllocationResult, attrs map[string]map[string]any) {
		mdev, _ := attrValue(attrs, gpuDriver, "mdevUUID").(string)
		if mdev == "" {
			t.Errorf("the vGPU pod's metadata has no mdevUUID: %v", attrs)
		}
		t.Logf("the vGPU pod got %s, mdev %s", res.Device, mdev)
	})
}

// competeGroups runs a MIG pod and then a vGPU pod that must wait for it
// on the one GPU of the mock profile; check sees the vGPU pod's device
// and its metadata.
func competeGroups(t *testing.T, name, profile string, check func(resourceapi.DeviceRequestAllocationResult, map[string]map[string]any)) {
	s := startScenario(t, "compete-"+name, profile, gpuDriver)
	mig := s.template(exampleClaim(t, "mig-1g.10gb.yaml"))
	vgpu := s.template(exampleClaim(t, "vgpu.yaml"))
	s.compete(name, []string{mig}, vgpu, func(r ran) {
		if r.pod.Name != "loser" {
			return
		}
		res := result(t, r.claim, "vgpu")
		check(res, metadataDevice(t, r, res))
	}, framework.MetadataPath("devices", "vgpu", gpuDriver))
}

// onePF400G is one ConnectX-7 PF at 400 Gb/s with 16 VFs.
const onePF400G = `
nics:
- model: cx7
  count: 1
  vfs: 16
`

// TestPodsCompeteBandwidth: on one 400 Gb/s PF, two pods with 150 Gb/s
// shares, created together, run on different VFs; a third cannot be
// placed (300G of 400G counted, 150G more does not fit) and stays Pending;
// once a 150G pod is deleted it runs.
func TestPodsCompeteBandwidth(t *testing.T) {
	s := startScenario(t, "compete-bw", framework.MockProfile(t, "one-pf-400g", onePF400G), nicDriver)
	competeShares(t, s, "compete-bandwidth", "150G")
}

// onePF2VFs is one ConnectX-7 PF at 400 Gb/s with 2 VFs.
const onePF2VFs = `
nics:
- model: cx7
  count: 1
  vfs: 2
`

// TestPodsCompeteVFCount: on a PF with 2 VFs, two pods with 1 Gb/s shares
// (created together) run; a third cannot be placed (each share consumes one of the PF's 2
// VFs, whatever bandwidth is left) and stays Pending; once one is deleted
// it runs.
func TestPodsCompeteVFCount(t *testing.T) {
	s := startScenario(t, "compete-vfs", framework.MockProfile(t, "one-pf-2vfs", onePF2VFs), nicDriver)
	competeShares(t, s, "compete-vf-count", "1G")
}

// competeShares: two share pods of bandwidth run on distinct VFs, a third
// waits until the first is deleted and then gets a VF the second does not
// hold.
func competeShares(t *testing.T, s *scenario, name, bandwidth string) {
	t.Helper()
	tmpl := s.template(shareClaim(t, bandwidth))
	vf := map[string]int{}
	s.compete(name, []string{tmpl, tmpl}, tmpl, func(r ran) {
		vf[r.pod.Name] = checkShare(t, s, r, "nic", bandwidth)
	}, "/dev", framework.MetadataPath("devices", "nic", nicDriver))
	if a, b := vf[winnerName(0)], vf[winnerName(1)]; a == b {
		t.Errorf("both running shares got VF %d", a)
	}
	if c, b := vf["loser"], vf[winnerName(1)]; c == b {
		t.Errorf("the third share got VF %d, which %s still holds", c, winnerName(1))
	}
}
