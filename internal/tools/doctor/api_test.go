// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package doctor

import (
	"context"
	"errors"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/hwdra/hwdra/internal/agent/publish/publishtest"
	"github.com/hwdra/hwdra/internal/agent/slices/device"
)

// apiServer is a fake API server of Kubernetes 1.37 that serves DRA's
// resource.k8s.io/v1 and answers dry-run creates with what it would
// store.
func apiServer() *fake.Clientset {
	c := publishtest.NewClientset()
	d := c.Discovery().(*fakediscovery.FakeDiscovery)
	d.FakedServerVersion = &version.Info{GitVersion: "v1.37.2"}
	d.Resources = []*metav1.APIResourceList{{
		GroupVersion: resourceapi.SchemeGroupVersion.String(),
		APIResources: []metav1.APIResource{{Name: "resourceslices"}, {Name: "resourceclaims", Namespaced: true}, {Name: "deviceclasses"}},
	}}
	return c
}

func apiInput(t *testing.T, c *fake.Clientset) Input {
	in := input(t, open(t, gpuNIC))
	in.API = API{Client: c, Server: "https://10.0.0.1:6443 (test)"}
	return in
}

// TestAPI: with an API server that answers, serves DRA and keeps every
// feature's fields, the API checks pass; the feature check is the
// publisher's dry-run create of its probe slice, for the node, on the GPU
// driver, storing nothing.
func TestAPI(t *testing.T) {
	c := apiServer()
	r := Run(context.Background(), apiInput(t, c))
	want(t, r, "api-server", OK, "the API server https://10.0.0.1:6443 (test) answers: Kubernetes v1.37.2")
	want(t, r, "dra-api", OK, "resource.k8s.io/v1 served")
	f := want(t, r, "dra-features", OK, "keeps the fields of every DRA feature", "gpu.hwdra.io on node worker-1")
	if len(f.Details) != 4 {
		t.Errorf("details %q", f.Details)
	}
	var dryRuns int
	for _, a := range c.Actions() {
		if create, ok := a.(k8stesting.CreateActionImpl); ok && a.GetResource().Resource == "resourceslices" {
			s := create.GetObject().(*resourceapi.ResourceSlice)
			if len(create.CreateOptions.DryRun) == 0 || s.Spec.NodeName == nil || *s.Spec.NodeName != "worker-1" || s.Spec.Driver != device.GPUDriver {
				t.Errorf("not the probe's dry run: %+v %+v", create.CreateOptions, s.Spec)
			}
			dryRuns++
		}
	}
	if list, _ := c.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{}); dryRuns != 1 || len(list.Items) != 0 {
		t.Errorf("%d dry runs, %d slices stored", dryRuns, len(list.Items))
	}
}

// TestAPIFeatureOff: an API server that drops a gate's fields from the
// probe slice (DRADeviceCompatibilityGroups off) is said, with what the
// agent leaves out and which gate to turn on.
func TestAPIFeatureOff(t *testing.T) {
	c := apiServer()
	c.PrependReactor("create", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		s := a.(k8stesting.CreateAction).GetObject().(*resourceapi.ResourceSlice)
		for i := range s.Spec.Devices {
			for j := range s.Spec.Devices[i].ConsumesCounters {
				s.Spec.Devices[i].ConsumesCounters[j].CompatibilityGroups = nil
			}
		}
		return false, nil, nil
	})
	r := Run(context.Background(), apiInput(t, c))
	f := want(t, r, "dra-features", Warn, "drops the fields of DRADeviceCompatibilityGroups", "DRADeviceCompatibilityGroups: off: no vGPU devices",
		"DRAPartitionableDevices: on", "--feature-gates=DRADeviceCompatibilityGroups=true")
	if len(f.Details) != 4 {
		t.Errorf("details %q", f.Details)
	}
}

// TestAPIFailures: what the API server refuses or lacks blocks, or warns
// where the agent falls back; no kubeconfig skips the API checks, and
// one that cannot be used warns.
func TestAPIFailures(t *testing.T) {
	t.Run("no kubeconfig", func(t *testing.T) {
		in := input(t, open(t, gpuNIC))
		r := Run(context.Background(), in)
		want(t, r, "api-server", Skip, "no kubeconfig")
		in.API.Err = errors.New("kubeconfig: bad")
		r = Run(context.Background(), in)
		want(t, r, "api-server", Warn, "API checks skipped: kubeconfig: bad", "--kubeconfig")
		want(t, r, "dra-features", Skip)
	})
	t.Run("unreachable", func(t *testing.T) {
		c := apiServer()
		c.Discovery().(*fakediscovery.FakeDiscovery).PrependReactor("get", "version", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, errors.New("dial tcp 10.0.0.1:6443: connect: connection refused")
		})
		r := Run(context.Background(), apiInput(t, c))
		want(t, r, "api-server", Blocker, "does not answer: dial tcp", "credentials")
		want(t, r, "dra-api", Skip, "does not answer")
		want(t, r, "dra-features", Skip, "does not answer")
	})
	t.Run("no DRA", func(t *testing.T) {
		c := apiServer()
		c.Discovery().(*fakediscovery.FakeDiscovery).Resources = nil
		r := Run(context.Background(), apiInput(t, c))
		want(t, r, "dra-api", Blocker, "does not serve resource.k8s.io/v1 ResourceSlices", "1.34")
		want(t, r, "dra-features", Skip, "no DRA API")
	})
	t.Run("forbidden", func(t *testing.T) {
		c := apiServer()
		c.PrependReactor("create", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, nil, apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceslices"}, "", errors.New("no"))
		})
		r := Run(context.Background(), apiInput(t, c))
		want(t, r, "dra-features", Warn, "this kubeconfig may not create ResourceSlices", "service account")
		if r.Count(Blocker) != 0 {
			t.Errorf("blockers:\n%s", text(t, r))
		}
	})
}
