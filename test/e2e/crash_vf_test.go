// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"sort"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/hw"
	"github.com/hwdra/hwdra/internal/mock/persist"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestCrashDuringVFSharePrepare: the agent is killed (SIGKILL) while it
// configures the VF of a 10G bandwidth share (the mock's SetVF takes 3 s;
// the VF has the new settings, the agent never learns it succeeded), and
// restarted with the same flags, state directory and hardware (its VF
// stand-ins stay where they are, as VFs outlive the agent). The kubelet
// retries, the pod runs with exactly one VF configured for it,
// rate-limited to the share's bandwidth, and has it as its interface
// net1; deleting the pod gives every VF its original settings back, the
// node its links as they were, and leaves none held.
func TestCrashDuringVFSharePrepare(t *testing.T) {
	r := startHWRig(t, "crash-vf", "mock:cx7", []string{persist.TimingsEnv + "=setVF=3s"}, device.NICDriver)
	before := r.state()
	links := nodeLinks(t)
	tmpl := r.template("vf-share-10g.yaml")
	meta := framework.MetadataPath("devices", "nic", nicDriver)
	began := r.createPod("share", tmpl, meta)

	op, err := framework.WaitMockBusy(r.ctx, r.mockDir, "setVF", 60*time.Second)
	if err != nil {
		t.Fatalf("the agent never started configuring a VF: %v\nevents: %v", err, r.podEvents("share"))
	}
	r.kill()
	mid := r.state()
	changed := changedVFs(before, mid)
	t.Logf("killed while configuring a VF of %s: VFs changed on the hardware: %v", op.Device, changed)
	if len(changed) != 1 {
		t.Errorf("%d VFs changed when the agent was killed during SetVF, want 1: the scenario tests less than it says", len(changed))
	}

	r.restart(nil)
	claim, out := r.waitRunning("share", "crash-vf-sigkill-during-setVF", began)
	after := r.state()
	if !interrupted(after, "setVF") {
		t.Errorf("the mock records no interrupted setVF: %+v", after.Interrupted)
	}
	changed = changedVFs(before, after)
	if len(changed) != 1 {
		t.Fatalf("VFs configured after the restarted agent prepared the share: %v, want exactly one", changed)
	}
	res := claim.Status.Allocation.Devices.Results
	if len(res) != 1 || res[0].ShareID == nil {
		t.Fatalf("allocation %+v: want one share", res)
	}
	bw := res[0].ConsumedCapacity[device.NICDriver+"/bandwidth"]
	wantMbps := int(bw.ScaledValue(resource.Mega))
	if vf := after.VFs[changed[0]]; vf.MaxTxRateMbps != wantMbps || wantMbps != 10000 {
		t.Errorf("VF %s: max_tx_rate %d Mb/s, the share consumed %s (want 10000)", changed[0], vf.MaxTxRateMbps, bw.String())
	}
	rec, err := framework.ReadAgentRecords(r.stateDir, device.NICDriver)
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Claims) != 1 || rec.Claims[string(claim.UID)] != "Prepared" || len(rec.Ledger) != 1 || len(rec.Placements) != 1 {
		t.Errorf("agent records while the pod runs: claims %v, ledger %v, in pods %v; want the claim Prepared and one VF, in the pod", rec.Claims, rec.Ledger, rec.Placements)
	}
	checkInterface(t, r.n, r.ctx, "share", out, claim, res[0], meta, defaultVF)

	r.deletePodAndCheck("share", device.NICDriver, "crash-vf-delete-to-unprepared", claim, before)
	waitNodeLinks(t, links)
}

// changedVFs are the VFs ("<pf>/<index>") whose settings differ between
// two states, sorted.
func changedVFs(before, after persist.State) []string {
	var out []string
	for k, v := range after.VFs {
		if !sameVF(before.VFs[k], v) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

func sameVF(a, b hw.VFConfig) bool {
	if (a.NetdevUp == nil) != (b.NetdevUp == nil) || a.NetdevUp != nil && *a.NetdevUp != *b.NetdevUp {
		return false
	}
	a.NetdevUp, b.NetdevUp = nil, nil
	return a == b
}
