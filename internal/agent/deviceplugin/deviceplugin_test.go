// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package deviceplugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"

	"github.com/hwdra/hwdra/internal/agent/config"
	"github.com/hwdra/hwdra/internal/waitfor"
)

// resource is the default configuration's: nvidia.com/gpu,
// nvidia.com/gpu.shared, nvidia.com/mig-*.
var gpuResource = config.Default().DevicePluginResource

// listen makes a unix socket file at path, as a device plugin's gRPC
// server does; closing the listener removes it.
func listen(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// TestFromSockets: NVIDIA's sockets for the plugin's GPU resources count;
// other plugins' sockets, other resources, and files that are no sockets
// (the kubelet's checkpoint, a leftover regular file) do not.
func TestFromSockets(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sockets []string
		files   []string
		want    []string
	}{
		{name: "empty directory"},
		{name: "the kubelet's own", sockets: []string{"kubelet.sock"}, files: []string{"kubelet_internal_checkpoint"}},
		{name: "whole GPUs", sockets: []string{"kubelet.sock", "nvidia-gpu.sock"}, want: []string{"nvidia-gpu.sock"}},
		{name: "time-slicing, renamed", sockets: []string{"nvidia-gpu.shared.sock"}, want: []string{"nvidia-gpu.shared.sock"}},
		{name: "MIG, mixed strategy", sockets: []string{"nvidia-mig-1g.10gb.sock", "nvidia-mig-3g.40gb.sock"},
			want: []string{"nvidia-mig-1g.10gb.sock", "nvidia-mig-3g.40gb.sock"}},
		{name: "another resource of NVIDIA's", sockets: []string{"nvidia-ib.sock"}},
		{name: "another vendor", sockets: []string{"amd.com_gpu.sock", "nvidia.sock", "nvidia-.sock"}},
		{name: "a regular file by the socket's name", files: []string{"nvidia-gpu.sock"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, s := range tc.sockets {
				listen(t, filepath.Join(dir, s))
			}
			for _, f := range tc.files {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("{}"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			entries, err := os.ReadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			var want []Signal
			for _, w := range tc.want {
				want = append(want, Signal{Source: SourceSocket, What: filepath.Join(dir, w)})
			}
			if got := FromSockets(dir, entries, gpuResource); !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

func nodeWith(capacity, allocatable map[string]int64) *v1.Node {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-1"}}
	list := func(m map[string]int64) v1.ResourceList {
		out := v1.ResourceList{v1.ResourceCPU: resource.MustParse("64")}
		for k, v := range m {
			out[v1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
		}
		return out
	}
	n.Status.Capacity, n.Status.Allocatable = list(capacity), list(allocatable)
	return n
}

// TestFromNode: the plugin's resources above zero in capacity or
// allocatable; the kubelet's 0 after the plugin left is no sign.
func TestFromNode(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		capacity, allocatable map[string]int64
		want                  []string
	}{
		{name: "no GPU resources"},
		{name: "whole GPUs", capacity: map[string]int64{"nvidia.com/gpu": 8}, allocatable: map[string]int64{"nvidia.com/gpu": 8},
			want: []string{"nvidia.com/gpu=8"}},
		{name: "every GPU unhealthy, or the plugin gone less than 5 minutes: capacity only",
			capacity: map[string]int64{"nvidia.com/gpu": 8}, allocatable: map[string]int64{"nvidia.com/gpu": 0},
			want: []string{"nvidia.com/gpu=8"}},
		{name: "allocatable only (patched by hand)", allocatable: map[string]int64{"nvidia.com/gpu": 2}, want: []string{"nvidia.com/gpu=2"}},
		{name: "the kubelet forgot the plugin: 0 left in both", capacity: map[string]int64{"nvidia.com/gpu": 0}, allocatable: map[string]int64{"nvidia.com/gpu": 0}},
		{name: "MIG, mixed strategy", capacity: map[string]int64{"nvidia.com/mig-1g.10gb": 14, "nvidia.com/mig-3g.40gb": 4, "nvidia.com/gpu": 0},
			want: []string{"nvidia.com/mig-1g.10gb=14", "nvidia.com/mig-3g.40gb=4"}},
		{name: "other extended resources", capacity: map[string]int64{"example.com/dongle": 1, "hugepages-2Mi": 1 << 30}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var want []Signal
			for _, w := range tc.want {
				want = append(want, Signal{Source: SourceNode, What: w})
			}
			if got := FromNode(nodeWith(tc.capacity, tc.allocatable), gpuResource); !reflect.DeepEqual(got, want) {
				t.Errorf("got %v, want %v", got, want)
			}
		})
	}
}

// TestWatcher: the watcher follows a socket appearing and going, and the
// node's status changing, tells each change, says why, and counts it in
// its metric; before the node's status is read it says so.
func TestWatcher(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dir := t.TempDir()
	client := fake.NewClientset(nodeWith(nil, nil))
	reg := prometheus.NewRegistry()
	w := New(Options{Dir: dir, NodeName: "worker-1", Client: client, Resources: config.Default(), Registry: reg})
	if got := w.Why(); len(got) != 1 || !strings.Contains(got[0], "not read yet") {
		t.Fatalf("before the node's status is read: %q", got)
	}
	var changes atomic.Int32
	if err := w.Start(ctx, func() { changes.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	// waitFor waits until the signals are want and, after the first
	// call, the change was told: the watcher counts a change in its
	// metric and then tells it, after Why shows it.
	told := int32(-1)
	waitFor := func(what string, want ...string) {
		t.Helper()
		waitfor.NoError(t, what, 10*time.Second, func() error {
			got := w.Why()
			if !reflect.DeepEqual(got, append([]string{}, want...)) || changes.Load() <= told {
				return fmt.Errorf("signals %q, want %q; %d changes told, %d before", got, want, changes.Load(), told)
			}
			told = changes.Load()
			return nil
		})
	}
	metric := func(source string) float64 {
		var m dto.Metric
		if err := w.detected.WithLabelValues(source).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetGauge().GetValue()
	}
	waitFor("nothing on the node")

	sock := filepath.Join(dir, "nvidia-gpu.sock")
	l := listen(t, sock) // its appearance is told (waitFor)
	waitFor("socket made", "its socket "+sock)
	if metric(SourceSocket) != 1 || metric(SourceNode) != 0 {
		t.Errorf("metric socket %v node %v, want 1 0", metric(SourceSocket), metric(SourceNode))
	}

	node := nodeWith(map[string]int64{"nvidia.com/gpu": 8}, map[string]int64{"nvidia.com/gpu": 8})
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("node advertises", "its socket "+sock, "the node advertises nvidia.com/gpu=8")
	if metric(SourceNode) != 1 {
		t.Errorf("metric node %v, want 1", metric(SourceNode))
	}

	l.Close() // removes the socket
	waitFor("socket gone", "the node advertises nvidia.com/gpu=8")
	if _, err := client.CoreV1().Nodes().UpdateStatus(ctx, nodeWith(map[string]int64{"nvidia.com/gpu": 0}, nil), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor("node forgot the plugin")
	if metric(SourceSocket) != 0 || metric(SourceNode) != 0 {
		t.Errorf("metric socket %v node %v, want 0 0", metric(SourceSocket), metric(SourceNode))
	}
}

// TestWatcherWithoutDirectory: a node without the kubelet's
// device-plugin directory is watched by its status alone.
func TestWatcherWithoutDirectory(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := fake.NewClientset(nodeWith(map[string]int64{"nvidia.com/mig-1g.10gb": 7}, nil))
	w := New(Options{Dir: filepath.Join(t.TempDir(), "missing"), NodeName: "worker-1", Client: client, Resources: config.Default(), Registry: prometheus.NewRegistry()})
	if err := w.Start(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if err := w.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := w.Why(), []string{"the node advertises nvidia.com/mig-1g.10gb=7"}; !reflect.DeepEqual(got, want) {
		t.Errorf("signals %q, want %q", got, want)
	}
}
