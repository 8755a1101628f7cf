// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"

	"github.com/hwdra/hwdra/internal/waitfor"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// byName indexes the items of a slice list field (devices, sharedCounters)
// across slices, per driver: "<driver>/<name>" -> item.
func byName(slices []map[string]any, field string) map[string]any {
	out := map[string]any{}
	for _, s := range slices {
		driver, _, _ := unstructured.NestedString(s, "spec", "driver")
		items, _, _ := unstructured.NestedSlice(s, "spec", field)
		for _, it := range items {
			name, _, _ := unstructured.NestedString(it.(map[string]any), "name")
			out[driver+"/"+name] = it
		}
	}
	return out
}

func keys(m map[string]any) []string {
	var k []string
	for x := range m {
		k = append(k, x)
	}
	sort.Strings(k)
	return k
}

// TestAgentPublishesAsIsAndRestsQuietly: what the running agent publishes is
// what `hwdra slices` computes for the same hardware, every field stored by
// the apiserver, and a node at rest (the agent rescanning every second)
// causes no further ResourceSlice writes.
func TestAgentPublishesAsIsAndRestsQuietly(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	var want []map[string]any
	for _, o := range hwdraSlices(t, "mock:dgx-h100", n.Name) {
		want = append(want, o.Object)
	}
	wantDrivers := map[string]bool{}
	for _, s := range want {
		d, _, _ := unstructured.NestedString(s, "spec", "driver")
		wantDrivers[d] = true
	}

	agent := n.StartAgent(t, "mock:dgx-h100", "--rescan-interval=1s")
	for d := range wantDrivers {
		if _, err := n.WaitResourceSlices(ctx, d, 60*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	logRSS(t, "dgx-h100", agent.Pid())

	dc, err := dynamic.NewForConfig(n.AdminConfig)
	if err != nil {
		t.Fatal(err)
	}
	// The agent publishes a pool's slices one by one: wait until all are
	// there.
	var list *unstructured.UnstructuredList
	waitfor.NoError(t, "the agent's slices as many as hwdra slices computes", 30*time.Second, func() error {
		if list, err = dc.Resource(sliceGVR).List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name}); err != nil {
			return err
		}
		if len(list.Items) < len(want) {
			return fmt.Errorf("the agent published %d slices, hwdra slices computes %d", len(list.Items), len(want))
		}
		return nil
	})
	var got []map[string]any
	for _, it := range list.Items {
		got = append(got, it.Object)
	}
	for _, field := range []string{"devices", "sharedCounters"} {
		w, g := byName(want, field), byName(got, field)
		if len(w) != len(g) {
			t.Errorf("%s: hwdra slices computes %d, the apiserver has %d\nwant %v\ngot  %v", field, len(w), len(g), keys(w), keys(g))
		}
		for name, item := range w {
			if diff := framework.Missing(item, g[name]); len(diff) > 0 {
				t.Errorf("%s %s differs from hwdra slices (dropped by the apiserver or published differently): %v", field, name, diff)
			}
		}
	}

	// At rest: no slice is written again while the agent rescans.
	w, err := dc.Resource(sliceGVR).Watch(ctx, metav1.ListOptions{
		FieldSelector:   "spec.nodeName=" + n.Name,
		ResourceVersion: list.GetResourceVersion(),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	const quiet = 5 * time.Second
	timeout := time.After(quiet)
	for {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatal("the watch ended early")
			}
			if ev.Type == watch.Bookmark {
				continue
			}
			name := ""
			if o, ok := ev.Object.(*unstructured.Unstructured); ok {
				name = o.GetName()
			}
			t.Fatalf("the agent wrote while at rest: %s %s", ev.Type, name)
		case <-timeout:
			t.Logf("no ResourceSlice write in %v with a 1s rescan interval", quiet)
			return
		}
	}
}

// logRSS logs a process's resident memory (the agent's, once it has
// published), for the closing note; the target lives in the agent's
// benchmark, not in a timed assertion here.
func logRSS(t *testing.T, what string, pid int) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Logf("RSS %s: %v", what, err)
		return
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmRSS:") || strings.HasPrefix(line, "RssAnon:") || strings.HasPrefix(line, "RssFile:") {
			t.Logf("RSS agent %s %s", what, strings.Join(strings.Fields(line), " "))
		}
	}
}
