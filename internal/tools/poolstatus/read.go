// Copyright The hwdra Authors.
// SPDX-License-Identifier: Apache-2.0

package poolstatus

import (
	"context"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
)

// Read lists what a report on drivers needs: their ResourceSlices (only
// node's, when node is set), every ResourceClaim, and the DeviceTaintRules
// where the API serves them (DRADeviceTaintRules).
func Read(ctx context.Context, client kubernetes.Interface, drivers []string, node string) (Cluster, error) {
	var c Cluster
	for _, driver := range drivers {
		sel := fields.Set{resourceapi.ResourceSliceSelectorDriver: driver}
		if node != "" {
			sel[resourceapi.ResourceSliceSelectorNodeName] = node
		}
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel.String()})
		if err != nil {
			return Cluster{}, fmt.Errorf("list ResourceSlices of %s: %w", driver, err)
		}
		c.Slices = append(c.Slices, list.Items...)
	}
	claims, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return Cluster{}, fmt.Errorf("list ResourceClaims: %w", err)
	}
	c.Claims = claims.Items
	rules, err := client.ResourceV1().DeviceTaintRules().List(ctx, metav1.ListOptions{})
	switch {
	case apierrors.IsNotFound(err):
		// DeviceTaintRules are off in this cluster: none apply.
	case err != nil:
		return Cluster{}, fmt.Errorf("list DeviceTaintRules: %w", err)
	default:
		c.TaintRules = rules.Items
	}
	return c, nil
}

// Status reads the cluster and reports the pools of drivers (of node, when
// set), drivers in the order given.
func Status(ctx context.Context, client kubernetes.Interface, drivers []string, node string) (Report, error) {
	c, err := Read(ctx, client, drivers, node)
	if err != nil {
		return Report{}, err
	}
	r := Report{Pools: []Pool{}}
	for _, driver := range drivers {
		r.Pools = append(r.Pools, Compute(c, driver)...)
	}
	return r, nil
}
