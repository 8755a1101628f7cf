// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/nri/pkg/api"
	"github.com/containerd/nri/pkg/stub"
)

// NRIGate is an NRI plugin of the test's own, called by containerd before
// the agent's (index 05 against 10): it refuses the sandbox of one pod
// until opened. The kubelet prepares a pod's claims before its sandbox
// and retries a refused sandbox without preparing again, so a test holds
// the pod between prepare and sandbox (to stop the agent there).
type NRIGate struct {
	namespace, name string
	open            atomic.Bool
	refused, passed atomic.Int32
	synced          chan struct{}
}

// StartNRIGate connects a gate for pod namespace/name to the node's
// containerd and returns once containerd has it; it disconnects when t
// ends.
func (n *Node) StartNRIGate(t testing.TB, namespace, name string) *NRIGate {
	t.Helper()
	g := &NRIGate{namespace: namespace, name: name, synced: make(chan struct{})}
	s, err := stub.New(g, stub.WithPluginName("e2e-gate"), stub.WithPluginIdx("05"), stub.WithSocketPath(n.NRISocket))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		s.Stop()
		<-done
	})
	select {
	case <-g.synced:
	case <-time.After(10 * time.Second):
		t.Fatal("the NRI gate did not connect to containerd within 10s")
	}
	// containerd drops events sent before it marks a plugin synchronized,
	// right after Synchronize returns; it tells no one when, so real time
	// passes.
	time.Sleep(500 * time.Millisecond)
	return g
}

// Synchronize implements the stub's Synchronize hook.
func (g *NRIGate) Synchronize(context.Context, []*api.PodSandbox, []*api.Container) ([]*api.ContainerUpdate, error) {
	select {
	case <-g.synced:
	default:
		close(g.synced)
	}
	return nil, nil
}

// RunPodSandbox refuses the gated pod's sandbox while the gate is closed.
func (g *NRIGate) RunPodSandbox(_ context.Context, sb *api.PodSandbox) error {
	if sb.GetNamespace() != g.namespace || sb.GetName() != g.name {
		return nil
	}
	if !g.open.Load() {
		g.refused.Add(1)
		return fmt.Errorf("e2e gate: sandbox of %s/%s held back by the test", g.namespace, g.name)
	}
	g.passed.Add(1)
	return nil
}

// Open lets the pod's next sandbox through.
func (g *NRIGate) Open() { g.open.Store(true) }

// Refused and Passed count the pod's sandboxes the gate refused and let
// through.
func (g *NRIGate) Refused() int { return int(g.refused.Load()) }
func (g *NRIGate) Passed() int  { return int(g.passed.Load()) }
