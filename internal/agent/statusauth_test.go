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
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// TestStatusAuthOffWarns: an agent whose API server enforces no granular
// claim status authorization (here one of Kubernetes 1.35, which has no
// such gate) serves all the same, and says so in /readyz, with a Warning
// Event on its Node, once.
func TestStatusAuthOffWarns(t *testing.T) {
	a := startAgentWith(t, Options{Hardware: "mock:" + writeProfile(t, "gpus:\n- model: h100-80gb\n  count: 1\n")}, func(c *fake.Clientset) {
		c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{Major: "1", Minor: "35"}
	})
	a.slices(device.GPUDriver, nil)
	a.registerPlugins(device.GPUDriver)
	want := "warning: the API server does not enforce granular status authorization (feature gate " + metadata.StatusAuthGate
	waitfor.True(t, "/readyz warning of the status authorization", 30*time.Second, func() bool {
		code, body := probe(t, a.opts.MetricsAddress, "/readyz")
		return code == http.StatusOK && strings.Contains(body, "\n"+want)
	})

	events := func() int {
		list, err := a.client.EventsV1().Events(metav1.NamespaceDefault).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, e := range list.Items {
			if e.Reason == reasonStatusAuth && e.Regarding.Kind == "Node" && e.Regarding.Name == node && e.Type == "Warning" &&
				strings.Contains(e.Note, metadata.StatusAuthGate) {
				n++
			}
		}
		return n
	}
	waitfor.True(t, "the Event on the Node", 30*time.Second, func() bool { return events() > 0 })
	a.settle()
	if n := events(); n != 1 {
		t.Errorf("%d %s Events, want 1", n, reasonStatusAuth)
	}
}

// TestStatusAuthTold: "off" is told once until it is found on again.
func TestStatusAuthTold(t *testing.T) {
	var a statusAuth
	for i, step := range []struct {
		found      metadata.StatusAuth
		tell, warn bool
	}{
		{metadata.StatusAuthUnknown, false, false},
		{metadata.StatusAuthOff, true, true},
		{metadata.StatusAuthOff, false, true},
		{metadata.StatusAuthUnknown, false, true}, // a failed check changes nothing
		{metadata.StatusAuthOn, false, false},
		{metadata.StatusAuthOff, true, true},
	} {
		if tell := a.set(step.found); tell != step.tell || (a.warning() != nil) != step.warn {
			t.Errorf("step %d (%v): told %v, warning %v; want %v, %v", i, step.found, tell, a.warning(), step.tell, step.warn)
		}
	}
}
