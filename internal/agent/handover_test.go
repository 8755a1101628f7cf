// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package agent

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/slices/device"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// probe GETs a probe endpoint of an agent: its status code and body.
func probe(t testing.TB, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestRollingUpdateHandover: a second agent on the same node (a rolling
// update's surge pod: same state directory, its own pod UID and sockets)
// waits, alive and not ready, asks the serving one to hand over, and then
// serves the node: its plugins registered under its own sockets, its
// slices published, ready; the first one stops serving (its sockets gone,
// not ready) and waits for termination without exiting.
func TestRollingUpdateHandover(t *testing.T) {
	a := startAgentWith(t, Options{Hardware: "mock:" + writeProfile(t, "gpus:\n- model: h100-80gb\n  count: 1\n"), PodUID: "11111111-aaaa-4aaa-8aaa-000000000001"})
	a.slices(device.GPUDriver, nil)
	oldSocket := registrarSocket(filepath.Join(a.dir, "registry"), device.GPUDriver, a.opts.PodUID)
	waitfor.True(t, "the first agent's registration socket", 30*time.Second, func() bool { _, err := os.Stat(oldSocket); return err == nil })
	// No kubelet here: the registration never comes, and /readyz says so
	// once the agent serves ("starting" until its start is done).
	waitfor.True(t, "/readyz naming the kubelet's registration", 30*time.Second, func() bool {
		code, body := probe(t, a.opts.MetricsAddress, "/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(body, "kubelet has not registered")
	})

	if code, body := probe(t, a.opts.MetricsAddress, "/healthz"); code != http.StatusOK {
		t.Fatalf("/healthz: %d %q", code, body)
	}

	// The surge pod's agent.
	b := &testAgent{t: t, dir: a.dir, client: a.client, done: make(chan error, 1), opts: a.opts}
	b.opts.PodUID = "22222222-bbbb-4bbb-8bbb-000000000002"
	b.opts.MetricsAddress = freeAddress(t)
	_, ctx := ktesting.NewTestContext(t)
	ctx, b.cancel = context.WithCancel(ctx)
	go func() { b.done <- Run(ctx, b.opts) }()
	t.Cleanup(b.stop)

	newSocket := registrarSocket(filepath.Join(a.dir, "registry"), device.GPUDriver, b.opts.PodUID)
	waitfor.True(t, "the second agent's registration socket", 30*time.Second, func() bool { _, err := os.Stat(newSocket); return err == nil })
	waitfor.True(t, "the first agent's sockets gone", 30*time.Second, func() bool { _, err := os.Stat(oldSocket); return os.IsNotExist(err) })
	if newSocket == oldSocket {
		t.Fatal("both agents use one registration socket")
	}
	// The first one stopped serving but did not exit: the kubelet would
	// restart it and it would ask for the node back.
	select {
	case err := <-a.done:
		t.Fatalf("the first agent exited after handing over: %v", err)
	case <-time.After(500 * time.Millisecond):
	}
	// Its listener is closed; the second one answers.
	if code, _ := probe(t, a.opts.MetricsAddress, "/readyz"); code != 0 {
		t.Errorf("the first agent still answers probes after handing over: %d", code)
	}
	waitfor.True(t, "the second agent's publication verified", 30*time.Second, func() bool {
		_, body := probe(t, b.opts.MetricsAddress, "/readyz")
		return strings.Contains(body, "kubelet plugin") && !strings.Contains(body, "ResourceSlices")
	})

	data, err := os.ReadFile(filepath.Join(a.dir, "state", lockFile))
	if err != nil || strings.TrimSpace(string(data)) != b.opts.PodUID {
		t.Errorf("state lock names %q (%v), want the second agent", data, err)
	}
	if _, err := os.Stat(filepath.Join(a.dir, "state", handoverFile)); !os.IsNotExist(err) {
		t.Errorf("the handover request is still there: %v", err)
	}
}

// TestStaleHandoverRequest: a request whose agent died (nobody holds its
// lock) is removed, not obeyed.
func TestStaleHandoverRequest(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, handoverFile), []byte("dead-agent\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := lockState(ctx, dir, "me", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	handed := make(chan string, 1)
	go l.watch(ctx, func(by string) { handed <- by })
	deadline := time.After(5 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(dir, handoverFile)); os.IsNotExist(err) {
			break
		}
		select {
		case by := <-handed:
			t.Fatalf("handed over to a dead agent %q", by)
		case <-deadline:
			t.Fatal("the stale request is still there")
		case <-time.After(50 * time.Millisecond):
		}
	}
	select {
	case by := <-handed:
		t.Fatalf("handed over to %q", by)
	case <-time.After(3 * handoverPoll):
	}
}
