// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	resourcev1beta2 "k8s.io/api/resource/v1beta2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/tools/allocate"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestUnfittableClaimRefusedAtOnce: a pod whose claim asks for one device
// more than the node holds is reported unschedulable by the real
// scheduler (PodScheduled=False, Unschedulable, the DRA plugin's "cannot
// allocate all claims") within seconds of its creation, rather than
// failing with "timed out trying to allocate devices" after the plugin's
// 10 s filter timeout, as it did while the allocator tried every subset of
// interchangeable devices (issue 19): five 1g.10gb+me on four H100s
// (one each, offered at two placements each, not seven; a node smaller
// than the cluster's largest, so the chart's claim limits let the claim
// through to the scheduler), and 21 H100-8C
// vGPUs on two H100s that hold 20 (two blocks per GPU that claims share,
// not ten devices each), and five in one request on the two
// VFIO-framework GPUs of h100-vm (two blocks each, which a request takes
// once), and nine GPU shares in one request on a DGX H100's eight GPUs
// (one share device each, which a request takes once). The time, from the pod's creation to the
// scheduler's FailedScheduling event, is logged (TIMING) and bounded well
// below the filter timeout.
func TestUnfittableClaimRefusedAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name, hardware, class, profile string
		count                          int64
	}{
		{"mig-plus-me", "four-h100", "mig.gpu.hwdra.io", "1g.10gb+me", 5},
		{"vgpu-shares", "mock:h100-vgpu", "vgpu.gpu.hwdra.io", "H100-8C", 21},
		{"vfio-vgpu-blocks", "mock:h100-vm", "vgpu.gpu.hwdra.io", "H100-8C", 5},
		{"gpu-shares", "mock:dgx-h100", "share.gpu.hwdra.io", "share", 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hardware := tc.hardware
			if hardware == "four-h100" {
				hardware = framework.MockProfile(t, hardware, "gpus:\n- model: h100-80gb\n  count: 4\n")
			}
			s := startScenario(t, "refuse-"+tc.name, hardware, gpuDriver)
			claim := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "too-many"},
				Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
					allocate.Request("devices", tc.class, tc.count, `device.attributes["gpu.hwdra.io"].profile == "`+tc.profile+`"`),
				}}},
			}
			created := s.createPod("too-many", s.template(claim))
			msg := s.waitPending("too-many")
			refused := s.firstFailedScheduling("too-many")
			took := refused.Sub(created)
			framework.Timing(t, "refuse/"+tc.name, took)
			t.Logf("%d x %s: %s", tc.count, tc.profile, msg)
			if took > refuseWithin {
				t.Errorf("the scheduler refused after %v: not within %v (its filter timeout is 10s)", took, refuseWithin)
			}
		})
	}
}

// refuseWithin bounds the scheduler's refusal: far above what it takes
// (well under a second on a quiet machine), below its 10 s filter timeout.
const refuseWithin = 8 * time.Second

