// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/waitfor"
)

// TestAgentSaysTheAPIServerIsUnreachable: an agent whose API server does
// not answer (a closed port on loopback) says so at the default
// verbosity, naming the server and where its address came from, and
// /readyz says it; when something answers on that address, the agent says
// so and /readyz no longer names it.
func TestAgentSaysTheAPIServerIsUnreachable(t *testing.T) {
	addr := freeAddress(t) // closed once freeAddress returns
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "registry"), 0o755); err != nil { // the kubelet's
		t.Fatal(err)
	}
	opts := Options{
		NodeName: node, Hardware: "mock:cx7", NRISocket: "",
		KubeConfig:       &rest.Config{Host: "https://" + addr, TLSClientConfig: rest.TLSClientConfig{Insecure: true}},
		KubeConfigSource: "--kubeconfig test.yaml", KubeAPIQPS: 50, KubeAPIBurst: 100,
		RegistrarDir: filepath.Join(dir, "registry"), PluginsDir: filepath.Join(dir, "plugins"),
		CDIDir: filepath.Join(dir, "cdi"), StateDir: filepath.Join(dir, "state"),
		Rescan: time.Minute, MetricsAddress: freeAddress(t),
	}
	logger := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
	ctx, cancel := context.WithCancel(klog.NewContext(context.Background(), logger))
	done := make(chan error, 1)
	go func() { done <- Run(ctx, opts) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent: %v", err)
		}
	}()
	log := func() string { return logger.GetSink().(ktesting.Underlier).GetBuffer().String() }
	ready := func() string { _, body := probe(t, opts.MetricsAddress, "/readyz"); return body }

	warning := `server="https://` + addr + `" from="--kubeconfig test.yaml" err="dial tcp ` + addr + `: connect: connection refused"`
	waitfor.True(t, "the warning", 30*time.Second, func() bool {
		return strings.Contains(log(), "Warning: cannot reach the API server: claims cannot be read nor devices published until it answers; retrying") &&
			strings.Contains(log(), warning)
	})

	unreachable := "the API server https://" + addr + " (--kubeconfig test.yaml) is unreachable for "
	waitfor.True(t, "/readyz to name the API server", 30*time.Second, func() bool { return strings.Contains(ready(), unreachable) })

	// Something answers there now (any HTTP answer is the server reached).
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":503}`, http.StatusServiceUnavailable)
	}))
	srv.Listener.Close()
	srv.Listener = ln
	srv.StartTLS()
	defer srv.Close()
	waitfor.True(t, "the agent to say the server answers", 30*time.Second, func() bool {
		return strings.Contains(log(), "The API server answers again") && strings.Contains(log(), `server="https://`+addr+`" after=`)
	})

	if body := ready(); strings.Contains(body, "unreachable") {
		t.Errorf("/readyz still names the API server: %q", body)
	}
	if n := strings.Count(log(), "Warning: cannot reach the API server"); n > 3 {
		t.Errorf("%d warnings in the few seconds it was down: no backoff", n)
	}
}
