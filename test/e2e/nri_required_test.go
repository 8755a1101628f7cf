// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/agent/podnet"
	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// TestVFPodWaitsForTheAgent: a VF pod whose sandbox starts while the agent
// is down (killed after the kubelet prepared the pod's claim, before the
// sandbox: a test NRI plugin holds the sandbox back until then) must not
// run without its VF. The pod requires the agent's NRI plugin
// (podnet.RequiredPluginsAnnotation) and containerd's default validator is
// on, as the operator guide asks: containerd refuses the pod's containers while
// the plugin is missing. When the agent is back, its NRI plugin moves the
// VF into the running sandbox and the pod runs with its interface.
func TestVFPodWaitsForTheAgent(t *testing.T) {
	r := startHWRig(t, "nri-required", "mock:cx7", nil, nicDriver)
	gate := r.n.StartNRIGate(t, r.ns, "vf")
	tmpl := r.template("vf-share-10g.yaml")
	meta := framework.MetadataPath("devices", "nic", nicDriver)
	pod := framework.PodWithClaimTemplate("vf", tmpl, meta)
	pod.Annotations = map[string]string{podnet.RequiredPluginsAnnotation + "/pod": `["` + podnet.PluginName + `"]`}
	began := time.Now()
	if _, err := r.n.Admin.CoreV1().Pods(r.ns).Create(r.ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the kubelet to try the pod's sandbox (its claim prepared)", 90*time.Second, func() bool { return gate.Refused() > 0 })
	r.kill()
	gate.Open()
	waitfor.True(t, "the pod's sandbox to start without the agent", 60*time.Second, func() bool { return gate.Passed() > 0 })

	// The sandbox runs; its containers wait for the agent's NRI plugin.
	// Real time passes (15 s) to show they do not start, watched
	// throughout.
	waitfor.Never(t, "the VF pod running while the agent is down (its containers started without the VF)", 15*time.Second, func() bool {
		p, err := r.n.Admin.CoreV1().Pods(r.ns).Get(r.ctx, "vf", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p.Status.Phase == corev1.PodRunning
	})
	refused := ""
	if err := waitfor.Until(r.ctx, "an event saying containerd refused the containers for the missing plugin", 30*time.Second, func() bool {
		for _, e := range r.podEvents("vf") {
			if strings.Contains(e, podnet.PluginName) && strings.Contains(e, "not present") {
				refused = e
			}
		}
		return refused != ""
	}); err != nil {
		t.Errorf("%v: %v", err, r.podEvents("vf"))
	}
	t.Logf("while the agent is down: %s", refused)

	r.restart(nil)
	claim, out := r.waitRunning("vf", "vf-pod-agent-down-at-sandbox-to-running", began)
	checkInterface(t, r.n, r.ctx, "vf", out, claim, result(t, claim, "nic"), meta, defaultVF)
}
