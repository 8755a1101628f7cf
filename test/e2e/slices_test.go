// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	"github.com/hwdra/hwdra/internal/mock/model"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

var sliceGVR = schema.GroupVersionResource{Group: "resource.k8s.io", Version: "v1", Resource: "resourceslices"}

// hwdraSlices runs `hwdra slices` and returns the ResourceSlices it prints;
// it skips t while the subcommand does not exist yet.
func hwdraSlices(t *testing.T, hardware, node string) []*unstructured.Unstructured {
	t.Helper()
	bin := framework.HwdraBinary(t)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "slices", "--hardware", hardware, "--node-name", node, "-o", "yaml")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if strings.Contains(stderr.String(), "unknown command") {
			t.Skipf("hwdra slices does not exist yet: %s", stderr.String())
		}
		t.Fatalf("hwdra slices: %v\n%s", err, stderr.String())
	}
	objs, err := framework.ReadObjects(&stdout)
	if err != nil {
		t.Fatalf("hwdra slices output: %v", err)
	}
	if len(objs) == 0 {
		t.Fatal("hwdra slices printed no ResourceSlice")
	}
	return objs
}

// publishSlices creates the slices with the agent's own credentials, as the
// agent would, and checks that the apiserver stored every field it was given
// (a disabled gate would drop some). They are deleted when t ends; with
// opts.DryRun they are only validated and never stored.
func publishSlices(t *testing.T, n *framework.Node, objs []*unstructured.Unstructured, opts metav1.CreateOptions) {
	t.Helper()
	ctx := context.Background()
	creds, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	dc, err := dynamic.NewForConfig(creds.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, obj := range objs {
		got, err := dc.Resource(sliceGVR).Create(ctx, obj, opts)
		if err != nil {
			t.Fatalf("create %s as the agent: %v", obj.GetName(), err)
		}
		name := got.GetName()
		if len(opts.DryRun) == 0 {
			t.Cleanup(func() {
				_ = n.Admin.ResourceV1().ResourceSlices().Delete(context.Background(), name, metav1.DeleteOptions{})
			})
		}
		if diff := framework.Missing(obj.Object["spec"], got.Object["spec"]); len(diff) > 0 {
			t.Errorf("ResourceSlice %s: the apiserver dropped or changed fields:\n  %s", name, strings.Join(diff, "\n  "))
		}
	}
}

// TestSlicesAcceptedAndAllocated: the slices `hwdra slices` prints for a mock
// DGX H100 are accepted as published by the real apiserver (with the agent's
// least-privilege credentials), and the real scheduler allocates the example
// claims from them. Preparing needs the agent; here the pods stay in
// ContainerCreating, and only the allocation is checked.
func TestSlicesAcceptedAndAllocated(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	objs := hwdraSlices(t, "mock:dgx-h100", n.Name)
	publishSlices(t, n, objs, metav1.CreateOptions{})

	// driver/device -> attributes, from what was published.
	attrs := map[string]map[string]any{}
	for _, obj := range objs {
		driver, _, _ := unstructured.NestedString(obj.Object, "spec", "driver")
		devs, _, _ := unstructured.NestedSlice(obj.Object, "spec", "devices")
		for _, d := range devs {
			m, _ := d.(map[string]any)
			name, _, _ := unstructured.NestedString(m, "name")
			a, _, _ := unstructured.NestedMap(m, "attributes")
			attrs[driver+"/"+name] = a
		}
	}
	attr := func(driver, device, name string) any {
		v, _ := attrs[driver+"/"+device][name].(map[string]any)
		for _, x := range v {
			return x // the one value of string/int/bool/version
		}
		return nil
	}

	type want struct{ request, driver, profile string }
	ns := n.CreateNamespace(t, "alloc")
	for _, tc := range []struct {
		example  string
		results  []want
		sameNUMA bool
	}{
		{"gpu-full.yaml", []want{{"gpu", "gpu.hwdra.io", "full"}}, false},
		{"mig-1g.10gb.yaml", []want{{"mig", "gpu.hwdra.io", "1g.10gb"}}, false},
		{"first-available.yaml", []want{{"gpu/small", "gpu.hwdra.io", "1g.10gb"}}, false},
		{"vf-share-10g.yaml", []want{{"nic", "sriov.hwdra.io", ""}}, false},
		{"gpu-and-vf-same-numa.yaml", []want{{"gpu", "gpu.hwdra.io", "full"}, {"nic", "sriov.hwdra.io", ""}}, true},
	} {
		t.Run(tc.example, func(t *testing.T) {
			claim, err := framework.ExampleClaim(tc.example)
			if err != nil {
				t.Fatal(err)
			}
			tmpl := framework.TemplateFor(claim)
			if _, err := n.Admin.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, tmpl, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			pod := framework.PodWithClaimTemplate(claim.Name, tmpl.Name)
			began := time.Now()
			if _, err := n.Admin.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			got, bound, err := n.WaitPodClaimAllocated(ctx, ns, pod.Name, 60*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			framework.RecordTiming(t, "pod creation -> claim allocated ("+tc.example+")", time.Since(began))
			if bound.Spec.NodeName != n.Name {
				t.Errorf("pod bound to %q, want %q", bound.Spec.NodeName, n.Name)
			}
			results := got.Status.Allocation.Devices.Results
			if len(results) != len(tc.results) {
				t.Fatalf("allocation has %d results, want %d: %+v", len(results), len(tc.results), results)
			}
			for i, w := range tc.results {
				r := results[i]
				if r.Driver != w.driver || r.Pool != n.Name || r.Request != w.request {
					t.Errorf("allocated %s/%s/%s for request %q, want driver %s, pool %s, request %q",
						r.Driver, r.Pool, r.Device, r.Request, w.driver, n.Name, w.request)
				}
				if _, ok := attrs[r.Driver+"/"+r.Device]; !ok {
					t.Errorf("allocated device %s/%s was never published", r.Driver, r.Device)
				}
				if w.profile != "" {
					if p := attr(r.Driver, r.Device, "gpu.hwdra.io/profile"); p != w.profile {
						t.Errorf("allocated device %s has profile %v, want %q", r.Device, p, w.profile)
					}
				}
			}
			if tc.sameNUMA {
				const numa = "resource.kubernetes.io/numaNode"
				a, b := attr(results[0].Driver, results[0].Device, numa), attr(results[1].Driver, results[1].Device, numa)
				if a == nil || a != b {
					t.Errorf("%s: %s on NUMA %v, %s on NUMA %v", numa, results[0].Device, a, results[1].Device, b)
				}
			}
		})
	}
}

// TestEveryGPUModelAcceptedByTheAPIServer: the slices of every mock GPU
// model, with MIG off, MIG on and in host-vGPU mode, pass the real API
// server's validation (a server-side dry run with the agent's credentials)
// and are stored as given.
func TestEveryGPUModelAcceptedByTheAPIServer(t *testing.T) {
	n := framework.Shared(t)
	for _, model := range model.GPUNames() {
		for _, mode := range []struct{ name, yaml string }{
			{"mig-off", ""}, {"mig-on", "\n  mig: true"}, {"host-vgpu", "\n  virtualization: host-vgpu"},
		} {
			t.Run(model+"/"+mode.name, func(t *testing.T) {
				hardware := framework.MockProfile(t, model, "gpus:\n- model: "+model+"\n  count: 8"+mode.yaml+"\n")
				publishSlices(t, n, hwdraSlices(t, hardware, n.Name), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			})
		}
	}
}