// firstFailedScheduling is the time of the scheduler's first
// FailedScheduling event for the pod (events.k8s.io, microseconds), which
// must say the claims cannot be allocated.
func (s *scenario) firstFailedScheduling(pod string) time.Time {
	s.t.Helper()
	list, err := s.n.Admin.EventsV1().Events(s.ns).List(s.ctx, metav1.ListOptions{FieldSelector: "regarding.name=" + pod})
	if err != nil {
		s.t.Fatal(err)
	}
	var first time.Time
	for _, e := range list.Items {
		if e.Reason != "FailedScheduling" || e.Regarding.Kind != "Pod" {
			continue
		}
		if !strings.Contains(e.Note, "cannot allocate all claims") {
			s.t.Errorf("scheduler event %q: not the DRA plugin's refusal", e.Note)
		}
		at := e.EventTime.Time
		if at.IsZero() {
			at = e.DeprecatedFirstTimestamp.Time
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	if first.IsZero() {
		s.t.Fatalf("no FailedScheduling event for pod %s: %+v", pod, list.Items)
	}
	return first
}

// TestClaimsRefusedAtCreation: the chart's claim-limits policy refuses,
// when it is created, a claim or claim template no node can satisfy
// (claimLimits.gpusPerNode 8: the suite's default values), naming the
// request, the count, the kind and the limit, whatever API version it is
// written in and wherever in a firstAvailable list the hopeless
// alternative is; a claim at the limit, one with allocationMode All and
// one for a profile the table lacks pass. Those are the claims the
// scheduler could only refuse after its 10 s filter timeout, on each node
// and at each retry (25 x 2g.20gb on a DGX H100).
func TestClaimsRefusedAtCreation(t *testing.T) {
	n := framework.Shared(t)
	ns := n.CreateNamespace(t, "claim-limits")
	ctx := context.Background()
	req := func(class, profile string, count int64) resourceapi.DeviceRequest {
		sel := ""
		if profile != "" {
			sel = `device.attributes["gpu.hwdra.io"].profile == "` + profile + `"`
		}
		return allocate.Request("devices", class, count, sel)
	}
	claim := func(reqs ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "limits-", Namespace: ns},
			Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}},
		}
	}
	all := req("mig.gpu.hwdra.io", "2g.20gb", 0)
	all.Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	all.Exactly.Count = 0
	firstAvailable := resourceapi.DeviceRequest{Name: "either", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "small", DeviceClassName: "mig.gpu.hwdra.io", Count: 2, Selectors: req("mig.gpu.hwdra.io", "1g.10gb", 2).Exactly.Selectors},
		{Name: "big", DeviceClassName: "mig.gpu.hwdra.io", Count: 17, Selectors: req("mig.gpu.hwdra.io", "3g.40gb", 17).Exactly.Selectors},
	}}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	for _, tc := range []struct {
		name  string
		claim *resourceapi.ResourceClaim
		want  string // "" accepted
	}{
		{"25 x 2g.20gb", claim(req("mig.gpu.hwdra.io", "2g.20gb", 25)), "request devices: 25 x 2g.20gb of class mig.gpu.hwdra.io, no node holds more than 24 (3 per GPU, 8 GPUs per node)"},
		{"24 x 2g.20gb", claim(req("mig.gpu.hwdra.io", "2g.20gb", 24)), ""},
		{"9 whole GPUs", claim(req("gpu.hwdra.io", "", 9)), "request devices: 9 x whole GPU of class gpu.hwdra.io, no node holds more than 8 (1 per GPU"},
		{"81 x H100-8C", claim(req("vgpu.gpu.hwdra.io", "H100-8C", 81)), "request devices: 81 x H100-8C of class vgpu.gpu.hwdra.io, no node holds more than 80 (10 per GPU"},
		{"a hopeless alternative", claim(firstAvailable), "request either/big: 17 x 3g.40gb of class mig.gpu.hwdra.io, no node holds more than 16 (2 per GPU"},
		{"all 2g.20gb", claim(all), ""},
		{"a profile the table lacks", claim(req("mig.gpu.hwdra.io", "9g.999gb", 99)), ""},
		{"GPU shares (not limited)", claim(req("share.gpu.hwdra.io", "share", 99)), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := n.Admin.ResourceV1().ResourceClaims(ns).Create(ctx, tc.claim, dry)
			checkRefusal(t, "claim", err, tc.want)
			tmpl := &resourceapi.ResourceClaimTemplate{
				ObjectMeta: metav1.ObjectMeta{GenerateName: "limits-", Namespace: ns},
				Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: tc.claim.Spec},
			}
			_, err = n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, dry)
			checkRefusal(t, "template", err, tc.want)
		})
	}
	// The same claim in v1beta2 is converted and refused alike.
	old := &resourcev1beta2.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "limits-", Namespace: ns},
		Spec: resourcev1beta2.ResourceClaimSpec{Devices: resourcev1beta2.DeviceClaim{Requests: []resourcev1beta2.DeviceRequest{{
			Name: "devices", Exactly: &resourcev1beta2.ExactDeviceRequest{DeviceClassName: "mig.gpu.hwdra.io", Count: 25,
				Selectors: []resourcev1beta2.DeviceSelector{{CEL: &resourcev1beta2.CELDeviceSelector{Expression: `device.attributes["gpu.hwdra.io"].profile == "2g.20gb"`}}}},
		}}}},
	}
	_, err := n.Admin.ResourceV1beta2().ResourceClaims(ns).Create(ctx, old, dry)
	checkRefusal(t, "v1beta2 claim", err, "request devices: 25 x 2g.20gb of class mig.gpu.hwdra.io, no node holds more than 24")
}

func checkRefusal(t *testing.T, what string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("%s refused: %v", what, err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "claimLimits.gpusPerNode")):
		t.Errorf("%s: %v, want refused saying %q and naming claimLimits.gpusPerNode", what, err, want)
	}
}
