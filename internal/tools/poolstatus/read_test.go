// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestReadWithoutDeviceTaintRules: where the API serves no
// DeviceTaintRules (404) the report still comes, with the slices' own
// taints; other errors are errors. Slices are asked for per driver and,
// with a node, per node (field selectors the API server applies).
func TestReadWithoutDeviceTaintRules(t *testing.T) {
	s := slice("p", 1, 1, "n1", dev("a", resourceapi.DeviceTaintEffectNoSchedule), dev("b"))
	s.Name = "s"
	client := fake.NewClientset(&s)
	var selectors []string
	client.PrependReactor("list", "resourceslices", func(a k8stesting.Action) (bool, runtime.Object, error) {
		selectors = append(selectors, a.(k8stesting.ListAction).GetListRestrictions().Fields.String())
		return false, nil, nil
	})
	client.PrependReactor("list", "devicetaintrules", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewNotFound(resourceapi.Resource("devicetaintrules"), "")
	})
	r, err := Status(context.Background(), client, []string{drv}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Pools) != 1 || *r.Pools[0].UnavailableDevices != 1 || *r.Pools[0].TotalDevices != 2 {
		t.Fatalf("report %+v", r.Pools)
	}
	if len(selectors) != 1 || selectors[0] != "spec.driver=example.com,spec.nodeName=n1" {
		t.Errorf("slice field selectors %v", selectors)
	}

	client.PrependReactor("list", "devicetaintrules", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewForbidden(resourceapi.Resource("devicetaintrules"), "", nil)
	})
	if _, err := Status(context.Background(), client, []string{drv}, ""); err == nil {
		t.Error("a forbidden list of DeviceTaintRules gave no error")
	}
}
