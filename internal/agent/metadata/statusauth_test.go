// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"context"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/version"
	fakediscovery "k8s.io/client-go/discovery/fake"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// statusAuthClient is an API server of the version with the claims, whose
// claim status updates answer with answer.
func statusAuthClient(t *testing.T, minor string, answer error, claims ...runtime.Object) (*fake.Clientset, *[]k8stesting.UpdateAction) {
	c := fake.NewClientset(claims...)
	c.Discovery().(*fakediscovery.FakeDiscovery).FakedServerVersion = &version.Info{Major: "1", Minor: minor}
	var updates []k8stesting.UpdateAction
	c.PrependReactor("update", "resourceclaims", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction)
		if u.GetSubresource() != "status" {
			t.Errorf("an update of %s, want only status", u.GetSubresource())
		}
		updates = append(updates, u)
		return true, u.GetObject(), answer
	})
	return c, &updates
}

func allocated(ns, name string) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{
			Results: []resourceapi.DeviceRequestAllocationResult{{Request: "r", Driver: "gpu.hwdra.io", Pool: "node-1", Device: "gpu-0"}},
		}}},
	}
}

// The refusal as the 1.37 API server words it (pkg/registry/resource
// AuthorizedForBinding) in its Invalid status.
var refusedBinding = apierrors.NewInvalid(schema.GroupKind{Group: "resource.k8s.io", Kind: "ResourceClaim"}, "c", field.ErrorList{
	field.Forbidden(field.NewPath("status", "allocation"), `changing status.allocation or status.reservedFor requires resource="resourceclaims/binding", verb="update" permission: forbidden`),
})

func TestCheckStatusAuth(t *testing.T) {
	unallocated := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "pending"}}
	for _, tc := range []struct {
		name    string
		minor   string
		answer  error
		claims  []runtime.Object
		want    StatusAuth
		probes  int
		wantErr bool
	}{
		{name: "1.35 has no such gate", minor: "35", want: StatusAuthOff},
		{name: "a provider's 1.35", minor: "35+", want: StatusAuthOff},
		{name: "no claim to ask with", minor: "37", claims: []runtime.Object{unallocated}, want: StatusAuthUnknown},
		{name: "refused for want of binding", minor: "37", answer: refusedBinding, claims: []runtime.Object{unallocated, allocated("b", "c")}, want: StatusAuthOn, probes: 1},
		{name: "allowed: off", minor: "36", claims: []runtime.Object{allocated("b", "c")}, want: StatusAuthOff, probes: 1},
		{name: "no status rights at all", minor: "37", answer: apierrors.NewForbidden(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "c", nil),
			claims: []runtime.Object{allocated("b", "c")}, want: StatusAuthOn, probes: 1},
		{name: "a conflict tells nothing", minor: "37", answer: apierrors.NewConflict(schema.GroupResource{Group: "resource.k8s.io", Resource: "resourceclaims"}, "c", nil),
			claims: []runtime.Object{allocated("b", "c")}, want: StatusAuthUnknown, probes: 1, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, updates := statusAuthClient(t, tc.minor, tc.answer, tc.claims...)
			got, err := CheckStatusAuth(context.Background(), c)
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("CheckStatusAuth = %v, %v; want %v (error: %v)", got, err, tc.want, tc.wantErr)
			}
			if len(*updates) != tc.probes {
				t.Fatalf("%d status updates, want %d", len(*updates), tc.probes)
			}
			for _, u := range *updates {
				// Nothing stored: a dry run, of the allocated claim, adding
				// a reservation (the change that needs resourceclaims/binding).
				opts, ok := u.(k8stesting.UpdateActionImpl)
				if !ok || len(opts.UpdateOptions.DryRun) != 1 || opts.UpdateOptions.DryRun[0] != metav1.DryRunAll {
					t.Errorf("the probe is no dry run: %+v", u)
				}
				claim := u.GetObject().(*resourceapi.ResourceClaim)
				if claim.Name != "c" || len(claim.Status.ReservedFor) != 1 || claim.Status.ReservedFor[0].Name != probePod {
					t.Errorf("the probe updates %s with reservations %v", claim.Name, claim.Status.ReservedFor)
				}
			}
		})
	}
}
