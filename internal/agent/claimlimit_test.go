// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// TestClaimLimitBelowTheNode: an agent told that the claim-limits policy
// allows 1 GPU per claim, on a node with 2, stays ready and warns in
// /readyz and with a Warning Event on its Node, once.
func TestClaimLimitBelowTheNode(t *testing.T) {
	a := startAgentWith(t, Options{Hardware: "mock:" + writeProfile(t, "gpus:\n- model: h100-80gb\n  count: 2\n"), ClaimLimitGPUs: 1})
	a.slices(device.GPUDriver, nil)
	a.registerPlugins(device.GPUDriver)
	want := "warning: this node has 2 GPUs, but the chart's claim-limits policy refuses claims for more than 1 GPUs"
	waitfor.True(t, "/readyz warning of the claim limit", 30*time.Second, func() bool {
		code, body := probe(t, a.opts.MetricsAddress, "/readyz")
		return code == http.StatusOK && strings.Contains(body, "\n"+want)
	})

	waitfor.True(t, "the Event on the Node", 30*time.Second, func() bool {
		list, err := a.client.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range list.Items {
			if e.Reason == reasonClaimLimit && e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Type == "Warning" &&
				strings.Contains(e.Note, "claimLimits.gpusPerNode") {
				return true
			}
		}
		return false
	})

	// More probes tell nothing new.
	for range 3 {
		probe(t, a.opts.MetricsAddress, "/readyz")
	}
	a.settle()
	list, err := a.client.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range list.Items {
		if e.Reason == reasonClaimLimit {
			n++
		}
	}
	if n != 1 {
		t.Errorf("%d %s Events, want 1", n, reasonClaimLimit)
	}
}
