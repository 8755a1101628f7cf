// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package framework

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	drapb "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/hwdra/hwdra/deploy"
	"github.com/hwdra/hwdra/internal/tools/allocate"
)

// Helpers that act as the scheduler and the kubelet for claims without
// pods: allocate with the scheduler's allocator, store the allocation as
// the scheduler does, and call the agent's DRA socket as the kubelet does.

// DRAClient dials a driver's kubelet plugin socket on the node, as the
// kubelet does: dra.sock of an agent process, dra-<pod>.sock of the agent
// pod (its rolling-update name), the newest where there are several.
func (n *Node) DRAClient(t testing.TB, driver string) drapb.DRAPluginClient {
	t.Helper()
	socks, _ := filepath.Glob(filepath.Join(n.PluginsDir(), driver, "dra*.sock"))
	if len(socks) == 0 {
		t.Fatalf("no DRA socket of %s in %s", driver, filepath.Join(n.PluginsDir(), driver))
	}
	newest, newestTime := "", time.Time{}
	for _, s := range socks {
		if st, err := os.Stat(s); err == nil && st.ModTime().After(newestTime) {
			newest, newestTime = s, st.ModTime()
		}
	}
	conn, err := grpc.NewClient("unix://"+newest,
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return drapb.NewDRAPluginClient(conn)
}

// Allocator returns the scheduler's allocator over the node's published
// slices of the given drivers, with the chart's DeviceClasses.
func (n *Node) Allocator(ctx context.Context, drivers ...string) (*allocate.Allocator, error) {
	classes, err := deploy.DeviceClasses()
	if err != nil {
		return nil, err
	}
	var all []*resourceapi.ResourceSlice
	for _, d := range drivers {
		ss, err := n.WaitPoolsComplete(ctx, d, 60*time.Second)
		if err != nil {
			return nil, err
		}
		for i := range ss {
			all = append(all, &ss[i])
		}
	}
	return allocate.New(allocate.ClusterFeatures, n.Name, all, classes), nil
}

// CreateAllocatedClaim creates the claim in ns, allocates it and stores the
// allocation in its status, as the scheduler does (no pod reserves it).
// Release the returned claim from alloc once it is deleted.
func (n *Node) CreateAllocatedClaim(ctx context.Context, alloc *allocate.Allocator, ns string, claim *resourceapi.ResourceClaim) (*resourceapi.ResourceClaim, error) {
	created, err := n.Admin.ResourceV1().ResourceClaims(ns).Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	if err := alloc.Allocate(ctx, created); err != nil {
		return nil, err
	}
	stored, err := n.Admin.ResourceV1().ResourceClaims(ns).UpdateStatus(ctx, created, metav1.UpdateOptions{})
	if err != nil {
		alloc.Release(created)
		return nil, err
	}
	return stored, nil
}

// SliceWrites counts the changes the API server makes to this node's
// ResourceSlices (ADDED, MODIFIED, DELETED watch events), per driver, from
// when it is started until ctx ends.
type SliceWrites struct {
	mu     sync.Mutex
	counts map[string]int
	events []string
}

// WatchSliceWrites starts counting at the slices' current resource version.
func (n *Node) WatchSliceWrites(ctx context.Context) (*SliceWrites, error) {
	sel := metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name}
	list, err := n.Admin.ResourceV1().ResourceSlices().List(ctx, sel)
	if err != nil {
		return nil, err
	}
	sel.ResourceVersion = list.ResourceVersion
	w, err := n.Admin.ResourceV1().ResourceSlices().Watch(ctx, sel)
	if err != nil {
		return nil, err
	}
	s := &SliceWrites{counts: map[string]int{}}
	go func() {
		defer w.Stop()
		for e := range w.ResultChan() {
			slice, ok := e.Object.(*resourceapi.ResourceSlice)
			if !ok || (e.Type != watch.Added && e.Type != watch.Modified && e.Type != watch.Deleted) {
				continue
			}
			s.mu.Lock()
			s.counts[slice.Spec.Driver]++
			s.events = append(s.events, fmt.Sprintf("%s %s (pool generation %d)", e.Type, slice.Name, slice.Spec.Pool.Generation))
			s.mu.Unlock()
		}
	}()
	return s, nil
}

// Count is the number of writes to the driver's slices so far.
func (s *SliceWrites) Count(driver string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[driver]
}

// Events lists the writes seen so far.
func (s *SliceWrites) Events() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.events)
}

// AgentAddr is where the chart's agent on the main node serves /metrics,
// /healthz and /readyz: the node's IP (the chart's metricsBind: hostIP),
// port 9464.
const AgentAddr = NodeIP + ":9464"

// AgentMetric returns the value of one sample line ("name{labels}") of the
// agent's Prometheus metrics at addr, "" when absent.
func AgentMetric(addr, sample string) (string, error) {
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, sample+" "); ok {
			return v, nil
		}
	}
	return "", nil
}
