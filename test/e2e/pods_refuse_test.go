package e2e

import (
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/allocate"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestUnfittableClaimRefusedAtOnce: a pod whose claim asks for one device
// more than the node holds is reported unschedulable by the real
// scheduler (PodScheduled=False, Unschedulable, the DRA plugin's "cannot
// allocate all claims") within seconds of its creation, rather than
// failing with "timed out trying to allocate devices" after the plugin's
// 10 s filter timeout, as it did while the allocator tried every subset of
// interchangeable devices (issue 19): nine 1g.10gb+me on eight H100s
// (one each, offered at two placements each, not seven), and 21 H100-8C
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
		{"mig-plus-me", "mock:dgx-h100", "mig.gpu.hwdra.io", "1g.10gb+me", 9},
		{"vgpu-shares", "mock:h100-vgpu", "vgpu.gpu.hwdra.io", "H100-8C", 21},
		{"vfio-vgpu-blocks", "mock:h100-vm", "vgpu.gpu.hwdra.io", "H100-8C", 5},
		{"gpu-shares", "mock:dgx-h100", "share.gpu.hwdra.io", "share", 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startScenario(t, "refuse-"+tc.name, tc.hardware, gpuDriver)
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
