// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package e2e

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hwdra/hwdra/internal/agent/metadata"
	"github.com/hwdra/hwdra/test/e2e/framework"
)

// allocatedClaim creates a claim with one request per driver and, as the
// scheduler would, allocates it to node.
func allocatedClaim(t *testing.T, n *framework.Node, ns, name, node string) {
	t.Helper()
	ctx := context.Background()
	claims := n.Admin.ResourceV1().ResourceClaims(ns)
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
			{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "gpu.hwdra.io"}},
			{Name: "other", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "other.example.com"}},
		}}},
	}
	claim, err := claims.Create(ctx, claim, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "gpu", Driver: "gpu.hwdra.io", Pool: node, Device: "gpu-0"},
			{Request: "other", Driver: "other.example.com", Pool: node, Device: "dev-0"},
		}},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{
				Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node},
			}},
		}}},
	}
	if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("allocate %s: %v", name, err)
	}
}

// TestAgentClaimAccess: the agent reads claims and writes status.devices
// only for its own drivers, only on claims allocated to its own node, and
// never changes an allocation or creates claims.
func TestAgentClaimAccess(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agent, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	ns := n.CreateNamespace(t, "claims")
	allocatedClaim(t, n, ns, "here", n.Name)
	allocatedClaim(t, n, ns, "elsewhere", "node-elsewhere")
	claims := agent.Client.ResourceV1().ResourceClaims(ns)

	for _, tc := range []struct {
		name, claim, driver, device string
		allowed                     bool
	}{
		{"own driver, own node", "here", "gpu.hwdra.io", "gpu-0", true},
		{"other driver, own node", "here", "other.example.com", "dev-0", false},
		{"own driver, other node", "elsewhere", "gpu.hwdra.io", "gpu-0", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			claim, err := claims.Get(ctx, tc.claim, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("the agent may read claims: %v", err)
			}
			pool := claim.Status.Allocation.Devices.Results[0].Pool
			claim.Status.Devices = append(claim.Status.Devices, resourceapi.AllocatedDeviceStatus{
				Driver: tc.driver, Pool: pool, Device: tc.device,
				Conditions: []metav1.Condition{{
					Type: "Ready", Status: metav1.ConditionTrue, Reason: "Prepared",
					LastTransitionTime: metav1.Now(),
				}},
			})
			_, err = claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{})
			switch {
			case tc.allowed && err != nil:
				t.Fatalf("status.devices write refused: %v", err)
			case !tc.allowed && err == nil:
				t.Fatal("status.devices write allowed, want forbidden")
			case !tc.allowed && !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
				t.Fatalf("want a denial, got %v", err)
			}
		})
	}

	t.Run("allocation is off limits", func(t *testing.T) {
		claim, err := claims.Get(ctx, "here", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		claim.Status.Allocation = nil
		if _, err := claims.UpdateStatus(ctx, claim, metav1.UpdateOptions{}); err == nil {
			t.Error("the agent deallocated a claim")
		}
	})
	t.Run("no claim creation or deletion", func(t *testing.T) {
		c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "by-agent"}}
		if _, err := claims.Create(ctx, c, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("create: %v, want forbidden", err)
		}
		if err := claims.Delete(ctx, "here", metav1.DeleteOptions{}); !apierrors.IsForbidden(err) {
			t.Errorf("delete: %v, want forbidden", err)
		}
	})
}

// TestAgentFindsClaimStatusAuthorization: the agent's check
// (metadata.CheckStatusAuth), with its own credentials against the real
// API server, finds granular status authorization on (the default since
// 1.36) once an allocated claim exists, and its dry-run probe stores
// nothing.
func TestAgentFindsClaimStatusAuthorization(t *testing.T) {
	n := framework.Shared(t)
	ctx := context.Background()
	agent, err := n.AgentCredentials(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	ns := n.CreateNamespace(t, "statusauth")
	allocatedClaim(t, n, ns, "probed", n.Name)
	before, err := n.Admin.ResourceV1().ResourceClaims(ns).Get(ctx, "probed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := metadata.CheckStatusAuth(ctx, agent.Client)
	if got != metadata.StatusAuthOn || err != nil {
		t.Fatalf("CheckStatusAuth = %v, %v; want on", got, err)
	}
	after, err := n.Admin.ResourceV1().ResourceClaims(ns).Get(ctx, "probed", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if after.ResourceVersion != before.ResourceVersion || len(after.Status.ReservedFor) != 0 {
		t.Errorf("the probe changed the claim: resourceVersion %s -> %s, reservedFor %v", before.ResourceVersion, after.ResourceVersion, after.Status.ReservedFor)
	}
}
