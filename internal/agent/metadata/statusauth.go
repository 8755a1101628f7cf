// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package metadata

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The agent's RBAC lets it update the status of every ResourceClaim
// (RBAC cannot scope by node). What keeps that to its own drivers' entries
// on claims allocated to its node is the API server's granular status
// authorization (KEP-4817): with it a status write that changes
// status.allocation or status.reservedFor needs resourceclaims/binding,
// and one that changes a driver's status.devices entries
// resourceclaims/driver, both of which the chart grants only as needed.
// Without it, a compromised node's agent could rewrite any claim's
// allocation. The gate exists from Kubernetes 1.36 (beta, on by default);
// an administrator can turn it off.

// StatusAuthGate is the API server's feature gate.
const StatusAuthGate = "DRAResourceClaimGranularStatusAuthorization"

// StatusAuth is what the API server does with the agent's claim status
// writes.
type StatusAuth int

const (
	// StatusAuthUnknown: not found out yet (no claim to ask with, or the
	// API server did not answer).
	StatusAuthUnknown StatusAuth = iota
	// StatusAuthOn: a status write that changes a claim's reservations
	// was refused for want of resourceclaims/binding.
	StatusAuthOn
	// StatusAuthOff: the API server lets the agent change any claim's
	// allocation and reservations.
	StatusAuthOff
)

// probePod is the reservation the probe pretends to add.
const probePod = "hwdra-status-authorization-probe"

// CheckStatusAuth finds out whether the API server enforces granular
// status authorization on the agent's writes: an API server older than
// 1.36 has no such gate; a newer one is asked with a dry-run status
// update of an allocated claim that adds a reservation, which stores
// nothing and which it refuses for want of resourceclaims/binding where
// the gate is on. Unknown (with the reason) where no allocated claim
// exists yet or the API server did not answer: ask again later.
func CheckStatusAuth(ctx context.Context, client kubernetes.Interface) (StatusAuth, error) {
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		return StatusAuthUnknown, fmt.Errorf("API server version: %w", err)
	}
	if major, minor := versionNumber(v.Major), versionNumber(v.Minor); major == 1 && minor < 36 {
		return StatusAuthOff, nil
	}
	claim, err := anyAllocatedClaim(ctx, client)
	if err != nil || claim == nil {
		return StatusAuthUnknown, err
	}
	probe := claim.DeepCopy()
	probe.Status.ReservedFor = append(probe.Status.ReservedFor,
		resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: probePod, UID: probePod})
	_, err = client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, probe,
		metav1.UpdateOptions{DryRun: []string{metav1.DryRunAll}, FieldManager: probePod})
	switch {
	case err == nil:
		return StatusAuthOff, nil
	case refusedForBinding(err):
		return StatusAuthOn, nil
	case apierrors.IsForbidden(err):
		// RBAC gives no claim status at all: nothing to enforce.
		return StatusAuthOn, nil
	}
	return StatusAuthUnknown, fmt.Errorf("a dry-run status update of claim %s/%s: %w", claim.Namespace, claim.Name, err)
}

// refusedForBinding: the API server refused the change of reservations
// for want of resourceclaims/binding (k8s.io/kubernetes
// pkg/registry/resource AuthorizedForBinding: a Forbidden field error on
// status.allocation, in an Invalid status).
func refusedForBinding(err error) bool {
	var se apierrors.APIStatus
	if !errors.As(err, &se) || se.Status().Details == nil {
		return false
	}
	for _, c := range se.Status().Details.Causes {
		if strings.Contains(c.Message, "resourceclaims/binding") {
			return true
		}
	}
	return false
}

// anyAllocatedClaim is the first allocated claim the API server lists,
// nil where there is none; a page at a time, as few as it takes.
func anyAllocatedClaim(ctx context.Context, client kubernetes.Interface) (*resourceapi.ResourceClaim, error) {
	opts := metav1.ListOptions{Limit: 100}
	for {
		list, err := client.ResourceV1().ResourceClaims("").List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("listing claims: %w", err)
		}
		for i := range list.Items {
			if list.Items[i].Status.Allocation != nil {
				return &list.Items[i], nil
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			return nil, nil
		}
	}
}

// versionNumber reads "36" and "36+" (a provider's build) as 36; what is
// no number at all as a version high enough to ask.
func versionNumber(s string) int {
	n, err := strconv.Atoi(strings.TrimRight(s, "+"))
	if err != nil {
		return 1 << 20
	}
	return n
}

// StatusAuthWarning is the warning for an API server without granular
// status authorization.
func StatusAuthWarning() error {
	return fmt.Errorf("the API server does not enforce granular status authorization (feature gate %s, on by default since Kubernetes 1.36): "+
		"the agent's credentials can change the allocation and reservations of every ResourceClaim in the cluster, not only its own drivers' status.devices entries on claims of this node; "+
		"turn the gate on in kube-apiserver (docs/security.md)", StatusAuthGate)
}
